// prepare_pipeline: the preparing thread (prepare_pipeline.hpp).
#include "tools/eldr-loadgen/prepare_pipeline.hpp"

#include <algorithm>
#include <chrono>

#include "cluster/wire/counts_message.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "tools/eldr-loadgen/prefill_emulator.hpp"

namespace eldr::loadgen {

prepare_pipeline::prepare_pipeline(const session& s, std::string run_id)
    : s_(s),
      run_id_(std::move(run_id)),
      budget_bytes_(static_cast<std::size_t>(std::max<uint64_t>(1, s.o->prepare_budget_mib)) << 20),
      items_(s.w->requests.size()) {}

void prepare_pipeline::start(const std::atomic<bool>& stop) {
  const uint32_t N = static_cast<uint32_t>(items_.size());
  thread_ = std::thread([this] { run(); });
  std::unique_lock lock(mu_);
  while (!(ready_.load() >= N || bytes_.load() >= budget_bytes_ || failed_.load() || stop.load()))
    cv_.wait_for(lock, std::chrono::milliseconds(20));
}

void prepare_pipeline::stop() {
  quit_.store(true);
  { std::lock_guard lock(mu_); }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void prepare_pipeline::wait_for(uint32_t i, const std::atomic<bool>& stop) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, std::chrono::microseconds(200),
               [&] { return ready_.load() > i || failed_.load() || stop.load(); });
}

void prepare_pipeline::release(uint32_t i) {
  prepared_request& pr = items_[i];
  const std::size_t freed = pr.footprint();
  pr = prepared_request{};
  if (bytes_.fetch_sub(freed) >= budget_bytes_) cv_.notify_all();
}

void prepare_pipeline::run() {
  const loadgen_options& o = *s_.o;
  const workload& w = *s_.w;
  const model_geometry& g = w.geometry();
  const uint32_t N = static_cast<uint32_t>(items_.size());
  std::vector<prefix_cache> caches;
  for (uint32_t p = 0; p < o.prefill_workers; ++p)
    caches.emplace_back(o.prefill_cache_blocks, o.block_size);
  prefill_clock prefill(o.prefill_workers, o.route_only ? 0.0 : o.prefill_base_ms,
                        o.route_only ? 0.0 : o.prefill_per_token_ms);
  std::vector<expert_id> ids;
  for (uint32_t i = 0; i < N && !quit_.load(); ++i) {
    if (bytes_.load() >= budget_bytes_) {
      std::unique_lock lock(mu_);
      // The consumer frees memory without the lock: wait in short slices, not for a notify
      // that may come between the check and the wait.
      while (bytes_.load() >= budget_bytes_ && !quit_.load())
        cv_.wait_for(lock, std::chrono::milliseconds(1));
      if (quit_.load()) break;
    }
    const sim_request& r = w.requests[i];
    std::shared_ptr<const prompt_plan> plan;
    if (auto it = s_.plans.find(r.source); it != s_.plans.end()) plan = it->second;
    if (!plan) {
      auto made = make_plan(w, r, o.block_size, o.send_counts, ids);
      if (!made.ok()) {
        failure_ = made.error();
        failed_.store(true);
        break;
      }
      plan = std::move(made).value();
    }
    // A prefix-aware prefill router: a prompt's first block picks its prefill worker.
    const uint32_t pw =
        plan->hashes.empty() ? 0 : static_cast<uint32_t>(plan->hashes[0] % o.prefill_workers);
    const prefill_outcome po = caches[pw].prefill(plan->hashes, plan->tokens);
    for (const kv_event& e : po.events)
      (e.type == kv_event_type::block_stored ? totals_.kv_blocks_stored
                                             : totals_.kv_blocks_removed) += e.block_hashes.size();
    totals_.blocks_total += plan->hashes.size();
    totals_.blocks_hit += po.hit_blocks;
    route_request req;
    req.id = run_id_ + "-" + std::to_string(i);
    req.model = s_.model;
    req.block_hashes = plan->hashes;
    if (r.label >= 0) req.label = static_cast<uint32_t>(r.label);
    const std::size_t first_counted = o.counts_of_hits ? 0 : po.hit_blocks;
    if (o.counts_of_hits) req.cached_blocks = po.hit_blocks;
    if (o.send_counts && first_counted < plan->hashes.size()) {
      counts_message m;
      m.geometry = g;
      for (std::size_t b = first_counted; b < plan->hashes.size(); ++b) {
        counts_block cb;
        cb.hash = plan->hashes[b];
        if (b > 0) cb.parent = plan->hashes[b - 1];
        cb.counts = plan->counts[b];
        m.blocks.push_back(std::move(cb));
      }
      req.counts = std::move(m);
    }
    const uint32_t uncached =
        r.prompt_tokens - std::min(r.prompt_tokens, po.hit_blocks * o.block_size);
    prepared_request& pr = items_[i];
    pr.handoff = prefill.handoff(r.arrival_s, uncached);
    pr.publisher = pw;
    pr.kv_payload = publisher::encode_events(po.events);
    pr.route_bytes = encode_route_request(req);
    bytes_.fetch_add(pr.footprint());
    ready_.store(i + 1, std::memory_order_release);
    if (((i + 1) & 63) == 0 || i + 1 == N) cv_.notify_all();
  }
  cv_.notify_all();
}

}  // namespace eldr::loadgen
