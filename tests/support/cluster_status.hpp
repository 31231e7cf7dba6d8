// What cluster integration tests ask a running eldr-node over its admin endpoint: the `status`
// result, the membership in it, the `workers` of a model, and a bounded poll. Every wait polls a
// condition until a deadline; nothing assumes how long propagation takes.
#pragma once

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cluster/zmq/client.hpp"

namespace eldr::testing {

// Polls `condition` every `interval` until it holds or `limit` passes; then asks once more.
template <class F>
bool eventually(F condition, std::chrono::milliseconds limit = std::chrono::seconds(20),
                std::chrono::milliseconds interval = std::chrono::milliseconds(20)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(interval);
  }
  return condition();
}

// The admin `status` result of the node at `admin`, or null when it does not answer within
// `timeout_ms` (one attempt).
inline nlohmann::json admin_status(const std::string& admin, int timeout_ms = 2000) {
  client_options o;
  o.timeout_ms = timeout_ms;
  auto a = admin_client::connect(admin, o);
  if (!a.ok()) return nullptr;
  auto r = (*a)->call("status");
  return r.ok() ? *r : nlohmann::json();
}

// Name -> alive of every member but the node itself, as `status` shows them ({} when `status` is
// not an answer).
inline std::map<std::string, bool> peers_of(const nlohmann::json& status) {
  std::map<std::string, bool> out;
  if (!status.is_object() || !status.contains("cluster") || !status["cluster"].is_object())
    return out;
  for (const auto& m : status["cluster"].value("members", nlohmann::json::array()))
    if (!m.value("self", false)) out[m.value("name", "")] = m.value("alive", false);
  return out;
}

// Peers marked alive in `status`; -1 when `status` is not an answer.
inline int alive_peers(const nlohmann::json& status) {
  if (!status.is_object() || !status.contains("cluster")) return -1;
  int alive = 0;
  for (const auto& [name, up] : peers_of(status))
    alive += up ? 1 : 0;
  return alive;
}

// A counter of the `cluster` object of `status` (joins, refused, dial_failures, ...); 0 when
// absent.
inline uint64_t cluster_counter(const nlohmann::json& status, const std::string& key) {
  if (!status.is_object() || !status.contains("cluster") || !status["cluster"].is_object())
    return 0;
  return status["cluster"].value(key, uint64_t{0});
}

// The admin `workers` result for `model` (an array), or null when the node does not answer.
inline nlohmann::json admin_workers(const std::string& admin, const std::string& model,
                                    int timeout_ms = 2000) {
  client_options o;
  o.timeout_ms = timeout_ms;
  auto a = admin_client::connect(admin, o);
  if (!a.ok()) return nullptr;
  auto r = (*a)->call("workers", {{"model", model}});
  return r.ok() ? *r : nlohmann::json();
}

}  // namespace eldr::testing
