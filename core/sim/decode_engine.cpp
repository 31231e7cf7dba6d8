// decode_engine: admission, continuous batching, step pricing and completion on D decode workers,
// and the latency figures of what it served.
#include "core/sim/decode_engine.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace eldr {

result<decode_engine> decode_engine::make(const workload& w, const decode_engine_config& c) {
  if (c.workers == 0) return status::invalid_argument("decode engine: workers must be >= 1");
  if (c.max_batch == 0) return status::invalid_argument("decode engine: max batch must be >= 1");
  auto cost = decode_cost_model::make(c.cost);
  if (!cost.ok()) return cost.error();
  auto counter = distinct_expert_counter::make(w.geometry());
  if (!counter.ok()) return counter.error();
  return decode_engine(w, c, std::move(cost).value(), std::move(counter).value());
}

decode_engine::decode_engine(const workload& w, const decode_engine_config& c,
                             decode_cost_model cost, distinct_expert_counter counter)
    : w_(&w),
      c_(c),
      cost_(std::move(cost)),
      counter_(std::move(counter)),
      workers_(c.workers),
      times_(w.requests.size()) {}

std::optional<double> decode_engine::arrive(uint32_t request, uint32_t worker, double t,
                                            std::vector<decode_finish>& finished) {
  account_to(t);
  decode_times& times = times_[request];
  times.arrival = t;
  if (w_->requests[request].output_tokens == 0) {  // nothing to decode
    times.first_token = times.finish = t;
    finished.push_back({request, worker, t});
    return std::nullopt;
  }
  worker_state& ws = workers_[worker];
  ws.waiting.push_back(request);
  if (ws.stepping) return std::nullopt;
  return start_step(worker, t);
}

std::optional<double> decode_engine::start_step(uint32_t wi, double t) {
  worker_state& ws = workers_[wi];
  while (!ws.waiting.empty() && ws.running.size() < c_.max_batch) {
    const sim_request& r = w_->requests[ws.waiting.front()];
    const uint64_t need = uint64_t{r.prompt_tokens} + r.output_tokens;
    if (c_.kv_capacity_tokens > 0 && ws.kv_used + need > c_.kv_capacity_tokens &&
        !ws.running.empty())
      break;
    ws.kv_used += need;
    const uint32_t id = ws.waiting.front();
    ws.waiting.pop_front();
    ws.running.push_back({id, 0, w_->source->open_decode(r.source)});
  }
  ws.stepping = !ws.running.empty();
  if (!ws.stepping) return std::nullopt;
  const model_geometry& g = w_->geometry();
  const std::size_t stride = std::size_t{g.layers} * g.top_k;
  step_ids_.resize(ws.running.size() * stride);
  batch_stats batch;
  batch.sequences = static_cast<uint32_t>(ws.running.size());
  for (std::size_t j = 0; j < ws.running.size(); ++j) {
    running_request& rr = ws.running[j];
    rr.stream->next(step_ids_.data() + j * stride);
    batch.context_tokens += uint64_t{w_->requests[rr.request].prompt_tokens} + rr.generated;
  }
  auto stats = counter_.count(step_ids_);
  // Ids come from validated traces or the generator: counting cannot fail.
  batch.distinct_experts = stats.ok() ? stats->total : 0;
  distinct_sum_ += stats.ok() ? stats->mean_per_layer : 0.0;
  batch_sum_ += batch.sequences;
  ++steps_;
  ws.last_step_ms = cost_.step_latency_ms(batch);
  return t + ws.last_step_ms / 1000.0;
}

std::optional<double> decode_engine::end_step(uint32_t wi, double t,
                                              std::vector<decode_finish>& finished) {
  account_to(t);
  worker_state& ws = workers_[wi];
  ws.tokens += ws.running.size();
  std::size_t kept = 0;
  for (std::size_t j = 0; j < ws.running.size(); ++j) {
    running_request& rr = ws.running[j];
    const uint32_t i = rr.request;
    const sim_request& r = w_->requests[i];
    if (++rr.generated == 1) times_[i].first_token = t;
    if (rr.generated >= r.output_tokens) {
      ws.kv_used -= uint64_t{r.prompt_tokens} + r.output_tokens;
      times_[i].finish = t;
      finished.push_back({i, wi, t});
      continue;
    }
    if (kept != j) ws.running[kept] = std::move(rr);
    ++kept;
  }
  ws.running.resize(kept);
  return start_step(wi, t);
}

void decode_engine::account_to(double t) {
  // O(workers): before the counts change at t.
  if (!std::isfinite(t) || !(t > accounted_t_)) return;
  std::size_t max_n = 0, sum = 0;
  for (const worker_state& ws : workers_) {
    const std::size_t n = ws.running.size() + ws.waiting.size();
    max_n = std::max(max_n, n);
    sum += n;
  }
  const double dt = t - accounted_t_;
  inflight_max_integral_ += dt * static_cast<double>(max_n);
  inflight_mean_integral_ += dt * static_cast<double>(sum) / static_cast<double>(workers_.size());
  accounted_t_ = t;
}

double decode_engine::inflight_imbalance() const {
  return inflight_mean_integral_ > 0.0 ? inflight_max_integral_ / inflight_mean_integral_ : 1.0;
}

double decode_engine::inflight_mean() const {
  return accounted_t_ > 0.0 ? inflight_mean_integral_ / accounted_t_ : 0.0;
}

double decode_engine::distinct_experts_per_layer() const {
  return steps_ == 0 ? 0.0 : distinct_sum_ / static_cast<double>(steps_);
}

double decode_engine::batch_size_mean() const {
  return steps_ == 0 ? 0.0 : batch_sum_ / static_cast<double>(steps_);
}

double decode_engine::load_imbalance() const {
  uint64_t max_tokens = 0, sum_tokens = 0;
  for (const worker_state& ws : workers_) {
    max_tokens = std::max(max_tokens, ws.tokens);
    sum_tokens += ws.tokens;
  }
  return sum_tokens == 0
             ? 1.0
             : static_cast<double>(max_tokens) * workers_.size() / static_cast<double>(sum_tokens);
}

latency_summary summarize_latency(const workload& w, const decode_engine& engine,
                                  std::span<const uint32_t> requests) {
  latency_summary s;
  std::vector<double> tpot, ttft;
  for (uint32_t i : requests) {
    const sim_request& r = w.requests[i];
    const decode_times& t = engine.times(i);
    if (t.finish < 0.0) {
      ++s.incomplete;
      continue;
    }
    ++s.completed;
    if (r.output_tokens == 0) continue;
    ttft.push_back((t.first_token - r.arrival_s) * 1000.0);
    if (r.output_tokens >= 2)
      tpot.push_back((t.finish - t.first_token) * 1000.0 / (r.output_tokens - 1));
  }
  s.tpot_p50_ms = percentile(tpot, 0.50);
  s.tpot_p95_ms = percentile(tpot, 0.95);
  s.tpot_p99_ms = percentile(tpot, 0.99);
  s.ttft_p50_ms = percentile(ttft, 0.50);
  s.ttft_p99_ms = percentile(ttft, 0.99);
  return s;
}

latency_summary summarize_latency(const workload& w, const decode_engine& engine) {
  std::vector<uint32_t> all(w.requests.size());
  std::iota(all.begin(), all.end(), 0u);
  return summarize_latency(w, engine, all);
}

double percentile(std::vector<double>& values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

}  // namespace eldr
