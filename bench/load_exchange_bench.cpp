// load_exchange_bench: what one load-sharing interval costs a router and an authority
// (core/membership/load_exchange.hpp; cluster.load_sharing = "authority"), at the sizes of
// docs/scaling.md's model: W decode workers spread evenly over A authorities, R routers.
//
// Per interval a router sends each authority its workers' totals and receives each authority's
// vector; an authority applies R deltas and publishes one vector. Benchmarks, each one event:
//
// - vector_compose_all: a vector arrives, and the router composes the load of EVERY worker into
//   pool-sized arrays (what the router did up to this change: O(W) per vector, O(A x W) per
//   interval).
// - vector_compose_one: a vector arrives, and the router composes that vector's W / A workers
//   (load_overlay::compose_vector, what it does now).
// - interval_deltas_full: the router's loop over its workers that made one interval's deltas, one
//   per authority, with every worker's total (up to this change; per interval, not per authority).
// - interval_deltas: one interval's deltas as delta_outbox makes them, only the totals routed to
//   since the authority last included a delta: 10 decisions per interval, each delta included
//   before the next interval (the ledger's tracking, the deltas and the acknowledgements).
// - send_bookkeeping_full_ledger: the router's old per-authority bookkeeping of a send: a copy
//   of the whole ledger (W totals), compared with the last one sent and copied into the overlay's
//   history, per authority per interval.
// - send_bookkeeping: the same with the authority's W / A (worker, total) pairs, as now (the
//   pairs themselves are built by the interval's loop over the workers in both versions).
// - authority_delta: an authority applies one router's delta of W / A totals.
// - authority_publish: an authority publishes its vector of W / A workers with R routers known.
//
// Args: W, A (and R for the authority's). Data: every worker routed to, totals that grow by a
// few per interval. Fixed seeds. Smoke mode: W = 8, A = 2, R = 2.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_support.hpp"
#include "core/membership/load_exchange.hpp"

namespace {

using eldr::decision_ledger;
using eldr::load_authority;
using eldr::load_delta;
using eldr::load_overlay;
using eldr::load_vector;

// Workers are dealt to the authorities round robin, W / A each: authority a holds a, a + A, ...
// (snprintf: GCC 12 at -O3 warns falsely, -Wrestrict, on concatenating std::to_string.)
std::string name_of(char prefix, uint32_t i) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%c%u", prefix, i);
  return buf;
}

std::string authority_name(uint32_t a) {
  return name_of('n', a + 1);
}

decision_ledger busy_ledger(uint32_t workers, uint64_t seed) {
  decision_ledger l(workers);
  std::mt19937_64 rng(seed);
  for (uint32_t i = 0; i < 4 * workers; ++i)
    (void)l.on_route(static_cast<uint32_t>(rng() % workers));
  return l;
}

std::vector<std::pair<uint32_t, uint64_t>> totals_for(const decision_ledger& l, uint32_t a,
                                                      uint32_t authorities) {
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (uint32_t w = a; w < l.totals().size(); w += authorities)
    if (l.total(w) > 0) out.emplace_back(w, l.total(w));
  return out;
}

// A vector of authority a's workers, as its publish() would make it.
load_vector vector_of(uint32_t a, uint32_t workers, uint32_t authorities, uint64_t seq,
                      uint64_t included) {
  load_vector v;
  v.authority = authority_name(a);
  v.seq = seq;
  for (uint32_t w = a; w < workers; w += authorities)
    v.workers.push_back({w, 3 + w % 7, true});
  v.included["me"] = {1, included};
  return v;
}

// A router that has sent every authority one delta and holds every authority's vector.
struct router_fixture {
  uint32_t workers, authorities;
  decision_ledger ledger;
  load_overlay overlay;
  std::vector<load_vector> vectors;

  router_fixture(uint32_t w, uint32_t a) : workers(w), authorities(a), ledger(busy_ledger(w, 1)) {
    for (uint32_t i = 0; i < a; ++i) {
      overlay.sent(authority_name(i), 1, totals_for(ledger, i, a));
      vectors.push_back(vector_of(i, w, a, 1, 1));
      (void)overlay.on_vector(vectors.back(), "me", 1);
    }
  }
  // The next vector of authority i (a newer seq each time, so on_vector applies it).
  const load_vector& next(uint32_t i) {
    ++vectors[i].seq;
    return vectors[i];
  }
};

void sizes(benchmark::internal::Benchmark* b) {
  if (eldr::bench::smoke()) {
    b->Args({8, 2});
    return;
  }
  for (int64_t w : {1000, 10000})
    for (int64_t a : {10, 100})
      b->Args({w, a});
}

void authority_sizes(benchmark::internal::Benchmark* b) {
  if (eldr::bench::smoke()) {
    b->Args({8, 2, 2});
    return;
  }
  for (int64_t w : {1000, 10000})
    for (int64_t a : {10, 100})
      b->Args({w, a, a});  // every node a router and an authority
}

void vector_compose_all(benchmark::State& state) {
  router_fixture f(static_cast<uint32_t>(state.range(0)), static_cast<uint32_t>(state.range(1)));
  uint32_t i = 0;
  for (auto _ : state) {
    (void)f.overlay.on_vector(f.next(i), "me", 1);
    std::vector<uint32_t> load(f.workers, 0);
    std::vector<uint8_t> covered(f.workers, 0);
    f.overlay.compose(f.ledger, load, covered);
    benchmark::DoNotOptimize(load.data());
    i = (i + 1) % f.authorities;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(vector_compose_all)->Apply(sizes)->ArgNames({"W", "A"});

void vector_compose_one(benchmark::State& state) {
  router_fixture f(static_cast<uint32_t>(state.range(0)), static_cast<uint32_t>(state.range(1)));
  uint32_t i = 0;
  for (auto _ : state) {
    const auto& v = f.next(i);
    (void)f.overlay.on_vector(v, "me", 1);
    auto part = f.overlay.compose_vector(v.authority, f.ledger);
    benchmark::DoNotOptimize(part.data());
    i = (i + 1) % f.authorities;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(vector_compose_one)->Apply(sizes)->ArgNames({"W", "A"});

// The router's decisions per interval in interval_deltas: docs/scaling.md's example router, 2,000
// decisions/s at load_sync_ms = 5.
constexpr uint32_t decisions_per_interval = 10;

void interval_deltas_full(benchmark::State& state) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  const auto authorities = static_cast<uint32_t>(state.range(1));
  const decision_ledger ledger = busy_ledger(workers, 3);
  std::map<uint32_t, std::string> authority_of;
  for (uint32_t w = 0; w < workers; ++w)
    authority_of[w] = authority_name(w % authorities);
  for (auto _ : state) {
    // The loop as it was (deltas_by_authority): every worker routed to, every interval.
    std::map<std::string, load_delta> out;
    for (const auto& [w, a] : authority_of)
      if (ledger.total(w) > 0) out[a].totals.emplace_back(w, ledger.total(w));
    benchmark::DoNotOptimize(out.size());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(interval_deltas_full)->Apply(sizes)->ArgNames({"W", "A"});

void interval_deltas(benchmark::State& state) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  const auto authorities = static_cast<uint32_t>(state.range(1));
  decision_ledger ledger = busy_ledger(workers, 3);
  (void)ledger.take_routed();
  std::vector<std::string> names(authorities);
  for (uint32_t a = 0; a < authorities; ++a)
    names[a] = authority_name(a);
  auto authority_of = [&](uint32_t w) { return &names[w % authorities]; };
  eldr::delta_outbox outbox;
  std::mt19937_64 rng(5);
  for (auto _ : state) {
    // This interval's decisions; the previous interval's deltas arrived and were included.
    for (uint32_t i = 0; i < decisions_per_interval; ++i)
      (void)ledger.on_route(static_cast<uint32_t>(rng() % workers));
    auto out = outbox.interval(ledger, ledger.take_routed(), authority_of);
    for (const auto& [a, d] : out)
      outbox.acknowledged(a, d.seq);
    benchmark::DoNotOptimize(out.size());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(interval_deltas)->Apply(sizes)->ArgNames({"W", "A"});

void send_bookkeeping_full_ledger(benchmark::State& state) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  const auto authorities = static_cast<uint32_t>(state.range(1));
  decision_ledger ledger = busy_ledger(workers, 2);
  std::vector<std::vector<uint64_t>> last(authorities);  // the old delta_stream::totals
  std::vector<std::vector<uint64_t>> history(authorities);
  uint32_t i = 0;
  for (auto _ : state) {
    (void)ledger.on_route(i % workers);  // something changed since the last send
    std::vector<uint64_t> totals(ledger.totals().begin(), ledger.totals().end());
    const bool same = totals == last[i];
    benchmark::DoNotOptimize(same);
    last[i] = std::move(totals);
    history[i].assign(ledger.totals().begin(), ledger.totals().end());
    i = (i + 1) % authorities;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(send_bookkeeping_full_ledger)->Apply(sizes)->ArgNames({"W", "A"});

void send_bookkeeping(benchmark::State& state) {
  const auto workers = static_cast<uint32_t>(state.range(0));
  const auto authorities = static_cast<uint32_t>(state.range(1));
  const decision_ledger ledger = busy_ledger(workers, 2);
  // The deltas' pairs, made by the router's interval loop in both versions (not timed).
  std::vector<std::vector<std::pair<uint32_t, uint64_t>>> pairs(authorities), last(authorities);
  for (uint32_t a = 0; a < authorities; ++a)
    pairs[a] = totals_for(ledger, a, authorities);
  load_overlay overlay;
  uint32_t i = 0;
  uint64_t seq = 0;
  for (auto _ : state) {
    if (!pairs[i].empty()) ++pairs[i].front().second;  // something changed since the last send
    auto totals = pairs[i];                            // the delta's copy kept for the next tick
    const bool same = totals == last[i];
    benchmark::DoNotOptimize(same);
    last[i] = totals;
    overlay.sent(authority_name(i), ++seq, std::move(totals));
    i = (i + 1) % authorities;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(send_bookkeeping)->Apply(sizes)->ArgNames({"W", "A"});

// An authority of W / A workers that has heard from R routers.
struct authority_fixture {
  load_authority authority{"n1", 0};
  std::vector<load_delta> deltas;

  authority_fixture(uint32_t workers, uint32_t authorities, uint32_t routers) {
    for (uint32_t w = 0; w < workers; w += authorities)
      authority.add_worker(w, 0);
    for (uint32_t r = 0; r < routers; ++r) {
      load_delta d;
      d.router = name_of('r', r);
      d.incarnation = 1;
      d.seq = 1;
      d.totals = totals_for(busy_ledger(workers, 10 + r), 0, authorities);
      authority.on_delta(d);
      deltas.push_back(std::move(d));
    }
  }
};

void authority_delta(benchmark::State& state) {
  authority_fixture f(static_cast<uint32_t>(state.range(0)), static_cast<uint32_t>(state.range(1)),
                      static_cast<uint32_t>(state.range(2)));
  uint32_t r = 0;
  for (auto _ : state) {
    auto& d = f.deltas[r];
    ++d.seq;
    for (auto& [w, t] : d.totals)
      t += 1;  // every worker routed to once more since the last interval
    f.authority.on_delta(d);
    r = (r + 1) % static_cast<uint32_t>(f.deltas.size());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(authority_delta)->Apply(authority_sizes)->ArgNames({"W", "A", "R"});

void authority_publish(benchmark::State& state) {
  authority_fixture f(static_cast<uint32_t>(state.range(0)), static_cast<uint32_t>(state.range(1)),
                      static_cast<uint32_t>(state.range(2)));
  int64_t now = 0;
  for (auto _ : state) {
    auto v = f.authority.publish(++now);
    benchmark::DoNotOptimize(v.workers.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(authority_publish)->Apply(authority_sizes)->ArgNames({"W", "A", "R"});

}  // namespace

BENCHMARK_MAIN();
