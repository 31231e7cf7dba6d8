// node: one eldr-node -- the actor system with the router, signature-cache, load-monitor, refit
// and admin actors, the ZeroMQ frontend, and the metrics endpoint -- started from a validated
// configuration and stopped by destroying it.
//
// Start-up order makes a restart warm: each model's signature cache is opened first and its
// current centroid set read back, so the first request after a restart is routed with the same
// epoch and the same signatures as before it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "cluster/config/node_config.hpp"
#include "cluster/zmq/zmq_frontend.hpp"
#include "core/base/status.hpp"

namespace eldr {

struct node_options {
  // Milliseconds on a monotonic clock (worker timeouts, uptime); default: steady clock.
  std::function<int64_t()> now_ms;
};

class node {
 public:
  // Errors: the data directory or a store cannot be opened, an endpoint cannot be bound, a
  // configured centroid file is invalid. Nothing is left running on error.
  static result<std::unique_ptr<node>> start(node_config config, node_options options = {});
  // Stops every actor, then the frontend and the metrics server.
  ~node();

  // Endpoints actually bound (ports resolved).
  const std::string& endpoint(frontend_channel c) const;
  // "http://host:port/metrics", or "" when metrics are off.
  const std::string& metrics_url() const;
  // host:port other nodes dial to join this one (port resolved), or "" when standalone.
  const std::string& cluster_address() const;
  // Per model name, the endpoint its KV-event publishers connect to (models[].kv_events.bind,
  // port resolved); models without one are absent.
  const std::map<std::string, std::string>& kv_events_endpoints() const;

  class impl;

 private:
  explicit node(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
