// node_restore: recording and restoring the node's policies and centroid epoch (node_restore.hpp).
#include "tools/eldr-loadgen/node_restore.hpp"

#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

using json = nlohmann::json;

status node_restore::record(const std::string& node, const std::string& m) {
  client_options co;
  // The same client restores the node after the run, when a node may still be draining the
  // run's queues (and a swap in a cluster goes through the refit leader and its store).
  co.timeout_ms = 30000;
  auto a = admin_client::connect(node, co);
  if (!a.ok()) return a.error();
  auto p = (*a)->call("policy", {{"model", m}});
  if (!p.ok())
    return status::io_error("policy of " + m + " at " + node + ": " + p.error().message());
  routers.push_back(router{node, std::move(a).value(), std::move(p).value(), false});
  return {};
}

node_restore::router* node_restore::find(const std::string& node) {
  for (auto& r : routers)
    if (r.node == node) return &r;
  return nullptr;
}

void node_restore::restore(const loadgen_options& o, loadgen_outcome& out) {
  auto failed = [&](const std::string& what) {
    say(o, "warning: " + what);
    out.restored.push_back("NOT restored: " + what);
    if (out.exit_code == 0) {
      out.exit_code = 1;
      out.error = what;
    }
  };
  for (auto& r : routers) {
    if (!r.changed) continue;
    const json& was = r.policy;
    json args = {{"model", model}};
    const bool from_config = was.value("policy_source", std::string("admin")) == "config";
    if (from_config) {
      args["reset"] = true;
    } else {
      args["policy"] = was.value("policy", std::string("eldr"));
      if (was.contains("tau") && was["tau"].is_number()) args["tau"] = was["tau"];
    }
    auto back = r.admin->call("policy", args);
    const std::string what = "policy of " + model + " at " + r.node + " back to " +
                             was.value("policy", std::string("?")) + " tau " +
                             (was.contains("tau") ? was["tau"].dump() : std::string("?")) +
                             (from_config ? " (the node's config)" : "");
    if (!back.ok()) {
      failed(what + ": " + back.error().message());
      continue;
    }
    say(o, "restored the " + what);
    out.restored.push_back(what);
  }
  if (imported && !routers.empty()) {
    if (o.keep_centroids) {
      const std::string what = "kept the loadgen's centroid set current as epoch " +
                               std::to_string(epoch_now) + " (--keep-centroids; the node was on " +
                               "epoch " + std::to_string(epoch_before) + ")";
      say(o, what);
      out.restored.push_back(what);
    } else if (epoch_before == 0) {
      const std::string what = "the node had no centroid set before; the loadgen's epoch " +
                               std::to_string(epoch_now) +
                               " stays current (no command removes a set)";
      say(o, "warning: " + what);
      out.restored.push_back(what);
    } else if (epoch_now != epoch_before) {
      auto back = routers.front().admin->call("centroids.swap",
                                              {{"model", model}, {"epoch", epoch_before}});
      const std::string what = "centroid epoch of " + model + " back to " +
                               std::to_string(epoch_before) + " (the loadgen's epoch " +
                               std::to_string(epoch_now) + " stays stored)";
      if (!back.ok())
        failed(what + ": " + back.error().message());
      else {
        // In a cluster the leader re-publishes the set as a new epoch (docs/cluster.md).
        const std::string renumbered =
            back->is_object() && back->contains("set_of_epoch")
                ? " (in the cluster: the set of epoch " + std::to_string(epoch_before) +
                      " as epoch " + std::to_string(back->value("epoch", uint64_t{0})) + ")"
                : "";
        say(o, "restored the " + what + renumbered);
        out.restored.push_back(what + renumbered);
      }
    }
  }
  if (out.report.is_object() || out.report.is_null())
    out.report["node_changes"] = {{"changed", out.changed}, {"restored", out.restored}};
}

}  // namespace eldr::loadgen
