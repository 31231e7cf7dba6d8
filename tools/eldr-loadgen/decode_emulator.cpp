// decode_emulator: continuous batching on D emulated decode workers (core/simulator's decode
// model over an injected clock).
#include "tools/eldr-loadgen/decode_emulator.hpp"

#include <algorithm>
#include <cmath>

#include "core/simulator.hpp"

namespace eldr::loadgen {

result<std::unique_ptr<decode_emulator>> decode_emulator::make(const workload& w,
                                                               const decode_emulator_config& c) {
  if (c.workers == 0) return status::invalid_argument("decode emulator: workers must be >= 1");
  if (c.max_batch == 0) return status::invalid_argument("decode emulator: max batch must be >= 1");
  auto cost = decode_cost_model::make(c.cost);
  if (!cost.ok()) return cost.error();
  auto counter = distinct_expert_counter::make(w.geometry());
  if (!counter.ok()) return counter.error();
  return std::unique_ptr<decode_emulator>(
      new decode_emulator(w, c, std::move(cost).value(), std::move(counter).value()));
}

decode_emulator::decode_emulator(const workload& w, const decode_emulator_config& c,
                                 decode_cost_model cost, distinct_expert_counter counter)
    : w_(&w),
      c_(c),
      cost_(std::move(cost)),
      counter_(std::move(counter)),
      workers_(c.workers),
      times_(w.requests.size()) {}

void decode_emulator::push(double t, kind k, uint32_t id, uint32_t worker) {
  events_.push({t, k == kind::arrival ? uint8_t{0} : uint8_t{1}, seq_++, k, id, worker});
}

void decode_emulator::account(double t) {
  if (!std::isfinite(t) || !(t > accounted_t_)) return;
  uint32_t max_n = 0;
  uint64_t sum = 0;
  for (const worker_state& ws : workers_) {
    max_n = std::max(max_n, ws.assigned);
    sum += ws.assigned;
  }
  const double dt = t - accounted_t_;
  inflight_max_integral_ += dt * max_n;
  inflight_mean_integral_ += dt * static_cast<double>(sum) / static_cast<double>(workers_.size());
  accounted_t_ = t;
}

void decode_emulator::arrive(uint32_t request, uint32_t worker, double t) {
  ++workers_[worker].in_transfer;
  push(std::max(t, now_), kind::arrival, request, worker);
}

double decode_emulator::next_event_time() const {
  return events_.empty() ? std::numeric_limits<double>::infinity() : events_.top().t;
}

void decode_emulator::advance_to(double t, std::vector<decode_finish>& finished) {
  while (!events_.empty() && events_.top().t <= t) {
    const event ev = events_.top();
    events_.pop();
    now_ = std::max(now_, ev.t);
    if (ev.k == kind::step_end) {
      end_step(ev.id, ev.t, finished);
      continue;
    }
    worker_state& ws = workers_[ev.worker];
    --ws.in_transfer;
    // In flight at the worker from its arrival event on: exact in model time, whereas arrive()
    // is called whenever the live loop gets round to it.
    account(ev.t);
    ++ws.assigned;
    times_[ev.id].arrival = ev.t;
    if (w_->requests[ev.id].output_tokens == 0) {  // nothing to decode
      account(ev.t);
      --ws.assigned;
      times_[ev.id].first_token = times_[ev.id].finish = ev.t;
      finished.push_back({ev.id, ev.worker, ev.t});
      continue;
    }
    ws.waiting.push_back(ev.id);
    if (!ws.stepping) start_step(ev.worker, ev.t);
  }
  now_ = std::max(now_, t);
  if (std::isfinite(now_)) account(now_);
}

void decode_emulator::start_step(uint32_t wi, double t) {
  worker_state& ws = workers_[wi];
  // Admit first come, first served while the batch and the KV capacity allow; a request larger
  // than the whole capacity runs alone rather than never (as core/simulator does).
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
  if (ws.running.empty()) {
    ws.stepping = false;
    return;
  }
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
  ws.stepping = true;
  ws.last_step_ms = cost_.step_latency_ms(batch);
  push(t + ws.last_step_ms / 1000.0, kind::step_end, wi, wi);
}

void decode_emulator::end_step(uint32_t wi, double t, std::vector<decode_finish>& finished) {
  worker_state& ws = workers_[wi];
  ws.tokens += ws.running.size();
  std::size_t kept = 0;
  for (std::size_t j = 0; j < ws.running.size(); ++j) {
    running_request& rr = ws.running[j];
    const uint32_t i = rr.request;
    const sim_request& r = w_->requests[i];
    if (++rr.generated == 1) times_[i].first_token = t;
    if (rr.generated >= r.output_tokens) {
      account(t);
      --ws.assigned;
      ws.kv_used -= uint64_t{r.prompt_tokens} + r.output_tokens;
      times_[i].finish = t;
      finished.push_back({i, wi, t});
      continue;
    }
    if (kept != j) ws.running[kept] = std::move(rr);
    ++kept;
  }
  ws.running.resize(kept);
  start_step(wi, t);
}

decode_worker_load decode_emulator::load(uint32_t worker) const {
  const worker_state& ws = workers_[worker];
  return {static_cast<uint32_t>(ws.running.size()),
          static_cast<uint32_t>(ws.waiting.size()) + ws.in_transfer};
}

double decode_emulator::distinct_experts_per_layer() const {
  return steps_ == 0 ? 0.0 : distinct_sum_ / static_cast<double>(steps_);
}

double decode_emulator::batch_size_mean() const {
  return steps_ == 0 ? 0.0 : batch_sum_ / static_cast<double>(steps_);
}

double decode_emulator::load_imbalance() const {
  uint64_t max_tokens = 0, sum_tokens = 0;
  for (const worker_state& ws : workers_) {
    max_tokens = std::max(max_tokens, ws.tokens);
    sum_tokens += ws.tokens;
  }
  return sum_tokens == 0
             ? 1.0
             : static_cast<double>(max_tokens) * workers_.size() / static_cast<double>(sum_tokens);
}

double decode_emulator::inflight_imbalance() const {
  return inflight_mean_integral_ > 0.0 ? inflight_max_integral_ / inflight_mean_integral_ : 1.0;
}

double decode_emulator::inflight_mean() const {
  return accounted_t_ > 0.0 ? inflight_mean_integral_ / accounted_t_ : 0.0;
}

latency_summary summarize_latency(const workload& w, const decode_emulator& d,
                                  const std::vector<uint32_t>& requests) {
  latency_summary s;
  std::vector<double> tpot, ttft;
  for (uint32_t i : requests) {
    const sim_request& r = w.requests[i];
    const decode_times& t = d.times(i);
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

}  // namespace eldr::loadgen
