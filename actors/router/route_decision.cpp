// route_decision: see route_decision.hpp.
#include "actors/router/route_decision.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "cluster/wire/route_protocol.hpp"

namespace eldr::router {

std::string decision_key(const model_state& m, const std::string& request) {
  return std::to_string(m.index) + "/" + request;
}

void send_route_error(const node_context& ctx, const route_job& job, wire_error_code code,
                      std::string message) {
  ctx.metrics->route_failed(code);
  ctx.edge->reply_error(job.from, job.request.id, code, std::move(message));
}

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

decided decide(router_state& st, model_state& m, const route_job& job, const sign_result* signed_,
               int attempt) {
  const auto& req = job.request;
  // A swap with a new spec landed while the cache signed: sign again under the current spec, so
  // the decision uses one set and a signature built for it.
  if (signed_ && signed_->spec != m.spec && m.spec && attempt == 0) {
    ++m.resigned;
    return decided::sign_again;
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
    send_route_error(*st.ctx, job, wire_error_code::no_eligible_worker,
                     "no decode worker of model '" + m.cfg->name +
                         "' is registered, live, undrained and below capacity");
    return decided::answered;
  }
  auto d = m.policy->route(in, &m.trace);
  if (!d.ok()) {
    ++m.failed;
    send_route_error(*st.ctx, job, wire_error_code::internal, d.error().to_string());
    return decided::answered;
  }
  if (auto s = m.pool.on_route(req.id, d->worker, now); !s.ok()) {
    ++m.failed;
    send_route_error(*st.ctx, job, wire_error_code::internal, s.to_string());
    return decided::answered;
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
    st.ctx->metrics->route_warning(m.cfg->name, "counts_geometry");
    reply.warnings.push_back(
        other_geometry
            ? counts_geometry_warning(req.counts->geometry, m.spec->geometry(), sig == nullptr)
            : counts_geometry_warning(signed_->problem, sig == nullptr));
  } else if (why == fallback_reason::signature_unusable && signed_ && !signed_->problem.empty()) {
    reply.warnings.push_back("signature_unusable: " + signed_->problem);
  }
  if (why != fallback_reason::none) {
    st.ctx->metrics->route_fallback(m.cfg->name, reply.fallback);
    uint64_t held = 0;
    if (m.fallback_log[static_cast<size_t>(why)].allow(now, held))
      spdlog::warn("model {}: request {} routed by load only ({}){}{}", m.cfg->name, req.id,
                   reply.fallback, reply.warnings.empty() ? "" : ": " + reply.warnings.front(),
                   log_limiter::held_note(held));
  } else if (!reply.warnings.empty()) {
    uint64_t held = 0;
    if (m.fallback_log[static_cast<size_t>(fallback_reason::counts_geometry)].allow(now, held))
      spdlog::warn("model {}: request {}: {}{}", m.cfg->name, req.id, reply.warnings.front(),
                   log_limiter::held_note(held));
  }
  bool arm_flush = false;
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
  st.ctx->edge->reply(job.from, encode_route_reply(reply));
  st.decisions->put(decision_key(m, req.id), remembered{d->worker, reply.epoch}, now);
  if (st.authority_mode) {
    // Counted in this router's totals, which reach the worker's authority every interval; and
    // its peers' decisions meanwhile estimated from it until the next vector includes them.
    m.ledger.resize(m.pool.k());
    (void)m.ledger.on_route(d->worker);
    if (const uint64_t peers = peer_estimate(1, st.estimate_routers(m, now)); peers > 0)
      (void)m.pool.add_estimate(d->worker, static_cast<uint32_t>(peers));
  } else if (!st.peers.empty()) {
    st.outbox[m.index].push_back(shared_decision{req.id, d->worker, reply.epoch});
    if (!st.flush_armed) {
      st.flush_armed = true;
      arm_flush = true;
    }
  }
  st.ctx->metrics->route_decided(
      m.cfg->name, d->worker, d->band_size, static_cast<double>(t1 - job.received_ns) * 1e-9,
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
  return arm_flush ? decided::arm_flush : decided::answered;
}

namespace {

// Sends a decision made earlier (here or at a peer) as the answer to `job`.
void reply_remembered(router_state& st, model_state& m, const route_job& job, const remembered& r,
                      int64_t now) {
  route_reply reply;
  reply.id = job.request.id;
  reply.worker = r.worker;
  auto snap = m.pool.snapshot(r.worker, now);
  if (snap.ok()) reply.endpoint = snap->endpoint;
  reply.epoch = r.epoch;
  reply.total_blocks = static_cast<uint32_t>(job.request.block_hashes.size());
  st.ctx->edge->reply(job.from, encode_route_reply(reply));
}

}  // namespace

// A route whose request id this router (or a peer) already decided: the same answer again, and
// no second count in the load view.
bool answer_retry(router_state& st, model_state& m, const route_job& job) {
  const int64_t now = st.ctx->now_ms();
  if (job.request.retry) ++st.marked_retries;
  const auto* r = st.decisions->get(decision_key(m, job.request.id), now);
  if (r == nullptr) return false;
  if (job.request.retry) ++st.marked_retries_remembered;
  reply_remembered(st, m, job, *r, now);
  ++st.retried;
  return true;
}

bool answer_recalled(router_state& st, model_state& m, const route_job& job,
                     const remembered& decision) {
  if (decision.worker >= m.pool.k()) return false;
  const int64_t now = st.ctx->now_ms();
  const auto key = decision_key(m, job.request.id);
  if (!st.authority_mode && st.decisions->get(key, now) == nullptr)
    (void)m.pool.on_route(job.request.id, decision.worker, now);
  st.decisions->put(key, decision, now);
  reply_remembered(st, m, job, decision, now);
  ++st.recalled;
  return true;
}

}  // namespace eldr::router
