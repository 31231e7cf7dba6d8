// router_load: the decode workers' load as the router learns it -- their worker-protocol messages
// (register, load_report, finished, drain), their vLLM /metrics scraped every scrape_interval_ms,
// and, with cluster.load_sharing = "authority", the load exchange between routers
// (core/membership/load_exchange.hpp): decision totals to each worker's authority, one load vector
// per model per interval back.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "actors/router/model_policy.hpp"
#include "actors/router/router_actor_internal.hpp"
#include "cluster/wire/worker_protocol.hpp"

namespace eldr::router {

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
    // With load authorities, only the worker's authority scrapes it (the others know its URL,
    // so that a successor can take it over).
    if (st.authority_mode && !m.claims.mine(w)) continue;
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

// --- Load authorities (cluster.load_sharing = "authority", core/membership/load_exchange.hpp) ---

// Finished ids an authority remembers so that a resent one is counted once; the same bound and
// lifetime as the load view's tracked ids.
constexpr uint32_t authority_finished_ids = 1u << 16;
constexpr int64_t authority_finished_ttl_ms = 10 * 60 * 1000;
// An unchanged vector is republished this often (it is also the workers' heartbeat at the other
// routers). Deltas need no resend timer: a total is sent every interval until a vector includes
// it (delta_outbox).
constexpr int64_t vector_republish_ms = 250;

namespace {

void ensure_authority(router_state& st, model_state& m) {
  if (!m.authority) {
    m.authority.emplace(st.ctx->config.name, m.cfg->worker_timeout_ms);
    // Both figures are >= 1, so make() cannot fail.
    auto seen =
        bounded_lru<std::string, bool>::make(authority_finished_ids, authority_finished_ttl_ms);
    m.finished_seen.emplace(std::move(*seen));
  }
}

// How a worker this node became the authority of will be heard, for the log line that says so.
std::string how_heard(const model_state& m, uint32_t worker) {
  return worker < m.metrics_url_text.size() && !m.metrics_url_text[worker].empty()
             ? "scraping " + m.metrics_url_text[worker]
             : "it pushes load reports: heard again once it reaches a node";
}

}  // namespace

// This node is the authority of `worker` (it registered here).
void become_authority(router_state& st, model_state& m, uint32_t worker, int64_t now) {
  ensure_authority(st, m);
  m.authority->add_worker(worker, now);
  (void)m.claims.on_registered(worker);
}

void on_authorities_left(router_state& st, model_state& m, const std::vector<std::string>& peers) {
  const int64_t now = st.ctx->now_ms();
  const std::string& me = st.ctx->config.name;
  std::set<std::string> departed;
  for (const auto& s : m.claims.on_members(peers)) {
    departed.insert(s.from);
    if (s.to != me) {
      ++st.authority_handovers;
      continue;
    }
    // Its last published load stands until the first scrape or report here; a worker that
    // pushes reports must reconnect to some node (and register there) to be heard again.
    const auto last = m.overlay.entry(s.from, s.worker);
    ensure_authority(st, m);
    m.authority->adopt_worker(s.worker, last ? last->in_flight : 0, now);
    ++st.authority_takeovers;
    spdlog::info(
        "model {}: took over decode worker {}'s load from node {}, which left the cluster ({})",
        m.cfg->name, s.worker, s.from, how_heard(m, s.worker));
  }
  for (const auto& a : departed)
    if (a != me) m.overlay.forget(a);
}

void on_snapshot_claim(router_state& st, model_state& m, uint32_t worker,
                       const authority_claim& claim, uint32_t load) {
  const bool own = claim.node == st.ctx->config.name;
  // A claim of a node that is no longer a member (the peer had not seen it leave) would outrank
  // its successor's: it is left to the successors' vectors. Before this router has the members,
  // on_members hands such claims on (on_authorities_left).
  if (!own && !st.routers_by_name.empty() && st.routers_by_name.count(claim.node) == 0) return;
  if (m.claims.on_claim(worker, claim) != authority_map::verdict::follow || !own) return;
  ensure_authority(st, m);
  m.authority->adopt_worker(worker, load, st.ctx->now_ms());
  ++st.authority_reclaims;
  spdlog::info(
      "model {}: decode worker {}'s load is this node's to publish again (a peer's snapshot names "
      "this node its authority: it restarted before the peers noticed; {})",
      m.cfg->name, worker, how_heard(m, worker));
}

// A vector (this node's own or a peer's): the loads it covers, with this router's decisions since
// the delta it includes, go into the load view.
bool apply_vector(router_state& st, model_state& m, const load_vector& v) {
  const int64_t now = st.ctx->now_ms();
  const auto outcome =
      m.overlay.on_vector(v, st.ctx->config.name, st.incarnation, &m.activity, now);
  if (outcome == load_overlay::vector_outcome::stale) return false;
  ++st.vectors_applied;
  if (outcome == load_overlay::vector_outcome::restarted) {
    // It came back faster than the membership noticed it leave: it holds none of this router's
    // totals, and only what is routed from now on would reach it.
    ++st.authority_restarts;
    m.outbox_resend_all = true;
    m.outbox.resync(v.authority);
    spdlog::info(
        "model {}: node {} restarted (a new incarnation's load vector): sending it every "
        "decision total again",
        m.cfg->name, v.authority);
  }
  m.outbox.acknowledged(v.authority, m.overlay.included(v.authority));
  const uint64_t claims_version = m.claims.nodes_version();
  const uint32_t routers = st.estimate_routers(m, now);
  for (const auto& e : v.workers) {
    if (e.worker >= m.pool.k()) continue;
    using verdict = authority_map::verdict;
    const authority_claim theirs = decode_claim(v.authority, e.claim);
    if (m.claims.on_claim(e.worker, theirs) != verdict::yield) continue;
    // Two nodes claimed the worker (a healed partition, a registration after a takeover): the
    // better claim keeps it, this node stops scraping it and sends its totals there.
    if (m.authority) m.authority->remove_worker(e.worker);
    ++st.authority_yields;
    spdlog::info(
        "model {}: decode worker {}'s load is now node {}'s to publish (its claim, by {} "
        "at generation {}, beats this node's)",
        m.cfg->name, e.worker, v.authority, theirs.registered ? "registration" : "succession",
        theirs.generation);
  }
  m.ledger.resize(m.pool.k());
  // Only this vector's workers: a vector costs its authority's workers, not the whole pool (with
  // A authorities, composing every worker per vector was O(A x W) per interval). A worker whose
  // better claim is another node's keeps that node's load.
  for (const auto& e : m.overlay.compose_vector(v.authority, m.ledger, routers)) {
    const auto* c = m.claims.claim(e.worker);
    if (e.worker < m.pool.k() && c != nullptr && c->node == v.authority)
      (void)m.pool.on_shared(e.worker, e.in_flight, e.alive, now, e.estimated);
  }
  publish_readiness(st, m);
  return outcome == load_overlay::vector_outcome::restarted ||
         m.claims.nodes_version() != claims_version;
}

// Every load_sync_ms while there is load to share (wake_load_tick), else every
// vector_republish_ms: to each authority, this router's totals that it has not applied yet (the
// workers routed to since, and those a lost delta carried), and this node's vector to every router
// (when it changed, or as a heartbeat).
bool load_tick(router_actor_t* self) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const std::string& me = st.ctx->config.name;
  bool busy = false;
  for (auto& mp : st.models) {
    auto& m = *mp;
    m.ledger.resize(m.pool.k());
    auto authority_of = [&m](uint32_t w) -> const std::string* {
      const authority_claim* c = m.claims.claim(w);
      return c == nullptr ? nullptr : &c->node;
    };
    // Workers changed authority (rare: registrations, takeovers, yields): every total goes
    // where its worker's claim now is. Otherwise an interval costs what was routed, not W.
    if (m.claims.nodes_version() != m.outbox_claims_version || m.outbox_resend_all) {
      m.outbox.resend_all(m.ledger, authority_of);
      m.outbox_claims_version = m.claims.nodes_version();
      m.outbox_resend_all = false;
    }
    const std::vector<uint32_t> routed = m.ledger.take_routed();
    for (auto& [a, d] : m.outbox.interval(m.ledger, routed, authority_of)) {
      busy = true;
      d.router = me;
      d.incarnation = st.incarnation;
      m.overlay.sent(a, d.seq, d.totals);
      if (a == me) {
        if (m.authority) m.authority->on_delta(d);
        continue;
      }
      auto r = st.routers_by_name.find(a);
      if (r == st.routers_by_name.end()) continue;  // gone: its vectors stop, the view times out
      load_delta_msg msg{m.cfg->name, me, d.incarnation, d.seq, {}, {}, d.resync};
      for (const auto& [w, t] : d.totals) {
        msg.workers.push_back(w);
        msg.totals.push_back(t);
      }
      self->send(r->second, load_delta_atom::value, std::move(msg));
      ++st.deltas_sent;
    }
    busy = busy || m.outbox.pending() != 0;
    if (!m.authority) continue;
    load_vector v = m.authority->publish(now);
    v.incarnation = st.incarnation;
    for (auto& e : v.workers)
      if (const auto* c = m.claims.claim(e.worker)) e.claim = encode_claim(*c);
    // A newly applied delta changes the vector even when no load moved: the routers learn it
    // was applied and stop resending its totals.
    const bool changed = v.workers.size() != m.last_published.size() ||
                         !std::equal(v.workers.begin(), v.workers.end(), m.last_published.begin(),
                                     [](const load_vector_entry& x, const load_vector_entry& y) {
                                       return x.worker == y.worker && x.in_flight == y.in_flight &&
                                              x.alive == y.alive && x.anchors == y.anchors;
                                     }) ||
                         v.included != m.last_published_included;
    if (!changed && now - m.published_ms < vector_republish_ms) continue;
    busy = busy || changed;
    m.last_published = v.workers;
    m.last_published_included = v.included;
    m.published_ms = now;
    apply_vector(st, m, v);
    load_vector_msg msg;
    msg.model = m.cfg->name;
    msg.authority = v.authority;
    msg.incarnation = v.incarnation;
    msg.seq = v.seq;
    for (const auto& e : v.workers) {
      msg.workers.push_back(e.worker);
      msg.in_flight.push_back(e.in_flight);
      msg.alive.push_back(e.alive ? 1 : 0);
      msg.anchors.push_back(e.anchors ? 1 : 0);
      msg.claim.push_back(e.claim);
    }
    for (const auto& [r, inc] : v.included) {
      msg.routers.push_back(r);
      msg.router_incarnations.push_back(inc.incarnation);
      msg.included.push_back(inc.seq);
    }
    for (const auto& p : st.peers)
      self->send(p, load_vector_atom::value, msg);
    st.vectors_sent += st.peers.size();
  }
  return busy;
}

namespace {

void arm_load_tick(router_actor_t* self, const wake_timer::arm& a) {
  if (a.delay_ms == 0)
    self->send(self, load_tick_atom::value, a.token);  // after the message being handled
  else
    self->delayed_send(self, std::chrono::milliseconds(a.delay_ms), load_tick_atom::value, a.token);
}

}  // namespace

void start_load_tick(router_actor_t* self) {
  auto& st = self->state;
  // An unchanged vector goes out every vector_republish_ms, so an idle node need not wake more
  // often (a fixed 5 ms tick cost an idle node 7-12 ms of CPU per second: BENCHMARKS.md, "An
  // idle cluster"); and a decision after a quiet spell goes out at once, not up to
  // load_sync_ms later.
  st.load_timer.emplace(st.ctx->config.cluster.load_sync_ms, vector_republish_ms);
  wake_load_tick(self);
}

void wake_load_tick(router_actor_t* self) {
  auto& st = self->state;
  if (!st.load_timer) return;
  if (auto a = st.load_timer->wake(st.ctx->now_ms())) arm_load_tick(self, *a);
}

void on_load_tick(router_actor_t* self, uint64_t token) {
  auto& st = self->state;
  if (!st.load_timer || !st.load_timer->fired(token)) return;  // superseded by a wake-up
  const bool busy = load_tick(self);
  const int64_t now = st.ctx->now_ms();
  const bool stores_wait = flush_due_stores(self, now);
  arm_load_tick(self, st.load_timer->ran(now, busy || stores_wait));
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
  auto fail = [&](wire_error_code code, const std::string& id, std::string message) {
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
          return fail(wire_error_code::unknown_model, msg.id, "no model named '" + msg.model + "'");
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
              return fail(wire_error_code::malformed, msg.id,
                          "worker " + std::to_string(msg.worker) + " is outside model '" +
                              msg.model + "''s pool of " + std::to_string(m->pool.k()));
            if (auto s = m->pool.resize(msg.worker + 1); !s.ok())
              return fail(wire_error_code::internal, msg.id, s.message());
          }
          if (auto s = m->pool.register_worker(msg.worker, msg.endpoint, msg.capacity, now);
              !s.ok())
            return fail(wire_error_code::malformed, msg.id, s.message());
          if (m->policy->workers() != m->pool.k()) (void)rebuild_policy(*m);
          // With load authorities only the worker's authority scrapes it (scrape_model), but
          // every router keeps the URL, for a takeover.
          set_metrics_url(*m, msg.worker, msg.metrics_url);
          if (st.authority_mode && answer) become_authority(st, *m, msg.worker, now);
          if (answer)
            spdlog::info("model {}: decode worker {} registered at {} (capacity {}{})", msg.model,
                         msg.worker, msg.endpoint, msg.capacity,
                         msg.metrics_url.empty() ? "" : ", load scraped from " + msg.metrics_url);
          ack(msg.id, *m, msg.worker);
        } else if constexpr (std::is_same_v<T, load_report>) {
          if (auto s = m->pool.on_report(msg.worker, msg.in_flight, msg.seq, now); !s.ok())
            return fail(wire_error_code::malformed, msg.id, s.message());
          // With load authorities only the authority's reports reach the other routers, so the
          // node a worker's reports reach must be its authority: a worker whose authority left
          // (its successor cannot hear it) or whose client failed over to this node is claimed
          // here, as a registration claims it, which beats a succession and the older claim.
          if (st.authority_mode && answer && !m->claims.mine(msg.worker)) {
            const auto* held = m->claims.claim(msg.worker);
            spdlog::info(
                "model {}: decode worker {}'s load reports reach this node: its load "
                "authority now (was {})",
                m->cfg->name, msg.worker, held ? held->node : std::string("nobody"));
            become_authority(st, *m, msg.worker, now);
            ++st.authority_claims_by_report;
          }
          if (m->authority) m->authority->on_report(msg.worker, msg.in_flight, msg.seq, now);
          if (m->reported.size() <= msg.worker) m->reported.resize(msg.worker + 1);
          auto& last = m->reported[msg.worker];
          if (!last || msg.seq >= last->seq)
            last = model_state::reported_load{
                vllm_load{msg.running, msg.waiting, std::clamp(msg.kv_usage, 0.0f, 1.0f)}, msg.seq};
          ack(msg.id, *m, msg.worker);
        } else if constexpr (std::is_same_v<T, finished_requests>) {
          if (msg.worker >= m->pool.k())
            return fail(wire_error_code::malformed, msg.id, "unknown worker");
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
          if (!s.ok()) return fail(wire_error_code::malformed, msg.id, s.message());
          spdlog::info("model {}: worker {} {}", msg.model, msg.worker,
                       msg.drain ? "drains" : "undrains");
          ack(msg.id, *m, msg.worker);
        } else {
          fail(wire_error_code::unknown_type, msg.id, "not a router message");
        }
      },
      job.message);
}

}  // namespace eldr::router
