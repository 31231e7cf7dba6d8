// node_config: see node_config.hpp; the file format is documented in docs/configuration.md.
#include "cluster/config/node_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cluster/config/first_error.hpp"
#include "cluster/http/metrics_http.hpp"
#include "core/base/file_io.hpp"
#include "core/base/spelling.hpp"
#include "core/routing.hpp"

// toml++ is used header-only in this translation unit, without exceptions (parse() returns a
// parse_result). Debian's libtomlplusplus.so is built with exceptions (namespace toml::v3::ex),
// so linking it would not provide the noex API; header-only keeps us independent of how the
// shared library was built. Its headers are third-party code: their warnings are not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wold-style-cast"
#pragma GCC diagnostic ignored "-Wcast-align"
#pragma GCC diagnostic ignored "-Woverloaded-virtual"
#pragma GCC diagnostic ignored "-Wimplicit-fallthrough"
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 0
#define TOML_ENABLE_FORMATTERS 0
// toml++ 3.3.0 (Debian 12) checks a parse_key() precondition with TOML_ASSERT_ASSUME, which a
// malformed table header such as "[=a]" or "[[[1]]]" breaks: debug builds abort on it, and clang
// release builds compile it to __builtin_assume -- undefined behaviour on a user's typo. Without
// the check the parser reports an ordinary syntax error (fixed upstream in tomlplusplus PR #301),
// so the macro is made a no-op before the parser is compiled.
#include <toml++/impl/preprocessor.h>
#undef TOML_ASSERT_ASSUME
#define TOML_ASSERT_ASSUME(expr) static_assert(true)
#include <toml++/toml.h>
#pragma GCC diagnostic pop

namespace eldr {
namespace {

constexpr size_t max_model_name_bytes = 256;
constexpr uint64_t max_config_file_bytes = uint64_t{16} << 20;   // a typo'd path to a huge file
constexpr uint64_t max_reply_backlog_bytes = uint64_t{1} << 40;  // beyond: a typo, not a budget

constexpr std::string_view known_roles[] = {"router", "signature-cache", "load-monitor", "refit"};
constexpr std::string_view known_log_levels[] = {"trace", "debug", "info", "warn", "error", "off"};
constexpr std::string_view known_log_formats[] = {"text", "json"};
constexpr std::string_view known_load_sharing[] = {"decisions", "authority"};

std::string quoted(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// Shortest text that reads back as the same value ("-0.5", not "-0.500000").
template <class F>
std::string number_text(F value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, value);
  return std::string(buf, r.ptr);
}

// "a, b, c", for the lists of valid values in messages.
template <class Range>
std::string joined(const Range& items) {
  std::string out;
  for (std::string_view s : items)
    out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

const char* type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

status wrong_type(const std::string& key, const char* expected, const toml::node& n) {
  return status::invalid_argument(key + ": expected " + expected + ", got " + type_name(n.type()));
}

// Conversions from one TOML value to one field. Integers must fit the field's type exactly:
// never wrapped, never clamped.
status convert(const toml::node& n, const std::string& key, std::string& out) {
  const auto* v = n.as_string();
  if (v == nullptr) return wrong_type(key, "a string", n);
  // Strings become paths and endpoints, which C APIs would silently truncate at a NUL.
  if (v->get().find('\0') != std::string::npos)
    return status::invalid_argument(key + ": must not contain a NUL character");
  out = v->get();
  return {};
}

status convert(const toml::node& n, const std::string& key, bool& out) {
  const auto* v = n.as_boolean();
  if (v == nullptr) return wrong_type(key, "a boolean (true or false)", n);
  out = v->get();
  return {};
}

template <class Int>
status convert_integer(const toml::node& n, const std::string& key, Int& out,
                       const char* type_text) {
  const auto* v = n.as_integer();
  if (v == nullptr) return wrong_type(key, "an integer", n);
  const int64_t x = v->get();
  if (!std::in_range<Int>(x))
    return status::invalid_argument(key + ": out of range for " + type_text + " (" +
                                    std::to_string(std::numeric_limits<Int>::min()) + ".." +
                                    std::to_string(std::numeric_limits<Int>::max()) + "), got " +
                                    std::to_string(x));
  out = static_cast<Int>(x);
  return {};
}
status convert(const toml::node& n, const std::string& key, uint32_t& out) {
  return convert_integer(n, key, out, "an unsigned 32-bit integer");
}
status convert(const toml::node& n, const std::string& key, uint64_t& out) {
  return convert_integer(n, key, out, "an unsigned 64-bit integer");
}
status convert(const toml::node& n, const std::string& key, int64_t& out) {
  return convert_integer(n, key, out, "a 64-bit integer");
}

// Floats accept integers too ("tau = 0" is not a type error worth stopping a node for).
status convert(const toml::node& n, const std::string& key, double& out) {
  if (const auto* f = n.as_floating_point()) {
    out = f->get();
  } else if (const auto* i = n.as_integer()) {
    out = static_cast<double>(i->get());
  } else {
    return wrong_type(key, "a number", n);
  }
  return {};
}
status convert(const toml::node& n, const std::string& key, float& out) {
  double d = 0;
  if (status s = convert(n, key, d); !s.ok()) return s;
  if (std::isfinite(d) && std::abs(d) > std::numeric_limits<float>::max())
    return status::invalid_argument(key + ": out of range for a 32-bit float, got " +
                                    number_text(d));
  out = static_cast<float>(d);  // nan and inf stay so; validation refuses them by name
  return {};
}

status convert(const toml::node& n, const std::string& key, std::vector<std::string>& out) {
  const auto* a = n.as_array();
  if (a == nullptr) return wrong_type(key, "an array of strings", n);
  std::vector<std::string> values(a->size());
  for (size_t i = 0; i < a->size(); ++i)
    if (status s = convert((*a)[i], key + "[" + std::to_string(i) + "]", values[i]); !s.ok())
      return s;
  out = std::move(values);
  return {};
}

// One TOML table being read: `path` names it in errors ("runtime", "models[1]").
class table_reader {
 public:
  table_reader(const toml::table& t, std::string path) : table_(t), path_(std::move(path)) {}

  std::string key_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  // Every key of the table must be one of `known`: a typo is an error, not a silent default.
  status check_known(std::initializer_list<std::string_view> known) const {
    return check_known(std::span(known.begin(), known.size()));
  }
  status check_known(std::span<const std::string_view> known) const {
    for (const auto& [k, v] : table_) {
      const std::string_view key = k.str();
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string message = key_path(key) + (v.is_table() ? ": unknown table" : ": unknown key");
      // A typo ("tua") names the key it meant ("tau").
      if (const auto closest = closest_spelling(key, known))
        message += " (did you mean " + key_path(*closest) + "?)";
      else
        message += "; valid: " + joined(known);
      return status::invalid_argument(message);
    }
    return {};
  }

  // Absent keys leave `out` (its default) untouched.
  template <class T>
  status read(std::string_view key, T& out) const {
    const toml::node* n = table_.get(key);
    return n == nullptr ? status{} : convert(*n, key_path(key), out);
  }

 private:
  const toml::table& table_;
  std::string path_;
};

// A sub-table of the root, or nullptr when absent.
result<const toml::table*> section(const toml::table& root, std::string_view name) {
  const toml::node* n = root.get(name);
  if (n == nullptr) return static_cast<const toml::table*>(nullptr);
  if (!n->is_table()) return wrong_type(std::string(name), "a table", *n);
  return n->as_table();
}

status read_model(const toml::table& t, const std::string& path, model_config& m) {
  const table_reader r(t, path);
  first_error e;
  e(r.check_known({"name",
                   "workers",
                   "max_workers",
                   "centroids",
                   "policy",
                   "tau",
                   "widen_single",
                   "seed",
                   "worker_timeout_ms",
                   "refit_interval_s",
                   "sample_size",
                   "sample_horizon",
                   "min_sample",
                   "max_balance_ratio",
                   "score_tolerance",
                   "refit_batch_size",
                   "kv_endpoints",
                   "counts_endpoints",
                   "scrape_interval_ms",
                   "kv_events"}));
  e(r.read("name", m.name));
  e(r.read("workers", m.workers));
  e(r.read("max_workers", m.max_workers));
  e(r.read("centroids", m.centroids));
  e(r.read("policy", m.policy));
  e(r.read("tau", m.tau));
  e(r.read("widen_single", m.widen_single));
  e(r.read("seed", m.seed));
  e(r.read("worker_timeout_ms", m.worker_timeout_ms));
  e(r.read("refit_interval_s", m.refit_interval_s));
  e(r.read("sample_size", m.sample_size));
  e(r.read("sample_horizon", m.sample_horizon));
  e(r.read("min_sample", m.min_sample));
  e(r.read("max_balance_ratio", m.max_balance_ratio));
  e(r.read("score_tolerance", m.score_tolerance));
  e(r.read("refit_batch_size", m.refit_batch_size));
  e(r.read("kv_endpoints", m.kv_endpoints));
  e(r.read("counts_endpoints", m.counts_endpoints));
  e(r.read("scrape_interval_ms", m.scrape_interval_ms));
  if (const toml::node* kv = t.get("kv_events")) {
    if (!kv->is_table()) {
      e(wrong_type(r.key_path("kv_events"), "a table", *kv));
    } else {
      const table_reader kr(*kv->as_table(), r.key_path("kv_events"));
      e(kr.check_known({"bind"}));
      e(kr.read("bind", m.kv_bind));
    }
  }
  return e.get();
}

// Reads the document into `c` (whose fields start at their defaults). Structure and types only;
// ranges are validate_node_config's.
// [timeouts]: every key, its field, read and validated alike (all in 1..max_timeout_ms).
struct timeout_key {
  std::string_view key;
  uint32_t timeouts_config::*field;
};
constexpr timeout_key timeout_keys[] = {
    {"shard_sign_ms", &timeouts_config::shard_sign_ms},
    {"recall_ms", &timeouts_config::recall_ms},
    {"subscribe_ms", &timeouts_config::subscribe_ms},
    {"admin_query_ms", &timeouts_config::admin_query_ms},
    {"dial_ms", &timeouts_config::dial_ms},
    {"challenge_ttl_ms", &timeouts_config::challenge_ttl_ms},
    {"leader_wait_ms", &timeouts_config::leader_wait_ms},
    {"leader_retry_ms", &timeouts_config::leader_retry_ms},
    {"set_change_ms", &timeouts_config::set_change_ms},
    {"peer_sample_ms", &timeouts_config::peer_sample_ms},
    {"vote_ms", &timeouts_config::vote_ms},
    {"leadership_tick_ms", &timeouts_config::leadership_tick_ms},
};
// Ten minutes: a longer wait is a typo, not a setting (requests would pile up behind it).
constexpr uint32_t max_timeout_ms = 600'000;

status read_document(const toml::table& root, node_config& c) {
  first_error e;
  e(table_reader(root, "").check_known({"node", "endpoints", "limits", "runtime", "signature_cache",
                                        "cluster", "security", "timeouts", "models"}));
  if (!e.get().ok()) return e.get();

  const auto read_section = [&](std::string_view name, auto&& fill) {
    auto t = section(root, name);
    if (!t.ok()) return e(t.error());
    if (*t != nullptr) fill(table_reader(**t, std::string(name)));
  };
  read_section("node", [&](const table_reader& r) {
    e(r.check_known({"name", "roles", "data_dir"}));
    e(r.read("name", c.name));
    e(r.read("roles", c.roles));
    e(r.read("data_dir", c.data_dir));
  });
  read_section("endpoints", [&](const table_reader& r) {
    e(r.check_known({"route", "worker", "admin", "metrics"}));
    e(r.read("route", c.route_endpoint));
    e(r.read("worker", c.worker_endpoint));
    e(r.read("admin", c.admin_endpoint));
    e(r.read("metrics", c.metrics_address));
  });
  read_section("limits", [&](const table_reader& r) {
    e(r.check_known({"max_message_bytes", "max_blocks", "max_pending", "max_tracked_requests",
                     "max_queued_reply_bytes"}));
    e(r.read("max_message_bytes", c.max_message_bytes));
    e(r.read("max_blocks", c.max_blocks));
    e(r.read("max_pending", c.max_pending));
    e(r.read("max_tracked_requests", c.max_tracked_requests));
    e(r.read("max_queued_reply_bytes", c.max_queued_reply_bytes));
  });
  read_section("runtime", [&](const table_reader& r) {
    e(r.check_known({"threads", "log_level", "log_format", "explain_history"}));
    e(r.read("threads", c.threads));
    e(r.read("log_level", c.log_level));
    e(r.read("log_format", c.log_format));
    e(r.read("explain_history", c.explain_history));
  });
  read_section("signature_cache", [&](const table_reader& r) {
    e(r.check_known({"memory_bytes", "max_blocks", "sync_wal", "commit_interval_ms",
                     "max_publishers", "publisher_forget_ms", "replay_timeout_ms",
                     "publisher_share", "uncounted_block_grace_ms"}));
    e(r.read("publisher_share", c.cache_publisher_share));
    e(r.read("uncounted_block_grace_ms", c.cache_uncounted_block_grace_ms));
    e(r.read("memory_bytes", c.cache_memory_bytes));
    e(r.read("max_blocks", c.cache_max_blocks));
    e(r.read("sync_wal", c.sync_wal));
    e(r.read("commit_interval_ms", c.commit_interval_ms));
    e(r.read("max_publishers", c.max_publishers));
    e(r.read("publisher_forget_ms", c.publisher_forget_ms));
    e(r.read("replay_timeout_ms", c.replay_timeout_ms));
  });

  read_section("cluster", [&](const table_reader& r) {
    e(r.check_known({"listen",          "advertise",      "seeds",
                     "secret_file",     "heartbeat_ms",   "connection_timeout_ms",
                     "reconnect_ms",    "replication",    "vnodes",
                     "load_sync_ms",    "load_sharing",   "peer_estimate",
                     "decision_ttl_ms", "max_decisions",  "shard_sum_cache_mib",
                     "seen_blocks_mib", "store_batch_ms", "handoff_grace_ms",
                     "tls_certificate", "tls_key",        "tls_ca_file"}));
    cluster_config& k = c.cluster;
    e(r.read("listen", k.listen));
    e(r.read("advertise", k.advertise));
    e(r.read("seeds", k.seeds));
    e(r.read("secret_file", k.secret_file));
    e(r.read("heartbeat_ms", k.heartbeat_ms));
    e(r.read("connection_timeout_ms", k.connection_timeout_ms));
    e(r.read("reconnect_ms", k.reconnect_ms));
    e(r.read("replication", k.replication));
    e(r.read("vnodes", k.vnodes));
    e(r.read("load_sync_ms", k.load_sync_ms));
    e(r.read("load_sharing", k.load_sharing));
    e(r.read("peer_estimate", k.peer_estimate));
    e(r.read("decision_ttl_ms", k.decision_ttl_ms));
    e(r.read("max_decisions", k.max_decisions));
    e(r.read("shard_sum_cache_mib", k.shard_sum_cache_mib));
    e(r.read("seen_blocks_mib", k.seen_blocks_mib));
    e(r.read("store_batch_ms", k.store_batch_ms));
    e(r.read("handoff_grace_ms", k.handoff_grace_ms));
    e(r.read("tls_certificate", k.tls_certificate));
    e(r.read("tls_key", k.tls_key));
    e(r.read("tls_ca_file", k.tls_ca_file));
  });
  read_section("timeouts", [&](const table_reader& r) {
    std::vector<std::string_view> known;
    for (const auto& t : timeout_keys)
      known.push_back(t.key);
    e(r.check_known(known));
    for (const auto& t : timeout_keys)
      e(r.read(t.key, c.timeouts.*t.field));
  });
  read_section("security", [&](const table_reader& r) {
    e(r.check_known({"curve_secret_key_file", "curve_authorized_keys_file"}));
    e(r.read("curve_secret_key_file", c.security.curve_secret_key_file));
    e(r.read("curve_authorized_keys_file", c.security.curve_authorized_keys_file));
  });

  // [[models]]: an array of tables (inline tables in an array are the same thing to TOML).
  if (const toml::node* n = root.get("models")) {
    const toml::array* a = n->as_array();
    if (a == nullptr) {
      e(wrong_type("models", "an array of tables ([[models]])", *n));
    } else {
      c.models.resize(a->size());
      for (size_t i = 0; i < a->size(); ++i) {
        const std::string path = "models[" + std::to_string(i) + "]";
        const toml::table* t = (*a)[i].as_table();
        if (t == nullptr) {
          e(wrong_type(path, "a table", (*a)[i]));
          continue;
        }
        e(read_model(*t, path, c.models[i]));
      }
    }
  }
  return e.get();
}

bool is_wildcard_port(std::string_view port) {
  return port == "*" || port == "0";
}

// Why a ZeroMQ endpoint is unusable, or "" when it is fine. Bind endpoints may ask for a free
// port ("*" or 0); connect endpoints need a real one.
std::string endpoint_problem(std::string_view ep, bool bind) {
  constexpr std::string_view tcp = "tcp://", ipc = "ipc://", inproc = "inproc://";
  if (ep.starts_with(ipc) || ep.starts_with(inproc)) {
    const size_t prefix = ep.starts_with(ipc) ? ipc.size() : inproc.size();
    return ep.size() > prefix ? "" : "has no path or name after the scheme";
  }
  if (!ep.starts_with(tcp)) return "must start with tcp://, ipc:// or inproc://";
  const std::string_view rest = ep.substr(tcp.size());
  const size_t colon = rest.rfind(':');
  if (colon == rest.npos || colon == 0) return "must be tcp://host:port";
  const std::string_view port = rest.substr(colon + 1);
  if (bind && port == "*") return "";
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
    return bind ? "port must be a number in 0..65535 or *" : "port must be a number in 1..65535";
  if (!bind && value == 0) return "port must be a number in 1..65535";
  return "";
}

status check_endpoint(const std::string& key, const std::string& ep, bool bind) {
  const std::string why = endpoint_problem(ep, bind);
  if (why.empty()) return {};
  return status::invalid_argument(key + ": " + quoted(ep) + " " + why);
}

template <class T>
status at_least(const std::string& key, T value, T min) {
  if (value >= min) return {};
  return status::invalid_argument(key + ": must be >= " + std::to_string(min) + ", got " +
                                  std::to_string(value));
}

// Finite and >= min: NaN and infinities are refused by name.
template <class F>
status finite_at_least(const std::string& key, F value, F min) {
  if (std::isfinite(value) && value >= min) return {};
  return status::invalid_argument(key + ": must be finite and >= " + number_text(min) + ", got " +
                                  number_text(value));
}

status validate_model(const model_config& m, const std::string& p) {
  if (m.name.empty()) return status::invalid_argument(p + ".name: must be non-empty");
  if (m.name.size() > max_model_name_bytes)
    return status::invalid_argument(p + ".name: longer than " +
                                    std::to_string(max_model_name_bytes) + " bytes");
  // Names appear in logs, metrics labels and directory names: no control characters.
  if (std::any_of(m.name.begin(), m.name.end(),
                  [](char ch) { return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f; }))
    return status::invalid_argument(p + ".name: must not contain control characters");

  first_error e;
  e(at_least(p + ".max_workers", m.max_workers, 1u));
  if (m.workers > m.max_workers)
    e(status::invalid_argument(p + ".workers: " + std::to_string(m.workers) +
                               " exceeds max_workers (" + std::to_string(m.max_workers) + ")"));

  const auto names = policy_names();
  if (m.policy == "domain") {
    e(status::invalid_argument(
        p +
        ".policy: \"domain\" needs calibration domain labels, which a node does not have; "
        "use eldr"));
  } else if (std::find(names.begin(), names.end(), m.policy) == names.end()) {
    std::string valid;
    for (std::string_view n : names)
      if (n != "domain") valid += (valid.empty() ? "" : ", ") + std::string(n);
    e(status::invalid_argument(p + ".policy: unknown policy " + quoted(m.policy) +
                               "; valid: " + valid));
  }
  e(finite_at_least(p + ".tau", m.tau, 0.0f));
  e(at_least(p + ".worker_timeout_ms", m.worker_timeout_ms, int64_t{0}));
  // 0 = workers never time out; a timeout shorter than this would declare every worker dead
  // between two of its reports.
  if (m.worker_timeout_ms != 0 && m.worker_timeout_ms < min_worker_timeout_ms)
    e(status::invalid_argument(
        p + ".worker_timeout_ms: must be 0 (never) or >= " + std::to_string(min_worker_timeout_ms) +
        ", got " + std::to_string(m.worker_timeout_ms)));
  if (m.scrape_interval_ms != 0 && m.scrape_interval_ms < min_scrape_interval_ms)
    e(status::invalid_argument(p + ".scrape_interval_ms: must be 0 (automatic) or >= " +
                               std::to_string(min_scrape_interval_ms) + ", got " +
                               std::to_string(m.scrape_interval_ms)));
  // A worker that only heartbeats through scrapes must be scraped at least twice per timeout,
  // or one slow scrape would declare it dead.
  if (m.scrape_interval_ms != 0 && m.worker_timeout_ms > 0 &&
      m.scrape_interval_ms > m.worker_timeout_ms / 2)
    e(status::invalid_argument(p + ".scrape_interval_ms: must be <= worker_timeout_ms / 2 (" +
                               std::to_string(m.worker_timeout_ms / 2) + "), got " +
                               std::to_string(m.scrape_interval_ms)));
  e(at_least(p + ".sample_size", m.sample_size, 1u));
  if (m.min_sample > m.sample_size)
    e(status::invalid_argument(p + ".min_sample: " + std::to_string(m.min_sample) +
                               " exceeds sample_size (" + std::to_string(m.sample_size) + ")"));
  if (m.sample_horizon != 0 && m.sample_horizon < m.sample_size)
    e(status::invalid_argument(p +
                               ".sample_horizon: must be 0 (automatic: 8 x sample_size) or >= "
                               "sample_size (" +
                               std::to_string(m.sample_size) + "), got " +
                               std::to_string(m.sample_horizon)));
  e(finite_at_least(p + ".max_balance_ratio", m.max_balance_ratio, 1.0));
  e(finite_at_least(p + ".score_tolerance", m.score_tolerance, 0.0));
  e(at_least(p + ".refit_batch_size", m.refit_batch_size, 1u));
  for (size_t i = 0; i < m.kv_endpoints.size(); ++i)
    e(check_endpoint(p + ".kv_endpoints[" + std::to_string(i) + "]", m.kv_endpoints[i], false));
  for (size_t i = 0; i < m.counts_endpoints.size(); ++i)
    e(check_endpoint(p + ".counts_endpoints[" + std::to_string(i) + "]", m.counts_endpoints[i],
                     false));
  if (!m.kv_bind.empty()) e(check_endpoint(p + ".kv_events.bind", m.kv_bind, true));
  return e.get();
}

// A cluster address: host:port with a real host (peers dial it) and a port (0 only to bind).
status check_host_port(const std::string& key, const std::string& value, bool bind) {
  auto hp = parse_host_port(value);
  if (!hp.ok()) return status::invalid_argument(key + ": " + hp.error().message());
  if (!bind && hp->port == 0)
    return status::invalid_argument(key + ": " + quoted(value) + " needs a port in 1..65535");
  return {};
}

// [signature_cache] publishers: the bound, the forget interval, the replay timeout, and the
// configured endpoints within the bound (each is one of the node's publishers).
status validate_publishers(const node_config& c) {
  if (c.max_publishers < 1 || c.max_publishers > 4096)
    return status::invalid_argument("signature_cache.max_publishers: must be in 1..4096, got " +
                                    std::to_string(c.max_publishers));
  if (c.publisher_forget_ms < 0)
    return status::invalid_argument(
        "signature_cache.publisher_forget_ms: must be >= 0 (0 = never), got " +
        std::to_string(c.publisher_forget_ms));
  if (c.replay_timeout_ms < 1 || c.replay_timeout_ms > 60000)
    return status::invalid_argument("signature_cache.replay_timeout_ms: must be in 1..60000, got " +
                                    std::to_string(c.replay_timeout_ms));
  size_t configured = 0;
  for (const auto& m : c.models)
    configured += m.kv_endpoints.size() + m.counts_endpoints.size() + (m.kv_bind.empty() ? 0 : 1);
  if (configured > c.max_publishers)
    return status::invalid_argument(
        "signature_cache.max_publishers: " + std::to_string(c.max_publishers) + " is below the " +
        std::to_string(configured) +
        " publishers the models configure (kv_endpoints, counts_endpoints, one per "
        "kv_events.bind)");
  return {};
}

status validate_cluster(const node_config& c) {
  const cluster_config& k = c.cluster;
  first_error e;
  if (!c.clustered()) {
    // A standalone node has no peers to serve the roles it lacks.
    if (c.roles.size() != std::size(known_roles))
      e(status::invalid_argument(
          "node.roles: a standalone node (cluster.listen = \"\") needs all of " +
          joined(known_roles) + "; set cluster.listen to run a subset in a cluster"));
    if (!k.seeds.empty())
      e(
          status::invalid_argument("cluster.seeds: needs cluster.listen (this node must be "
                                   "reachable by the nodes it joins)"));
    return e.get();
  }
  e(check_host_port("cluster.listen", k.listen, true));
  if (!k.advertise.empty())
    e(check_host_port("cluster.advertise", k.advertise, false));
  else if (auto hp = parse_host_port(k.listen);
           hp.ok() && (hp->host == "0.0.0.0" || hp->host == "::"))
    e(
        status::invalid_argument("cluster.advertise: required when cluster.listen binds a wildcard "
                                 "address (" +
                                 quoted(k.listen) + "): peers need a host to dial"));
  for (size_t i = 0; i < k.seeds.size(); ++i)
    e(check_host_port("cluster.seeds[" + std::to_string(i) + "]", k.seeds[i], false));
  if (k.secret_file.empty())
    e(
        status::invalid_argument("cluster.secret_file: required when cluster.listen is set (nodes "
                                 "prove they know it before they may join)"));
  e(at_least("cluster.heartbeat_ms", k.heartbeat_ms, 10u));
  if (k.connection_timeout_ms <= k.heartbeat_ms)
    e(status::invalid_argument("cluster.connection_timeout_ms: must exceed cluster.heartbeat_ms (" +
                               std::to_string(k.heartbeat_ms) + "), got " +
                               std::to_string(k.connection_timeout_ms)));
  e(at_least("cluster.reconnect_ms", k.reconnect_ms, 10u));
  e(at_least("cluster.replication", k.replication, 1u));
  if (k.vnodes < 1 || k.vnodes > 4096)
    e(status::invalid_argument("cluster.vnodes: must be in 1..4096, got " +
                               std::to_string(k.vnodes)));
  e(at_least("cluster.load_sync_ms", k.load_sync_ms, 1u));
  e(at_least("cluster.decision_ttl_ms", k.decision_ttl_ms, 1u));
  // The node a worker talks to is its load authority, which lives in the node's router.
  if (k.load_sharing == "authority" && c.has_role("load-monitor") && !c.has_role("router"))
    e(status::invalid_argument(
        "cluster.load_sharing: \"authority\" (the default) needs the router role on every "
        "load-monitor node (node.roles): the node a decode worker talks to is that worker's load "
        "authority; add \"router\" to node.roles or set cluster.load_sharing = \"decisions\""));
  if (k.max_decisions < 1 || k.max_decisions > (1u << 24))
    e(status::invalid_argument("cluster.max_decisions: must be in 1..16777216, got " +
                               std::to_string(k.max_decisions)));
  if (k.shard_sum_cache_mib > 65536)
    e(status::invalid_argument("cluster.shard_sum_cache_mib: must be in 0..65536, got " +
                               std::to_string(k.shard_sum_cache_mib)));
  if (k.seen_blocks_mib > 65536)
    e(status::invalid_argument("cluster.seen_blocks_mib: must be in 0..65536, got " +
                               std::to_string(k.seen_blocks_mib)));
  if (k.store_batch_ms > 1000)
    e(status::invalid_argument("cluster.store_batch_ms: must be in 0..1000, got " +
                               std::to_string(k.store_batch_ms)));
  if (k.handoff_grace_ms > 600000)
    e(status::invalid_argument("cluster.handoff_grace_ms: must be in 0..600000, got " +
                               std::to_string(k.handoff_grace_ms)));
  if (k.tls_certificate.empty() != k.tls_key.empty())
    e(status::invalid_argument(
        std::string(k.tls_key.empty() ? "cluster.tls_key" : "cluster.tls_certificate") +
        ": cluster.tls_certificate and cluster.tls_key go together"));
  if (!k.tls_ca_file.empty() && k.tls_certificate.empty())
    e(
        status::invalid_argument("cluster.tls_ca_file: needs cluster.tls_certificate and "
                                 "cluster.tls_key (peers verify this node's certificate too)"));
  return e.get();
}

}  // namespace

uint32_t model_config::scrape_interval() const {
  if (scrape_interval_ms != 0) return scrape_interval_ms;
  if (worker_timeout_ms <= 0) return 200;
  return static_cast<uint32_t>(std::clamp<int64_t>(worker_timeout_ms / 2, 10, 200));
}

bool node_config::has_role(std::string_view role) const {
  return std::find(roles.begin(), roles.end(), role) != roles.end();
}

node_config default_node_config() {
  node_config c;
  model_config m;
  m.name = "default";
  c.models.push_back(std::move(m));
  return c;
}

status validate_node_config(const node_config& c) {
  first_error e;
  if (c.name.empty()) e(status::invalid_argument("node.name: must be non-empty"));
  if (c.roles.empty())
    e(status::invalid_argument("node.roles: at least one role is required; valid: " +
                               joined(known_roles)));
  for (size_t i = 0; i < c.roles.size(); ++i) {
    const std::string key = "node.roles[" + std::to_string(i) + "]";
    if (std::find(std::begin(known_roles), std::end(known_roles), c.roles[i]) ==
        std::end(known_roles))
      e(status::invalid_argument(key + ": unknown role " + quoted(c.roles[i]) +
                                 "; valid: " + joined(known_roles)));
    else if (std::find(c.roles.begin(), c.roles.begin() + static_cast<ptrdiff_t>(i), c.roles[i]) !=
             c.roles.begin() + static_cast<ptrdiff_t>(i))
      e(status::invalid_argument(key + ": duplicate role " + quoted(c.roles[i])));
  }
  if (c.data_dir.empty()) e(status::invalid_argument("node.data_dir: must be non-empty"));

  // Bind endpoints: well-formed, and distinct unless they ask for a free port (two binds of one
  // address would fail at start-up with a less helpful message).
  const std::pair<const char*, const std::string*> binds[] = {
      {"endpoints.route", &c.route_endpoint},
      {"endpoints.worker", &c.worker_endpoint},
      {"endpoints.admin", &c.admin_endpoint}};
  for (size_t i = 0; i < std::size(binds); ++i) {
    const std::string& ep = *binds[i].second;
    e(check_endpoint(binds[i].first, ep, true));
    const bool free_port =
        ep.starts_with("tcp://") && is_wildcard_port(ep.substr(ep.rfind(':') + 1));
    for (size_t j = 0; j < i && !free_port; ++j)
      if (*binds[j].second == ep)
        e(status::invalid_argument(std::string(binds[i].first) + ": " + quoted(ep) + " is also " +
                                   binds[j].first));
  }
  if (!c.metrics_address.empty()) {
    auto hp = parse_host_port(c.metrics_address);
    if (!hp.ok())
      e(status::invalid_argument("endpoints.metrics: " + hp.error().message() +
                                 "; \"\" turns the metrics server off"));
  }

  e(at_least("limits.max_message_bytes", c.max_message_bytes, 1024u));
  e(at_least("limits.max_blocks", c.max_blocks, 1u));
  e(at_least("limits.max_pending", c.max_pending, 1u));
  e(at_least("limits.max_tracked_requests", c.max_tracked_requests, 1u));
  if (c.max_queued_reply_bytes > max_reply_backlog_bytes)
    e(status::invalid_argument("limits.max_queued_reply_bytes: must be <= 2^40 (1 TiB), got " +
                               std::to_string(c.max_queued_reply_bytes)));

  if (c.threads < 1 || c.threads > 64)
    e(status::invalid_argument("runtime.threads: must be in 1..64, got " +
                               std::to_string(c.threads)));
  if (std::find(std::begin(known_log_levels), std::end(known_log_levels), c.log_level) ==
      std::end(known_log_levels))
    e(status::invalid_argument("runtime.log_level: unknown level " + quoted(c.log_level) +
                               "; valid: " + joined(known_log_levels)));
  if (std::find(std::begin(known_load_sharing), std::end(known_load_sharing),
                c.cluster.load_sharing) == std::end(known_load_sharing))
    e(status::invalid_argument("cluster.load_sharing: unknown mode " +
                               quoted(c.cluster.load_sharing) +
                               "; valid: " + joined(known_load_sharing)));
  if (std::find(std::begin(known_log_formats), std::end(known_log_formats), c.log_format) ==
      std::end(known_log_formats))
    e(status::invalid_argument("runtime.log_format: unknown format " + quoted(c.log_format) +
                               "; valid: " + joined(known_log_formats)));

  e(at_least("signature_cache.max_blocks", c.cache_max_blocks, uint64_t{1}));
  e(validate_publishers(c));
  // The commit timer runs whether or not events arrived: at 0 it spins (43% of a core on an idle
  // node, issue 12 defect 13).
  e(at_least("signature_cache.commit_interval_ms", c.commit_interval_ms, min_commit_interval_ms));
  if (!(c.cache_publisher_share > 0.0 && c.cache_publisher_share <= 1.0))
    e(status::invalid_argument("signature_cache.publisher_share: must be in (0, 1], got " +
                               std::to_string(c.cache_publisher_share)));
  e(validate_cluster(c));
  for (const auto& t : timeout_keys)
    if (const uint32_t v = c.timeouts.*t.field; v < 1 || v > max_timeout_ms)
      e(status::invalid_argument("timeouts." + std::string(t.key) + ": must be in 1.." +
                                 std::to_string(max_timeout_ms) + ", got " + std::to_string(v)));
  if (c.security.curve_secret_key_file.empty() && !c.security.curve_authorized_keys_file.empty())
    e(
        status::invalid_argument("security.curve_authorized_keys_file: needs "
                                 "security.curve_secret_key_file (CURVE is off without it)"));

  if (c.models.empty())
    e(status::invalid_argument("models: at least one [[models]] table is required"));
  for (size_t i = 0; i < c.models.size(); ++i) {
    const std::string p = "models[" + std::to_string(i) + "]";
    e(validate_model(c.models[i], p));
    for (size_t j = 0; j < i; ++j)
      if (!c.models[i].name.empty() && c.models[j].name == c.models[i].name)
        e(status::invalid_argument(p + ".name: duplicate model name " + quoted(c.models[i].name) +
                                   " (also models[" + std::to_string(j) + "])"));
  }
  return e.get();
}

result<node_config> parse_node_config(const std::string& toml_text, const std::string& origin,
                                      bool validate) {
  const std::string prefix = origin.empty() ? "" : origin + ": ";
  toml::parse_result parsed = toml::parse(std::string_view(toml_text), std::string_view(origin));
  if (!parsed) {
    const toml::parse_error& err = parsed.error();
    return status::invalid_argument(prefix + "line " + std::to_string(err.source().begin.line) +
                                    ", column " + std::to_string(err.source().begin.column) +
                                    ": TOML syntax error: " + std::string(err.description()));
  }
  node_config c;
  if (status s = read_document(parsed.table(), c); !s.ok())
    return status::invalid_argument(prefix + s.message());
  if (!validate) return c;
  if (status s = validate_node_config(c); !s.ok())
    return status::invalid_argument(prefix + s.message());
  return c;
}

result<node_config> load_node_config(const std::string& path, bool validate) {
  auto bytes = read_file(path, max_config_file_bytes);
  if (!bytes.ok()) return bytes.error();
  return parse_node_config(std::string(bytes->begin(), bytes->end()), path, validate);
}

}  // namespace eldr
