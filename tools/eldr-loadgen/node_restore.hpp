// node_restore: what the loadgen changes on the node (policies, the current centroid epoch) and
// how to put it back: recorded before the first change, restored once whatever way the run ended
// (done, error, SIGINT), with its own admin clients so that nothing of the run needs to be alive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"

namespace eldr::loadgen {

struct node_restore {
  struct router {
    std::string node;  // admin endpoint
    std::unique_ptr<admin_client> admin;
    nlohmann::json policy;  // its `policy` answer before the run: policy, tau, policy_source
    bool changed = false;
  };
  std::vector<router> routers;
  std::string model;
  bool imported = false;
  uint64_t epoch_before = 0;  // the node's epoch before the loadgen's first import (0: none)
  uint64_t epoch_now = 0;     // the last epoch the loadgen made current

  // Connects to `node` and records its policy for `model`.
  status record(const std::string& node, const std::string& m);
  // The recorded router at admin endpoint `node`, or nullptr.
  router* find(const std::string& node);

  // Puts back every changed router's policy and the centroid epoch (unless --keep-centroids),
  // saying so in out.restored and out.report["node_changes"]; a failed restore makes the outcome
  // an error (exit 1) unless it already is one.
  void restore(const loadgen_options& o, loadgen_outcome& out);
};

}  // namespace eldr::loadgen
