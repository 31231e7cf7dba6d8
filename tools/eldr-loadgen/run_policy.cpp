// run_policy: one policy's run, its threads and its figures (run_policy.hpp).
#include "tools/eldr-loadgen/run_policy.hpp"

#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/eldr-loadgen/decode_emulator.hpp"
#include "tools/eldr-loadgen/decode_loop.hpp"
#include "tools/eldr-loadgen/generator.hpp"
#include "tools/eldr-loadgen/hot_swap.hpp"
#include "tools/eldr-loadgen/prepare_pipeline.hpp"
#include "tools/eldr-loadgen/route_book.hpp"
#include "tools/eldr-loadgen/route_socket.hpp"

namespace eldr::loadgen {
namespace {

// The figures that do not come from the route book: the offered rate, the prefill emulation's,
// and (unless --route-only) the decode emulation's.
void summarize_run(const session& s, const prefill_totals& prefill, const decode_emulator* emu,
                   const decode_stats& dstats, policy_result& res) {
  const loadgen_options& o = *s.o;
  const workload& w = *s.w;
  const uint32_t N = static_cast<uint32_t>(w.requests.size());
  // Offered in wall time, like route_rps: the model-time rate times the time scale.
  if (N > 1 && w.requests.back().arrival_s > w.requests.front().arrival_s)
    res.offered_rps =
        (N - 1) / (w.requests.back().arrival_s - w.requests.front().arrival_s) * o.time_scale;
  res.kv_blocks_stored = prefill.kv_blocks_stored;
  res.kv_blocks_removed = prefill.kv_blocks_removed;
  res.prefix_hit_fraction = prefill.blocks_total > 0 ? static_cast<double>(prefill.blocks_hit) /
                                                           static_cast<double>(prefill.blocks_total)
                                                     : 0.0;
  if (emu == nullptr) return;
  const latency_summary ls = report_run_figures(w, emu->engine(), res);
  res.completed = ls.completed;
  res.incomplete = ls.incomplete;
  res.token_imbalance = emu->load_imbalance();
  res.inflight_imbalance = emu->inflight_imbalance();
  res.inflight_mean = emu->inflight_mean();
  res.worker_messages += dstats.messages;
  res.worker_errors += dstats.errors;
}

}  // namespace

result<policy_result> run_policy(session& s, const std::string& policy, uint32_t run_index,
                                 const std::atomic<bool>& stop) {
  const loadgen_options& o = *s.o;
  const workload& w = *s.w;
  const uint32_t D = o.decode_workers;
  const uint32_t N = static_cast<uint32_t>(w.requests.size());
  const std::string run_id = "r" + std::to_string(run_index) + "." + s.id_nonce;
  policy_result res;
  res.policy = policy;
  res.decisions.assign(D, 0);

  auto route =
      route_socket::connect(s.ctx, s.route_endpoints, o.router_weights, o.route_timeout_ms);
  if (!route.ok()) return route.error();
  client_options co;
  co.timeout_ms = o.route_timeout_ms;
  std::unique_ptr<worker_client> finisher;  // route-only: finishes every decided request
  if (o.route_only) {
    auto wc = worker_client::connect(s.worker_endpoint, co);
    if (!wc.ok()) return wc.error();
    finisher = std::move(wc).value();
  }

  // Fresh prefill caches per run, so every policy sees the same hits; the node is told.
  for (uint32_t p = 0; p < o.prefill_workers; ++p) {
    kv_event cleared;
    cleared.type = kv_event_type::all_blocks_cleared;
    s.publishers[p].publish({cleared});
  }

  // Preparation, ahead of the timed phase (see prepare_pipeline).
  prepare_pipeline prep(s, run_id);
  prep.start(stop);
  if (prep.failed()) {
    prep.stop();
    return prep.failure();
  }

  std::unique_ptr<decode_emulator> emu;
  if (!o.route_only) {
    decode_emulator_config dc;
    dc.workers = D;
    dc.max_batch = o.max_batch;
    dc.kv_capacity_tokens = o.kv_capacity_tokens;
    dc.cost = o.cost;
    auto e = decode_emulator::make(w, dc);
    if (!e.ok()) return e.error();
    emu = std::move(e).value();
  }

  // The hot swap (--swap-at), for the eldr policy: its admin client connects before the clock
  // starts; its own socket and thread leave the route socket's timing alone.
  const bool swapping = o.swap_at.has_value() && policy == "eldr" && s.have_imported;
  const uint64_t epoch_before = s.current_epoch;
  std::unique_ptr<hot_swap> swap;
  if (swapping) {
    auto h = hot_swap::prepare(s);
    if (!h.ok()) return h.error();
    swap = std::move(h).value();
  }

  run_clock clock;
  clock.scale = o.time_scale;
  handoff_queue q;
  decode_stats dstats;
  std::thread decoder;
  if (emu) decoder = std::thread([&] { decode_loop(s, *emu, q, clock, stop, run_id, dstats); });
  if (swap) swap->start(clock, *o.swap_at, stop);

  route_book book(run_id, N, D, o.warmup_s);
  generator gen(s, prep, **route, book, clock, emu ? &q : nullptr, finisher.get(), res);
  // Below N, the preparing thread keeps encoding during the run, on the cores the nodes measured
  // beside it use too: said here and in the report, so that no figure hides it.
  res.prepared_at_start = prep.ready();
  if (res.prepared_at_start < N)
    say(o, "  " + std::to_string(res.prepared_at_start) + " of " + std::to_string(N) +
               " requests prepared before the clock (--prepare-budget-mib full): the rest are "
               "prepared during the run");
  // A marker for whoever samples the nodes around the run (bench/cluster_bench.py's fan-in case):
  // the preparation above may take seconds, so "playing" is not yet the first request.
  say(o, "  timed phase begins");
  const auto t0 = wall_clock::now();
  const double cpu0 = process_cpu_s();
  const status failure = gen.run(stop);
  prep.stop();
  if (swap) swap->finish();
  res.interrupted = stop.load();
  if (decoder.joinable()) {
    {
      std::lock_guard lock(q.mu);
      q.producer_done = true;
    }
    q.cv.notify_one();
    decoder.join();
  }
  if (!failure.ok()) return failure;
  if (swap) {
    res.swap = swap->measure(book.records(), epoch_before);
    if (swap->imported()) s.current_epoch = swap->epoch_after();
  }
  res.wall_s = std::chrono::duration<double>(wall_clock::now() - t0).count();
  res.cpu_s = process_cpu_s() - cpu0;

  // Results.
  res.errors += res.error_replies + res.timeouts;
  book.summarize(res);
  summarize_run(s, prep.totals(), emu.get(), dstats, res);
  return res;
}

}  // namespace eldr::loadgen
