// router_files: the small per-model documents the router keeps in the data directory -- the
// policies an operator set with `eldrctl policy` (router-policy.json) and the rollback histories
// (centroid-history.json). Each is {"format": F, "version": 1, "models": {"<name>": ...}},
// replaced atomically on each change. A file that does not read is logged and ignored (what
// applies instead is said in the log line): a bad file must never stop routing.
#pragma once

#include <map>
#include <optional>
#include <string>

#include "actors/router/router_state.hpp"
#include "cluster/config/node_config.hpp"
#include "core/base/status.hpp"
#include "core/formats/centroid_history.hpp"

namespace eldr::router {

std::string policy_file_path(const node_config& c);
std::string history_file_path(const node_config& c);

// Writes every model whose policy_source is "admin" (policy, tau, widen_single).
status persist_policies(const router_state& st);

// A persisted admin policy.
struct persisted_policy {
  std::string policy;
  float tau = 0.0f;
  std::optional<bool> widen_single;  // absent in files written before it could be set
};

// The persisted admin policies by model name; empty when there is no file. An entry without a
// policy and a finite tau >= 0 is logged and left out (the config's policy applies).
std::map<std::string, persisted_policy> read_persisted_policies(const node_config& c);

// Writes every model's rollback history; a failure is logged (a restart then forgets it).
void persist_histories(const router_state& st);

// The persisted histories by model name; one that does not parse is logged and left out.
std::map<std::string, centroid_history> read_histories(const node_config& c);

}  // namespace eldr::router
