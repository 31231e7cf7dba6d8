// decode_loop: every emulated decode worker, against the wall clock (decode_loop.hpp).
#include "tools/eldr-loadgen/decode_loop.hpp"

#include <algorithm>
#include <variant>

namespace eldr::loadgen {

void drain_acks(worker_client& c, uint64_t& errors) {
  for (;;) {
    auto r = c.receive(0);
    if (!r.ok()) return;
    if (std::holds_alternative<error_reply>(*r)) ++errors;
  }
}

// The decode loop: every emulated decode worker, against the wall clock.
void decode_loop(session& s, decode_emulator& emu, handoff_queue& q, const run_clock& clock,
                 const std::atomic<bool>& stop, const std::string& run_id, decode_stats& out) {
  const loadgen_options& o = *s.o;
  client_options co;
  co.timeout_ms = o.route_timeout_ms;
  auto wc = worker_client::connect(s.worker_endpoint, co);
  if (!wc.ok()) {
    ++out.errors;
    return;
  }
  worker_client& c = **wc;
  const uint32_t D = o.decode_workers;
  std::vector<handoff> taken;
  std::vector<decode_finish> finished;
  const double report_s = o.report_ms / 1000.0 * o.time_scale;  // in model time
  double next_report = clock.model_now();
  wall_clock::time_point drain_deadline = wall_clock::time_point::max();
  auto send_reports = [&] {
    for (uint32_t wi = 0; wi < D; ++wi) {
      const decode_worker_load l = emu.load(wi);
      load_report m;
      m.model = s.model;
      m.worker = wi;
      m.in_flight = l.in_flight();
      m.running = l.running;
      m.waiting = l.waiting;
      m.kv_usage =
          o.max_batch > 0
              ? std::min(1.0f, static_cast<float>(l.running) / static_cast<float>(o.max_batch))
              : 0.0f;
      m.seq = ++s.report_seq[wi];
      if (c.send(m).ok()) {
        ++out.messages;
      } else {
        ++out.errors;
      }
    }
  };
  for (;;) {
    bool done = false;
    {
      std::unique_lock lock(q.mu);
      taken.swap(q.items);
      done = q.producer_done;
      if (done && drain_deadline == wall_clock::time_point::max())
        drain_deadline = wall_clock::now() + std::chrono::duration_cast<wall_clock::duration>(
                                                 std::chrono::duration<double>(o.drain_s));
    }
    for (const handoff& h : taken)
      emu.arrive(h.request, h.worker, h.t);
    taken.clear();
    const double now = clock.model_now();
    emu.advance_to(now, finished);
    if (!finished.empty()) {
      // One finished message per worker with every request it completed since the last one.
      std::sort(finished.begin(), finished.end(),
                [](const decode_finish& a, const decode_finish& b) { return a.worker < b.worker; });
      for (std::size_t j = 0; j < finished.size();) {
        finished_requests m;
        m.model = s.model;
        m.worker = finished[j].worker;
        for (; j < finished.size() && finished[j].worker == m.worker; ++j)
          m.requests.push_back(run_id + "-" + std::to_string(finished[j].request));
        if (c.send(m).ok()) {
          ++out.messages;
        } else {
          ++out.errors;
        }
      }
      finished.clear();
    }
    if (now >= next_report) {
      send_reports();
      next_report = now + report_s;
    }
    drain_acks(c, out.errors);
    if (stop.load() || (done && emu.idle()) || wall_clock::now() >= drain_deadline) break;
    const double next = std::min(emu.next_event_time(), next_report);
    std::unique_lock lock(q.mu);
    q.cv.wait_until(lock, std::min(clock.wall_at(next), drain_deadline),
                    [&] { return !q.items.empty() || (q.producer_done && !done) || stop.load(); });
  }
  send_reports();  // the final view: whatever is left
  drain_acks(c, out.errors);
}

}  // namespace eldr::loadgen
