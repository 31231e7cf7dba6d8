// generator: the send loop, pacing and replies of one policy's run (generator.hpp).
#include "tools/eldr-loadgen/generator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>

namespace eldr::loadgen {

generator::generator(session& s, prepare_pipeline& prep, route_socket& route, route_book& book,
                     const run_clock& clock, handoff_queue* decode, worker_client* finisher,
                     policy_result& res)
    : s_(s),
      o_(*s.o),
      prep_(prep),
      route_(route),
      book_(book),
      clock_(clock),
      decode_(decode),
      finisher_(finisher),
      res_(res),
      to_finish_(s.o->decode_workers),
      next_finish_flush_(wall_clock::now()),
      next_report_(wall_clock::now()) {}

void generator::on_reply(const route_outcome& out, wall_clock::time_point now) {
  const auto i = book_.on_reply(out, now, res_);
  if (!i) return;
  const route_reply& d = std::get<route_reply>(out);
  if (decode_ != nullptr) {
    const double t = clock_.model_now() + o_.kv_transfer_ms / 1000.0;
    {
      std::lock_guard lock(decode_->mu);
      decode_->items.push_back({*i, d.worker, t});
    }
    decode_->cv.notify_one();
  } else {
    to_finish_[d.worker].push_back(d.id);
  }
}

// Route-only: the decided requests are finished at once, and every worker reports an empty
// load each report interval (a node drops workers that stay silent).
void generator::flush_finished() {
  if (finisher_ == nullptr) return;
  const uint32_t D = o_.decode_workers;
  if (wall_clock::now() >= next_report_) {
    next_report_ = wall_clock::now() + std::chrono::milliseconds(o_.report_ms);
    for (uint32_t wi = 0; wi < D; ++wi) {
      load_report m;
      m.model = s_.model;
      m.worker = wi;
      m.seq = ++s_.report_seq[wi];
      ++res_.worker_messages;
      if (!finisher_->send(m).ok()) ++res_.worker_errors;
    }
  }
  for (uint32_t wi = 0; wi < D; ++wi) {
    if (to_finish_[wi].empty()) continue;
    finished_requests m;
    m.model = s_.model;
    m.worker = wi;
    m.requests.swap(to_finish_[wi]);
    ++res_.worker_messages;
    if (!finisher_->send(m).ok()) ++res_.worker_errors;
  }
  drain_acks(*finisher_, res_.worker_errors);
}

status generator::run(const std::atomic<bool>& stop) {
  const workload& w = *s_.w;
  const uint32_t N = static_cast<uint32_t>(w.requests.size());
  const auto on_reply = [this](route_outcome out, wall_clock::time_point now) {
    this->on_reply(out, now);
  };
  uint32_t next_arrival = 0;
  status failure;
  while (!stop.load()) {
    const double now = clock_.model_now();
    while (next_arrival < N && w.requests[next_arrival].arrival_s <= now) {
      if (prep_.ready() <= next_arrival) {
        // Preparation fell behind (only when the run exceeds the preparation budget).
        if (prep_.failed()) {
          failure = prep_.failure();
          break;
        }
        ++res_.prepare_stalls;
        prep_.wait_for(next_arrival, stop);
        break;
      }
      pending_.push({prep_.item(next_arrival).handoff, next_arrival});
      ++next_arrival;
    }
    if (!failure.ok()) break;
    while (!pending_.empty() && pending_.top().handoff <= now &&
           book_.outstanding() < o_.max_outstanding) {
      const uint32_t i = pending_.top().request;
      pending_.pop();
      const prepared_request& pr = prep_.item(i);
      // KV events first: the node must have them before the route request that needs them.
      s_.publishers[pr.publisher].publish_encoded(pr.kv_payload);
      book_.sending(i, res_);
      const bool sent = route_.send(pr.route_bytes, o_.routers_by_prefill
                                                        ? std::optional<std::size_t>(pr.publisher)
                                                        : std::nullopt);
      prep_.release(i);
      if (!sent) {
        book_.send_failed(i, res_);
        continue;
      }
      book_.sent(i);
    }
    // Requests without a reply after the timeout are given up on.
    const auto now_wall = wall_clock::now();
    book_.expire(now_wall, o_.route_timeout_ms, res_);
    if (finisher_ != nullptr && (now_wall >= next_finish_flush_)) {
      flush_finished();
      next_finish_flush_ = now_wall + std::chrono::milliseconds(10);
    }
    if (next_arrival >= N && pending_.empty() && book_.outstanding() == 0) break;
    // Wait for a reply, at most until the next arrival or handoff is due.
    double next_due = std::numeric_limits<double>::infinity();
    if (next_arrival < N) next_due = w.requests[next_arrival].arrival_s;
    if (!pending_.empty() && book_.outstanding() < o_.max_outstanding)
      next_due = std::min(next_due, pending_.top().handoff);
    auto wake = wall_clock::now() + std::chrono::milliseconds(50);
    if (std::isfinite(next_due)) wake = std::min(wake, clock_.wall_at(next_due));
    if (finisher_ != nullptr) wake = std::min(wake, next_finish_flush_);
    const double left_ms =
        std::chrono::duration<double, std::milli>(wake - wall_clock::now()).count();
    if (book_.outstanding() == 0) {
      // Nothing to receive: wait on the clock alone.
      if (left_ms > 0) std::this_thread::sleep_until(wake);
      continue;
    }
    if (!route_.wait(wake)) ++res_.errors;
    route_.receive_all(on_reply, res_.errors);
  }
  flush_finished();
  return failure;
}

}  // namespace eldr::loadgen
