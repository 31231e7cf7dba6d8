// simulator: the event loop (prefill pool, handoff and routing, KV transfer, the decode engine's
// steps, online refits) and the metrics.
#include "core/sim/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <queue>
#include <unordered_map>

#include "core/base/parallel.hpp"
#include "core/base/random.hpp"
#include "core/expert_counts.hpp"
#include "core/membership/load_exchange.hpp"
#include "core/membership/router_activity.hpp"

namespace eldr {
namespace {

enum class event_kind : uint8_t { route, decode_arrival, step_end, refit, load_sync };

struct event {
  double t;
  uint64_t seq;  // insertion order: ties at one instant resolve deterministically
  event_kind kind;
  uint32_t id;  // request (route, decode_arrival) or worker (step_end)
  bool operator>(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

struct request_state {
  double handoff = 0;
  uint32_t worker = 0;
};

}  // namespace

status sim_config::validate() const {
  auto bad = [](const std::string& m) { return status::invalid_argument("simulator: " + m); };
  if (prefill_workers == 0) return bad("prefill workers must be >= 1");
  if (decode_workers == 0) return bad("decode workers must be >= 1");
  if (max_batch == 0) return bad("max batch must be >= 1");
  for (double v : {prefill_base_ms, prefill_per_token_ms, kv_transfer_ms})
    if (!(v >= 0.0 && std::isfinite(v)))
      return bad("prefill and transfer times must be finite and >= 0");
  if (block_size == 0 || block_size > 255) return bad("block size must be in 1..255");
  if (routers == 0 || routers > 4096) return bad("routers must be in 1..4096");
  if (!(load_sync_ms >= 0.0 && std::isfinite(load_sync_ms)))
    return bad("load_sync_ms must be finite and >= 0");
  if (load_sync_lag > 16) return bad("load_sync_lag must be in 0..16");
  if (routers_with_traffic > routers) return bad("routers_with_traffic must be in 0..routers");
  if (peer_estimate_routers > 4096) return bad("peer_estimate_routers must be in 0..4096");
  return cost.validate();
}

std::vector<uint32_t> decode_profiles(const workload& w, uint32_t threads) {
  const std::size_t width = w.geometry().width();
  std::vector<uint32_t> out(w.prefill_sources.size() * width, 0);
  parallel_for_each_index(threads, w.prefill_sources.size(), [&](std::size_t k) {
    w.source->add_decode_counts(w.prefill_sources[k], std::span(out).subspan(k * width, width));
  });
  return out;
}

result<sim_metrics> simulate(const workload& w, const sim_config& c, sim_policy& p,
                             const std::vector<uint32_t>* decode_counts,
                             const sim_progress& progress) {
  const auto wall0 = std::chrono::steady_clock::now();
  if (status s = c.validate(); !s.ok()) return s;
  if (!p.policy) return status::invalid_argument("simulator: policy " + p.name + " is empty");
  const uint32_t D = c.decode_workers;
  if (p.policy->workers() != D)
    return status::invalid_argument("simulator: policy " + p.name + " routes over " +
                                    std::to_string(p.policy->workers()) + " workers, but " +
                                    std::to_string(D) + " decode workers are simulated");
  const model_geometry& g = w.geometry();
  if (p.signatures != signature_source::none) {
    if (!p.spec) return status::invalid_argument("simulator: policy " + p.name + " has no spec");
    if (p.spec->geometry() != g)
      return status::invalid_argument("simulator: policy " + p.name + " signatures are for " +
                                      p.spec->geometry().to_string() + ", the workload is " +
                                      g.to_string());
  }
  const std::size_t full = g.width();
  if (p.signatures == signature_source::decode_profile &&
      (decode_counts == nullptr || decode_counts->size() != w.prefill_sources.size() * full))
    return status::invalid_argument("simulator: policy " + p.name +
                                    " needs the requests' decode profiles");
  auto* band = dynamic_cast<centroid_policy*>(p.policy.get());
  if (p.refit.enabled && (band == nullptr || p.signatures != signature_source::prefill))
    return status::invalid_argument(
        "simulator: online refit needs an eldr or eldr-adaptive policy on prefill "
        "signatures (" +
        p.name + ")");
  if (p.refit.enabled && !(p.refit.interval_s > 0.0 && std::isfinite(p.refit.interval_s)))
    return status::invalid_argument("simulator: the refit interval must be finite and > 0");
  // Router 0 routes with p.policy; routers 1.. with their own instances.
  std::vector<std::unique_ptr<routing_policy>> own_policies;
  std::vector<routing_policy*> router_policy{p.policy.get()};
  std::vector<centroid_policy*> router_band{band};
  if (c.routers > 1 && !p.more_routers)
    return status::invalid_argument("simulator: policy " + p.name + " cannot be run by " +
                                    std::to_string(c.routers) +
                                    " routers: it has no maker for the other routers' instances");
  for (uint32_t r = 1; r < c.routers; ++r) {
    auto made = p.more_routers(r);
    if (!made.ok()) return made.error();
    if (!*made || (*made)->name() != p.policy->name() || (*made)->workers() != D)
      return status::invalid_argument("simulator: router " + std::to_string(r) +
                                      "'s instance of policy " + p.name +
                                      " is not the same policy over the same workers");
    router_policy.push_back(made->get());
    router_band.push_back(dynamic_cast<centroid_policy*>(made->get()));
    own_policies.push_back(std::move(made).value());
  }
  auto engine = decode_engine::make(w, {D, c.max_batch, c.kv_capacity_tokens, c.cost});
  if (!engine.ok()) return engine.error();
  std::optional<signature_sample> sample;  // the online refit's, as the router keeps it
  if (p.refit.enabled) {
    auto made = signature_sample::make(
        p.refit.sample_size, p.spec->width(), p.refit.rule.seed,
        resolved_sample_horizon(p.refit.sample_size, p.refit.sample_horizon));
    if (!made.ok()) return made.error();
    sample.emplace(std::move(made).value());
  }

  const std::size_t N = w.requests.size();
  sim_metrics m;
  m.policy = p.name;
  m.requests = static_cast<uint32_t>(N);
  std::vector<request_state> rs(N);

  // ---- Prefill: FCFS over P workers, in arrival order; it does not depend on decode. With
  // prefix caching, a block counts as cached once the prefill that computed it has finished.
  std::priority_queue<double, std::vector<double>, std::greater<>> prefill_free;
  for (uint32_t i = 0; i < c.prefill_workers; ++i)
    prefill_free.push(0.0);
  std::unordered_map<uint64_t, double> block_ready;        // (prompt_id, block) -> time computed
  std::unordered_map<uint64_t, block_counts> block_cache;  // the block-level signature cache
  auto block_key = [](uint32_t prompt, uint32_t block) { return (uint64_t{prompt} << 32) | block; };
  uint64_t prompt_total = 0, prompt_cached = 0;
  for (std::size_t i = 0; i < N; ++i) {
    const sim_request& r = w.requests[i];
    const double start = std::max(r.arrival_s, prefill_free.top());
    prefill_free.pop();
    uint32_t uncached = r.prompt_tokens;
    if (c.prefix_caching) {
      // Only full blocks are cached, and only a leading run of them is a prefix hit.
      const uint32_t full_blocks = r.prompt_tokens / c.block_size;
      uint32_t hit = 0;
      while (hit < full_blocks) {
        auto it = block_ready.find(block_key(r.prompt_id, hit));
        if (it == block_ready.end() || it->second > start) break;
        ++hit;
      }
      uncached -= hit * c.block_size;
    }
    const double done = start + (c.prefill_base_ms + c.prefill_per_token_ms * uncached) / 1000.0;
    if (c.prefix_caching)
      for (uint32_t b = 0; b < r.prompt_tokens / c.block_size; ++b) {
        auto [it, fresh] = block_ready.emplace(block_key(r.prompt_id, b), done);
        if (!fresh) it->second = std::min(it->second, done);  // the earliest computation wins
      }
    prompt_total += r.prompt_tokens;
    prompt_cached += r.prompt_tokens - uncached;
    prefill_free.push(done);
    rs[i].handoff = done;
  }
  m.prefix_hit_fraction =
      prompt_total == 0 ? 0.0 : static_cast<double>(prompt_cached) / prompt_total;

  // ---- Decode: events in time order.
  std::priority_queue<event, std::vector<event>, std::greater<>> events;
  uint64_t seq = 0;
  auto push = [&](double t, event_kind k, uint32_t id) { events.push({t, seq++, k, id}); };
  for (std::size_t i = 0; i < N; ++i)
    push(rs[i].handoff, event_kind::route, static_cast<uint32_t>(i));

  std::vector<uint32_t> load(D, 0);  // the true in-flight count per worker
  std::vector<uint32_t> decisions(D, 0);
  // The routers' stale views (sim_config): per router, the shared vector of the last
  // load-sharing instant as it reads it (the true load, less its peers' decisions the vector does
  // not carry yet: load_sync_lag), and its own decisions since then. Unused when every view is
  // exact.
  const bool stale = c.routers > 1 && c.load_sync_ms > 0.0;
  const std::size_t R = stale ? c.routers : 0;
  std::vector<uint32_t> view(D, 0);
  std::vector<std::vector<uint32_t>> shared(R, std::vector<uint32_t>(D, 0));
  std::vector<std::vector<uint32_t>> own_since_sync(R, std::vector<uint32_t>(D, 0));
  // Per router, its decisions the shared vector does not carry yet (the lag intervals' and those
  // since the last instant): what the peer estimate scales (sim_config::peer_estimate).
  std::vector<std::vector<uint32_t>> own_unshared(R, std::vector<uint32_t>(D, 0));
  // Per router, the routers its peer estimate counts (sim_config::peer_estimate), as the node
  // counts them: from the decisions each sharing instant's vector shows (router_activity).
  const uint32_t fixed_routers = c.peer_estimate ? c.peer_estimate_routers : 0;
  std::vector<uint32_t> estimate_routers(R, fixed_routers > 0 ? fixed_routers : 1);
  router_activity activity(peer_activity_window_ms);
  std::vector<std::string> router_names(R);
  for (std::size_t r = 0; r < R; ++r)
    router_names[r] = "r" + std::to_string(r);
  // The last load_sync_lag intervals' decisions per router, oldest first (ring[h * R + r]).
  std::vector<std::vector<uint32_t>> ring(R * c.load_sync_lag, std::vector<uint32_t>(D, 0));
  std::size_t ring_head = 0;  // the oldest interval's slot
  uint64_t routed = 0;        // decisions so far: the next goes to router routed mod `deciding`
  const uint32_t deciding = c.routers_with_traffic > 0 ? c.routers_with_traffic : c.routers;
  std::optional<signature_builder> builder;
  if (p.signatures != signature_source::none) builder.emplace(p.spec);
  signature sig;
  std::vector<expert_id> prompt_ids;
  std::vector<decode_finish> finished;
  std::size_t completed = 0;
  std::size_t next_report = N / 20 + 1;
  auto on_finished = [&] {
    for (const decode_finish& f : finished) {
      --load[f.worker];
      ++completed;
      if (progress && completed >= next_report) {
        progress(static_cast<double>(completed) / static_cast<double>(N));
        next_report += N / 20 + 1;
      }
    }
    finished.clear();
  };
  auto schedule_step = [&](std::optional<double> end, uint32_t wi) {
    if (end) push(*end, event_kind::step_end, wi);
  };

  if (p.refit.enabled && N > 0) push(rs.front().handoff + p.refit.interval_s, event_kind::refit, 0);
  // The first sharing instant after time 0 (at 0 every view is the true, empty load).
  if (stale && N > 0) push(c.load_sync_ms / 1000.0, event_kind::load_sync, 0);
  uint64_t refit_runs = 0;

  while (!events.empty()) {
    const event ev = events.top();
    events.pop();
    switch (ev.kind) {
      case event_kind::route: {
        const uint32_t i = ev.id;
        const sim_request& r = w.requests[i];
        const uint32_t router = static_cast<uint32_t>(routed++ % deciding);
        route_input in;
        if (stale) {
          for (uint32_t k = 0; k < D; ++k)
            view[k] = shared[router][k] + own_since_sync[router][k] +
                      static_cast<uint32_t>(
                          peer_estimate(own_unshared[router][k], estimate_routers[router]));
          in.load = view;
        } else {
          in.load = load;
        }
        in.label = r.label;
        if (p.signatures == signature_source::prefill && c.prefix_caching) {
          // Sum the prompt's blocks from the block-level cache, computing the missing ones:
          // a prefix hit yields the same signature as a full recompute.
          const uint32_t blocks = (r.prompt_tokens + c.block_size - 1) / c.block_size;
          bool have_ids = false;
          for (uint32_t b = 0; b < blocks; ++b) {
            const uint64_t key = block_key(r.prompt_id, b);
            auto it = block_cache.find(key);
            if (it == block_cache.end()) {
              if (!have_ids) {
                w.source->prompt_experts(r.source, prompt_ids);
                have_ids = true;
              }
              const uint32_t end = std::min(r.prompt_tokens, (b + 1) * c.block_size);
              auto counted = block_counts::from_tokens(g, prompt_ids, b * c.block_size, end);
              if (!counted.ok()) return counted.error();
              // Partial last blocks are not cached (a KV cache shares full blocks only).
              if (end - b * c.block_size < c.block_size) {
                if (status s = builder->add(*counted); !s.ok()) return s;
                continue;
              }
              it = block_cache.emplace(key, std::move(counted).value()).first;
            }
            if (status s = builder->add(it->second); !s.ok()) return s;
          }
          builder->finish(sig);
          in.sig = &sig;
        } else if (p.signatures != signature_source::none) {
          const std::size_t row = w.prefill_row_of_request[i];
          const std::span<const uint32_t> counts =
              p.signatures == signature_source::prefill
                  ? w.prefill_of(i)
                  : std::span<const uint32_t>(*decode_counts).subspan(row * full, full);
          if (status s = builder->add_dense(counts); !s.ok()) return s;
          builder->finish(sig);
          in.sig = &sig;
        }
        auto d = router_policy[router]->route(in);
        if (!d.ok()) return d.error();
        rs[i].worker = d->worker;
        ++load[d->worker];
        ++decisions[d->worker];
        if (stale) {
          ++own_since_sync[router][d->worker];
          ++own_unshared[router][d->worker];
        }
        if (sample) (void)sample->add(sig);  // as the router does: a refused row is not sampled
        push(ev.t + c.kv_transfer_ms / 1000.0, event_kind::decode_arrival, i);
        break;
      }
      case event_kind::decode_arrival:
        schedule_step(engine->arrive(ev.id, rs[ev.id].worker, ev.t, finished), rs[ev.id].worker);
        on_finished();
        break;
      case event_kind::step_end:
        schedule_step(engine->end_step(ev.id, ev.t, finished), ev.id);
        on_finished();
        break;
      case event_kind::refit: {
        if (completed == N) break;  // nothing left to route: stop ticking
        // The node's refit (actors/refit_actor.cpp) on the simulated clock: same sample, same
        // rule, same candidate and validation, installed only when accepted; anything else
        // counts as rejected, as the node counts it.
        ++refit_runs;
        const auto current = band->centroids();
        bool installed = false;
        if (p.refit.rule.sample_shortfall(sample->size()).empty()) {
          auto out = refit_candidate(*sample, current.get(),
                                     p.refit.rule.options(*current, {}, refit_runs));
          installed = out.ok() && out->report.accepted;
          // The leader's accepted set reaches every router (at once: no announcement latency).
          for (centroid_policy* b : router_band)
            installed = installed && b->install(out->candidate).ok();
        }
        ++(installed ? m.refits : m.refits_rejected);
        push(ev.t + p.refit.interval_s, event_kind::refit, 0);
        break;
      }
      case event_kind::load_sync: {
        if (completed == N) break;  // nothing left to route: stop sharing
        if (c.load_sync_lag > 0) {  // the interval just ended replaces the oldest
          for (std::size_t r = 0; r < R; ++r)
            std::swap(ring[ring_head * R + r], own_since_sync[r]);
          ring_head = (ring_head + 1) % c.load_sync_lag;
        }
        const auto now_ms = static_cast<int64_t>(std::llround(ev.t * 1000.0));
        for (std::size_t r = 0; r < R; ++r) {
          // own_since_sync[r] now holds the decisions this instant's vector takes in.
          if (std::any_of(own_since_sync[r].begin(), own_since_sync[r].end(),
                          [](uint32_t n) { return n > 0; }))
            activity.on_decided(router_names[r], now_ms);
        }
        for (std::size_t r = 0; r < R; ++r) {
          if (c.peer_estimate && fixed_routers == 0)
            estimate_routers[r] = activity.active(router_names[r], now_ms);
          // The vector lacks every router's decisions of the last lag intervals; router r adds
          // back its own.
          for (uint32_t k = 0; k < D; ++k) {
            uint64_t missing = 0;
            for (std::size_t h = 0; h < c.load_sync_lag; ++h)
              for (std::size_t q = 0; q < R; ++q)
                missing += ring[h * R + q][k];
            uint64_t mine = 0;
            for (std::size_t h = 0; h < c.load_sync_lag; ++h)
              mine += ring[h * R + r][k];
            shared[r][k] =
                static_cast<uint32_t>((load[k] > missing ? load[k] - missing : 0) + mine);
            own_unshared[r][k] = static_cast<uint32_t>(mine);
          }
          std::fill(own_since_sync[r].begin(), own_since_sync[r].end(), 0u);
        }
        ++m.load_syncs;
        push(ev.t + c.load_sync_ms / 1000.0, event_kind::load_sync, 0);
        break;
      }
    }
  }

  // ---- Metrics.
  (void)report_run_figures(w, *engine, m);
  m.load_imbalance = engine->load_imbalance();
  m.inflight_imbalance = engine->inflight_imbalance();
  m.decision_cv = decision_cv(std::span<const uint32_t>(decisions));
  m.decisions = decisions;
  m.routers = c.routers;
  m.load_sync_ms = c.load_sync_ms;
  const double first_arrival = N > 0 ? w.requests.front().arrival_s : 0.0;
  double last_finish = 0;
  uint64_t out_tokens = 0;
  for (std::size_t i = 0; i < N; ++i) {
    last_finish = std::max(last_finish, engine->times(static_cast<uint32_t>(i)).finish);
    out_tokens += w.requests[i].output_tokens;
  }
  m.makespan_s = last_finish - first_arrival;
  if (m.makespan_s > 0) {
    m.throughput_tokens_s = static_cast<double>(out_tokens) / m.makespan_s;
    m.throughput_requests_s = static_cast<double>(N) / m.makespan_s;
  }
  if (progress && N > 0) progress(1.0);
  m.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return m;
}

result<std::vector<locality_point>> measure_locality(const workload& w,
                                                     std::span<const uint32_t> batch_sizes,
                                                     uint32_t batches, uint32_t steps,
                                                     uint64_t seed) {
  if (batches == 0 || steps == 0)
    return status::invalid_argument("locality: batches and steps must be >= 1");
  // One entry per distinct source request (a resampled trace repeats them).
  std::vector<std::vector<uint32_t>> by_label(w.labels.size());
  std::vector<uint32_t> all;
  std::unordered_map<uint64_t, bool> seen;
  for (std::size_t i = 0; i < w.requests.size(); ++i) {
    if (!seen.emplace(w.requests[i].source, true).second) continue;
    all.push_back(static_cast<uint32_t>(i));
    if (w.requests[i].label >= 0)
      by_label[static_cast<std::size_t>(w.requests[i].label)].push_back(static_cast<uint32_t>(i));
  }
  std::vector<std::size_t> labelled;
  for (std::size_t l = 0; l < by_label.size(); ++l)
    if (!by_label[l].empty()) labelled.push_back(l);
  if (labelled.empty())
    return status::invalid_argument("locality: the workload has no labelled requests");
  auto counter = distinct_expert_counter::make(w.geometry());
  if (!counter.ok()) return counter.error();
  const std::size_t stride = std::size_t{w.geometry().layers} * w.geometry().top_k;
  rng_engine rng(seed);
  std::vector<locality_point> out;
  std::vector<expert_id> ids;
  for (uint32_t b : batch_sizes) {
    if (b == 0) return status::invalid_argument("locality: batch sizes must be >= 1");
    locality_point point;
    point.batch = b;
    for (int mixed = 0; mixed < 2; ++mixed) {
      double sum = 0.0;
      for (uint32_t t = 0; t < batches; ++t) {
        // Distinct requests while the pool allows (a request twice in one batch would repeat
        // its own tokens and understate the distinct experts), then with replacement.
        std::vector<uint32_t> pool;
        if (mixed != 0) {
          pool = all;
        } else {
          pool = by_label[labelled[t % labelled.size()]];
        }
        std::vector<std::unique_ptr<decode_stream>> streams;
        for (uint32_t j = 0; j < b; ++j) {
          uint32_t i = 0;
          if (j < pool.size()) {
            std::swap(pool[j], pool[j + uniform_index(rng, pool.size() - j)]);
            i = pool[j];
          } else {
            i = pool[uniform_index(rng, pool.size())];
          }
          streams.push_back(w.source->open_decode(w.requests[i].source));
        }
        ids.resize(b * stride);
        for (uint32_t s = 0; s < steps; ++s) {
          for (uint32_t j = 0; j < b; ++j)
            streams[j]->next(ids.data() + j * stride);
          auto stats = counter->count(ids);
          if (!stats.ok()) return stats.error();
          sum += stats->mean_per_layer;
        }
      }
      (mixed != 0 ? point.mixed : point.same_domain) = sum / (double{1} * batches * steps);
    }
    out.push_back(point);
  }
  return out;
}

}  // namespace eldr
