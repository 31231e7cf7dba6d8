// views: eldrctl's status, workers and explain printers (views.hpp).
#include "tools/eldrctl/views.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tools/eldrctl/render.hpp"

namespace eldr::ctl {

std::string uptime_text(const json& v) {
  if (!v.is_number()) return text(v);
  auto s = static_cast<uint64_t>(std::max(0.0, v.get<double>()));
  std::ostringstream o;
  if (s >= 86400) o << s / 86400 << "d";
  if (s >= 3600) o << (s % 86400) / 3600 << "h";
  if (s >= 60) o << (s % 3600) / 60 << "m";
  o << s % 60 << "s";
  return o.str();
}

namespace {

// Handshakes this node refused or was refused, when any were: a node refused for the secret or
// for its cluster protocol stays apart, which the member table alone does not say.
void print_cluster_refusals(std::ostream& out, const json& c) {
  auto count = [&](const char* key) {
    return c.contains(key) && c[key].is_number_unsigned() ? c[key].get<uint64_t>() : 0;
  };
  if (auto n = count("refused_protocol"))
    out << "  " << n << " handshake(s) with nodes of another cluster protocol than this node's "
        << count("protocol") << ", refused (docs/cluster.md, \"Upgrades\")\n";
  if (auto n = count("refused"))
    out << "  " << n << " join(s) refused: the cluster secret not proven, or a name in use\n";
}

}  // namespace

void print_status_wide(std::ostream& out, const json& r) {
  if (!r.is_object()) {
    print_object(out, r, {});
    return;
  }
  if (r.contains("node") && r["node"].is_object()) {
    const json& n = r["node"];
    std::string line = "node " + text(n.value("name", json("?")));
    if (n.contains("version")) line += "  version " + text(n["version"]);
    if (n.contains("roles")) line += "  roles " + text(n["roles"]);
    if (n.contains("uptime_s")) line += "  uptime " + uptime_text(n["uptime_s"]);
    for (const auto& [k, v] : n.items())
      if (k != "name" && k != "version" && k != "roles" && k != "uptime_s")
        line += "  " + k + " " + text(v);
    out << line << "\n";
  }
  if (r.contains("endpoints")) {
    out << "\nendpoints\n";
    print_object(out, r["endpoints"], {"route", "worker", "admin", "metrics"}, 2);
  }
  if (r.contains("models") && r["models"].is_array()) {
    out << "\nmodels\n";
    if (r["models"].empty())
      out << "  (none)\n";
    else
      print_table(out, r["models"],
                  {{"name", "MODEL"},
                   {"k", "K"},
                   {"policy", "POLICY"},
                   {"tau", "TAU"},
                   {"epoch", "EPOCH"},
                   {"width", "WIDTH"},
                   {"workers.registered", "REGISTERED"},
                   {"workers.active", "ACTIVE"},
                   {"workers.draining", "DRAINING"},
                   {"workers.dead", "DEAD"}},
                  2);
  }
  if (r.contains("cluster") && r["cluster"].is_object() && r["cluster"].contains("members")) {
    out << "\ncluster\n";
    print_table(out, r["cluster"]["members"],
                {{"name", "NODE"}, {"address", "ADDRESS"}, {"roles", "ROLES"}, {"alive", "ALIVE"}},
                2);
    print_cluster_refusals(out, r["cluster"]);
  }
  if (r.contains("counters") && r["counters"].is_object() && !r["counters"].empty()) {
    out << "\ncounters\n";
    print_object(out, r["counters"], {}, 2);
  }
  json rest = json::object();
  for (const auto& [k, v] : r.items())
    if (k != "node" && k != "endpoints" && k != "models" && k != "counters" && k != "cluster")
      rest[k] = v;
  if (!rest.empty()) {
    out << "\n";
    print_object(out, rest, {});
  }
}

// The number at key (dotted), 0 when absent or not a number.
double number_at(const json& v, const std::string& dotted) {
  const json* at = &v;
  size_t from = 0;
  while (true) {
    const size_t dot = dotted.find('.', from);
    const std::string key =
        dotted.substr(from, dot == std::string::npos ? dotted.npos : dot - from);
    if (!at->is_object() || !at->contains(key)) return 0;
    at = &(*at)[key];
    if (dot == std::string::npos) break;
    from = dot + 1;
  }
  return at->is_number() ? at->get<double>() : 0;
}

// The sum of an object's numbers (a per-cause breakdown), 0 when it is not an object.
double sum_of(const json& v) {
  double total = 0;
  if (v.is_object())
    for (const auto& e : v)
      if (e.is_number()) total += e.get<double>();
  return total;
}

// What an operator must look at for one model, "ok" when nothing: decisions made by load only,
// no worker to route to, dead workers, a degraded signature store.
std::string model_state_text(const json& m, const json& caches) {
  std::vector<std::string> notes;
  if (m.contains("routing_with") && m.contains("policy") && m["routing_with"] != m["policy"])
    notes.push_back("routing by " + text(m["routing_with"]));
  const double active = number_at(m, "workers.active"), dead = number_at(m, "workers.dead");
  if (m.contains("workers") && active == 0) notes.push_back("no active worker");
  if (dead > 0) notes.push_back(number_text(json(dead)) + " dead");
  if (caches.is_array())
    for (const json& c : caches)
      if (c.is_object() && c.value("model", json()) == m.value("name", json()) &&
          c.contains("store") && c["store"].is_object() && c["store"].value("degraded", false))
        notes.push_back("store degraded");
  std::string out;
  for (const auto& n : notes)
    out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "ok" : out;
}

// `eldrctl status` for people: the figures an operator scans first, within 100 columns for
// usual names; --wide prints everything (print_status_wide), --json the node's answer.
void print_status(std::ostream& out, const json& r) {
  if (!r.is_object()) {
    print_object(out, r, {});
    return;
  }
  json head = json::object();
  for (const char* key : {"node", "endpoints"})
    if (r.contains(key)) head[key] = r[key];
  print_status_wide(out, head);
  const json caches = r.value("signature_cache", json());
  if (r.contains("models") && r["models"].is_array()) {
    out << "\nmodels\n";
    json rows = json::array();
    for (const json& m : r["models"]) {
      if (!m.is_object()) continue;
      char tau[32], coverage[32];
      std::snprintf(tau, sizeof tau, "%.2f", number_at(m, "tau"));
      std::snprintf(coverage, sizeof coverage, "%.1f%%", 100.0 * number_at(m, "coverage"));
      rows.push_back({{"name", m.value("name", json("?"))},
                      {"k", m.value("k", json())},
                      {"policy", m.value("policy", json())},
                      {"tau", tau},
                      {"epoch", m.value("epoch", json())},
                      {"workers", number_text(json(number_at(m, "workers.active"))) + "/" +
                                      number_text(json(number_at(m, "workers.registered")))},
                      {"coverage", coverage},
                      {"routed", number_at(m, "routed")},
                      {"errors", number_at(m, "route_errors")},
                      {"load_only", sum_of(m.value("fallbacks", json()))},
                      {"state", model_state_text(m, caches)}});
    }
    if (rows.empty())
      out << "  (none)\n";
    else
      print_table(out, rows,
                  {{"name", "MODEL"},
                   {"k", "K"},
                   {"policy", "POLICY"},
                   {"tau", "TAU"},
                   {"epoch", "EPOCH"},
                   {"workers", "ACTIVE"},
                   {"coverage", "COVERAGE"},
                   {"routed", "ROUTED"},
                   {"errors", "ERRORS"},
                   {"load_only", "LOAD_ONLY"},
                   {"state", "STATE"}},
                  2, false);
  }
  if (caches.is_array() && !caches.empty()) {
    out << "\nsignature cache\n";
    json rows = json::array();
    for (const json& c : caches) {
      if (!c.is_object()) continue;
      const json store = c.value("store", json::object());
      std::string state = store.is_object() && store.value("degraded", false)
                              ? "degraded: " + text(store.value("reason", json("")))
                              : "ok";
      if (state.size() > 40) state = state.substr(0, 37) + "...";
      rows.push_back({{"model", c.value("model", json("?"))},
                      {"blocks", number_at(c, "blocks")},
                      {"with_counts", number_at(c, "blocks_with_counts")},
                      {"publishers", number_at(c, "publishers")},
                      {"gaps", number_at(c, "ingest.gaps")},
                      {"dropped", sum_of(c.contains("ingest") ? c["ingest"].value("dropped", json())
                                                              : json())},
                      {"store", state}});
    }
    print_table(out, rows,
                {{"model", "MODEL"},
                 {"blocks", "BLOCKS"},
                 {"with_counts", "WITH_COUNTS"},
                 {"publishers", "PUBLISHERS"},
                 {"gaps", "GAPS"},
                 {"dropped", "DROPPED"},
                 {"store", "STORE"}},
                2, false);
  }
  if (r.contains("cluster") && r["cluster"].is_object() && r["cluster"].contains("members")) {
    out << "\ncluster\n";
    print_table(out, r["cluster"]["members"],
                {{"name", "NODE"}, {"address", "ADDRESS"}, {"roles", "ROLES"}, {"alive", "ALIVE"}},
                2, false);
    print_cluster_refusals(out, r["cluster"]);
  }
  // Counters that moved; the ones still at 0 are counted, not listed.
  if (r.contains("counters") && r["counters"].is_object() && !r["counters"].empty()) {
    json moved = json::object();
    size_t zero = 0;
    for (const auto& [k, v] : r["counters"].items())
      if (v.is_number() && v.get<double>() == 0)
        ++zero;
      else
        moved[k] = v;
    out << "\ncounters" << (zero ? " (" + std::to_string(zero) + " more at 0)" : "") << "\n";
    if (!moved.empty()) print_object(out, moved, {}, 2);
  }
  // Sections this build does not know: small objects and scalars shown, tables counted.
  json rest = json::object();
  for (const auto& [k, v] : r.items()) {
    if (k == "node" || k == "endpoints" || k == "models" || k == "counters" || k == "cluster" ||
        k == "signature_cache" || k == "curve_public_key")
      continue;
    if (v.is_array() && !v.empty() && v[0].is_object())
      rest[k] = std::to_string(v.size()) + " rows (--wide)";
    else
      rest[k] = v;
  }
  if (r.contains("curve_public_key"))
    rest["curve"] = text(r["curve_public_key"]).empty() || r["curve_public_key"].is_null()
                        ? json("off")
                        : r["curve_public_key"];
  if (!rest.empty()) {
    out << "\n";
    print_object(out, rest, {});
  }
  out << "\n(--wide: every column and counter; --json: the node's answer)\n";
}

void print_workers(std::ostream& out, const json& r) {
  if (!r.is_array()) {
    print_object(out, r, {});
    return;
  }
  if (r.empty()) {
    out << "no workers\n";
    return;
  }
  std::vector<column> cols = {{"model", "MODEL"},
                              {"worker", "WORKER"},
                              {"endpoint", "ENDPOINT"},
                              {"state", "STATE"},
                              {"load", "LOAD"},
                              {"capacity", "CAPACITY"},
                              {"last_report_ms_ago", "LAST_REPORT_MS"},
                              {"routed", "ROUTED"},
                              {"finished", "FINISHED"}};
  // With load authorities (cluster.load_sharing = "authority"): the node that publishes each
  // worker's load, the one to look at when it seems wrong.
  if (std::any_of(r.begin(), r.end(), [](const json& w) { return w.contains("authority"); })) {
    cols.push_back({"authority", "AUTHORITY"});
    // Of LOAD, peers' decisions this router estimated until the next vector (a guess).
    cols.insert(cols.begin() + 5, {"load_estimated", "ESTIMATED"});
  }
  print_table(out, r, std::move(cols));
}

void print_explain(std::ostream& out, json r) {
  json band;
  if (r.is_object() && r.contains("band") && r["band"].is_array()) {
    band = std::move(r["band"]);
    r.erase("band");
  }
  print_object(out, r,
               {"request", "id", "model", "worker", "endpoint", "epoch", "policy", "tau",
                "covered_blocks", "total_blocks"});
  if (band.is_null()) return;
  // The band travels as [[worker, score], ...]: name the columns.
  json rows = json::array();
  for (const json& m : band)
    rows.push_back(m.is_array() && m.size() >= 2 ? json{{"worker", m[0]}, {"score", m[1]}} : m);
  out << "band\n";
  if (rows.empty())
    out << "  (empty)\n";
  else
    print_table(out, rows, {{"worker", "WORKER"}, {"score", "SCORE"}}, 2);
}

}  // namespace eldr::ctl
