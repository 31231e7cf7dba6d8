// simulator_bench: the run time of one simulated policy over the paper's workload size -- 7,200
// requests of 512 output tokens on 16 decode workers (8 prefill), qwen-task synthetic workload
// (48 layers x 128 experts, top-8) at 40 req/s -- one core, as eldr-sim runs it.
//
// - simulate/rr, simulate/jsq, simulate/eldr: one whole simulation per iteration (workload and
//   ELDR's calibration fit are prepared once, outside the timing). Counters: decode steps,
//   simulated ids per second.
// Smoke mode: 60 requests of 16 tokens on 4 decode workers.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "bench/bench_support.hpp"
#include "core/sim/sim_policies.hpp"
#include "core/sim/simulator.hpp"
#include "core/sim/synthetic.hpp"
#include "core/sim/workload.hpp"

namespace {

struct fixture {
  eldr::workload w;
  std::unique_ptr<eldr::policy_factory> factory;
  eldr::sim_config config;
};

fixture& shared_fixture() {
  static fixture* f = [] {
    const bool smoke = eldr::bench::smoke();
    auto p = eldr::synthetic_preset("qwen-task").value();
    p.prompt_min = 4;
    p.prompt_max = 1024;
    p.output_min = p.output_max = smoke ? 16 : 512;
    const uint32_t requests = smoke ? 60 : 7200, calibration = smoke ? 40 : 1000;
    p.requests = requests + calibration;
    p.seed = 1;
    auto model =
        std::make_shared<const eldr::synthetic_model>(eldr::synthetic_model::make(p).value());
    eldr::workload_options o;
    o.requests = requests;
    o.calibration = calibration;
    o.rate_rps = 40.0;
    o.seed = 1;
    auto* out = new fixture{
        eldr::make_workload(eldr::make_synthetic_source(model), 0, o).value(), nullptr, {}};
    out->config.decode_workers = smoke ? 4 : 16;
    eldr::policy_factory_options fo;
    fo.workers = out->config.decode_workers;
    fo.pairs = smoke ? 200 : eldr::default_rho_pairs;
    out->factory =
        std::make_unique<eldr::policy_factory>(eldr::policy_factory::make(out->w, fo).value());
    return out;
  }();
  return *f;
}

void simulate_policy(benchmark::State& state, const std::string& name) {
  fixture& f = shared_fixture();
  uint64_t steps = 0, ids = 0;
  for (auto _ : state) {
    state.PauseTiming();
    eldr::sim_policy p = f.factory->build(name).value();
    state.ResumeTiming();
    auto m = eldr::simulate(f.w, f.config, p);
    if (!m.ok()) {
      state.SkipWithError(m.error().to_string().c_str());
      return;
    }
    steps = m->decode_steps;
    ids = 0;
    for (const eldr::sim_request& r : f.w.requests)
      ids += uint64_t{r.output_tokens} * f.w.geometry().layers * f.w.geometry().top_k;
    benchmark::DoNotOptimize(m->tpot_p50_ms);
  }
  state.counters["decode_steps"] = static_cast<double>(steps);
  state.counters["ids_per_s"] =
      benchmark::Counter(static_cast<double>(ids), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(simulate_policy, rr, std::string("rr"))->Unit(benchmark::kSecond)->Iterations(1);
BENCHMARK_CAPTURE(simulate_policy, jsq, std::string("jsq"))
    ->Unit(benchmark::kSecond)
    ->Iterations(1);
BENCHMARK_CAPTURE(simulate_policy, eldr, std::string("eldr"))
    ->Unit(benchmark::kSecond)
    ->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
