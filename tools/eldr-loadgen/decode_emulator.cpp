// decode_emulator: the decode engine's steps and arrivals as events over an injected clock, and
// the in-flight balance of the emulated workers.
#include "tools/eldr-loadgen/decode_emulator.hpp"

#include <algorithm>
#include <cmath>

namespace eldr::loadgen {

result<std::unique_ptr<decode_emulator>> decode_emulator::make(const workload& w,
                                                               const decode_emulator_config& c) {
  if (c.workers == 0) return status::invalid_argument("decode emulator: workers must be >= 1");
  if (c.max_batch == 0) return status::invalid_argument("decode emulator: max batch must be >= 1");
  auto engine = decode_engine::make(w, c);
  if (!engine.ok()) return engine.error();
  return std::unique_ptr<decode_emulator>(new decode_emulator(std::move(engine).value()));
}

decode_emulator::decode_emulator(decode_engine engine)
    : engine_(std::move(engine)), in_transfer_(engine_.workers(), 0) {}

void decode_emulator::push(double t, kind k, uint32_t id, uint32_t worker) {
  events_.push({t, k == kind::arrival ? uint8_t{0} : uint8_t{1}, seq_++, k, id, worker});
}

void decode_emulator::push_step(std::optional<double> end, uint32_t worker) {
  if (end) push(*end, kind::step_end, worker, worker);
}

void decode_emulator::arrive(uint32_t request, uint32_t worker, double t) {
  ++in_transfer_[worker];
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
    // The engine closes its in-flight integrals at this instant before the counts change: in
    // model time, exact, whereas arrive() is called whenever the live loop gets round to it.
    if (ev.k == kind::step_end) {
      push_step(engine_.end_step(ev.id, ev.t, finished), ev.id);
      continue;
    }
    --in_transfer_[ev.worker];
    push_step(engine_.arrive(ev.id, ev.worker, ev.t, finished), ev.worker);
  }
  now_ = std::max(now_, t);
  engine_.account_to(now_);
}

decode_worker_load decode_emulator::load(uint32_t worker) const {
  return {engine_.running(worker), engine_.waiting(worker) + in_transfer_[worker]};
}

latency_summary summarize_latency(const workload& w, const decode_emulator& d,
                                  const std::vector<uint32_t>& requests) {
  return eldr::summarize_latency(w, d.engine(), requests);
}

}  // namespace eldr::loadgen
