// router_actor: see router_actor.hpp.
#include "actors/router_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_map>

#include "actors/cluster_protocol.hpp"
#include "cluster/counts_message.hpp"
#include "cluster/http_url.hpp"
#include "cluster/metrics_scraper.hpp"
#include "core/bounded_lru.hpp"
#include "core/centroid_history.hpp"
#include "core/file_io.hpp"
#include "core/hash_ring.hpp"
#include "core/leadership.hpp"
#include "core/load_exchange.hpp"
#include "core/load_view.hpp"
#include "core/random.hpp"
#include "core/refit.hpp"
#include "core/route_fallback.hpp"
#include "core/routing.hpp"
#include "core/shard_plan.hpp"

namespace eldr {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One past decision, for `eldrctl explain`.
struct explained {
  std::string request;
  uint32_t worker = 0;
  uint64_t epoch = 0;
  std::string policy;
  float tau = 0.0f;
  uint32_t covered = 0, total = 0;
  float best_score = 0.0f, worker_score = 0.0f;
  bool widened = false;
  std::string fallback;  // why the decision was by load only ("" when it was not)
  std::vector<uint32_t> candidates;
  std::vector<float> scores;   // s_k of every worker ("eldr", "eldr-adaptive"), else empty
  std::vector<uint32_t> load;  // in-flight per worker at the decision
};

struct model_state {
  uint32_t index = 0;
  const model_config* cfg = nullptr;
  load_view pool;
  std::string policy_name;  // as configured or set by `eldrctl policy`
  float tau = 0.1f;
  bool widen_single = true;  // the band's widening of a one-worker band (core/routing.hpp)
  // "config", or "admin" when `eldrctl policy` set policy_name/tau/widen_single: an admin change
  // is persisted (data_dir/router-policy.json) and wins over the config at the next start.
  std::string policy_source = "config";
  std::unique_ptr<routing_policy> policy;  // what routes now
  bool eldr_active = false;                // policy is the locality band over `set`
  std::optional<centroid_file> file;
  centroid_set_ptr set;
  spec_ptr spec;
  uint64_t epoch = 0;
  std::optional<signature_sample> sample;  // width of spec; reset when the width changes
  // Cluster: which published epochs this router accepts (a refit leader's term fences a stale
  // leader's publishes; docs/cluster.md).
  epoch_fence fence;
  uint64_t fenced = 0;  // announcements refused (stale term or old epoch)
  // The installs that made sets current, for `centroids rollback` (persisted in data_dir), and
  // the cause of the newest install, which an announcement to the peers carries.
  centroid_history history;
  std::string last_cause;
  std::deque<explained> recent;
  route_trace trace;
  uint64_t routed = 0, failed = 0, resigned = 0, unsigned_routes = 0, swaps = 0;
  uint64_t covered_blocks = 0, total_blocks = 0;
  // Loud fallbacks (core/route_fallback.hpp): decisions by load only per reason, requests whose
  // counts were of another geometry (the documented name, counts_geometry), and one log limiter
  // per reason so that a misconfigured client cannot flood the log.
  std::array<uint64_t, fallback_reason_count> fallbacks{};
  uint64_t counts_geometry = 0;
  std::array<log_limiter, fallback_reason_count> fallback_log;

  // Per worker slot: the metrics URL it registered (scraped every scrape_interval_ms), or none
  // (it pushes load_reports). Grows with the pool; cleared when a worker registers without one.
  std::vector<std::optional<http_url>> metrics_urls;
  std::vector<std::string> metrics_url_text;  // as registered, for the workers listing
  std::vector<std::string> scrape_error;  // the last failed scrape's reason ("" after a good one)
  std::vector<std::optional<vllm_load>> scraped;  // the last good scrape (workers listing)
  // Per worker slot: the running/waiting/KV usage of the newest pushed load_report (informational:
  // the load view counts its in_flight), and that report's seq; for the listing and the page.
  struct reported_load {
    vllm_load load;
    uint64_t seq = 0;
  };
  std::vector<std::optional<reported_load>> reported;

  // cluster.load_sharing = "authority" (core/load_exchange.hpp): this router's decisions per
  // worker; the authorities' vectors over them; the load authority for the workers that talk to
  // this node (made at the first local registration) and the finished ids it applied; which node
  // is each worker's authority (learned from the vectors); per authority, the last delta seq, the
  // totals it carried and when (an unchanged delta is resent at most every delta_resend_ms).
  decision_ledger ledger;
  load_overlay overlay;
  std::optional<load_authority> authority;
  std::optional<bounded_lru<std::string, bool>> finished_seen;
  std::map<uint32_t, std::string> authority_of;
  struct delta_stream {
    uint64_t seq = 0;
    std::vector<uint64_t> totals;
    int64_t sent_ms = 0;
  };
  std::map<std::string, delta_stream> deltas_out;
  std::vector<load_vector_entry> last_published;
  int64_t published_ms = 0;

  explicit model_state(load_view p) : pool(std::move(p)) {}
};

// A decision remembered for retries: the same request id gets the same worker and epoch.
struct remembered {
  uint32_t worker = 0;
  uint64_t epoch = 0;
};

struct router_state {
  node_context_ptr ctx;
  caf::actor sigcache;
  std::vector<std::unique_ptr<model_state>> models;
  uint64_t unknown_model = 0;
  // Decisions by "<model index>/<request id>", this router's and its peers': a client that
  // retries a route (after a timeout, possibly at another router) gets the first decision again,
  // and the load is counted once.
  std::optional<bounded_lru<std::string, remembered>> decisions;
  uint64_t retried = 0;
  // Cluster: the other routers, this router's decisions not yet sent to them (by model), and
  // what came from them.
  std::vector<caf::actor> peers;
  std::map<uint32_t, std::vector<shared_decision>> outbox;
  bool flush_armed = false;
  uint64_t peer_decisions = 0, peer_worker_messages = 0, peer_epochs = 0, untrusted = 0;
  // cluster.load_sharing = "authority": on, this incarnation (its decision totals restart from 0
  // when the node restarts), and what went through it.
  bool authority_mode = false;
  uint64_t incarnation = 0;
  uint64_t deltas_sent = 0, deltas_applied = 0, vectors_sent = 0, vectors_applied = 0;
  uint64_t load_messages_refused = 0;  // malformed or for a model/worker this node lacks
  // Cluster: the signature cache is sharded by block hash over the live signature-cache nodes
  // (this one included when it holds the role), R copies of each block's counts.
  std::optional<hash_ring> ring;
  std::vector<caf::actor> shards;       // by ring member index
  std::optional<uint32_t> local_shard;  // this node's ring member index, when it holds a cache
  uint64_t shard_requests = 0, shard_failovers = 0, shard_failures = 0, shard_store_messages = 0;
  uint64_t shard_local_requests = 0;    // of shard_requests, to this node's own shard
  std::vector<uint32_t> shard_scratch;  // a shard's reply, unpacked
  // Cluster: the refit leader as last announced ("" until one is), and the live routers by node
  // name. Only the leader numbers epochs (core/leadership.hpp), so imports go through it.
  std::string leader;
  uint64_t leader_term = 0;
  std::map<std::string, caf::actor> routers_by_name;
  uint64_t changes_forwarded = 0;  // imports, swaps, rollbacks sent to the refit leader
  // The decode workers' vLLM /metrics, fetched off the actor's thread; made at the first
  // registration with a metrics_url. Results come back as scraped_atom messages.
  std::unique_ptr<metrics_scraper> scraper;

  model_state* find(const std::string& name) {
    for (auto& m : models)
      if (m->cfg->name == name) return m.get();
    return nullptr;
  }
};

using router_actor_t = caf::stateful_actor<router_state>;

// --- Router state files ---
//
// The router keeps small per-model documents in the data directory (the admin policies, the
// rollback histories): {"format": F, "version": 1, "models": {"<name>": ...}}, replaced
// atomically on each change.

std::string state_file_path(const node_config& c, const char* file) {
  return (std::filesystem::path(c.data_dir) / file).string();
}

status write_models_file(const node_config& c, const char* file, const char* format,
                         nlohmann::json models) {
  const std::string text =
      nlohmann::json{{"format", format}, {"version", 1}, {"models", std::move(models)}}.dump(2) +
      "\n";
  std::error_code ec;
  std::filesystem::create_directories(c.data_dir, ec);
  return write_file_atomic(state_file_path(c, file),
                           std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// The "models" object of such a file; nullopt when there is none, or when it does not read (then
// logged, with `instead`: what applies in its place -- a bad file must not stop routing).
std::optional<nlohmann::json> read_models_file(const node_config& c, const char* file,
                                               const char* format, size_t max_bytes,
                                               const char* instead) {
  const std::string path = state_file_path(c, file);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto bytes = read_file(path, max_bytes);
  if (!bytes.ok()) {
    spdlog::error("{}: not read ({}); {}", path, bytes.error().message(), instead);
    return std::nullopt;
  }
  auto doc = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("format", format) != format ||
      !doc.contains("models") || !doc["models"].is_object()) {
    spdlog::error("{}: not an {} file; {}", path, format, instead);
    return std::nullopt;
  }
  return std::move(doc["models"]);
}

// --- Policy persistence ---
//
// `eldrctl policy` changes survive a restart: every model whose policy an operator set is written
// to one small JSON file in the data directory, {"models": {"<name>": {"policy": ..., "tau":
// ..., "widen_single": ...}}}, replaced atomically on each change (a file without widen_single,
// from before it could be set, keeps the config's). The config's policy is the default; a persisted
// admin change wins at start-up until `eldrctl policy M --reset` returns the model to the config.

constexpr const char* policy_file = "router-policy.json";
constexpr const char* policy_format = "eldr-router-policy";

std::string policy_file_path(const node_config& c) {
  return state_file_path(c, policy_file);
}

status persist_policies(const router_state& st) {
  nlohmann::json models = nlohmann::json::object();
  for (const auto& m : st.models)
    if (m->policy_source == "admin")
      models[m->cfg->name] = {
          {"policy", m->policy_name}, {"tau", m->tau}, {"widen_single", m->widen_single}};
  return write_models_file(st.ctx->config, policy_file, policy_format, std::move(models));
}

// The persisted admin policies by model name; empty when there is no file. A file that does not
// read is logged and ignored (the config's policies apply): a bad file must not stop routing.
struct persisted_policy {
  std::string policy;
  float tau = 0.0f;
  std::optional<bool> widen_single;  // absent in files written before it could be set
};

std::map<std::string, persisted_policy> read_persisted_policies(const node_config& c) {
  std::map<std::string, persisted_policy> out;
  const std::string path = policy_file_path(c);
  const auto models =
      read_models_file(c, policy_file, policy_format, 1u << 20, "the config's policies apply");
  if (!models) return out;
  for (const auto& [name, v] : models->items()) {
    if (!v.is_object() || !v.contains("policy") || !v["policy"].is_string() || !v.contains("tau") ||
        !v["tau"].is_number()) {
      spdlog::error("{}: model {}: no policy and tau; the config's policy applies", path, name);
      continue;
    }
    const double tau = v["tau"].get<double>();
    if (!std::isfinite(tau) || tau < 0.0) {
      spdlog::error("{}: model {}: tau {} is not finite and >= 0; the config's policy applies",
                    path, name, tau);
      continue;
    }
    persisted_policy pp{v["policy"].get<std::string>(), static_cast<float>(tau), std::nullopt};
    if (v.contains("widen_single") && v["widen_single"].is_boolean())
      pp.widen_single = v["widen_single"].get<bool>();
    out[name] = std::move(pp);
  }
  return out;
}

// A routing policy built for a model and the flag saying it is the locality band.
struct built_policy {
  std::unique_ptr<routing_policy> policy;
  bool eldr_active = false;
};

// The admin surface's and the config's rule for tau, checked before anything changes: the
// policy routing now may not read tau (JSQ while "eldr*" has no set), so a NaN accepted here would
// only fail at the next install, after the set was stored (issue 12 defect 7).
status check_tau(double tau) {
  // Checked as a double: a value beyond float's range would become inf when narrowed.
  if (std::isfinite(tau) && tau >= 0.0 && tau <= std::numeric_limits<float>::max()) return {};
  const std::string text = std::isnan(tau)   ? "nan"
                           : std::isinf(tau) ? (tau > 0 ? "inf" : "-inf")
                                             : nlohmann::json(tau).dump();
  return status::invalid_argument("tau must be finite and >= 0, got " + text);
}

// Builds (without installing) the policy `name` with `tau` over `set` for a pool of k workers.
// A locality policy ("eldr", "eldr-adaptive": needs_centroids) without a set of the pool's K
// routes by load (JSQ) until one is installed. Changes
// nothing, so callers validate a change completely before making it.
result<built_policy> build_policy(const model_state& m, const std::string& name, float tau,
                                  bool widen_single, const centroid_set_ptr& set, uint32_t k) {
  const auto& cfg = *m.cfg;
  if (auto s = check_tau(tau); !s.ok()) return s;
  // The node serves every policy but 'domain', which needs a trace's calibration labels
  // (eldr-sim only): the refusal names the ones it serves, and never lists 'domain' as valid.
  const bool known =
      std::find(policy_names().begin(), policy_names().end(), name) != policy_names().end();
  if (name == "domain" || !known) {
    std::string servable;
    for (std::string_view n : policy_names())
      if (n != "domain") servable += (servable.empty() ? "" : ", ") + std::string(n);
    return status::invalid_argument(
        (name == "domain"
             ? std::string("policy 'domain' runs only in eldr-sim (it needs a trace's calibration "
                           "labels)")
             : "unknown routing policy \"" + name + "\"") +
        "; the node serves: " + servable);
  }
  built_policy out;
  out.eldr_active = needs_centroids(name) && set && set->k() == k;
  policy_config pc;
  pc.workers = k;
  pc.seed = cfg.seed;
  pc.tau = tau;
  pc.widen_single = widen_single;
  if (out.eldr_active) pc.centroids = set;
  auto p = make_policy(needs_centroids(name) && !out.eldr_active ? "jsq" : name, pc);
  if (!p.ok()) return p.error();
  out.policy = std::move(*p);
  return out;
}

// Rebuilds the routing policy after a change of K, centroid set, policy name or tau. On error
// the model keeps routing with its current policy.
status rebuild_policy(router_state& st, model_state& m) {
  auto built = build_policy(m, m.policy_name, m.tau, m.widen_single, m.set, m.pool.k());
  if (!built.ok()) return built.error();
  m.policy = std::move(built->policy);
  m.eldr_active = built->eldr_active;
  (void)st;
  return {};
}

// Tells the readiness board (/readyz) whether the model can be routed: called where the pool,
// the set or the policy changes.
void publish_readiness(const router_state& st, const model_state& m) {
  if (!st.ctx->readiness) return;
  const auto r = m.pool.routable(st.ctx->now_ms());
  st.ctx->readiness->set_routing(m.cfg->name, r.workers, r.live_until_ms,
                                 needs_centroids(m.policy_name), m.eldr_active);
}

// --- Rollback history persistence ---
//
// Each model's centroid_history survives a restart in data_dir/centroid-history.json,
// {"format": "eldr-centroid-history", "version": 1, "models": {"<name>": "<history text>"}}
// (core/centroid_history.hpp's text), replaced atomically after each install. A file that does not
// read is logged and ignored: the history then starts from the set installed at start-up.

constexpr const char* history_file = "centroid-history.json";
constexpr const char* history_format = "eldr-centroid-history";

std::string history_file_path(const node_config& c) {
  return state_file_path(c, history_file);
}

void persist_histories(const router_state& st) {
  nlohmann::json models = nlohmann::json::object();
  for (const auto& m : st.models)
    models[m->cfg->name] = m->history.encode();
  const auto s = write_models_file(st.ctx->config, history_file, history_format, std::move(models));
  // Installs are rare (imports, refits, swaps): every failure is worth its line.
  if (!s.ok())
    spdlog::error("{}: rollback history not persisted (a restart forgets it): {}",
                  history_file_path(st.ctx->config), s.message());
}

std::map<std::string, centroid_history> read_histories(const node_config& c) {
  std::map<std::string, centroid_history> out;
  const std::string path = history_file_path(c);
  const auto models =
      read_models_file(c, history_file, history_format, 4u << 20, "rollback history starts afresh");
  if (!models) return out;
  for (const auto& [name, text] : models->items()) {
    auto h = text.is_string() ? centroid_history::parse(text.get<std::string>())
                              : result<centroid_history>(status::invalid_argument("not a string"));
    if (!h.ok()) {
      spdlog::error("{}: model {}: {}; its rollback history starts afresh", path, name,
                    h.error().message());
      continue;
    }
    out.emplace(name, std::move(*h));
  }
  return out;
}

// The K a model's pool has once `file` is installed: the set's when the config leaves K open.
uint32_t k_after_install(const model_state& m, const centroid_file& file) {
  return m.cfg->workers == 0 ? file.workers : m.pool.k();
}

// Can the model's policy route with `file` installed? Checked before the set is stored, so that
// a refused import leaves no epoch behind.
status check_policy_accepts(const model_state& m, const centroid_file& file) {
  auto set = centroid_set::make(file.workers, file.spec.width(), file.centroids, 0);
  if (!set.ok()) return set.error();
  auto ptr = std::make_shared<const centroid_set>(std::move(*set));
  auto built = build_policy(m, m.policy_name, m.tau, m.widen_single, ptr, k_after_install(m, file));
  if (!built.ok()) return built.error();
  return {};
}

// Makes `file` (stored as `epoch`) the model's current set, recorded in its rollback history with
// `cause` ("import", "refit", "swap", "rollback", "peer", "start"). Everything that can fail is
// done before the model changes: on error the model is as it was.
status install(router_state& st, model_state& m, const centroid_file& file, uint64_t epoch,
               std::string_view cause) {
  auto made = centroid_set::make(file.workers, file.spec.width(), file.centroids, epoch);
  if (!made.ok()) return made.error();
  auto set = std::make_shared<const centroid_set>(std::move(*made));
  const uint32_t k = k_after_install(m, file);
  if (set->k() != k)
    return status::invalid_argument("the set has " + std::to_string(set->k()) +
                                    " centroids but model '" + m.cfg->name + "' has " +
                                    std::to_string(k) + " decode workers");
  auto built = build_policy(m, m.policy_name, m.tau, m.widen_single, set, k);
  if (!built.ok()) return built.error();
  if (k != m.pool.k()) {
    // K follows the set when the config leaves it open; registrations beyond it were refused
    // by the import check.
    if (auto s = m.pool.resize(k); !s.ok()) return s;
  }
  m.set = std::move(set);
  // Keep the spec object when only the centroids changed (a refit, most imports): requests being
  // signed under it stay valid and are not signed twice.
  const bool same_spec = m.spec && m.spec->geometry() == file.spec.geometry() &&
                         m.spec->transform() == file.spec.transform() &&
                         m.spec->layer_mask() == file.spec.layer_mask() &&
                         m.spec->idf() == file.spec.idf();
  if (!same_spec) m.spec = std::make_shared<const signature_spec>(file.spec);
  m.file = file;
  m.file->epoch = epoch;
  m.epoch = epoch;
  if (!m.sample || m.sample->width() != m.spec->width()) {
    auto sample = signature_sample::make(m.cfg->sample_size, m.spec->width(), m.cfg->seed);
    if (sample.ok()) m.sample = std::move(*sample);
  }
  ++m.swaps;
  st.ctx->metrics->swapped(m.cfg->name, epoch);
  m.policy = std::move(built->policy);
  m.eldr_active = built->eldr_active;
  publish_readiness(st, m);
  m.last_cause = std::string(cause);
  if (m.history.record({epoch, content_digest(file), m.last_cause, st.ctx->now_ms()}))
    spdlog::info("model {}: epoch {} undoes the newest change of the current set", m.cfg->name,
                 epoch);
  // At start-up the models are persisted together once all are made.
  if (m.index < st.models.size() && st.models[m.index].get() == &m) persist_histories(st);
  return {};
}

// Tells the other routers that `m` now routes with `epoch` (they install it when it is newer
// than theirs), and why, so that their rollback histories follow this one's.
void announce_epoch(caf::event_based_actor* self, const router_state& st, const model_state& m) {
  if (st.peers.empty() || !m.file) return;
  const auto bytes = encode_centroid_file(*m.file);
  for (const auto& p : st.peers)
    self->send(p, epoch_atom::value, m.cfg->name, m.epoch, m.fence.highest_term(), bytes,
               m.last_cause);
}

// Can `file` become the model's set? K must match a fixed pool, and no registered worker may lie
// outside it.
status check_installable(const model_state& m, const centroid_file& file) {
  if (auto s = validate_centroid_file(file); !s.ok()) return s;
  if (m.cfg->workers != 0 && file.workers != m.cfg->workers)
    return status::invalid_argument("the set has " + std::to_string(file.workers) +
                                    " centroids but model '" + m.cfg->name + "' has " +
                                    std::to_string(m.cfg->workers) + " decode workers");
  if (file.workers > m.cfg->max_workers)
    return status::invalid_argument("the set has more centroids than max_workers");
  for (uint32_t w = file.workers; w < m.pool.k(); ++w) {
    auto snap = m.pool.snapshot(w, 0);
    if (snap.ok() && snap->state != worker_state::unregistered)
      return status::invalid_argument("decode worker " + std::to_string(w) +
                                      " is registered but the set has only " +
                                      std::to_string(file.workers) + " centroids");
  }
  return {};
}

// Does an imported `file` belong to model `m`? A set fitted for another model (its name) or
// another geometry than the current set's, or of another K than the workers registered in an open
// pool, would install and then route by load only or by scores that mean nothing: refused unless
// the operator forces it (eldrctl centroids import --force). What can never work (K against a
// fixed pool, registered workers outside the set) is check_installable's, and never forced.
status check_import_fits(const model_state& m, const centroid_file& file) {
  std::vector<std::string> problems;
  if (file.model_name != m.cfg->name)
    problems.push_back("the file was fitted for model \"" + file.model_name + "\", not \"" +
                       m.cfg->name + "\" (eldr-fit --model " + m.cfg->name + ")");
  if (m.spec && file.spec.geometry() != m.spec->geometry())
    problems.push_back("its geometry " + file.spec.geometry().to_string() +
                       " differs from the current set's " + m.spec->geometry().to_string());
  if (m.cfg->workers == 0 && m.pool.k() > 1 && file.workers != m.pool.k())
    problems.push_back("it has " + std::to_string(file.workers) + " centroids but the pool has " +
                       std::to_string(m.pool.k()) + " decode workers");
  if (problems.empty()) return {};
  std::string text = "centroid set refused for model '" + m.cfg->name + "': ";
  for (size_t i = 0; i < problems.size(); ++i)
    text += (i ? "; " : "") + problems[i];
  return status::invalid_argument(text + "; nothing was imported (force it with --force)");
}

void send_route_error(router_actor_t* self, const route_job& job, route_error_code code,
                      std::string message) {
  self->state.ctx->metrics->route_failed(code);
  self->state.ctx->edge->reply_error(job.from, job.request.id, code, std::move(message));
}

void decide(router_actor_t* self, model_state& m, const route_job_ptr& job,
            const sign_result* signed_, int attempt);

void shard_sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt);

// The request carries counts of another geometry than the model's current centroid set: they can
// make no signature, and must not reach a store (an empty one would adopt their geometry).
bool counts_of_other_geometry(const model_state& m, const route_request& req) {
  return req.counts && !req.counts->blocks.empty() && m.spec &&
         req.counts->geometry != m.spec->geometry();
}

// The job as the signature cache should see it: without counts it would refuse anyway.
route_job_ptr job_to_sign(const model_state& m, const route_job_ptr& job) {
  if (!counts_of_other_geometry(m, job->request)) return job;
  auto copy = std::make_shared<route_job>(*job);
  copy->request.counts.reset();
  return copy;
}

void sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt) {
  // A ring of this node alone (a one-node cluster, or the only cache node left) signs like a
  // standalone node: one local message, no partial sums.
  const auto& ring = self->state.ring;
  if (ring && !(ring->size() == 1 && self->state.sigcache &&
                ring->members()[0] == self->state.ctx->config.name)) {
    if (!ring->empty()) return shard_sign_and_route(self, m, std::move(job), attempt);
    return decide(self, m, job, nullptr, attempt);  // no signature-cache node alive: load only
  }
  if (!self->state.sigcache) return decide(self, m, job, nullptr, attempt);
  auto sj = std::make_shared<sign_job>(sign_job{m.index, m.spec, job_to_sign(m, job)});
  const uint32_t index = m.index;
  self->request(self->state.sigcache, caf::infinite, sign_atom::value, sign_job_ptr(sj))
      .then(
          [=](sign_result_ptr r) {
            decide(self, *self->state.models[index], job, r.get(), attempt);
          },
          [=](caf::error& e) {
            spdlog::warn("signature cache failed for request {}: {}", job->request.id,
                         self->system().render(e));
            decide(self, *self->state.models[index], job, nullptr, attempt);
          });
}

void decide(router_actor_t* self, model_state& m, const route_job_ptr& job,
            const sign_result* signed_, int attempt) {
  auto& st = self->state;
  const auto& req = job->request;
  // A swap with a new spec landed while the cache signed: sign again under the current spec, so
  // the decision uses one set and a signature built for it.
  if (signed_ && signed_->spec != m.spec && m.spec && attempt == 0) {
    ++m.resigned;
    sign_and_route(self, m, job, 1);
    return;
  }
  const int64_t now = st.ctx->now_ms();
  const int64_t t0 = steady_ns();
  const signature* sig = nullptr;
  if (signed_ && m.eldr_active && signed_->spec == m.spec && !signed_->sig.index.empty())
    sig = &signed_->sig;
  if (m.eldr_active && !sig) ++m.unsigned_routes;
  // Counts the model could not use: of another geometry than the set's (checked here), or
  // refused by the store, which alone knows its geometry when there is no set yet.
  const bool carried_counts = req.counts && !req.counts->blocks.empty();
  const bool other_geometry = counts_of_other_geometry(m, req);
  const bool store_refused = carried_counts && !m.spec && signed_ && !signed_->problem.empty();
  route_input in;
  in.sig = sig;
  in.load = m.pool.load();
  in.eligible = m.pool.eligible(now);
  in.label = req.label ? static_cast<int32_t>(*req.label) : -1;
  if (m.pool.eligible_count(now) == 0) {
    ++m.failed;
    send_route_error(self, *job, route_error_code::no_eligible_worker,
                     "no decode worker of model '" + m.cfg->name +
                         "' is registered, live, undrained and below capacity");
    return;
  }
  auto d = m.policy->route(in, &m.trace);
  if (!d.ok()) {
    ++m.failed;
    send_route_error(self, *job, route_error_code::internal, d.error().to_string());
    return;
  }
  if (auto s = m.pool.on_route(req.id, d->worker, now); !s.ok()) {
    ++m.failed;
    send_route_error(self, *job, route_error_code::internal, s.to_string());
    return;
  }
  const int64_t t1 = steady_ns();
  route_reply reply;
  reply.id = req.id;
  reply.worker = d->worker;
  auto snap = m.pool.snapshot(d->worker, now);
  if (snap.ok()) reply.endpoint = snap->endpoint;
  reply.epoch = m.eldr_active ? d->epoch : m.epoch;
  reply.total_blocks = static_cast<uint32_t>(req.block_hashes.size());
  reply.covered_blocks = signed_ ? std::min(signed_->covered, reply.total_blocks) : 0;
  fallback_facts facts;
  facts.locality_policy = needs_centroids(m.policy_name);
  facts.set_active = m.eldr_active;
  facts.cache_answered = signed_ != nullptr;
  facts.covered = reply.covered_blocks;
  facts.have_signature = sig != nullptr;
  facts.counts_refused = other_geometry || store_refused;
  const fallback_reason why = classify_fallback(facts);
  reply.fallback = to_string(why);
  if (other_geometry || store_refused) {
    ++m.counts_geometry;
    st.ctx->metrics->route_warning(m.cfg->name, "counts_geometry");
    reply.warnings.push_back(
        other_geometry
            ? counts_geometry_warning(req.counts->geometry, m.spec->geometry(), sig == nullptr)
            : counts_geometry_warning(signed_->problem, sig == nullptr));
  } else if (why == fallback_reason::signature_unusable && signed_ && !signed_->problem.empty()) {
    reply.warnings.push_back("signature_unusable: " + signed_->problem);
  }
  if (why != fallback_reason::none) {
    ++m.fallbacks[static_cast<size_t>(why)];
    st.ctx->metrics->route_fallback(m.cfg->name, reply.fallback);
    uint64_t held = 0;
    if (m.fallback_log[static_cast<size_t>(why)].allow(now, held))
      spdlog::warn("model {}: request {} routed by load only ({}){}{}", m.cfg->name, req.id,
                   reply.fallback, reply.warnings.empty() ? "" : ": " + reply.warnings.front(),
                   held > 0 ? " [" + std::to_string(held) + " more since the last line]" : "");
  } else if (!reply.warnings.empty()) {
    uint64_t held = 0;
    if (m.fallback_log[static_cast<size_t>(fallback_reason::counts_geometry)].allow(now, held))
      spdlog::warn("model {}: request {}: {}{}", m.cfg->name, req.id, reply.warnings.front(),
                   held > 0 ? " [" + std::to_string(held) + " more since the last line]" : "");
  }
  const std::string policy_name(m.policy->name());
  const float tau = m.eldr_active ? m.tau : 0.0f;
  if (req.explain) {
    route_explain ex;
    ex.policy = policy_name;
    ex.tau = tau;
    for (uint32_t w : m.trace.candidates)
      ex.band.push_back({w, w < m.trace.score.size() ? m.trace.score[w] : 0.0f});
    reply.explain = std::move(ex);
  }
  st.ctx->edge->reply(job->from, encode_route_reply(reply));
  st.decisions->put(std::to_string(m.index) + "/" + req.id, remembered{d->worker, reply.epoch},
                    now);
  if (st.authority_mode) {
    // Counted in this router's totals, which reach the worker's authority every interval.
    m.ledger.resize(m.pool.k());
    (void)m.ledger.on_route(d->worker);
  } else if (!st.peers.empty()) {
    st.outbox[m.index].push_back(shared_decision{req.id, d->worker, reply.epoch});
    if (!st.flush_armed) {
      st.flush_armed = true;
      self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.cluster.load_sync_ms),
                         flush_atom::value);
    }
  }
  ++m.routed;
  m.covered_blocks += reply.covered_blocks;
  m.total_blocks += reply.total_blocks;
  st.ctx->metrics->route_decided(
      m.cfg->name, d->worker, d->band_size, static_cast<double>(t1 - job->received_ns) * 1e-9,
      static_cast<double>(t1 - t0) * 1e-9, reply.covered_blocks, reply.total_blocks);
  if (sig && m.sample) (void)m.sample->add(*sig);
  if (st.ctx->config.explain_history > 0) {
    explained e;
    e.request = req.id;
    e.worker = d->worker;
    e.epoch = reply.epoch;
    e.policy = policy_name;
    e.tau = tau;
    e.covered = reply.covered_blocks;
    e.total = reply.total_blocks;
    e.best_score = d->best_score;
    e.worker_score = d->worker_score;
    e.widened = m.trace.widened;
    e.fallback = reply.fallback;
    e.candidates = m.trace.candidates;
    e.scores = m.trace.score;
    e.load.assign(in.load.begin(), in.load.end());
    if (m.recent.size() >= st.ctx->config.explain_history) m.recent.pop_front();
    m.recent.push_back(std::move(e));
  }
}

// --- Sharded signing (cluster) ---
//
// A request's blocks are split among the shards by core/shard_plan.hpp: the blocks this node's
// own shard owns are summed here (a message by pointer, no encoding), the rest by as few other
// nodes as possible, each asked only for the layers the spec uses. A part that fails or times
// out goes to the owners of its blocks that have not been tried yet.

// What the shards of one request have answered so far.
struct shard_gather {
  route_job_ptr job;
  spec_ptr spec;                 // the spec when the shards were asked (null: coverage only)
  std::vector<uint32_t> layers;  // spec's layer mask: what shards are asked to sum (empty: none)
  uint32_t model = 0;
  int attempt = 0;
  size_t pending = 0;
  uint32_t covered = 0;
  std::vector<uint32_t> acc;  // spec->width(): the masked sum over every shard's blocks
  std::string problem;
};
using shard_gather_ptr = std::shared_ptr<shard_gather>;

constexpr auto shard_timeout = std::chrono::milliseconds(100);

// Adds a shard's sum (over the requested layers its store keeps) to the request's sum (over the
// spec's mask); a layer the store lacks adds nothing. `scratch`: the unpacked sum.
void merge_shard(shard_gather& g, const shard_sign_reply& r, std::vector<uint32_t>& scratch) {
  g.covered += r.covered;
  if (!r.problem.empty()) g.problem = r.problem;
  if (!g.spec || r.sums.empty()) return;
  const uint32_t e = g.spec->geometry().experts;
  if (r.experts != e || !unpack_sums(r.sums, r.value_bytes, scratch) ||
      !add_common_layers(r.layer_mask, scratch, g.layers, e, g.acc))
    g.problem = "a shard's counts have another geometry";
}

void shard_done(router_actor_t* self, const shard_gather_ptr& g) {
  if (--g->pending > 0) return;
  auto out = std::make_shared<sign_result>();
  out->spec = g->spec;
  out->covered = g->covered;
  out->problem = g->problem;
  if (g->spec && g->covered > 0) {
    signature_builder b(g->spec);
    if (b.add_masked(g->acc).ok()) b.finish(out->sig);
  }
  auto& m = *self->state.models[g->model];
  decide(self, m, g->job, out.get(), g->attempt);
}

// Blocks of one request that one shard is asked to sum (prompt order).
struct shard_part {
  std::vector<uint64_t> blocks;
};

// Plans who sums `blocks` (core/shard_plan.hpp), never asking a member named in `excluded`
// (names, not ring indices: the ring may change between a request and its fail-over), and asks
// them.
void ask_shards(router_actor_t* self, const shard_gather_ptr& g, const shard_part& part,
                const std::vector<std::string>& excluded);

// Asks one shard for its part; on an error or a timeout the part goes to the owners left.
void ask_shard(router_actor_t* self, const shard_gather_ptr& g, uint32_t owner, shard_part part,
               std::vector<std::string> excluded) {
  auto& st = self->state;
  ++st.shard_requests;
  std::string name = st.ring->members()[owner];
  const bool local = st.local_shard && owner == *st.local_shard;
  auto on_reply = [self, g, local, sent_ns = steady_ns()](const shard_sign_reply& r) {
    merge_shard(*g, r, self->state.shard_scratch);
    self->state.ctx->metrics->shard_answered(local, 1e-9 * double(steady_ns() - sent_ns));
    shard_done(self, g);
  };
  auto on_error = [self, g, name = std::move(name), blocks = part.blocks,
                   excluded = std::move(excluded)](caf::error&) mutable {
    excluded.push_back(name);
    ++g->pending;  // ask_shards adds its own parts and releases this slot
    ask_shards(self, g, shard_part{std::move(blocks)}, excluded);
    shard_done(self, g);
  };
  if (local) {
    ++st.shard_local_requests;
    auto job = std::make_shared<shard_job>();
    job->model = g->model;
    job->layers = g->layers;
    job->job = g->job;
    job->blocks = std::move(part.blocks);
    self->request(st.shards[owner], shard_timeout, sign_atom::value, shard_job_ptr(job))
        .then(on_reply, std::move(on_error));
    return;
  }
  shard_sign_request req;
  req.model = g->job->request.model;
  req.blocks = std::move(part.blocks);
  req.layers = g->layers;
  self->request(st.shards[owner], shard_timeout, shard_sign_atom::value, std::move(req))
      .then(on_reply, std::move(on_error));
}

void ask_shards(router_actor_t* self, const shard_gather_ptr& g, const shard_part& part,
                const std::vector<std::string>& excluded_names) {
  auto& st = self->state;
  const size_t r = st.ctx->config.cluster.replication;
  std::vector<uint32_t> excluded;
  for (const auto& n : excluded_names)
    if (auto i = st.ring->index_of(n)) excluded.push_back(*i);
  std::vector<std::vector<uint32_t>> owners;
  owners.reserve(part.blocks.size());
  for (uint64_t h : part.blocks)
    owners.push_back(st.ring->owners(h, r));
  const auto chosen = choose_signers(owners, st.local_shard, excluded);
  std::map<uint32_t, shard_part> parts;
  size_t lost = 0;
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (chosen[i] == no_signer)
      ++lost;
    else
      parts[chosen[i]].blocks.push_back(part.blocks[i]);
  }
  if (!excluded_names.empty()) {
    if (!parts.empty()) ++st.shard_failovers;
    if (lost > 0 || parts.empty()) ++st.shard_failures;
  }
  g->pending += parts.size();
  for (auto& [owner, p] : parts)
    ask_shard(self, g, owner, std::move(p), excluded_names);
  // The caller holds one pending slot for this call: release it.
  shard_done(self, g);
}

// Sends the counts a request carries to every owner of their blocks (R of them; core/hash_ring),
// one message per owner: by pointer to this node's own shard, encoded to the others. One-way, off
// the request's path. A later request that needs these blocks is sent to their owners by this
// router after this store, and CAF delivers one sender's messages to one receiver in order.
void store_at_owners(router_actor_t* self, const shard_gather_ptr& g) {
  auto& st = self->state;
  const auto& req = g->job->request;
  if (!req.counts || req.counts->blocks.empty()) return;
  const size_t r = st.ctx->config.cluster.replication;
  std::map<uint32_t, std::vector<const counts_block*>> by_owner;
  for (const auto& b : req.counts->blocks)
    for (uint32_t o : st.ring->owners(b.hash, r))
      by_owner[o].push_back(&b);
  for (auto& [owner, blocks] : by_owner) {
    if (st.local_shard && owner == *st.local_shard) {
      auto job = std::make_shared<shard_job>();
      job->model = g->model;
      job->job = g->job;
      job->counts = std::move(blocks);
      self->send(st.shards[owner], shard_store_atom::value, shard_job_ptr(job));
      continue;
    }
    ++st.shard_store_messages;
    counts_message cm;
    cm.geometry = req.counts->geometry;
    for (const auto* b : blocks)
      cm.blocks.push_back(*b);
    self->send(st.shards[owner], shard_store_atom::value, req.model, encode_counts_message(cm));
  }
}

// The counts a request carries are summed here, where they already are, and stored at their
// owners on the side; only the blocks without counts (prefix hits) are asked of the shards. A cold
// prompt, all of whose counts the prefill sent, needs no shard at all.
void shard_sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt) {
  const auto& req = job->request;
  auto g = std::make_shared<shard_gather>();
  g->job = std::move(job);
  g->spec = m.eldr_active ? m.spec : nullptr;
  if (g->spec) {
    g->layers = g->spec->layer_mask();
    g->acc.assign(g->spec->width(), 0);
  }
  g->model = m.index;
  g->attempt = attempt;
  std::unordered_map<uint64_t, const counts_block*> carried;
  // Counts of another geometry are neither summed nor stored (decide() says so in the reply).
  const bool counts_usable = !counts_of_other_geometry(m, req);
  if (req.counts && counts_usable)
    for (const auto& b : req.counts->blocks)
      carried.emplace(b.hash, &b);
  shard_part asked;
  for (uint64_t h : req.block_hashes) {
    const auto it = carried.find(h);
    if (it == carried.end()) {
      asked.blocks.push_back(h);
      continue;
    }
    ++g->covered;
    if (!g->spec) continue;
    if (auto s = add_masked_counts(*g->spec, it->second->counts, g->acc); !s.ok())
      g->problem = s.message();
  }
  if (counts_usable) store_at_owners(self, g);
  g->pending = 1;
  ask_shards(self, g, asked, {});
}

// Rebuilds the ring of signature-cache shards from the live members (and this node).
void rebuild_ring(router_state& st, const std::vector<member_info>& members) {
  std::vector<std::string> names;
  std::map<std::string, caf::actor> actors;
  if (st.sigcache) {
    names.push_back(st.ctx->config.name);
    actors[st.ctx->config.name] = st.sigcache;
  }
  for (const auto& mi : members)
    if (mi.sigcache && !actors.count(mi.name)) {
      names.push_back(mi.name);
      actors[mi.name] = mi.sigcache;
    }
  auto ring = hash_ring::make(std::move(names), st.ctx->config.cluster.vnodes);
  if (!ring.ok()) {
    spdlog::error("signature-cache ring: {}", ring.error().to_string());
    return;
  }
  st.shards.clear();
  for (const auto& n : ring->members())
    st.shards.push_back(actors[n]);
  st.local_shard = st.sigcache ? ring->index_of(st.ctx->config.name) : std::nullopt;
  st.ring.emplace(std::move(*ring));
}

// Decisions by load only per reason (every reason listed, zeros included, so scripts can rely on
// the keys).
nlohmann::json fallbacks_json(const model_state& m) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t r = 1; r < fallback_reason_count; ++r)
    out[to_string(static_cast<fallback_reason>(r))] = m.fallbacks[r];
  return out;
}

nlohmann::json model_json(router_state& st, model_state& m) {
  const int64_t now = st.ctx->now_ms();
  uint32_t registered = 0, active = 0, draining = 0, dead = 0, full = 0;
  for (const auto& w : m.pool.snapshot_all(now)) {
    if (w.state == worker_state::unregistered) continue;
    ++registered;
    switch (w.state) {
      case worker_state::active:
        ++active;
        break;
      case worker_state::draining:
        ++draining;
        break;
      case worker_state::dead:
        ++dead;
        break;
      case worker_state::full:
        ++full;
        break;
      default:
        break;
    }
  }
  const auto& c = m.pool.counters();
  return {{"name", m.cfg->name},
          {"k", m.pool.k()},
          // false: K follows the centroid set or the registrations (config workers = 0)
          {"k_fixed", m.cfg->workers != 0},
          {"policy", m.policy_name},
          {"policy_source", m.policy_source},
          {"routing_with", std::string(m.policy->name())},
          {"tau", m.tau},
          {"widen_single", m.widen_single},
          {"epoch", m.epoch},
          {"width", m.spec ? m.spec->width() : 0},
          {"workers",
           {{"registered", registered},
            {"active", active},
            {"draining", draining},
            {"dead", dead},
            {"full", full}}},
          {"routed", m.routed},
          {"route_errors", m.failed},
          {"routed_without_signature", m.unsigned_routes},
          {"counts_geometry", m.counts_geometry},
          {"fallbacks", fallbacks_json(m)},
          {"resigned_after_swap", m.resigned},
          {"swaps", m.swaps},
          {"term", m.fence.highest_term()},
          {"epochs_refused", m.fenced},
          {"coverage", m.total_blocks ? static_cast<double>(m.covered_blocks) /
                                            static_cast<double>(m.total_blocks)
                                      : 0.0},
          {"sample", m.sample ? m.sample->size() : 0},
          {"finished", c.finished},
          {"finished_unknown", c.finished_unknown},
          {"reports", c.reports},
          {"reports_stale", c.reports_stale},
          {"reports_seq_reset", c.seq_resets},
          {"tracked_requests", m.pool.tracked()}};
}

// The current centroid set's spec and provenance (`centroids.show`, the operator page).
nlohmann::json spec_json(const model_state& m) {
  nlohmann::json r = {{"model", m.cfg->name}, {"epoch", m.epoch}};
  if (m.file) {
    r["k"] = m.file->workers;
    r["width"] = m.file->spec.width();
    r["transform"] = std::string(to_string(m.file->spec.transform()));
    r["layers"] = m.file->spec.layer_mask();
    r["geometry"] = {m.file->spec.geometry().layers, m.file->spec.geometry().experts,
                     m.file->spec.geometry().top_k};
    r["source"] = m.file->provenance.source;
    r["tool"] = m.file->provenance.tool;
    r["rho"] = m.file->provenance.rho;
    r["objective"] = m.file->provenance.objective;
  }
  return r;
}

nlohmann::json workers_json(router_state& st, model_state& m) {
  nlohmann::json rows = nlohmann::json::array();
  const int64_t now = st.ctx->now_ms();
  for (const auto& w : m.pool.snapshot_all(now)) {
    if (w.state == worker_state::unregistered) continue;
    rows.push_back({{"model", m.cfg->name},
                    {"worker", w.index},
                    {"endpoint", w.endpoint},
                    {"state", std::string(to_string(w.state))},
                    {"draining", w.draining},
                    {"load", w.load},
                    {"capacity", w.capacity},
                    {"last_report_ms_ago", w.last_report_age_ms},
                    {"routed", w.routed},
                    {"finished", w.finished}});
    if (w.index < m.metrics_urls.size() && m.metrics_urls[w.index]) {
      auto& row = rows.back();
      row["metrics_url"] = m.metrics_url_text[w.index];
      row["last_scrape_ms_ago"] = w.last_scrape_age_ms;
      row["scrapes"] = w.scrapes;
      row["scrapes_failed"] = w.scrapes_failed;
      row["scrape_error"] = m.scrape_error[w.index];
      // The engine's own view at the last good scrape (null before one).
      const auto& seen = w.index < m.scraped.size() ? m.scraped[w.index] : std::nullopt;
      row["running"] = seen ? nlohmann::json(seen->running) : nlohmann::json(nullptr);
      row["waiting"] = seen ? nlohmann::json(seen->waiting) : nlohmann::json(nullptr);
      row["kv_usage"] = seen ? nlohmann::json(seen->kv_usage) : nlohmann::json(nullptr);
      row["load_source"] = "scrape";
    } else if (w.index < m.reported.size() && m.reported[w.index]) {
      // A worker that pushes load_reports: its own figures from the newest one.
      auto& row = rows.back();
      const auto& r = m.reported[w.index]->load;
      row["running"] = r.running;
      row["waiting"] = r.waiting;
      row["kv_usage"] = r.kv_usage;
      row["load_source"] = "report";
    }
  }
  return rows;
}

// Runs `file` through the store (new epoch) and installs it, then calls done(epoch or error).
using install_done = std::function<void(result<uint64_t>)>;
// `cause` goes to the rollback history (install); `what` to the log. `term`: the refit leader's
// term, in which the new epoch is numbered (core/leadership.hpp's next_epoch); 0 outside a cluster.
void store_and_install(router_actor_t* self, model_state& m, centroid_file file, std::string cause,
                       std::string what, install_done done, uint64_t term) {
  m.fence.observe_term(term);
  if (auto s = check_installable(m, file); !s.ok()) return done(s);
  if (auto s = check_policy_accepts(m, file); !s.ok()) return done(s);
  const auto at_least = next_epoch(m.epoch, term);
  if (!at_least)
    return done(status::failed_precondition(
        "term " + std::to_string(term) + " cannot number an epoch after " +
        std::to_string(m.epoch) + " (a newer term's set is installed, or the term's range is " +
        "used up)"));
  if (!self->state.sigcache) {
    // No store on this node: the set lives in the routers' memories (and their snapshots).
    const uint64_t epoch = *at_least;
    if (auto s = install(self->state, m, file, epoch, cause); !s.ok()) return done(s);
    (void)m.fence.offer(term, epoch);
    spdlog::info("model {}: {} installed as epoch {}", m.cfg->name, what, epoch);
    announce_epoch(self, self->state, m);
    return done(epoch);
  }
  const uint32_t index = m.index;
  // Above every epoch this router has routed with, even one adopted from a peer, and inside the
  // term's range.
  auto stored = std::make_shared<const stored_set>(stored_set{0, std::move(file), *at_least});
  self->request(self->state.sigcache, caf::infinite, store_set_atom::value, index,
                stored_set_ptr(stored))
      .then(
          [=](uint64_t epoch) {
            auto& mm = *self->state.models[index];
            if (term != 0 && term_of_epoch(epoch) != term)
              return done(status::failed_precondition(
                  "the store numbered the set " + std::to_string(epoch) + ", outside term " +
                  std::to_string(term) + " (it holds a newer term's epoch)"));
            if (auto s = install(self->state, mm, stored->file, epoch, cause); !s.ok())
              return done(s);
            (void)mm.fence.offer(term, epoch);
            spdlog::info("model {}: {} installed as epoch {}", mm.cfg->name, what, epoch);
            announce_epoch(self, self->state, mm);
            done(epoch);
          },
          [=](caf::error& e) { done(status::io_error(self->system().render(e))); });
}

// The admin error code for a failed change: a refused input is malformed, a missing epoch or
// nothing to undo is not_found, the rest is internal.
route_error_code admin_code_for(const status& s) {
  switch (s.code()) {
    case status_code::invalid_argument:
      return route_error_code::malformed;
    case status_code::not_found:
      return route_error_code::not_found;
    default:
      return route_error_code::internal;
  }
}

install_done answer_with_epoch(router_actor_t* self, admin_job_ptr job) {
  return [self, job](result<uint64_t> r) {
    if (!r.ok())
      return answer_admin_error(*self->state.ctx, *job, admin_code_for(r.error()),
                                r.error().message());
    answer_admin(*self->state.ctx, *job, {{"epoch", *r}});
  };
}

// An install's outcome for an actor that asked for it: the epoch, or the error as text.
install_done deliver_epoch(caf::typed_response_promise<uint64_t> rp) {
  return [rp](result<uint64_t> r) mutable {
    if (r.ok())
      rp.deliver(*r);
    else
      rp.deliver(caf::make_error(caf::sec::runtime_error, r.error().to_string()));
  };
}

// The text of an error another actor delivered with caf::make_error(code, text): the text, not
// CAF's rendering of the whole error (which an operator should not have to read).
std::string error_text(router_actor_t* self, const caf::error& e) {
  const auto& ctx = e.context();
  if (ctx.size() >= 1 && ctx.match_element<std::string>(ctx.size() - 1))
    return ctx.get_as<std::string>(ctx.size() - 1);
  return self->system().render(e);
}

// A change of the current set that the refit leader makes (or this node outside a cluster):
// its outcome is the epoch the set was installed as and the stored epoch it came from (0 for an
// import), or the error.
using change_done = std::function<void(result<uint64_t> epoch, uint64_t source)>;

// "epoch 9 is not stored; stored epochs: 1, 2" (not_found), or ok when `epoch` is among them.
status check_stored(uint64_t epoch, const std::vector<uint64_t>& epochs) {
  if (std::find(epochs.begin(), epochs.end(), epoch) != epochs.end()) return {};
  std::string stored;
  for (uint64_t s : epochs)
    stored += (stored.empty() ? "" : ", ") + std::to_string(s);
  return status::not_found("epoch " + std::to_string(epoch) +
                           " is not stored; stored epochs: " + (stored.empty() ? "none" : stored));
}

// On the refit leader (term > 0): makes the change, numbering a new epoch in the term. A swap or
// rollback re-publishes the stored set as a new epoch rather than going back to its number: the
// routers' fences accept only newer epochs (docs/cluster.md), and every router then records the
// change alike (core/centroid_history.hpp).
void change_as_leader(router_actor_t* self, model_state& m, const std::string& command,
                      const std::vector<uint8_t>& bytes, uint64_t epoch, uint64_t term,
                      change_done done) {
  if (command == "import") {
    auto file = parse_centroid_file(std::span<const uint8_t>(bytes.data(), bytes.size()), "import");
    if (!file.ok()) return done(file.error(), 0);
    return store_and_install(
        self, m, std::move(*file), "import", "imported set",
        [done](result<uint64_t> r) { done(std::move(r), 0); }, term);
  }
  uint64_t source = epoch;
  if (command == "rollback") {
    auto previous = m.history.previous();
    if (!previous.ok()) return done(previous.error(), 0);
    source = previous->epoch;
  }
  if (!self->state.sigcache)
    return done(status::failed_precondition(
                    "the refit leader " + self->state.ctx->config.name +
                    " has no signature-cache role, so it keeps no stored sets to " + command +
                    " to; give the refit role to nodes that also hold the signature cache"),
                0);
  const uint32_t index = m.index;
  self->request(self->state.sigcache, caf::infinite, history_atom::value, index)
      .then(
          [=](std::vector<uint64_t> epochs) {
            if (auto s = check_stored(source, epochs); !s.ok())
              return done(command == "rollback"
                              ? status::not_found("the set rollback returns to (epoch " +
                                                  std::to_string(source) +
                                                  ") is no longer stored: " + s.message())
                              : s,
                          0);
            self->request(self->state.sigcache, caf::infinite, load_set_atom::value, index, source,
                          false)
                .then(
                    [=](stored_set_ptr s) {
                      store_and_install(
                          self, *self->state.models[index], s->file, command,
                          command + " to the set of epoch " + std::to_string(source),
                          [done, source](result<uint64_t> r) { done(std::move(r), source); }, term);
                    },
                    [=](caf::error& e) { done(status::not_found(error_text(self, e)), 0); });
          },
          [=](caf::error& e) { done(status::io_error(error_text(self, e)), 0); });
}

// How long a change waits for a refit leader to be known (an election under way) before it is
// refused.
constexpr int64_t leader_wait_ms = 5000;

// A change of the current set in a cluster (import, swap, rollback): made by the refit leader
// (this node's router when this node leads, else the leader's router, asked over the cluster), so
// that two changes at two routers can never get one epoch number and every router's history
// follows the same sequence. Waits up to leader_wait_ms for a leader to be known.
void change_via_leader(router_actor_t* self, uint32_t index, admin_job_ptr job, std::string command,
                       std::vector<uint8_t> bytes, uint64_t epoch, int64_t deadline_ms) {
  auto& st = self->state;
  auto& m = *st.models[index];
  auto answer = [self, job](result<uint64_t> r, uint64_t source, const std::string& leader) {
    if (!r.ok())
      return answer_admin_error(*self->state.ctx, *job, admin_code_for(r.error()),
                                r.error().message());
    nlohmann::json out{{"epoch", *r}, {"numbered_by", leader}};
    if (source != 0) out["set_of_epoch"] = source;
    answer_admin(*self->state.ctx, *job, out);
  };
  if (!st.leader.empty() && st.leader == st.ctx->config.name) {
    const std::string me = st.leader;
    return change_as_leader(
        self, m, command, bytes, epoch, st.leader_term,
        [answer, me](result<uint64_t> r, uint64_t source) { answer(std::move(r), source, me); });
  }
  auto it = st.leader.empty() ? st.routers_by_name.end() : st.routers_by_name.find(st.leader);
  if (it == st.routers_by_name.end()) {
    if (st.ctx->now_ms() < deadline_ms) {
      self->delayed_send(self, std::chrono::milliseconds(100), set_change_retry_atom::value, index,
                         job, std::move(command), std::move(bytes), epoch, deadline_ms);
      return;
    }
    return answer_admin_error(
        *st.ctx, *job, route_error_code::internal,
        "no refit leader is known after " + std::to_string(leader_wait_ms / 1000) +
            " s: in a cluster only the refit leader changes the current set (it needs a node "
            "with the router and refit roles that sees a majority of the members); nothing "
            "changed");
  }
  ++st.changes_forwarded;
  const std::string leader = st.leader;
  self->request(it->second, std::chrono::seconds(10), set_change_atom::value, m.cfg->name, command,
                std::move(bytes), epoch)
      .then([=](uint64_t installed, uint64_t source) { answer(installed, source, leader); },
            [=](caf::error& e) {
              // The leader's refusal keeps its code in the text ("not_found: ..."): the operator
              // gets the same answer as from the leader itself.
              const std::string text = error_text(self, e);
              const auto code = text.rfind("not_found: ", 0) == 0 ? route_error_code::not_found
                                : text.rfind("invalid_argument: ", 0) == 0
                                    ? route_error_code::malformed
                                    : route_error_code::internal;
              answer_admin_error(
                  *self->state.ctx, *job, code,
                  "the refit leader " + leader + " did not " + command + ": " + text);
            });
}

// Makes a stored epoch current on a node outside a cluster (swap, rollback); `cause` goes to the
// rollback history.
void swap_to(router_actor_t* self, model_state& m, uint64_t epoch, std::string cause,
             admin_job_ptr job) {
  const uint32_t index = m.index;
  const uint64_t from = m.epoch;
  self->request(self->state.sigcache, caf::infinite, load_set_atom::value, index, epoch, true)
      .then(
          [=](stored_set_ptr s) {
            auto& mm = *self->state.models[index];
            if (auto c = check_installable(mm, s->file); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, route_error_code::malformed, c.message());
              return;
            }
            if (auto c = check_policy_accepts(mm, s->file); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, route_error_code::malformed, c.message());
              return;
            }
            if (auto c = install(self->state, mm, s->file, s->epoch, cause); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, route_error_code::internal, c.to_string());
              return;
            }
            spdlog::info("model {}: {} to stored epoch {} (from {})", mm.cfg->name, cause, s->epoch,
                         from);
            announce_epoch(self, self->state, mm);
            answer_admin(*self->state.ctx, *job, {{"epoch", s->epoch}, {"from_epoch", from}});
          },
          [=](caf::error& e) {
            answer_admin_error(*self->state.ctx, *job, route_error_code::not_found,
                               error_text(self, e));
          });
}

template <class T>
std::optional<T> arg(const nlohmann::json& args, const char* key) {
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return std::nullopt;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

nlohmann::json policy_json(const model_state& m) {
  return {{"model", m.cfg->name},
          {"policy", m.policy_name},
          {"policy_source", m.policy_source},
          {"routing_with", std::string(m.policy->name())},
          {"tau", m.tau},
          {"widen_single", m.widen_single}};
}

// After a change: persist every admin policy, then answer. A write that fails (a full disk) does
// not undo the change -- an operator switching policy in an emergency must get it -- but the
// answer says it will not survive a restart (persisted false, and why), and the log says it once.
void answer_policy(router_state& st, model_state& m, const admin_job& job) {
  auto r = policy_json(m);
  const status s = persist_policies(st);
  r["persisted"] = s.ok();
  if (!s.ok()) {
    r["persist_error"] = s.message();
    spdlog::error("model {}: policy change not persisted (lost on a restart): {}", m.cfg->name,
                  s.message());
  }
  answer_admin(*st.ctx, job, r);
}

void handle_admin(router_actor_t* self, const admin_job_ptr& job) {
  auto& st = self->state;
  const auto& cmd = job->request.command;
  const auto& args = job->request.args;
  const auto model_arg = string_arg(args, "model");
  if (!model_arg.ok())
    return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                              model_arg.error().message());
  const auto& model_name = *model_arg;
  model_state* m = model_name ? st.find(*model_name) : nullptr;
  auto need_model = [&]() -> bool {
    if (m) return true;
    answer_admin_error(*st.ctx, *job, route_error_code::unknown_model,
                       model_name ? "no model named '" + *model_name + "'"
                                  : "argument 'model' (string) is required");
    return false;
  };
  auto need_worker = [&]() -> std::optional<uint32_t> {
    auto w = uint_arg(args, "worker", UINT32_MAX);
    if (!w.ok() || !*w) {
      answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                         w.ok() ? "argument 'worker' (uint) is required" : w.error().message());
      return std::nullopt;
    }
    return static_cast<uint32_t>(**w);
  };
  if (cmd == "workers") {
    nlohmann::json rows = nlohmann::json::array();
    if (model_name && !need_model()) return;
    for (auto& mm : st.models)
      if (!m || mm.get() == m)
        for (auto& r : workers_json(st, *mm))
          rows.push_back(std::move(r));
    answer_admin(*st.ctx, *job, rows);
  } else if (cmd == "drain" || cmd == "undrain") {
    if (!need_model()) return;
    auto w = need_worker();
    if (!w) return;
    auto s = cmd == "drain" ? m->pool.drain(*w) : m->pool.undrain(*w);
    publish_readiness(st, *m);
    if (!s.ok()) return answer_admin_error(*st.ctx, *job, route_error_code::malformed, s.message());
    spdlog::info("model {}: worker {} {}ed by admin", m->cfg->name, *w, cmd);
    auto snap = m->pool.snapshot(*w, st.ctx->now_ms());
    answer_admin(*st.ctx, *job, {{"worker", *w}, {"state", std::string(to_string(snap->state))}});
  } else if (cmd == "centroids.show") {
    if (!need_model()) return;
    nlohmann::json r = spec_json(*m);
    // What rollback would undo, newest last (the stored epochs are under "history").
    nlohmann::json changes = nlohmann::json::array();
    for (const auto& c : m->history.changes())
      changes.push_back({{"epoch", c.epoch}, {"cause", c.cause}, {"at_ms", c.at_ms}});
    r["changes"] = std::move(changes);
    const uint32_t index = m->index;
    self->request(st.sigcache, caf::infinite, history_atom::value, index)
        .then(
            [=](std::vector<uint64_t> epochs) mutable {
              r["history"] = epochs;
              answer_admin(*self->state.ctx, *job, r);
            },
            [=](caf::error&) mutable { answer_admin(*self->state.ctx, *job, r); });
  } else if (cmd == "centroids.import") {
    if (!need_model()) return;
    auto it = args.find("file");
    if (it == args.end() || !it->is_binary())
      return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                "argument 'file' (bin: a centroid file) is required");
    const auto& bin = it->get_binary();
    auto file = parse_centroid_file(std::span<const uint8_t>(bin.data(), bin.size()), "import");
    if (!file.ok())
      return answer_admin_error(*st.ctx, *job, route_error_code::malformed, file.error().message());
    bool force = false;
    if (auto f = args.find("force"); f != args.end() && !f->is_null()) {
      if (!f->is_boolean())
        return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                  "argument 'force' must be a bool");
      force = f->get<bool>();
    }
    if (auto fits = check_import_fits(*m, *file); !fits.ok()) {
      if (!force)
        return answer_admin_error(*st.ctx, *job, route_error_code::malformed, fits.message());
      spdlog::warn("model {}: importing a set anyway (--force): {}", m->cfg->name, fits.message());
    }
    if (!st.ctx->config.clustered())
      return store_and_install(self, *m, std::move(*file), "import", "imported set",
                               answer_with_epoch(self, job), 0);
    change_via_leader(self, m->index, job, "import", std::vector<uint8_t>(bin.begin(), bin.end()),
                      0, st.ctx->now_ms() + leader_wait_ms);
  } else if (cmd == "centroids.swap" || cmd == "centroids.rollback") {
    if (!need_model()) return;
    const bool swap = cmd == "centroids.swap";
    uint64_t epoch = 0;
    if (swap) {
      auto e = uint_arg(args, "epoch");
      if (!e.ok() || !*e)
        return answer_admin_error(
            *st.ctx, *job, route_error_code::malformed,
            e.ok() ? "argument 'epoch' (uint) is required" : e.error().message());
      epoch = **e;
    }
    if (st.ctx->config.clustered())
      return change_via_leader(self, m->index, job, swap ? "swap" : "rollback", {}, epoch,
                               st.ctx->now_ms() + leader_wait_ms);
    if (!st.sigcache)
      return answer_admin_error(*st.ctx, *job, route_error_code::internal,
                                "this node has no signature-cache role, so it keeps no stored "
                                "sets");
    if (!swap) {
      // Undo the newest change of the current set (core/centroid_history.hpp), whatever its
      // epoch number.
      auto previous = m->history.previous();
      if (!previous.ok())
        return answer_admin_error(*st.ctx, *job, route_error_code::not_found,
                                  previous.error().message());
      epoch = previous->epoch;
    }
    // An epoch that is not stored is named with the ones that are, so the operator can pick.
    const uint32_t index = m->index;
    self->request(st.sigcache, caf::infinite, history_atom::value, index)
        .then(
            [=](std::vector<uint64_t> epochs) {
              if (auto s = check_stored(epoch, epochs); !s.ok())
                return answer_admin_error(*self->state.ctx, *job, route_error_code::not_found,
                                          swap ? s.message()
                                               : "the set rollback returns to (epoch " +
                                                     std::to_string(epoch) +
                                                     ") is no longer stored: " + s.message());
              swap_to(self, *self->state.models[index], epoch, swap ? "swap" : "rollback", job);
            },
            [=](caf::error& err) {
              answer_admin_error(*self->state.ctx, *job, route_error_code::internal,
                                 error_text(self, err));
            });
  } else if (cmd == "explain") {
    if (!need_model()) return;
    auto id_arg = string_arg(args, "request");
    if (!id_arg.ok() || !*id_arg)
      return answer_admin_error(
          *st.ctx, *job, route_error_code::malformed,
          id_arg.ok() ? "argument 'request' (string) is required" : id_arg.error().message());
    const auto& id = *id_arg;
    for (auto it = m->recent.rbegin(); it != m->recent.rend(); ++it) {
      if (it->request != *id) continue;
      nlohmann::json band = nlohmann::json::array();
      for (uint32_t w : it->candidates)
        band.push_back({{"worker", w},
                        {"score", w < it->scores.size() ? it->scores[w] : 0.0f},
                        {"load", w < it->load.size() ? it->load[w] : 0}});
      answer_admin(*st.ctx, *job,
                   {{"request", it->request},
                    {"model", m->cfg->name},
                    {"worker", it->worker},
                    {"epoch", it->epoch},
                    {"policy", it->policy},
                    {"tau", it->tau},
                    {"best_score", it->best_score},
                    {"worker_score", it->worker_score},
                    {"threshold", it->best_score - it->tau},
                    {"widened", it->widened},
                    {"fallback", it->fallback},
                    {"covered_blocks", it->covered},
                    {"total_blocks", it->total},
                    {"band", band},
                    {"scores", it->scores},
                    {"load", it->load}});
      return;
    }
    answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                       "request '" + *id + "' is not among the " +
                           std::to_string(m->recent.size()) + " recent decisions");
  } else if (cmd == "policy") {
    if (!need_model()) return;
    if (auto r = args.find("reset"); r != args.end() && !r->is_null()) {
      // Back to the config's policy and tau, and forget the persisted change.
      if (!r->is_boolean())
        return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                  "argument 'reset' must be a bool");
      if (r->get<bool>()) {
        if (args.contains("policy") || args.contains("tau") || args.contains("widen_single"))
          return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                    "argument 'reset' goes without 'policy', 'tau' and "
                                    "'widen_single'");
        const auto old_name = m->policy_name;
        const auto old_tau = m->tau;
        const auto old_widen = m->widen_single;
        const auto old_source = m->policy_source;
        m->policy_name = m->cfg->policy;
        m->tau = m->cfg->tau;
        m->widen_single = m->cfg->widen_single;
        m->policy_source = "config";
        if (auto s = rebuild_policy(st, *m); !s.ok()) {
          m->policy_name = old_name;
          m->tau = old_tau;
          m->widen_single = old_widen;
          m->policy_source = old_source;
          (void)rebuild_policy(st, *m);
          return answer_admin_error(*st.ctx, *job, route_error_code::internal, s.message());
        }
        publish_readiness(st, *m);
        spdlog::info("model {}: policy {} tau {} from the config again", m->cfg->name,
                     m->policy_name, m->tau);
        return answer_policy(st, *m, *job);
      }
    }
    // Every argument is checked, and the new policy built, before the model changes: a refused
    // change leaves the policy and tau as they were (issue 12 defect 7).
    const bool has_name = args.contains("policy") && !args["policy"].is_null();
    const bool has_tau = args.contains("tau") && !args["tau"].is_null();
    const bool has_widen = args.contains("widen_single") && !args["widen_single"].is_null();
    if (has_widen && !args["widen_single"].is_boolean())
      return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                "argument 'widen_single': expected a bool");
    if (has_name && !args["policy"].is_string())
      return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                "argument 'policy': expected a string");
    if (has_tau && !args["tau"].is_number())
      return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                "argument 'tau': expected a number");
    if (has_name || has_tau || has_widen) {
      const std::string name = has_name ? args["policy"].get<std::string>() : m->policy_name;
      const double tau = has_tau ? args["tau"].get<double>() : static_cast<double>(m->tau);
      const bool widen = has_widen ? args["widen_single"].get<bool>() : m->widen_single;
      if (auto s = check_tau(tau); !s.ok())
        return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                  "argument 'tau': " + s.message());
      auto built = build_policy(*m, name, static_cast<float>(tau), widen, m->set, m->pool.k());
      if (!built.ok())
        return answer_admin_error(*st.ctx, *job, route_error_code::malformed,
                                  built.error().message());
      m->policy_name = name;
      m->tau = static_cast<float>(tau);
      m->widen_single = widen;
      m->policy = std::move(built->policy);
      m->eldr_active = built->eldr_active;
      publish_readiness(st, *m);
      spdlog::info("model {}: policy {} tau {} widen_single {}", m->cfg->name, m->policy_name,
                   m->tau, m->widen_single);
      m->policy_source = "admin";
      return answer_policy(st, *m, *job);
    }
    answer_admin(*st.ctx, *job, policy_json(*m));
  } else {
    answer_admin_error(*st.ctx, *job, route_error_code::unknown_type,
                       "the router has no admin command '" + cmd + "'");
  }
}

// --- Load from the workers' own metrics (docs/vllm.md, "Load") ---
//
// A worker that registered a metrics_url is scraped every scrape_interval_ms; each result goes to
// the load view (on_scrape: authoritative load plus this router's routes since the scrape was
// issued, and a heartbeat; a failure is only counted, so a worker whose scrapes keep failing
// leaves the candidate set after worker_timeout_ms). Workers without one push load_reports.

void set_metrics_url(model_state& m, uint32_t worker, const std::string& url) {
  const size_t k = m.pool.k();
  if (m.metrics_urls.size() < k) {
    m.metrics_urls.resize(k);
    m.metrics_url_text.resize(k);
    m.scrape_error.resize(k);
    m.scraped.resize(k);
  }
  if (worker >= k) return;
  m.scrape_error[worker].clear();
  m.scraped[worker].reset();
  m.metrics_url_text[worker] = url;
  m.metrics_urls[worker].reset();
  // Validated by the worker protocol's decoder; a peer's copy went through it too.
  if (auto u = parse_http_url(url); !url.empty() && u.ok()) m.metrics_urls[worker] = *u;
}

void scrape_model(router_actor_t* self, model_state& m) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const uint32_t model = m.index;
  for (uint32_t w = 0; w < m.metrics_urls.size() && w < m.pool.k(); ++w) {
    if (!m.metrics_urls[w] || m.pool.state(w, now) == worker_state::unregistered) continue;
    if (auto snap = m.pool.snapshot(w, now); snap.ok() && snap->last_scrape_age_ms >= 0)
      st.ctx->metrics->worker_scrape_age(m.cfg->name, w,
                                         static_cast<double>(snap->last_scrape_age_ms) / 1000.0);
    if (!st.scraper) st.scraper = std::make_unique<metrics_scraper>();
    const caf::actor me = caf::actor_cast<caf::actor>(self);
    const uint64_t key = (uint64_t{model} << 32) | w;
    // Skipped while the previous scrape of this worker runs: a slow worker is never queued twice.
    (void)st.scraper->scrape(
        key, *m.metrics_urls[w], m.cfg->name, [me, model, w, now](uint64_t, result<vllm_load> r) {
          if (r.ok())
            caf::anon_send(me, scraped_atom::value, model, w, now, true, r->running, r->waiting,
                           r->kv_usage, std::string());
          else
            caf::anon_send(me, scraped_atom::value, model, w, now, false, uint32_t{0}, uint32_t{0},
                           0.0f, r.error().to_string());
        });
  }
}

// --- Load authorities (cluster.load_sharing = "authority", core/load_exchange.hpp) ---

// Finished ids an authority remembers so that a resent one is counted once; the same bound and
// lifetime as the load view's tracked ids.
constexpr uint32_t authority_finished_ids = 1u << 16;
constexpr int64_t authority_finished_ttl_ms = 10 * 60 * 1000;
// An unchanged delta is resent this often (a lost one is then repaired), and an unchanged vector
// republished (it is also the workers' heartbeat at the other routers).
constexpr int64_t delta_resend_ms = 500;
constexpr int64_t vector_republish_ms = 250;

// This node is the authority of `worker` (its messages reach this node's load monitor).
void become_authority(router_state& st, model_state& m, uint32_t worker, int64_t now) {
  if (!m.authority) {
    m.authority.emplace(st.ctx->config.name, m.cfg->worker_timeout_ms);
    // Both figures are >= 1, so make() cannot fail.
    auto seen =
        bounded_lru<std::string, bool>::make(authority_finished_ids, authority_finished_ttl_ms);
    m.finished_seen.emplace(std::move(*seen));
  }
  m.authority->add_worker(worker, now);
  m.authority_of[worker] = st.ctx->config.name;
}

// A vector (this node's own or a peer's): the loads it covers, with this router's decisions since
// the delta it includes, go into the load view.
void apply_vector(router_state& st, model_state& m, const load_vector& v) {
  if (!m.overlay.on_vector(v, st.ctx->config.name)) return;
  ++st.vectors_applied;
  for (const auto& e : v.workers)
    if (e.worker < m.pool.k()) m.authority_of[e.worker] = v.authority;
  m.ledger.resize(m.pool.k());
  std::vector<uint32_t> load(m.pool.k(), 0);
  std::vector<uint8_t> covered(m.pool.k(), 0);
  m.overlay.compose(m.ledger, load, covered);
  const int64_t now = st.ctx->now_ms();
  for (const auto& e : v.workers)
    if (e.worker < covered.size() && covered[e.worker] != 0)
      (void)m.pool.on_shared(e.worker, load[e.worker], covered[e.worker] == 1, now);
  publish_readiness(st, m);
}

// Every load_sync_ms: this router's totals to each authority (when they changed, or to repair a
// lost one), and this node's vector to every router (when it changed, or as a heartbeat).
void load_tick(router_actor_t* self) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const std::string& me = st.ctx->config.name;
  for (auto& mp : st.models) {
    auto& m = *mp;
    m.ledger.resize(m.pool.k());
    std::map<std::string, load_delta> out;
    for (const auto& [w, a] : m.authority_of)
      if (m.ledger.total(w) > 0) out[a].totals.emplace_back(w, m.ledger.total(w));
    for (auto& [a, d] : out) {
      auto& stream = m.deltas_out[a];
      std::vector<uint64_t> totals(m.ledger.totals().begin(), m.ledger.totals().end());
      if (totals == stream.totals && now - stream.sent_ms < delta_resend_ms) continue;
      d.router = me;
      d.incarnation = st.incarnation;
      d.seq = ++stream.seq;
      stream.totals = std::move(totals);
      stream.sent_ms = now;
      m.overlay.sent(a, d.seq, m.ledger.totals());
      if (a == me) {
        if (m.authority) m.authority->on_delta(d);
        continue;
      }
      auto r = st.routers_by_name.find(a);
      if (r == st.routers_by_name.end()) continue;  // gone: its vectors stop, the view times out
      load_delta_msg msg{m.cfg->name, me, d.incarnation, d.seq, {}, {}};
      for (const auto& [w, t] : d.totals) {
        msg.workers.push_back(w);
        msg.totals.push_back(t);
      }
      self->send(r->second, load_delta_atom::value, std::move(msg));
      ++st.deltas_sent;
    }
    if (!m.authority) continue;
    const load_vector v = m.authority->publish(now);
    const bool changed = v.workers.size() != m.last_published.size() ||
                         !std::equal(v.workers.begin(), v.workers.end(), m.last_published.begin(),
                                     [](const load_vector_entry& x, const load_vector_entry& y) {
                                       return x.worker == y.worker && x.in_flight == y.in_flight &&
                                              x.alive == y.alive;
                                     });
    if (!changed && now - m.published_ms < vector_republish_ms) continue;
    m.last_published = v.workers;
    m.published_ms = now;
    apply_vector(st, m, v);
    load_vector_msg msg{m.cfg->name, v.authority, v.seq, {}, {}, {}, {}, {}};
    for (const auto& e : v.workers) {
      msg.workers.push_back(e.worker);
      msg.in_flight.push_back(e.in_flight);
      msg.alive.push_back(e.alive ? 1 : 0);
    }
    for (const auto& [r, seq] : v.included) {
      msg.routers.push_back(r);
      msg.included.push_back(seq);
    }
    for (const auto& p : st.peers)
      self->send(p, load_vector_atom::value, msg);
    st.vectors_sent += st.peers.size();
  }
}

void on_scraped(router_actor_t* self, uint32_t model, uint32_t worker, int64_t issued_ms, bool ok,
                const vllm_load& load, const std::string& error) {
  auto& st = self->state;
  if (model >= st.models.size()) return;
  auto& m = *st.models[model];
  if (worker >= m.pool.k() || worker >= m.metrics_urls.size() || !m.metrics_urls[worker]) return;
  const uint32_t in_flight = load.in_flight();
  st.ctx->metrics->worker_scraped(m.cfg->name, worker, ok, in_flight, load.kv_usage);
  if (!ok) {
    if (m.scrape_error[worker].empty() || m.scrape_error[worker] != error)
      spdlog::warn("model {}: worker {}'s metrics not scraped: {}", m.cfg->name, worker, error);
    m.scrape_error[worker] = error;
    (void)m.pool.on_scrape_failed(worker);
    return;
  }
  if (!m.scrape_error[worker].empty())
    spdlog::info("model {}: worker {}'s metrics scraped again", m.cfg->name, worker);
  m.scrape_error[worker].clear();
  if (worker < m.scraped.size()) m.scraped[worker] = load;
  (void)m.pool.on_scrape(worker, in_flight, issued_ms, st.ctx->now_ms());
  // Scrapes are in issue order: their issue time orders them as a report's seq would.
  if (m.authority)
    m.authority->on_report(worker, in_flight,
                           static_cast<uint64_t>(std::max<int64_t>(issued_ms, 0)),
                           st.ctx->now_ms());
  publish_readiness(st, m);
}

// `answer`: false for a message another node's load monitor received and answered (its copy
// only updates this router's load view).
void handle_worker(router_actor_t* self, const worker_job& job, bool answer) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  auto fail = [&](route_error_code code, const std::string& id, std::string message) {
    if (answer) st.ctx->edge->reply_error(job.from, id, code, std::move(message));
  };
  auto ack = [&](const std::string& id, model_state& m, uint32_t worker) {
    if (!answer) return;
    worker_ack a;
    a.id = id;
    auto snap = m.pool.snapshot(worker, now);
    a.state = snap.ok() ? std::string(to_string(snap->state)) : "unregistered";
    a.epoch = m.epoch;
    st.ctx->edge->reply(job.from, encode_worker_ack(a));
  };
  std::visit(
      [&](const auto& msg) {
        using T = std::decay_t<decltype(msg)>;
        model_state* m = st.find(msg.model);
        if (!m)
          return fail(route_error_code::unknown_model, msg.id,
                      "no model named '" + msg.model + "'");
        // Whatever the message changed, /readyz sees it once the handler returns.
        struct publish_on_return {
          const router_state& st;
          const model_state& m;
          ~publish_on_return() { publish_readiness(st, m); }
        } publish{st, *m};
        if constexpr (std::is_same_v<T, worker_register>) {
          if (msg.worker >= m->pool.k()) {
            const bool open_k = m->cfg->workers == 0 && !m->set;
            if (!open_k || msg.worker >= m->cfg->max_workers)
              return fail(route_error_code::malformed, msg.id,
                          "worker " + std::to_string(msg.worker) + " is outside model '" +
                              msg.model + "''s pool of " + std::to_string(m->pool.k()));
            if (auto s = m->pool.resize(msg.worker + 1); !s.ok())
              return fail(route_error_code::internal, msg.id, s.message());
          }
          if (auto s = m->pool.register_worker(msg.worker, msg.endpoint, msg.capacity, now);
              !s.ok())
            return fail(route_error_code::malformed, msg.id, s.message());
          if (m->policy->workers() != m->pool.k()) (void)rebuild_policy(st, *m);
          // With load authorities, only the worker's authority scrapes it.
          set_metrics_url(*m, msg.worker,
                          st.authority_mode && !answer ? std::string() : msg.metrics_url);
          if (st.authority_mode && answer) become_authority(st, *m, msg.worker, now);
          if (answer)
            spdlog::info("model {}: decode worker {} registered at {} (capacity {}{})", msg.model,
                         msg.worker, msg.endpoint, msg.capacity,
                         msg.metrics_url.empty() ? "" : ", load scraped from " + msg.metrics_url);
          ack(msg.id, *m, msg.worker);
        } else if constexpr (std::is_same_v<T, load_report>) {
          if (auto s = m->pool.on_report(msg.worker, msg.in_flight, msg.seq, now); !s.ok())
            return fail(route_error_code::malformed, msg.id, s.message());
          if (m->authority) m->authority->on_report(msg.worker, msg.in_flight, msg.seq, now);
          if (m->reported.size() <= msg.worker) m->reported.resize(msg.worker + 1);
          auto& last = m->reported[msg.worker];
          if (!last || msg.seq >= last->seq)
            last = model_state::reported_load{
                vllm_load{msg.running, msg.waiting, std::clamp(msg.kv_usage, 0.0f, 1.0f)}, msg.seq};
          ack(msg.id, *m, msg.worker);
        } else if constexpr (std::is_same_v<T, finished_requests>) {
          if (msg.worker >= m->pool.k())
            return fail(route_error_code::malformed, msg.id, "unknown worker");
          for (const auto& r : msg.requests) {
            m->pool.on_finished(msg.worker, r, now);
            // The authority counts every request of its worker once, whichever router routed it.
            if (m->authority && m->finished_seen && !m->finished_seen->contains(r, now)) {
              m->finished_seen->put(r, true, now);
              m->authority->on_finished(msg.worker, 1);
            }
          }
          ack(msg.id, *m, msg.worker);
        } else if constexpr (std::is_same_v<T, worker_drain>) {
          auto s = msg.drain ? m->pool.drain(msg.worker) : m->pool.undrain(msg.worker);
          if (!s.ok()) return fail(route_error_code::malformed, msg.id, s.message());
          spdlog::info("model {}: worker {} {}", msg.model, msg.worker,
                       msg.drain ? "drains" : "undrains");
          ack(msg.id, *m, msg.worker);
        } else {
          fail(route_error_code::unknown_type, msg.id, "not a router message");
        }
      },
      job.message);
}

void untrusted(router_actor_t* self) {
  ++self->state.untrusted;
  self->state.ctx->metrics->cluster_event("untrusted");
}

// A route whose request id this router (or a peer) already decided: the same answer again, and
// no second count in the load view.
bool answer_retry(router_actor_t* self, model_state& m, const route_job& job) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const auto* r = st.decisions->get(std::to_string(m.index) + "/" + job.request.id, now);
  if (r == nullptr) return false;
  route_reply reply;
  reply.id = job.request.id;
  reply.worker = r->worker;
  auto snap = m.pool.snapshot(r->worker, now);
  if (snap.ok()) reply.endpoint = snap->endpoint;
  reply.epoch = r->epoch;
  reply.total_blocks = static_cast<uint32_t>(job.request.block_hashes.size());
  st.ctx->edge->reply(job.from, encode_route_reply(reply));
  ++st.retried;
  return true;
}

void flush_decisions(router_actor_t* self) {
  auto& st = self->state;
  st.flush_armed = false;
  for (auto& [index, ds] : st.outbox) {
    if (ds.empty()) continue;
    for (const auto& p : st.peers)
      self->send(p, decisions_atom::value, st.models[index]->cfg->name, ds);
    ds.clear();
  }
}

std::vector<pool_snapshot> snapshot_pools(router_state& st) {
  std::vector<pool_snapshot> out;
  const int64_t now = st.ctx->now_ms();
  for (auto& m : st.models) {
    pool_snapshot p;
    p.model = m->cfg->name;
    p.epoch = m->epoch;
    p.term = m->fence.highest_term();
    if (m->file) p.centroids = encode_centroid_file(*m->file);
    for (const auto& w : m->pool.snapshot_all(now))
      if (w.state != worker_state::unregistered)
        p.workers.push_back(worker_row{w.index, w.endpoint, w.capacity, w.load, w.draining});
    out.push_back(std::move(p));
  }
  return out;
}

// Installs a peer's centroid set when the fence accepts it (a newer epoch of a current term),
// and stores it under the same epoch on this node, so that a restart is warm and the next local
// epoch number is above it. `cause` is the change as the announcing router recorded it ("peer"
// for a snapshot), so that this router's rollback history follows.
void adopt_epoch(router_actor_t* self, model_state& m, uint64_t epoch, uint64_t term,
                 const std::vector<uint8_t>& bytes, const char* why, const std::string& cause) {
  if (bytes.empty()) return;
  if (!m.fence.has_epoch() && m.epoch > 0) m.fence = epoch_fence(0, m.epoch);
  const auto verdict = m.fence.offer(term, epoch);
  if (verdict != fence_result::accepted) {
    if (verdict == fence_result::stale_term || verdict == fence_result::old_epoch) {
      ++m.fenced;
      spdlog::info("model {}: epoch {} (term {}) {} refused: {} (current epoch {}, term {})",
                   m.cfg->name, epoch, term, why, to_string(verdict), m.epoch,
                   m.fence.highest_term());
    }
    return;
  }
  auto file = parse_centroid_file(std::span<const uint8_t>(bytes.data(), bytes.size()), "peer");
  if (!file.ok()) {
    spdlog::warn("model {}: epoch {} {} is unreadable: {}", m.cfg->name, epoch, why,
                 file.error().message());
    return;
  }
  if (auto s = check_installable(m, *file); !s.ok()) {
    spdlog::warn("model {}: epoch {} {} does not fit: {}", m.cfg->name, epoch, why, s.message());
    return;
  }
  if (auto s = install(self->state, m, *file, epoch, cause); !s.ok()) return;
  ++self->state.peer_epochs;
  spdlog::info("model {}: installed epoch {} (term {}) {}", m.cfg->name, epoch, term, why);
  if (self->state.sigcache) {
    auto stored = std::make_shared<const stored_set>(stored_set{epoch, std::move(*file)});
    const std::string name = m.cfg->name;
    self->request(self->state.sigcache, caf::infinite, store_set_atom::value, m.index,
                  stored_set_ptr(stored))
        .then([](uint64_t) {},
              [self, name, epoch](caf::error& e) {
                spdlog::warn("model {}: adopted epoch {} not stored: {}", name, epoch,
                             self->system().render(e));
              });
  }
}

// A router that joins late (or after a partition) learns the registered workers and the newest
// centroid set from its peers; its in-flight counts converge with the next load reports.
void merge_pools(router_actor_t* self, const std::vector<pool_snapshot>& pools) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  for (const auto& p : pools) {
    auto* m = st.find(p.model);
    if (!m) continue;
    adopt_epoch(self, *m, p.epoch, p.term, p.centroids, "from a peer's snapshot", "peer");
    for (const auto& w : p.workers) {
      if (w.worker >= m->pool.k()) {
        if (m->cfg->workers != 0 || m->set || w.worker >= m->cfg->max_workers) continue;
        if (!m->pool.resize(w.worker + 1).ok()) continue;
      }
      auto snap = m->pool.snapshot(w.worker, now);
      if (snap.ok() && snap->state != worker_state::unregistered) continue;
      if (!m->pool.register_worker(w.worker, w.endpoint, w.capacity, now).ok()) continue;
      if (w.draining) (void)m->pool.drain(w.worker);
    }
    if (m->policy->workers() != m->pool.k()) (void)rebuild_policy(st, *m);
    publish_readiness(st, *m);
  }
}

void on_members(router_actor_t* self, const std::vector<member_info>& members) {
  auto& st = self->state;
  std::vector<caf::actor> peers;
  for (const auto& mi : members)
    if (mi.router) peers.push_back(mi.router);
  // A router we did not know gets our pools, so that it can route before the next reports.
  std::vector<pool_snapshot> snapshot;
  for (const auto& p : peers) {
    if (std::find(st.peers.begin(), st.peers.end(), p) != st.peers.end()) continue;
    if (snapshot.empty()) snapshot = snapshot_pools(st);
    self->send(p, pool_sync_atom::value, snapshot);
  }
  st.peers = std::move(peers);
  if (st.peers.empty()) st.outbox.clear();
  st.routers_by_name.clear();
  for (const auto& mi : members)
    if (mi.router) st.routers_by_name[mi.name] = mi.router;
  rebuild_ring(st, members);
}

caf::behavior router_behavior(router_actor_t* self, node_context_ptr ctx, caf::actor sigcache,
                              std::vector<router_model_init> init) {
  auto& st = self->state;
  st.ctx = ctx;
  st.sigcache = sigcache;
  // Validated config: capacity and TTL are >= 1, so make() cannot fail.
  auto decisions = bounded_lru<std::string, remembered>::make(ctx->config.cluster.max_decisions,
                                                              ctx->config.cluster.decision_ttl_ms);
  st.decisions.emplace(std::move(*decisions));
  if (ctx->config.clustered()) rebuild_ring(st, {});  // this node's shard until peers join
  st.authority_mode = ctx->config.clustered() && ctx->config.cluster.load_sharing == "authority";
  if (st.authority_mode) {
    // A restarted router counts from 0 again: a new incarnation tells the authorities so.
    std::random_device rd;
    st.incarnation = (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(ctx->now_ms());
    self->send(self, load_tick_atom::value);
  }
  const auto persisted = read_persisted_policies(ctx->config);
  auto histories = read_histories(ctx->config);
  for (uint32_t i = 0; i < ctx->config.models.size(); ++i) {
    const auto& cfg = ctx->config.models[i];
    load_view_options lo;
    lo.report_timeout_ms = cfg.worker_timeout_ms;
    lo.max_tracked = ctx->config.max_tracked_requests;
    lo.max_id_bytes = 256;
    uint32_t k = cfg.workers;
    if (k == 0 && init[i].current) k = init[i].current->workers;
    auto pool = load_view::make(std::max<uint32_t>(k, 1), lo);
    auto m = std::make_unique<model_state>(std::move(*pool));
    m->index = i;
    m->cfg = &ctx->config.models[i];
    m->policy_name = cfg.policy;
    m->tau = cfg.tau;
    m->widen_single = cfg.widen_single;
    if (auto p = persisted.find(cfg.name); p != persisted.end()) {
      m->policy_name = p->second.policy;
      m->tau = p->second.tau;
      m->widen_single = p->second.widen_single.value_or(cfg.widen_single);
      m->policy_source = "admin";
      if (auto s = rebuild_policy(st, *m); !s.ok() || m->policy_name == "domain") {
        spdlog::error(
            "model {}: persisted policy {} tau {} not usable ({}); the config's {} applies",
            cfg.name, m->policy_name, m->tau, s.ok() ? "not servable" : s.message(), cfg.policy);
        m->policy_name = cfg.policy;
        m->tau = cfg.tau;
        m->widen_single = cfg.widen_single;
        m->policy_source = "config";
      } else {
        spdlog::info(
            "model {}: policy {} tau {} as set with eldrctl policy (persisted in {}); "
            "the config says {} tau {}",
            cfg.name, m->policy_name, m->tau, policy_file_path(ctx->config), cfg.policy, cfg.tau);
      }
    }
    if (auto h = histories.find(cfg.name); h != histories.end()) m->history = std::move(h->second);
    if (init[i].current) {
      if (auto s = install(st, *m, *init[i].current, init[i].current->epoch, "start"); !s.ok())
        spdlog::error("model {}: stored centroid set not installed: {}", cfg.name, s.to_string());
    }
    if (!m->policy) (void)rebuild_policy(st, *m);
    publish_readiness(st, *m);
    st.models.push_back(std::move(m));
    self->send(self, scrape_tick_atom::value, i);
  }
  persist_histories(st);
  return {
      [=](scrape_tick_atom, uint32_t index) {
        auto& s = self->state;
        if (self->current_sender() != self->ctrl() || index >= s.models.size()) return;
        scrape_model(self, *s.models[index]);
        self->delayed_send(self, std::chrono::milliseconds(s.models[index]->cfg->scrape_interval()),
                           scrape_tick_atom::value, index);
      },
      [=](scraped_atom, uint32_t model, uint32_t worker, int64_t issued_ms, bool ok,
          uint32_t running, uint32_t waiting, float kv_usage, const std::string& error) {
        vllm_load load;
        load.running = running;
        load.waiting = waiting;
        load.kv_usage = kv_usage;
        on_scraped(self, model, worker, issued_ms, ok, load, error);
      },
      [=](route_atom, route_job_ptr job) {
        auto* m = self->state.find(job->request.model);
        if (!m) {
          ++self->state.unknown_model;
          send_route_error(self, *job, route_error_code::unknown_model,
                           "no model named '" + job->request.model + "'");
          return;
        }
        if (answer_retry(self, *m, *job)) return;
        sign_and_route(self, *m, std::move(job), 0);
      },
      [=](flush_atom) { flush_decisions(self); },
      [=](load_tick_atom) {
        auto& s = self->state;
        if (self->current_sender() != self->ctrl()) return;
        load_tick(self);
        self->delayed_send(self, std::chrono::milliseconds(s.ctx->config.cluster.load_sync_ms),
                           load_tick_atom::value);
      },
      // A router's decision totals for workers this node is the authority of.
      [=](load_delta_atom, const load_delta_msg& msg) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(msg.model);
        if (!m || !m->authority || msg.workers.size() != msg.totals.size() || msg.seq == 0) {
          ++s.load_messages_refused;
          return;
        }
        load_delta d{msg.router, msg.incarnation, msg.seq, {}};
        d.totals.reserve(msg.workers.size());
        for (size_t i = 0; i < msg.workers.size(); ++i)
          d.totals.emplace_back(msg.workers[i], msg.totals[i]);
        m->authority->on_delta(d);
        ++s.deltas_applied;
      },
      // An authority's load vector.
      [=](load_vector_atom, const load_vector_msg& msg) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(msg.model);
        if (!m || msg.workers.size() != msg.in_flight.size() ||
            msg.workers.size() != msg.alive.size() || msg.routers.size() != msg.included.size() ||
            msg.authority.empty() || msg.authority == s.ctx->config.name) {
          ++s.load_messages_refused;
          return;
        }
        load_vector v;
        v.authority = msg.authority;
        v.seq = msg.seq;
        for (size_t i = 0; i < msg.workers.size(); ++i)
          v.workers.push_back({msg.workers[i], msg.in_flight[i], msg.alive[i] != 0});
        for (size_t i = 0; i < msg.routers.size(); ++i)
          v.included[msg.routers[i]] = msg.included[i];
        apply_vector(s, *m, v);
      },
      [=](members_atom, const std::vector<member_info>& members, uint32_t) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return;
        on_members(self, members);
      },
      [=](decisions_atom, const std::string& model, const std::vector<shared_decision>& ds) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(model);
        if (!m) return;
        const int64_t now = s.ctx->now_ms();
        for (const auto& d : ds) {
          const auto key = std::to_string(m->index) + "/" + d.request;
          if (s.decisions->get(key, now) != nullptr || d.worker >= m->pool.k()) continue;
          (void)m->pool.on_route(d.request, d.worker, now);
          s.decisions->put(key, remembered{d.worker, d.epoch}, now);
          ++s.peer_decisions;
        }
      },
      [=](peer_worker_atom, const std::vector<uint8_t>& bytes) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        worker_protocol_limits limits;
        auto msg = decode_worker_message(bytes, limits);
        if (!msg.ok()) return;
        ++s.peer_worker_messages;
        handle_worker(self, worker_job{reply_address{}, std::move(*msg)}, false);
      },
      [=](pool_sync_atom, const std::vector<pool_snapshot>& pools) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return untrusted(self);
        merge_pools(self, pools);
      },
      [=](epoch_atom, const std::string& model, uint64_t epoch, uint64_t term,
          const std::vector<uint8_t>& file, const std::string& cause) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        auto* m = s.find(model);
        if (m) adopt_epoch(self, *m, epoch, term, file, "announced by a peer router", cause);
      },
      // A refit leader's term: publishes from older terms are refused from now on, and imports
      // go to that leader.
      [=](leader_atom, const std::string& name, uint64_t term) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return untrusted(self);
        for (auto& m : s.models)
          m->fence.observe_term(term);
        if (!name.empty() && term >= s.leader_term) {
          s.leader = name;
          s.leader_term = term;
        } else if (name.empty() && local_sender(self) && s.leader == s.ctx->config.name) {
          s.leader.clear();  // this node's refit actor stepped down
        }
      },
      [=](set_change_retry_atom, uint32_t index, admin_job_ptr job, std::string& command,
          std::vector<uint8_t>& bytes, uint64_t epoch, int64_t deadline_ms) {
        if (self->current_sender() != self->ctrl() || index >= self->state.models.size()) return;
        change_via_leader(self, index, std::move(job), std::move(command), std::move(bytes), epoch,
                          deadline_ms);
      },
      // Another router's change of the current set (import, swap, rollback), for this node to
      // make as the refit leader.
      [=](set_change_atom, const std::string& model, const std::string& command,
          const std::vector<uint8_t>& bytes, uint64_t epoch) -> caf::result<uint64_t, uint64_t> {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) {
          untrusted(self);
          return caf::sec::request_receiver_down;
        }
        auto* m = s.find(model);
        if (!m) return caf::make_error(caf::sec::runtime_error, "no model named '" + model + "'");
        if (command != "import" && command != "swap" && command != "rollback")
          return caf::make_error(caf::sec::runtime_error, "no change named '" + command + "'");
        if (s.leader != s.ctx->config.name)
          return caf::make_error(caf::sec::runtime_error,
                                 "this node is not the refit leader (the leader is " +
                                     (s.leader.empty() ? std::string("unknown") : s.leader) + ")");
        auto rp = self->make_response_promise<uint64_t, uint64_t>();
        change_as_leader(
            self, *m, command, bytes, epoch, s.leader_term,
            [rp](result<uint64_t> r, uint64_t source) mutable {
              if (r.ok())
                rp.deliver(*r, source);
              else
                rp.deliver(caf::make_error(caf::sec::runtime_error, r.error().to_string()));
            });
        return rp;
      },
      // The refit leader's sample of this router's live signatures (a copy).
      [=](peer_sample_atom, const std::string& model) -> caf::result<sample_reply> {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) {
          untrusted(self);
          return caf::sec::request_receiver_down;
        }
        auto* m = s.find(model);
        if (!m) return caf::sec::invalid_argument;
        sample_reply r;
        r.epoch = m->epoch;
        if (m->sample && m->spec) {
          r.width = m->spec->width();
          r.seen = m->sample->seen();
          r.points = pack_points(m->sample->points());
        }
        return r;
      },
      [=](worker_atom, worker_job_ptr job) { handle_worker(self, *job, true); },
      [=](admin_atom, admin_job_ptr job) { handle_admin(self, job); },
      // The operator page's worker rows (the `workers` admin command's) and spec, per model.
      [=](page_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        nlohmann::json out = nlohmann::json::object();
        for (auto& m : self->state.models)
          out[m->cfg->name] = {{"workers", workers_json(self->state, *m)}, {"spec", spec_json(*m)}};
        return out.dump();
      },
      // The router's part of `status`: models as a JSON text.
      [=](admin_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        nlohmann::json models = nlohmann::json::array();
        for (auto& m : self->state.models)
          models.push_back(model_json(self->state, *m));
        const auto& s = self->state;
        return nlohmann::json{{"models", models},
                              {"unknown_model", s.unknown_model},
                              {"retried_routes", s.retried},
                              {"peer_routers", s.peers.size()},
                              {"peer_decisions", s.peer_decisions},
                              {"load_sharing", s.authority_mode ? "authority" : "decisions"},
                              {"load_deltas_sent", s.deltas_sent},
                              {"load_deltas_applied", s.deltas_applied},
                              {"load_vectors_sent", s.vectors_sent},
                              {"load_vectors_applied", s.vectors_applied},
                              {"load_messages_refused", s.load_messages_refused},
                              {"peer_worker_messages", s.peer_worker_messages},
                              {"peer_epochs", s.peer_epochs},
                              {"untrusted_messages", s.untrusted},
                              {"shards", s.ring ? s.ring->size() : 0},
                              {"shard_requests", s.shard_requests},
                              {"shard_local_requests", s.shard_local_requests},
                              {"changes_forwarded", s.changes_forwarded},
                              {"refit_leader", s.leader},
                              {"refit_leader_term", s.leader_term},
                              {"shard_failovers", s.shard_failovers},
                              {"shard_failures", s.shard_failures},
                              {"shard_store_messages", s.shard_store_messages}}
            .dump();
      },
      // The refit's sample: a copy of the reservoir and the current set.
      [=](sample_atom, uint32_t index) -> caf::result<refit_input_ptr> {
        if (index >= self->state.models.size()) return caf::sec::invalid_argument;
        auto& m = *self->state.models[index];
        auto in = std::make_shared<refit_input>();
        in->model = index;
        in->model_name = m.cfg->name;
        in->k = m.pool.k();
        in->spec = m.spec;
        in->current = m.set;
        in->current_file = m.file;
        if (m.sample) {
          in->seen = m.sample->seen();
          const auto pts = m.sample->points();
          in->points.assign(pts.begin(), pts.end());
        }
        return refit_input_ptr(in);
      },
      // An accepted refit: store as a new epoch and install.
      // An accepted refit, published in `term` (0 standalone).
      [=](install_atom, uint32_t index, stored_set_ptr s, uint64_t term) -> caf::result<uint64_t> {
        if (index >= self->state.models.size()) return caf::sec::invalid_argument;
        auto& m = *self->state.models[index];
        if (term < m.fence.highest_term())
          return caf::make_error(caf::sec::runtime_error,
                                 "term " + std::to_string(term) + " is stale (current term " +
                                     std::to_string(m.fence.highest_term()) + ")");
        auto rp = self->make_response_promise<uint64_t>();
        store_and_install(self, m, s->file, "refit", "refit", deliver_epoch(rp), term);
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_router(caf::actor_system& sys, node_context_ptr ctx, caf::actor sigcache,
                        std::vector<router_model_init> init) {
  return sys.spawn(router_behavior, std::move(ctx), std::move(sigcache), std::move(init));
}

}  // namespace eldr
