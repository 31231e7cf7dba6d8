// loadgen: the whole run (loadgen.hpp) -- the setup against the node (status, workload, centroids,
// registrations, publishers), every policy's run (run_policy.hpp), the report, and the node put
// back as it was (node_restore.hpp) however the run ends.
#include "tools/eldr-loadgen/loadgen.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <variant>

#include <zmq.hpp>

#include "cluster/zmq/client.hpp"
#include "tools/eldr-loadgen/node_restore.hpp"
#include "tools/eldr-loadgen/report.hpp"
#include "tools/eldr-loadgen/run_policy.hpp"
#include "tools/eldr-loadgen/session.hpp"
#include "tools/eldr-loadgen/setup.hpp"

namespace eldr::loadgen {
namespace {

using json = nlohmann::json;

// The setup and every policy's run; what it changes on the node goes into `restore` first.
loadgen_outcome play(const loadgen_options& o, const std::atomic<bool>& stop,
                     node_restore& restore) {
  loadgen_outcome out;
  auto fail = [&](int code, const std::string& m) {
    out.exit_code = code;
    out.error = m;
    return out;
  };
  if (status st = check_options(o); !st.ok()) return fail(2, st.message());
  session s;
  {
    std::random_device rd;
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%08x%08x", rd(), rd());
    s.id_nonce = nonce;
  }
  s.o = &o;

  // 1. The node.
  client_options probe_opts;
  probe_opts.timeout_ms = 3000;
  auto probe = admin_client::connect(o.node, probe_opts);
  if (!probe.ok()) return fail(3, "cannot connect to " + o.node + ": " + probe.error().message());
  auto st = (*probe)->call("status");
  if (!st.ok())
    return fail(3, "node unreachable at " + o.node + " (admin status): " + st.error().message());
  client_options admin_opts;  // importing a centroid file may take the node a while
  admin_opts.timeout_ms = 30000;
  auto admin = admin_client::connect(o.node, admin_opts);
  if (!admin.ok()) return fail(3, "cannot connect to " + o.node + ": " + admin.error().message());
  if (status rs = read_status(s, *st); !rs.ok()) return fail(2, rs.message());
  // What the run will change, recorded before any change (step 3 imports, step 5 sets policies).
  restore.model = s.model;
  restore.epoch_before = s.import_epoch > 0 ? s.import_epoch - 1 : 0;
  if (status rs = restore.record(o.node, s.model); !rs.ok()) return fail(3, rs.message());
  for (const std::string& r : o.routers)
    if (r != o.node)
      if (status rs = restore.record(r, s.model); !rs.ok()) return fail(3, rs.message());
  say(o, "node " + o.node + ": model " + s.model + ", route " + s.route_endpoint + ", worker " +
             s.worker_endpoint);
  if (o.routers.empty()) s.route_endpoints.push_back(s.route_endpoint);
  for (const std::string& r : o.routers) {
    if (r == o.node) {
      s.route_endpoints.push_back(s.route_endpoint);
      continue;
    }
    auto a = admin_client::connect(r, probe_opts);
    if (!a.ok()) return fail(3, "cannot connect to router " + r + ": " + a.error().message());
    auto rs = (*a)->call("status");
    if (!rs.ok())
      return fail(3, "router unreachable at " + r + " (admin status): " + rs.error().message());
    const json ep = rs->is_object() ? rs->value("endpoints", json::object()) : json::object();
    if (!ep.is_object() || !ep.contains("route") || !ep["route"].is_string() ||
        !ep.contains("worker") || !ep["worker"].is_string())
      return fail(2, "router " + r + ": its status names no route and worker endpoints");
    s.route_endpoints.push_back(reachable(ep["route"].get<std::string>(), r));
    s.other_workers.push_back(reachable(ep["worker"].get<std::string>(), r));
    s.other_admins.push_back(std::move(a).value());
    say(o, "router " + r + ": route " + s.route_endpoints.back());
  }

  // 2. The workload.
  say(o, "preparing the workload (" +
             std::to_string(static_cast<uint64_t>(std::ceil(o.rate_rps * o.duration_s))) +
             " requests)");
  if (status ws = build_workload(s); !ws.ok()) return fail(2, ws.message());
  s.report_seq.assign(o.decode_workers, 0);
  if (status ps = prepare_plans(s); !ps.ok()) return fail(2, ps.message());

  // 3. Centroids.
  if (!o.no_import) {
    auto bytes = centroid_bytes(s);
    if (!bytes.ok()) return fail(2, bytes.error().message());
    // Forced: the set is fitted on this run's workload, whose geometry or K may differ from the
    // node's current set (an earlier run's); the node's epoch is swapped back at the end.
    json args = {
        {"model", s.model}, {"file", json::binary(std::move(bytes).value())}, {"force", true}};
    auto imported = (*admin)->call("centroids.import", std::move(args));
    if (!imported.ok()) return fail(1, "centroids.import: " + imported.error().message());
    say(o, "imported centroids: " + imported->dump());
    if (imported->is_object() && imported->contains("epoch") &&
        (*imported)["epoch"].is_number_unsigned())
      s.current_epoch = (*imported)["epoch"].get<uint64_t>();
    restore.imported = true;
    restore.epoch_now = s.current_epoch;
    out.changed.push_back("imported a centroid set for " + s.model + " as epoch " +
                          std::to_string(s.current_epoch) + " (the node was on epoch " +
                          std::to_string(restore.epoch_before) + ")");
    say(o, "changed: " + out.changed.back());
  }

  // 4. Emulated decode workers register; emulated prefill workers announce their publishers.
  client_options wopts;
  wopts.timeout_ms = 5000;
  auto workers = worker_client::connect(s.worker_endpoint, wopts);
  if (!workers.ok()) return fail(3, "worker endpoint: " + workers.error().message());
  for (uint32_t wi = 0; wi < o.decode_workers; ++wi) {
    worker_register m;
    m.model = s.model;
    m.worker = wi;
    m.endpoint = "loadgen://decode/" + std::to_string(wi);
    // Unbounded by default, like core/sim/simulator's decode workers, whose waiting queue has no
    // limit (max_batch bounds the running batch only): a node refusing requests as "full" would
    // make the run's requests differ from the simulation's.
    m.capacity = o.capacity.value_or(0);
    auto r = (*workers)->call(m);
    if (!r.ok()) return fail(3, "worker_register: " + r.error().message());
    if (const auto* e = std::get_if<error_reply>(&*r))
      return fail(1, "worker_register " + std::to_string(wi) + " refused: " + e->message);
  }
  for (uint32_t p = 0; p < o.prefill_workers; ++p) {
    publisher pub{zmq::socket_t(s.ctx, zmq::socket_type::xpub), "", 0};
    pub.socket.set(zmq::sockopt::xpub_verbose, 1);
    pub.socket.set(zmq::sockopt::sndhwm, 100000);
    pub.socket.set(zmq::sockopt::linger, 0);
    pub.socket.bind("tcp://127.0.0.1:*");
    pub.endpoint = pub.socket.get(zmq::sockopt::last_endpoint);
    publisher_register m;
    m.model = s.model;
    m.endpoint = pub.endpoint;
    auto r = (*workers)->call(m);
    if (!r.ok()) return fail(3, "publisher_register: " + r.error().message());
    if (const auto* e = std::get_if<error_reply>(&*r))
      return fail(1, "publisher_register refused: " + e->message);
    if (!pub.wait_subscriber(o.subscribe_timeout_ms))
      say(o, "warning: the node did not subscribe to " + pub.endpoint + " within " +
                 std::to_string(o.subscribe_timeout_ms) + " ms; its first events may be lost");
    // Every router's signature cache follows the prefill side's KV events (unless measuring
    // what that costs: --publishers-at-node-only).
    const std::vector<std::string> none;
    for (const std::string& we : o.publishers_at_node_only ? none : s.other_workers) {
      auto oc = worker_client::connect(we, wopts);
      if (!oc.ok()) return fail(3, "worker endpoint " + we + ": " + oc.error().message());
      auto orr = (*oc)->call(m);
      if (!orr.ok()) return fail(3, "publisher_register at " + we + ": " + orr.error().message());
      if (const auto* e = std::get_if<error_reply>(&*orr))
        return fail(1, "publisher_register at " + we + " refused: " + e->message);
      if (!pub.wait_subscriber(o.subscribe_timeout_ms))
        say(o, "warning: " + we + "'s node did not subscribe to " + pub.endpoint);
    }
    s.publishers.push_back(std::move(pub));
  }

  if (o.swap_at && std::find(o.policies.begin(), o.policies.end(), "eldr") == o.policies.end())
    say(o,
        "warning: --swap-at applies to the eldr policy's run only, and eldr is not in --policies");

  // 5. Every policy over the same workload.
  for (std::size_t pi = 0; pi < o.policies.size() && !stop.load(); ++pi) {
    const std::string& name = o.policies[pi];
    json args = {{"model", s.model}, {"policy", name}};
    if (o.tau) args["tau"] = *o.tau;
    // Marked changed before the call: a command that timed out may still have been applied.
    if (auto* r = restore.find(o.node)) r->changed = true;
    auto set = (*admin)->call("policy", args);
    if (!set.ok()) return fail(1, "policy " + name + ": " + set.error().message());
    for (auto& r : restore.routers)
      r.changed = true;
    for (auto& a : s.other_admins) {
      auto other = a->call("policy", args);
      if (!other.ok()) return fail(1, "policy " + name + " (router): " + other.error().message());
    }
    if (pi == 0) {
      const json& was = restore.routers.front().policy;
      out.changed.push_back("set the policy of " + s.model + " for each run (was " +
                            was.value("policy", std::string("?")) + " tau " +
                            (was.contains("tau") ? was["tau"].dump() : std::string("?")) + ")");
      say(o, "changed: " + out.changed.back());
    }
    say(o, "playing " + std::to_string(s.w->requests.size()) + " requests at " +
               fmt(o.rate_rps, 1) + " req/s under " + name);
    auto r = run_policy(s, name, static_cast<uint32_t>(pi), stop);
    restore.epoch_now = s.current_epoch;  // --swap-at imports another set
    if (!r.ok()) return fail(1, name + ": " + r.error().message());
    say(o, "  " + name + ": " + std::to_string(r->replied) + " replies, " +
               std::to_string(r->errors) + " errors, route p99 " + fmt(r->route_p99_us, 0) +
               " us, TPOT p50 " + fmt(r->tpot_p50_ms) + " ms");
    out.results.push_back(std::move(r).value());
  }

  // 6. The report.
  out.report = run_report(s, out.results);
  if (stop.load()) out.exit_code = 130;
  return out;
}

}  // namespace

loadgen_outcome run_loadgen(const loadgen_options& o, const std::atomic<bool>& stop) {
  node_restore restore;
  loadgen_outcome out = play(o, stop, restore);
  restore.restore(o, out);
  return out;
}

}  // namespace eldr::loadgen
