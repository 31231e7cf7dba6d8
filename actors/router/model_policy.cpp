// model_policy: see model_policy.hpp.
#include "actors/router/model_policy.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "actors/router/router_files.hpp"

namespace eldr::router {

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
status rebuild_policy(model_state& m) {
  auto built = build_policy(m, m.policy_name, m.tau, m.widen_single, m.set, m.pool.k());
  if (!built.ok()) return built.error();
  m.policy = std::move(built->policy);
  m.eldr_active = built->eldr_active;
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
    auto sample =
        signature_sample::make(m.cfg->sample_size, m.spec->width(), m.cfg->seed,
                               resolved_sample_horizon(m.cfg->sample_size, m.cfg->sample_horizon));
    if (sample.ok()) {
      m.sample = std::move(*sample);
    } else {  // the config's checks make this unreachable; loud if it is not
      spdlog::error(
          "model {}: no refit sample under epoch {}: {}; this router offers the refit "
          "no signatures until the next install",
          m.cfg->name, epoch, sample.error().message());
      m.sample.reset();
    }
  }
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

}  // namespace eldr::router
