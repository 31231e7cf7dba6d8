// zmq_frontend_replies: the frontend's reply queue -- pending slots, sending without blocking,
// and the capped per-peer backlog of replies a full peer could not take (zmq_frontend_impl.hpp).
#include "cluster/zmq/zmq_frontend_impl.hpp"

namespace eldr {

using namespace frontend_detail;

void zmq_frontend::impl::queue(reply_address to, std::vector<uint8_t> payload) {
  bool was_empty = false;
  {
    std::lock_guard lock(mutex);
    was_empty = outbox.empty();
    outbox.push_back({std::move(to), std::move(payload)});
  }
  if (was_empty) wake();  // one wake per burst: the loop drains the whole outbox
}

uint64_t zmq_frontend::impl::take_slot() {
  const uint64_t id = next_slot++;
  open_slots.insert(id);
  counters.pending.fetch_add(1);
  return id;
}

void zmq_frontend::impl::release_slot(uint64_t id) {
  if (id != 0 && open_slots.erase(id) != 0) counters.pending.fetch_sub(1);
}

void zmq_frontend::impl::send_queued() {
  // Consume the wake-up BEFORE taking the batch: a reply queued after the swap finds the
  // outbox empty and wakes the loop again, so none is left behind.
  uint64_t dummy = 0;
  [[maybe_unused]] const auto n = ::read(wake_fd, &dummy, sizeof dummy);
  std::deque<queued_reply> batch;
  {
    std::lock_guard lock(mutex);
    batch.swap(outbox);
  }
  const int64_t now = steady_ns();
  for (auto& r : batch) {
    // Answered, whether it is sent, waits or is dropped below.
    release_slot(r.to.slot);
    deliver(std::move(r), now);
  }
}

// One reply, without blocking: ZeroMQ takes it, its queue for the peer is full, or the peer is
// gone (then nothing of the message was sent).
send_outcome zmq_frontend::impl::try_send(const queued_reply& r) {
  auto& s = routers[static_cast<size_t>(r.to.channel)];
  if (!s) return send_outcome::gone;
  router_poll[static_cast<size_t>(r.to.channel)].hot = true;  // a send may take a notification
  try {
    // With ROUTER_MANDATORY the routing-id frame is where ZeroMQ refuses; once it is taken, the
    // rest of the message is too (the high-water mark counts whole messages).
    if (!s->send(zmq::buffer(r.to.peer), zmq::send_flags::sndmore | zmq::send_flags::dontwait))
      return send_outcome::full;
    if (r.to.delimiter)
      (void)s->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)s->send(zmq::message_t(r.payload.data(), r.payload.size()), zmq::send_flags::dontwait);
    return send_outcome::sent;
  } catch (const zmq::error_t&) {
    return send_outcome::gone;  // EHOSTUNREACH: no such peer (any more)
  }
}

void zmq_frontend::impl::publish_backlog() {
  counters.queued_reply_bytes.store(backlog_bytes);
  counters.queued_replies.store(backlog_count);
  if (backlog_bytes > counters.queued_reply_bytes_peak.load())
    counters.queued_reply_bytes_peak.store(backlog_bytes);
}

// Drops the oldest reply waiting for a peer (counted over the cap).
void zmq_frontend::impl::evict_oldest(peer_backlog& b) {
  const uint64_t cost = backlog_cost(b.replies.front());
  b.replies.pop_front();
  b.bytes -= cost;
  backlog_bytes -= cost;
  --backlog_count;
  counters.replies_over_cap.fetch_add(1);
  drop(1);
}

// Appends to a peer's backlog within the cap. At the cap, the peer that holds the most gives
// way (its oldest replies are dropped while it holds more than this peer would): peers that
// never read then cannot take the whole cap from one that is only briefly behind.
void zmq_frontend::impl::hold(peer_backlog& b, queued_reply r) {
  const uint64_t cost = backlog_cost(r);
  while (backlog_bytes + cost > opt.max_queued_reply_bytes) {
    peer_backlog* largest = nullptr;
    for (auto& [key, other] : backlog)
      if (!other.replies.empty() && (!largest || other.bytes > largest->bytes)) largest = &other;
    if (!largest || largest == &b || largest->bytes <= b.bytes + cost) break;
    evict_oldest(*largest);
  }
  if (backlog_bytes + cost > opt.max_queued_reply_bytes) {
    counters.replies_over_cap.fetch_add(1);
    return drop(1);
  }
  backlog_bytes += cost;
  b.bytes += cost;
  ++backlog_count;
  b.replies.push_back(std::move(r));
}

void zmq_frontend::impl::deliver(queued_reply r, int64_t now) {
  auto key = std::make_pair(static_cast<size_t>(r.to.channel), r.to.peer);
  // A peer with a backlog gets its replies in order: behind the ones already waiting.
  if (auto it = backlog.find(key); it != backlog.end()) {
    hold(it->second, std::move(r));
    return publish_backlog();
  }
  switch (try_send(r)) {
    case send_outcome::sent:
      counters.replies_sent.fetch_add(1);
      return;
    case send_outcome::gone:
      return drop(1);
    case send_outcome::full: {
      peer_backlog b;
      b.retry_at_ns = now + b.interval_ns;
      hold(b, std::move(r));
      if (!b.replies.empty()) backlog.emplace(std::move(key), std::move(b));
      return publish_backlog();
    }
  }
}

// Sends what the peers whose retry time has come can take now.
void zmq_frontend::impl::flush_backlog(int64_t now) {
  for (auto it = backlog.begin(); it != backlog.end();) {
    auto& b = it->second;
    if (b.retry_at_ns > now) {
      ++it;
      continue;
    }
    bool progressed = false, gone = false;
    while (!b.replies.empty()) {
      const auto outcome = try_send(b.replies.front());
      if (outcome == send_outcome::full) break;
      if (outcome == send_outcome::gone) {
        gone = true;
        break;
      }
      counters.replies_sent.fetch_add(1);
      backlog_bytes -= backlog_cost(b.replies.front());
      b.bytes -= backlog_cost(b.replies.front());
      --backlog_count;
      b.replies.pop_front();
      progressed = true;
    }
    if (gone) {
      // The peer left: nothing queued for it can be delivered.
      drop(b.replies.size());
      backlog_bytes -= b.bytes;
      b.bytes = 0;
      backlog_count -= b.replies.size();
      b.replies.clear();
    }
    if (b.replies.empty()) {
      it = backlog.erase(it);
      continue;
    }
    b.interval_ns =
        progressed ? backlog_retry_min_ns : std::min(b.interval_ns * 2, backlog_retry_max_ns);
    b.retry_at_ns = now + b.interval_ns;
    ++it;
  }
  publish_backlog();
}

// How long the loop may sleep: until the earliest backlog retry, or indefinitely.
std::chrono::milliseconds zmq_frontend::impl::poll_timeout(int64_t now) const {
  if (backlog.empty()) return std::chrono::milliseconds(-1);
  int64_t first = INT64_MAX;
  for (const auto& [key, b] : backlog)
    first = std::min(first, b.retry_at_ns);
  if (first <= now) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds((first - now + 999'999) / 1'000'000);
}

}  // namespace eldr
