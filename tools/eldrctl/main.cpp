// eldrctl: the operator's CLI of an eldr node, over the node's admin endpoint (docs/protocol.md
// section 5, cluster/admin_protocol.hpp).
//
//   eldrctl [--node tcp://HOST:5702] [--timeout-ms N] [--json] COMMAND ...
//     status                                 node, endpoints, one row per model, counters
//     workers [--model M]                    one row per decode worker
//     drain MODEL WORKER | undrain MODEL WORKER
//     centroids show MODEL
//     centroids export MODEL [--epoch E] -o FILE
//     centroids import MODEL FILE [--force]  validated here first; an invalid file is refused, so
//                                            is one of another model or geometry unless --force
//     centroids swap MODEL EPOCH | centroids rollback MODEL
//     refit MODEL                            exit 1 when the node rejects the candidate
//     explain MODEL REQUEST_ID
//     policy MODEL [--set NAME] [--tau T] [--widen-single true|false] | policy MODEL --reset
//                                            a change is persisted (survives a restart) until
//                                            --reset returns the model to its config
//
// Output: aligned tables for people, or the node's raw result as JSON with --json. Errors go to
// stderr. Exit codes: 0 ok; 1 the node refused the command (its error code's name and message are
// printed); 2 usage error, or a local file refused or unwritable; 3 transport failure (timeout,
// node unreachable, an answer that does not decode).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cluster/client.hpp"
#include "cluster/curve_keys.hpp"
#include "core/centroid_file.hpp"
#include "core/file_io.hpp"
#include "core/spelling.hpp"
#include "tools/cli.hpp"

namespace {

using json = nlohmann::json;

constexpr int exit_ok = 0;
constexpr int exit_node_error = 1;
constexpr int exit_usage = 2;
constexpr int exit_transport = 3;

struct global_options {
  std::string node = "tcp://127.0.0.1:5702";
  int timeout_ms = 5000;
  bool json = false;
  bool wide = false;                  // status: every column and counter, not the 100-column view
  std::string curve_server_key;       // the node's CURVE public key (Z85); "" = plain TCP
  std::string curve_secret_key_file;  // our own long-term CURVE key (allowlisted nodes)
};

// The node's refusals come back from admin_client::call as "<code name>: <message>"
// (cluster/client.hpp); anything else (timeout, refused connection, a corrupt answer) failed
// before the node could answer. The exit code tells the two apart for scripts.
bool is_node_error(const eldr::status& s) {
  // Every code this build names ("unknown" for the rest, which is also what a code newer than this
  // build prints as).
  for (int code = 1; code <= UINT8_MAX; ++code) {
    const std::string name = eldr::to_string(static_cast<eldr::route_error_code>(code));
    if (s.message().rfind(name + ": ", 0) == 0) return true;
  }
  return false;
}

struct outcome {
  int exit = exit_ok;
  json result;
};

// What to do when --node is not the admin endpoint: the route and worker endpoints answer an
// admin request with unknown_type naming their own message type.
std::string endpoint_hint(const std::string& node_error) {
  auto names = [&](const char* what) {
    return node_error.find("unknown_type: " + std::string(what)) != std::string::npos;
  };
  const char* which = names("route_request.type")    ? "route"
                      : names("worker message.type") ? "worker"
                                                     : nullptr;
  if (!which) return "";
  return std::string("\neldrctl: that is the node's ") + which +
         " endpoint; eldrctl needs its admin endpoint ([endpoints].admin, by default "
         "tcp://127.0.0.1:5702; eldr-node prints all three in its ready line)";
}

// When `word` is not one of `valid` (the subcommands at that level), the message that names the
// closest one (within 2 edits) or lists them all; "" when it is valid.
std::string unknown_subcommand(const std::string& context, const std::string& word,
                               const std::vector<std::string>& valid) {
  if (std::find(valid.begin(), valid.end(), word) != valid.end()) return "";
  std::string all;
  std::vector<std::string_view> names;
  for (const auto& v : valid) {
    all += (all.empty() ? "" : ", ") + v;
    names.push_back(v);
  }
  std::string msg = "eldrctl: unknown command \"" + context + word + "\"";
  if (const auto best = eldr::closest_spelling(word, names))
    msg += "; did you mean \"" + context + std::string(*best) + "\"?";
  return msg + "\n  " + (context.empty() ? "commands" : context + "commands") + ": " + all;
}

// The subcommand words of argv (global options and their values skipped), for the check above.
std::vector<std::string> command_words(int argc, char** argv) {
  static const std::vector<std::string> with_value = {
      "--node", "--timeout-ms", "--curve-server-key", "--curve-secret-key-file"};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (std::find(with_value.begin(), with_value.end(), a) != with_value.end()) {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    out.push_back(a);
  }
  return out;
}

// The admin client for --node (with CURVE when asked); errors are printed and turned into the
// exit code.
eldr::result<std::unique_ptr<eldr::admin_client>> connect_admin(const global_options& g) {
  eldr::client_options o;
  o.timeout_ms = g.timeout_ms;
  if (!g.curve_server_key.empty()) {
    eldr::curve_client_keys keys;
    keys.server_public_key = g.curve_server_key;
    if (!g.curve_secret_key_file.empty()) {
      auto mine = eldr::read_curve_secret_key(g.curve_secret_key_file);
      if (!mine.ok())
        return eldr::status::invalid_argument("--curve-secret-key-file: " + mine.error().message());
      keys.public_key = mine->public_key;
      keys.secret_key = mine->secret_key;
    }
    o.curve = std::move(keys);
  }
  if (g.node.find("://") == std::string::npos)
    return eldr::status::invalid_argument(
        "--node " + g.node + ": not a ZeroMQ endpoint; did you mean tcp://" + g.node + "?");
  auto client = eldr::admin_client::connect(g.node, o);
  if (!client.ok())
    return eldr::status::invalid_argument("--node " + g.node + ": " + client.error().message());
  return client;
}

outcome call_node(const global_options& g, const std::string& command, json args) {
  auto client = connect_admin(g);
  if (!client.ok()) {
    std::cerr << "eldrctl: " << client.error().message() << "\n";
    return {exit_usage, {}};
  }
  auto r = (*client)->call(command, std::move(args));
  if (r.ok()) return {exit_ok, std::move(*r)};
  if (is_node_error(r.error())) {
    std::cerr << "eldrctl: " << command << ": " << r.error().message()
              << endpoint_hint(r.error().message()) << "\n";
    return {exit_node_error, {}};
  }
  std::cerr << "eldrctl: " << g.node << ": " << r.error().message() << "\n";
  // A node with CURVE on drops a plain client's connection without a word: say so.
  if (g.curve_server_key.empty())
    std::cerr << "eldrctl: no answer: check that --node is the admin endpoint and the node is up;"
                 " a node with CURVE on answers only clients given --curve-server-key "
                 "(docs/security.md)\n";
  return {exit_transport, {}};
}

// ---- rendering -------------------------------------------------------------------------------

std::string number_text(const json& v) {
  if (v.is_number_float()) {
    std::ostringstream s;
    s << v.get<double>();  // 6 significant digits: a float32 tau prints as 0.1, not 0.100000001
    return s.str();
  }
  return v.dump();
}

bool is_scalar(const json& v) {
  return !v.is_object() && !v.is_array();
}

// One cell or value: strings unquoted, null as "-", arrays of scalars joined, binary by size,
// anything else as compact JSON.
std::string text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_number()) return number_text(v);
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_binary()) return "<" + std::to_string(v.get_binary().size()) + " bytes>";
  if (v.is_array() && std::all_of(v.begin(), v.end(), is_scalar)) {
    std::string s;
    for (const json& e : v)
      s += (s.empty() ? "" : ",") + text(e);
    return s.empty() ? "-" : s;
  }
  return v.dump();
}

std::string upper(std::string s) {
  for (char& c : s)
    c = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : (c == '.' ? '_' : c);
  return s;
}

// Nested objects become dotted keys ("workers.active") so that they fit table columns.
void flatten(const json& v, const std::string& prefix,
             std::vector<std::pair<std::string, json>>& out) {
  for (const auto& [k, e] : v.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (e.is_object() && !e.empty())
      flatten(e, key, out);
    else
      out.emplace_back(key, e);
  }
}

struct column {
  std::string key;  // dotted
  std::string header;
};

// An aligned table of objects: the preferred columns first (shown even when a row lacks them),
// then every other key any row has, so fields a newer node adds are shown, not lost. Numeric
// columns are right-aligned.
// With all_columns false only `cols` are shown (the compact views of `status`).
void print_table(std::ostream& out, const json& rows, std::vector<column> cols, int indent = 0,
                 bool all_columns = true) {
  std::vector<std::map<std::string, json>> flat;
  for (const json& row : rows) {
    std::vector<std::pair<std::string, json>> kv;
    if (row.is_object())
      flatten(row, "", kv);
    else
      kv.emplace_back("value", row);
    std::map<std::string, json> m;
    for (auto& entry : kv) {
      // Not a structured binding: clang 14 cannot capture one in a lambda (C++20 P1091).
      const std::string& k = entry.first;
      if (all_columns &&
          std::none_of(cols.begin(), cols.end(), [&](const column& c) { return c.key == k; }))
        cols.push_back({k, upper(k)});
      m[k] = std::move(entry.second);
    }
    flat.push_back(std::move(m));
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(cols.size());
  std::vector<bool> numeric(cols.size(), true);
  for (size_t c = 0; c < cols.size(); ++c)
    width[c] = cols[c].header.size();
  for (const auto& m : flat) {
    std::vector<std::string> line;
    for (size_t c = 0; c < cols.size(); ++c) {
      auto it = m.find(cols[c].key);
      const json v = it == m.end() ? json() : it->second;
      if (!v.is_number() && !v.is_null()) numeric[c] = false;
      line.push_back(text(v));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    std::string s(static_cast<size_t>(indent), ' ');
    for (size_t c = 0; c < line.size(); ++c) {
      const std::string pad(width[c] - line[c].size(), ' ');
      const bool last = c + 1 == line.size();
      s += numeric[c] ? pad + line[c] : line[c] + (last ? "" : pad);
      if (!last) s += "  ";
    }
    out << s << "\n";
  };
  std::vector<std::string> headers;
  for (const column& c : cols)
    headers.push_back(c.header);
  print_line(headers);
  for (const auto& line : cells)
    print_line(line);
}

// key  value lines, the preferred keys first; nested objects indented below their key, arrays of
// objects as tables.
void print_object(std::ostream& out, const json& obj, const std::vector<std::string>& preferred,
                  int indent = 0) {
  if (!obj.is_object()) {
    out << std::string(static_cast<size_t>(indent), ' ') << (obj.is_null() ? "ok" : text(obj))
        << "\n";
    return;
  }
  std::vector<std::string> keys;
  for (const std::string& k : preferred)
    if (obj.contains(k)) keys.push_back(k);
  for (const auto& [k, v] : obj.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  size_t w = 0;
  for (const std::string& k : keys)
    w = std::max(w, k.size());
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (const std::string& k : keys) {
    const json& v = obj[k];
    if (v.is_object() && !v.empty()) {
      out << pad << k << "\n";
      print_object(out, v, {}, indent + 2);
    } else if (v.is_array() && !v.empty() &&
               std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_object(); })) {
      out << pad << k << "\n";
      print_table(out, v, {}, indent + 2);
    } else {
      out << pad << k << std::string(w - k.size() + 2, ' ') << text(v) << "\n";
    }
  }
}

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
  print_table(out, r,
              {{"model", "MODEL"},
               {"worker", "WORKER"},
               {"endpoint", "ENDPOINT"},
               {"state", "STATE"},
               {"load", "LOAD"},
               {"capacity", "CAPACITY"},
               {"last_report_ms_ago", "LAST_REPORT_MS"},
               {"routed", "ROUTED"},
               {"finished", "FINISHED"}});
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

// ---- commands ----------------------------------------------------------------------------------

// Runs one command and prints its result: raw JSON with --json, else render(result).
template <class Render>
int run(const global_options& g, const std::string& command, json args, Render render) {
  outcome o = call_node(g, command, std::move(args));
  if (o.exit != exit_ok) return o.exit;
  if (g.json)
    std::cout << o.result.dump(2) << "\n";
  else
    render(std::cout, o.result);
  return exit_ok;
}

auto keyed(std::vector<std::string> preferred) {
  return [preferred = std::move(preferred)](std::ostream& out, const json& r) {
    print_object(out, r, preferred);
  };
}

int run_export(const global_options& g, const std::string& model, const CLI::Option* epoch_opt,
               uint64_t epoch, const std::string& path) {
  json args = {{"model", model}};
  if (epoch_opt->count() > 0) args["epoch"] = epoch;
  outcome o = call_node(g, "centroids.export", std::move(args));
  if (o.exit != exit_ok) return o.exit;
  const json* blob = nullptr;
  if (o.result.is_binary())
    blob = &o.result;
  else if (o.result.is_object() && o.result.contains("file") && o.result["file"].is_binary())
    blob = &o.result["file"];
  if (blob == nullptr) {
    std::cerr << "eldrctl: centroids.export: the node's answer holds no centroid file\n";
    return exit_node_error;
  }
  const std::vector<uint8_t>& bytes = blob->get_binary();
  // A file that would not import again is not worth keeping: check it as import would.
  auto f = eldr::parse_centroid_file(bytes, "the node's export");
  if (!f.ok()) {
    std::cerr << "eldrctl: centroids.export: " << f.error().message() << "\n";
    return exit_node_error;
  }
  if (eldr::status s = eldr::write_file_atomic(path, bytes); !s.ok()) {
    std::cerr << "eldrctl: " << s.message() << "\n";
    return exit_usage;
  }
  const json summary = {{"path", path},      {"bytes", bytes.size()}, {"model", f->model_name},
                        {"epoch", f->epoch}, {"workers", f->workers}, {"width", f->spec.width()}};
  if (g.json)
    std::cout << summary.dump(2) << "\n";
  else
    std::cout << "wrote " << path << ": model " << f->model_name << ", epoch " << f->epoch << ", "
              << f->workers << " workers, width " << f->spec.width() << ", " << bytes.size()
              << " bytes\n";
  return exit_ok;
}

// What the file says against the model: another model's name (eldr-fit --model sets it), or a
// geometry or K other than the node's current set. Empty when it fits (or the node has no set to
// compare with: the node checks again either way).
std::vector<std::string> import_mismatches(const eldr::centroid_file& f, const std::string& model,
                                           const json& shown) {
  std::vector<std::string> out;
  if (f.model_name != model)
    out.push_back("it was fitted for model \"" + f.model_name + "\", not \"" + model +
                  "\" (eldr-fit --model " + model + ")");
  if (!shown.is_object()) return out;
  const auto& g = f.spec.geometry();
  if (shown.contains("geometry") && shown["geometry"].is_array() && shown["geometry"].size() == 3 &&
      shown["geometry"] != json::array({g.layers, g.experts, g.top_k}))
    out.push_back("its geometry " + g.to_string() + " differs from the node's current set's (" +
                  text(shown["geometry"]) + " as layers,experts,top_k)");
  if (shown.contains("k") && shown["k"].is_number_unsigned() && shown["k"].get<uint32_t>() != 0 &&
      shown["k"].get<uint32_t>() != f.workers)
    out.push_back("it has " + std::to_string(f.workers) + " centroids, the node's current set " +
                  text(shown["k"]));
  return out;
}

int run_import(const global_options& g, const std::string& model, const std::string& path,
               bool force) {
  // Read once, validate those very bytes, send those very bytes: what was checked is what the
  // node gets. parse_centroid_file runs validate_centroid_file after decoding.
  auto bytes = eldr::read_file(path, eldr::admin_protocol_limits{}.max_payload_bytes);
  if (!bytes.ok()) {
    std::cerr << "eldrctl: refusing " << path << ": " << bytes.error().message() << "\n";
    return exit_usage;
  }
  auto f = eldr::parse_centroid_file(*bytes, path);
  if (!f.ok()) {
    std::cerr << "eldrctl: refusing " << path << ": " << f.error().message() << "\n";
    return exit_usage;
  }
  // Compared with the node's current set before anything is sent; the node checks again (every
  // client gets its refusal), so a failed show only skips this early check.
  json shown;
  if (auto c = connect_admin(g); c.ok())
    if (auto r = (*c)->call("centroids.show", {{"model", model}}); r.ok()) shown = std::move(*r);
  const auto mismatches = import_mismatches(*f, model, shown);
  for (const auto& m : mismatches)
    std::cerr << "eldrctl: " << (force ? "warning" : "refusing " + path) << ": " << m << "\n";
  if (!mismatches.empty() && !force) {
    std::cerr << "eldrctl: nothing was sent; import it anyway with --force\n";
    return exit_usage;
  }
  json args = {{"model", model}, {"file", json::binary(std::move(*bytes))}};
  if (force) args["force"] = true;
  return run(g, "centroids.import", std::move(args), keyed({"model", "epoch"}));
}

// Local: no node involved. The secret key file is created 0600 before anything is written.
int run_keygen(const std::string& prefix) {
  auto pair = eldr::generate_curve_keypair();
  if (!pair.ok()) {
    std::cerr << "eldrctl: keygen: " << pair.error().message() << "\n";
    return exit_node_error;
  }
  const std::string secret_path = prefix + ".key", public_path = prefix + ".pub";
  // The keys' directory must exist (it is usually /etc/eldr/NODE, made with the right owner).
  if (const auto dir = std::filesystem::path(prefix).parent_path();
      !dir.empty() && !std::filesystem::is_directory(dir)) {
    std::cerr << "eldrctl: keygen: directory " << dir.string()
              << " does not exist; create it first (mkdir -p " << dir.string() << ")\n";
    return exit_usage;
  }
  // Both files are created exclusively (the secret one 0600): existing keys are never replaced.
  auto write_new = [](const std::string& path, const std::string& text, mode_t mode) -> bool {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0) {
      std::cerr << "eldrctl: keygen: " << path << ": " << std::strerror(errno)
                << " (existing keys are never overwritten)\n";
      return false;
    }
    const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool closed = ::close(fd) == 0;
    if (!wrote || !closed) std::cerr << "eldrctl: keygen: cannot write " << path << "\n";
    return wrote && closed;
  };
  if (!write_new(secret_path,
                 "# eldr CURVE secret key (Z85); keep private\n" + pair->secret_key + "\n", 0600))
    return exit_usage;
  if (!write_new(public_path, pair->public_key + "\n", 0644)) {
    ::unlink(secret_path.c_str());  // no half-made pair
    return exit_usage;
  }
  std::cout << "public key " << pair->public_key << "\nwrote " << secret_path << " and "
            << public_path << "\n";
  return exit_ok;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"eldrctl: administer an eldr node over its admin endpoint"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand (eldrctl status --json).
  app.fallthrough();

  global_options g;
  app.add_option("--node", g.node, "the node's admin endpoint")
      ->envname("ELDR_ADMIN_ENDPOINT")
      ->capture_default_str();
  app.add_option("--timeout-ms", g.timeout_ms, "wait for the node's answer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", g.json, "print the node's raw result as JSON instead of tables");
  app.add_flag("--wide", g.wide,
               "status: every column and counter (default: what an operator scans first, in 100 "
               "columns)");
  app.add_option("--curve-server-key", g.curve_server_key,
                 "the node's CURVE public key (Z85), when its endpoints use CURVE")
      ->envname("ELDR_CURVE_SERVER_KEY");
  app.add_option("--curve-secret-key-file", g.curve_secret_key_file,
                 "this client's CURVE secret key file, for nodes that allowlist clients")
      ->envname("ELDR_CURVE_SECRET_KEY_FILE");

  std::string model, request, out_path, file, policy_name;
  uint32_t worker = 0;
  uint64_t epoch = 0;
  double tau = 0.0;

  auto* status_cmd = app.add_subcommand("status", "node, endpoints, models, counters");
  auto* workers_cmd = app.add_subcommand("workers", "decode workers, one row each");
  auto* workers_model = workers_cmd->add_option("--model", model, "only this model's workers");
  auto* drain_cmd = app.add_subcommand("drain", "stop routing to a worker (in-flight finish)");
  auto* undrain_cmd = app.add_subcommand("undrain", "route to a drained worker again");
  for (auto* c : {drain_cmd, undrain_cmd}) {
    c->add_option("model", model, "model")->required();
    c->add_option("worker", worker, "worker index in the model's pool")->required();
  }

  auto* centroids = app.add_subcommand("centroids", "centroid sets: show, export, import, ...");
  centroids->require_subcommand(1);
  auto* show_cmd = centroids->add_subcommand("show", "the current centroid set and its history");
  show_cmd->add_option("model", model, "model")->required();
  auto* export_cmd = centroids->add_subcommand("export", "write a centroid set to a file");
  export_cmd->add_option("model", model, "model")->required();
  auto* export_epoch = export_cmd->add_option("--epoch", epoch, "epoch (default: the current)");
  export_cmd->add_option("-o,--output", out_path, "file to write")->required();
  auto* import_cmd = centroids->add_subcommand("import", "validate a centroid file, then load it");
  import_cmd->add_option("model", model, "model")->required();
  import_cmd->add_option("file", file, "centroid file (eldr-fit's output)")->required();
  bool force = false;
  import_cmd->add_flag("--force", force,
                       "import a set fitted for another model name or geometry (refused without)");
  auto* swap_cmd = centroids->add_subcommand(
      "swap", "make a stored epoch current (in a cluster: on every router, through the leader)");
  swap_cmd->add_option("model", model, "model")->required();
  swap_cmd->add_option("epoch", epoch, "epoch")->required();
  auto* rollback_cmd = centroids->add_subcommand(
      "rollback",
      "undo the newest change of the current set (an import, refit, swap or rollback's "
      "predecessor), whatever its epoch number: after `swap M 1` from 2 it goes back to 2; "
      "repeat to walk further back (in a cluster: on every router, through the leader)");
  rollback_cmd->add_option("model", model, "model")->required();

  auto* refit_cmd = app.add_subcommand("refit", "fit new centroids from recent traffic");
  refit_cmd->add_option("model", model, "model")->required();
  auto* explain_cmd = app.add_subcommand("explain", "the recorded decision of a recent request");
  explain_cmd->add_option("model", model, "model")->required();
  explain_cmd->add_option("request", request, "request id")->required();
  auto* policy_cmd = app.add_subcommand("policy", "show or set a model's routing policy");
  policy_cmd->add_option("model", model, "model")->required();
  auto* policy_set =
      policy_cmd->add_option("--set", policy_name, "policy name (eldr-adaptive, eldr, jsq, ...)");
  auto* policy_tau =
      policy_cmd->add_option("--tau", tau, "band half-width")->check(CLI::NonNegativeNumber);
  bool widen_single = true;
  auto* policy_widen = policy_cmd->add_option(
      "--widen-single", widen_single,
      "true: a band of one worker is widened to the best two (the paper's rule); false: not");
  bool policy_reset = false;
  policy_cmd
      ->add_flag("--reset", policy_reset,
                 "back to the config's policy and tau (forget the change persisted by --set/--tau)")
      ->excludes(policy_set)
      ->excludes(policy_tau)
      ->excludes(policy_widen);

  auto* keygen_cmd = app.add_subcommand(
      "keygen", "make a CURVE key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub");
  keygen_cmd->add_option("prefix", out_path, "path prefix of the two files")->required();

  // A mistyped subcommand: CLI11 would only say "A subcommand is required".
  if (const auto words = command_words(argc, argv); !words.empty()) {
    std::vector<std::string> top, under_centroids;
    for (const auto* c : app.get_subcommands([](CLI::App*) { return true; }))
      top.push_back(c->get_name());
    for (const auto* c : centroids->get_subcommands([](CLI::App*) { return true; }))
      under_centroids.push_back(c->get_name());
    std::string msg = unknown_subcommand("", words[0], top);
    if (msg.empty() && words[0] == "centroids" && words.size() > 1)
      msg = unknown_subcommand("centroids ", words[1], under_centroids);
    if (!msg.empty()) {
      std::cerr << msg << "\n";
      return exit_usage;
    }
  }
  // Help is a success; every other parse failure is a usage error, exit code 2 for scripts.
  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;

  if (*keygen_cmd) return run_keygen(out_path);
  if (*status_cmd)
    return run(g, "status", json::object(), g.wide ? print_status_wide : print_status);
  if (*workers_cmd) {
    json args = json::object();
    if (workers_model->count() > 0) args["model"] = model;
    return run(g, "workers", std::move(args), print_workers);
  }
  if (*drain_cmd || *undrain_cmd)
    return run(g, *drain_cmd ? "drain" : "undrain", {{"model", model}, {"worker", worker}},
               keyed({"model", "worker", "state"}));
  if (*show_cmd)
    return run(g, "centroids.show", {{"model", model}},
               keyed({"model", "epoch", "k", "width", "transform", "layers", "history"}));
  if (*export_cmd) return run_export(g, model, export_epoch, epoch, out_path);
  if (*import_cmd) return run_import(g, model, file, force);
  if (*swap_cmd)
    return run(g, "centroids.swap", {{"model", model}, {"epoch", epoch}},
               keyed({"model", "epoch", "from_epoch", "set_of_epoch", "numbered_by"}));
  if (*rollback_cmd)
    return run(g, "centroids.rollback", {{"model", model}},
               keyed({"model", "epoch", "from_epoch", "set_of_epoch", "numbered_by"}));
  if (*refit_cmd) {
    // A rejected candidate is the node refusing the command (README: exit 1), with its reason on
    // stderr; the figures are printed either way.
    outcome o = call_node(g, "refit", {{"model", model}});
    if (o.exit != exit_ok) return o.exit;
    if (g.json)
      std::cout << o.result.dump(2) << "\n";
    else
      print_object(std::cout, o.result, {"accepted", "epoch", "reason"});
    if (o.result.is_object() && o.result.contains("accepted") &&
        o.result["accepted"].is_boolean() && !o.result["accepted"].get<bool>()) {
      std::cerr << "eldrctl: refit: rejected: " << text(o.result.value("reason", json("-")))
                << "\n";
      return exit_node_error;
    }
    return exit_ok;
  }
  if (*explain_cmd)
    return run(g, "explain", {{"model", model}, {"request", request}}, print_explain);
  if (*policy_cmd) {
    json args = {{"model", model}};
    if (policy_set->count() > 0) args["policy"] = policy_name;
    if (policy_tau->count() > 0) args["tau"] = tau;
    if (policy_widen->count() > 0) args["widen_single"] = widen_single;
    if (policy_reset) args["reset"] = true;
    return run(g, "policy", std::move(args),
               keyed({"model", "policy", "tau", "widen_single", "policy_source"}));
  }
  return exit_usage;  // unreachable: require_subcommand
}
