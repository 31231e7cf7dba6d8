// node_context: what every actor of one node shares -- the validated configuration, the ZeroMQ
// frontend that carries answers back to clients, the metrics, and the clock. Built once by
// node.cpp before any actor starts; immutable afterwards except through its own thread-safe
// members.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/node_metrics.hpp"
#include "actors/readiness.hpp"
#include "cluster/config/node_config.hpp"
#include "cluster/zmq/zmq_frontend.hpp"

namespace eldr {

class cluster_trust;
class operator_view;

struct node_context {
  node_config config;
  reply_sink* edge = nullptr;              // answers and subscriptions; outlives every actor
  const zmq_frontend* frontend = nullptr;  // for status (bound endpoints, counters); may be null
  std::shared_ptr<node_metrics> metrics;
  // Milliseconds on a monotonic clock; tests inject their own.
  std::function<int64_t()> now_ms;
  int64_t started_ms = 0;
  std::string metrics_url;  // "http://host:port/metrics", "" when off
  // Nodes that proved the cluster secret (cluster_protocol.hpp); null when standalone.
  std::shared_ptr<cluster_trust> trust;
  // What GET /readyz answers (readiness.hpp): written by the actors, read by the HTTP thread.
  // Null in code that builds a context without one (tests).
  std::shared_ptr<readiness_board> readiness;
  // What the operator page serves (operator_page.hpp): the admin actor samples into it, the HTTP
  // thread reads it. Null when the metrics endpoint is off, and in tests.
  std::shared_ptr<operator_view> operator_page;
};
using node_context_ptr = std::shared_ptr<const node_context>;

// An admin argument of the given type (admin_protocol.hpp's admin_uint_arg / admin_string_arg):
// nullopt when absent or null, an error naming the argument when it has another type or is out of
// range (never converted, never throws: arguments come from clients). Handlers answer that error
// as malformed.
result<std::optional<std::string>> string_arg(const nlohmann::json& args, const char* key);
result<std::optional<uint64_t>> uint_arg(const nlohmann::json& args, const char* key,
                                         uint64_t max = UINT64_MAX);

// Sends an admin reply (ok with `result`, or an error) back through the frontend.
void answer_admin(const node_context& ctx, const admin_job& job, nlohmann::json result);
void answer_admin_error(const node_context& ctx, const admin_job& job, wire_error_code code,
                        std::string message);

}  // namespace eldr
