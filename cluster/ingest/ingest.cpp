// ingest: see ingest.hpp.
#include "cluster/ingest/ingest.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace eldr {
namespace {

// One log line per (publisher, cause) at most this often; the counters carry the rest.
constexpr int64_t log_interval_ms = 10'000;
const char* const metrics_key = "ingest_metrics";

}  // namespace

ingest::ingest(signature_cache& cache, kv_decode_limits limits, clock_fn clock, ingest_limits work)
    : cache_(cache),
      limits_(limits),
      clock_(clock ? std::move(clock) : system_clock_ms()),
      work_(work) {
  if (auto prior = cache_.metadata(metrics_key)) {
    const auto j = nlohmann::json::parse(*prior, nullptr, false);
    if (j.is_object()) {
      for (size_t c = 0; c < drop_cause_count; ++c)
        prior_dropped_[c] = j.value("dropped", nlohmann::json::object())
                                .value(to_string(static_cast<drop_cause>(c)), uint64_t{0});
      prior_gaps_ = j.value("gaps", uint64_t{0});
      prior_gaps_unfilled_ = j.value("gaps_unfilled", uint64_t{0});
      prior_restarts_ = j.value("restarts", uint64_t{0});
      prior_replayed_ = j.value("replayed", uint64_t{0});
    }
  }
}

uint32_t ingest::add_kv_publisher(const std::string& name, replay_fn replay) {
  kv_pubs_.push_back({cache_.worker_id(name), std::move(replay), {}, std::nullopt});
  kv_.push_back({});
  kv_.back().name = name;
  kv_logged_.emplace_back().fill(INT64_MIN);
  return static_cast<uint32_t>(kv_.size() - 1);
}

uint32_t ingest::add_counts_publisher(const std::string& name) {
  counts_.push_back({});
  counts_.back().name = name;
  counts_last_seq_.emplace_back();
  counts_logged_.emplace_back().fill(INT64_MIN);
  return static_cast<uint32_t>(counts_.size() - 1);
}

void ingest::drop(publisher_metrics& m, log_times& logged, drop_cause cause,
                  const std::string& detail) {
  const auto c = static_cast<size_t>(cause);
  ++m.dropped[c];
  const int64_t now = clock_();
  if (logged[c] != INT64_MIN && now - logged[c] < log_interval_ms) return;
  logged[c] = now;
  spdlog::warn("ingest {}: dropped ({}, {} so far): {}", m.name, to_string(cause), m.dropped[c],
               detail);
}

void ingest::stage_batch(uint32_t p, uint64_t seq, std::span<const uint8_t> payload) {
  publisher_metrics& m = kv_[p];
  log_times& logged = kv_logged_[p];
  issues_.clear();
  auto batch = decode_kv_batch(payload, limits_, issues_);
  for (const kv_decode_issue& i : issues_)
    drop(m, logged, i.cause, "seq " + std::to_string(seq) + ", " + i.detail);
  batch_work b;
  b.publisher = p;
  b.seq = seq;
  // A dropped payload still advances the sequence (when its turn comes): it was received, and
  // replaying it would give the same bytes.
  if (!batch.ok()) {
    drop(m, logged, kv_batch_error_cause(batch.error()),
         "seq " + std::to_string(seq) + ": " + batch.error().message());
    staged_.emplace_back(std::move(b));
    return;
  }
  ++m.messages;
  b.decoded = true;
  b.dp_rank = batch->data_parallel_rank && *batch->data_parallel_rank >= INT32_MIN &&
                      *batch->data_parallel_rank <= INT32_MAX
                  ? static_cast<int32_t>(*batch->data_parallel_rank)
                  : -1;
  b.batch = std::move(*batch);
  staged_.emplace_back(std::move(b));
}

size_t ingest::apply_some(batch_work& b, size_t budget) {
  publisher_metrics& m = kv_[b.publisher];
  const uint32_t worker = kv_pubs_[b.publisher].worker;
  const auto before = cache_.stats();
  size_t used = 0;
  auto& events = b.batch.events;
  while (b.event < events.size() && used < budget) {
    const kv_event& e = events[b.event];
    holder_key who{worker, b.dp_rank, -1, e.medium.value_or("")};
    if (e.group_idx && *e.group_idx >= 0 && *e.group_idx <= INT32_MAX)
      who.group = static_cast<int32_t>(*e.group_idx);
    if (e.type == kv_event_type::all_blocks_cleared) {
      used += std::max<size_t>(1, cache_.stats().blocks);  // one pass over the table
      cache_.clear_worker(worker, false);
      ++b.event;
      continue;
    }
    const std::span<const block_hash> all(e.block_hashes);
    const size_t n = std::min(all.size() - b.offset, budget - used);
    const auto part = all.subspan(b.offset, n);
    if (e.type == kv_event_type::block_stored) {
      // A slice after the first continues the chain: its parent is the block before it.
      const std::optional<block_hash> parent =
          b.offset == 0 ? e.parent_block_hash : std::optional<block_hash>(all[b.offset - 1]);
      cache_.store_blocks(who, parent, part);
    } else {
      cache_.remove_blocks(who, part);
    }
    m.block_events += n;
    hashes_applied_ += n;
    used += std::max<size_t>(n, 1);
    b.offset += n;
    if (b.offset == all.size()) {
      ++b.event;
      b.offset = 0;
    }
  }
  const auto after = cache_.stats();
  b.refused_capacity += (after.refused_capacity - before.refused_capacity) +
                        (after.refused_holders - before.refused_holders);
  b.refused_quota += after.refused_quota - before.refused_quota;
  return used;
}

void ingest::finish(batch_work& b) {
  publisher_metrics& m = kv_[b.publisher];
  log_times& logged = kv_logged_[b.publisher];
  cache_.note_sequence(kv_pubs_[b.publisher].worker, b.seq);
  // One log line per batch and cause; the counters count every refused block.
  auto report = [&](drop_cause cause, uint64_t n, const std::string& what) {
    if (n == 0) return;
    m.dropped[static_cast<size_t>(cause)] += n - 1;
    drop(m, logged, cause, "seq " + std::to_string(b.seq) + ": " + std::to_string(n) + what);
  };
  report(drop_cause::capacity, b.refused_capacity,
         " blocks or holders refused at the cache's bounds");
  report(drop_cause::publisher_quota, b.refused_quota,
         " blocks refused: the publisher holds its share of the cache (" +
             std::to_string(cache_.usage(kv_pubs_[b.publisher].worker).blocks) + " blocks)");
}

void ingest::run_turn() {
  size_t budget = work_.hashes_per_turn > 0 ? work_.hashes_per_turn : SIZE_MAX;
  bool accepted = false;  // at most one waiting message is decoded per turn
  while (!backlog_.empty() && budget > 0) {
    work_item& w = backlog_.front();
    if (auto* msg = std::get_if<waiting_message>(&w)) {
      if (accepted && work_.hashes_per_turn > 0) return;
      accepted = true;
      waiting_message taken = std::move(*msg);
      backlog_.pop_front();
      for (const auto& f : taken.frames)
        backlog_bytes_ -= f.size();
      std::vector<std::span<const uint8_t>> frames(taken.frames.begin(), taken.frames.end());
      accept_kv(taken.publisher, frames);
      backlog_.insert(backlog_.begin(), std::make_move_iterator(staged_.begin()),
                      std::make_move_iterator(staged_.end()));
      staged_.clear();
      continue;
    }
    if (auto* c = std::get_if<clear_work>(&w)) {
      const size_t cost = std::max<size_t>(1, cache_.stats().blocks);
      cache_.clear_worker(kv_pubs_[c->publisher].worker, true);
      backlog_.pop_front();
      budget = budget > cost ? budget - cost : 0;
      continue;
    }
    auto& b = std::get<batch_work>(w);
    const size_t used = apply_some(b, budget);
    budget = budget > used ? budget - used : 0;
    if (b.event == b.batch.events.size()) {
      finish(b);
      backlog_.pop_front();
    }
  }
}

void ingest::resume() {
  run_turn();
}

void ingest::on_kv_message(uint32_t p, std::span<const std::span<const uint8_t>> frames) {
  // A publisher waiting for a replay holds its live messages in arrival order: at once, unless
  // earlier ones of it still wait in the backlog (then behind them).
  const bool held_now = kv_pubs_.size() > p && kv_pubs_[p].pending && !has_waiting(p);
  if (!backlog_.empty() && !held_now) {
    // Behind a backlog: waits its turn, so that the sequence rules see the state before it.
    size_t bytes = 0;
    for (const auto& f : frames)
      bytes += f.size();
    if (backlog_bytes_ + bytes > work_.max_backlog_bytes) {
      drop(kv_[p], kv_logged_[p], drop_cause::capacity,
           "the ingest backlog holds " + std::to_string(backlog_bytes_) +
               " bytes: message dropped (its sequence will be a gap)");
    } else {
      waiting_message msg{p, {}};
      for (const auto& f : frames)
        msg.frames.emplace_back(f.begin(), f.end());
      backlog_bytes_ += bytes;
      backlog_.emplace_back(std::move(msg));
    }
  } else {
    accept_kv(p, frames);
    for (work_item& w : staged_)
      backlog_.push_back(std::move(w));
    staged_.clear();
  }
  run_turn();
}

void ingest::accept_kv(uint32_t p, std::span<const std::span<const uint8_t>> frames) {
  publisher_metrics& m = kv_[p];
  log_times& logged = kv_logged_[p];
  if (frames.size() != 3) {
    drop(m, logged, drop_cause::bad_frames, std::to_string(frames.size()) + " frames, expected 3");
    return;
  }
  const auto seq = decode_sequence(frames[1]);
  if (!seq) {
    drop(m, logged, drop_cause::bad_frames,
         "sequence frame of " + std::to_string(frames[1].size()) + " bytes");
    return;
  }
  if (kv_pubs_[p].pending) return hold(p, *seq, frames[2]);  // behind a replay in progress
  const uint32_t worker = kv_pubs_[p].worker;
  const std::optional<uint64_t> last = cache_.last_sequence(worker);
  if (last && *seq <= *last) {
    ++m.restarts;
    spdlog::info("ingest {}: sequence went from {} to {}: engine restart, dropping its blocks",
                 m.name, *last, *seq);
    staged_.emplace_back(clear_work{p});
  } else if (last && *seq > *last + 1) {
    ++m.gaps;
    uint64_t next = *last + 1;
    if (start_replay(p, next, *seq, frames[2])) return;
    if (kv_pubs_[p].replay) {
      const bool ok = kv_pubs_[p].replay(next, [&](uint64_t s, std::span<const uint8_t> payload) {
        // Apply only what closes the gap, in order; older or duplicate batches are ignored.
        if (s != next || s >= *seq) return;
        stage_batch(p, s, payload);
        ++m.replayed;
        ++next;
      });
      if (!ok) spdlog::warn("ingest {}: replay from {} failed", m.name, *last + 1);
    }
    if (next < *seq) {
      ++m.gaps_unfilled;
      spdlog::warn("ingest {}: events {}..{} lost, resynchronising the worker", m.name, next,
                   *seq - 1);
      staged_.emplace_back(clear_work{p});
    }
  }
  stage_batch(p, *seq, frames[2]);
}

void ingest::set_replay_requester(uint32_t p, replay_request_fn request) {
  kv_pubs_.at(p).request_replay = std::move(request);
}

bool ingest::replay_pending(uint32_t p) const {
  return kv_pubs_.at(p).pending.has_value();
}

void ingest::drop_replay(uint32_t p) {
  kv_pubs_.at(p).pending.reset();
}

bool ingest::start_replay(uint32_t p, uint64_t from, uint64_t seq,
                          std::span<const uint8_t> payload) {
  kv_publisher& pub = kv_pubs_[p];
  if (!pub.request_replay) return false;
  pending_replay r;
  r.token = next_token_++;
  r.next = from;
  r.until = seq;
  pub.pending = std::move(r);
  hold(p, seq, payload);
  // The request may answer at once (a publisher without a replay socket): the state is set up
  // before, so that its answer finds the replay it ends.
  const uint64_t token = pub.pending->token;
  if (pub.request_replay(token, from)) return true;
  if (pub.pending && pub.pending->token == token) {
    spdlog::warn("ingest {}: cannot ask for a replay from {}", kv_[p].name, from);
    finish_replay(p);
  }
  return true;
}

void ingest::hold(uint32_t p, uint64_t seq, std::span<const uint8_t> payload) {
  auto& r = *kv_pubs_[p].pending;
  r.held.push_back({seq, {payload.begin(), payload.end()}});
  r.held_bytes += payload.size();
  if (r.held_bytes > max_held_bytes) {
    spdlog::warn("ingest {}: {} bytes arrived during a replay, giving it up", kv_[p].name,
                 r.held_bytes);
    finish_replay(p);
  }
}

void ingest::on_replay_batch(uint32_t p, uint64_t token, uint64_t seq,
                             std::span<const uint8_t> payload) {
  if (p >= kv_pubs_.size()) return;
  auto& r = kv_pubs_[p].pending;
  // Apply only what closes the gap, in order; older, duplicate or later batches are ignored
  // (the later ones are live messages, held or still to come).
  if (!r || r->token != token || seq != r->next || seq >= r->until) return;
  stage_batch(p, seq, payload);
  queue_for(p, std::move(staged_));
  staged_.clear();
  ++kv_[p].replayed;
  if (++r->next == r->until) finish_replay(p);  // the rest of the replay is not needed
  run_turn();
}

// Work of publisher p that must come before its live messages still waiting in the backlog
// (they arrived after the message that opened the gap) and after everything of p queued
// earlier: it goes in front of p's first waiting message, in the order given.
void ingest::queue_for(uint32_t p, std::vector<work_item> items) {
  auto at = std::find_if(backlog_.begin(), backlog_.end(), [p](const work_item& w) {
    const auto* m = std::get_if<waiting_message>(&w);
    return m && m->publisher == p;
  });
  for (auto& w : items) {
    if (const auto* m = std::get_if<waiting_message>(&w))
      for (const auto& f : m->frames)
        backlog_bytes_ += f.size();
    at = std::next(backlog_.insert(at, std::move(w)));
  }
}

bool ingest::has_waiting(uint32_t p) const {
  return std::any_of(backlog_.begin(), backlog_.end(), [p](const work_item& w) {
    const auto* m = std::get_if<waiting_message>(&w);
    return m && m->publisher == p;
  });
}

void ingest::on_replay_end(uint32_t p, uint64_t token, bool ok) {
  if (p >= kv_pubs_.size()) return;
  const auto& r = kv_pubs_[p].pending;
  if (!r || r->token != token) return;  // a replay finished early, or superseded
  if (!ok) spdlog::warn("ingest {}: replay from {} failed", kv_[p].name, r->next);
  finish_replay(p);
  run_turn();
}

void ingest::finish_replay(uint32_t p) {
  kv_publisher& pub = kv_pubs_[p];
  pending_replay r = std::move(*pub.pending);
  pub.pending.reset();
  publisher_metrics& m = kv_[p];
  std::vector<work_item> after;
  if (r.next < r.until) {
    ++m.gaps_unfilled;
    spdlog::warn("ingest {}: events {}..{} lost, resynchronising the worker", m.name, r.next,
                 r.until - 1);
    after.emplace_back(clear_work{p});
  }
  // The held messages go through the live path in order, behind the replayed batches (already
  // queued) and the resynchronisation: one of them may open another gap, which holds the rest
  // behind its own replay.
  for (auto& h : r.held) {
    waiting_message w{p, {}};
    std::vector<uint8_t> seq8(8);
    for (int i = 0; i < 8; ++i)
      seq8[static_cast<size_t>(i)] = static_cast<uint8_t>(h.seq >> (56 - 8 * i));
    w.frames.emplace_back();  // topic: empty
    w.frames.push_back(std::move(seq8));
    w.frames.push_back(std::move(h.payload));
    after.emplace_back(std::move(w));
  }
  queue_for(p, std::move(after));
}

void ingest::on_counts_message(uint32_t p, std::span<const std::span<const uint8_t>> frames) {
  publisher_metrics& m = counts_[p];
  log_times& logged = counts_logged_[p];
  if (frames.size() != 2) {
    drop(m, logged, drop_cause::bad_frames, std::to_string(frames.size()) + " frames, expected 2");
    return;
  }
  issues_.clear();
  auto msg = decode_counts_message(frames[1], counts_decode_limits{}, issues_);
  for (const kv_decode_issue& i : issues_)
    drop(m, logged, i.cause, i.detail);
  if (!msg.ok()) {
    drop(m, logged, counts_error_cause(msg.error()), msg.error().message());
    return;
  }
  ++m.messages;
  if (msg->seq) {
    auto& last = counts_last_seq_[p];
    if (last && *msg->seq > *last + 1) ++m.gaps;
    if (last && *msg->seq <= *last) ++m.restarts;
    last = msg->seq;
  }
  const auto before = cache_.stats();
  for (const counts_block& b : msg->blocks) {
    if (status s = cache_.put_counts(b.hash, b.parent, msg->geometry, b.counts); !s.ok()) {
      drop(m, logged, drop_cause::counts_geometry, s.message());
      continue;
    }
    ++m.block_events;
  }
  if (cache_.stats().refused_capacity > before.refused_capacity)
    drop(m, logged, drop_cause::capacity, "counts refused at the cache's max_blocks");
}

std::string ingest::metrics_json() const {
  drop_counters dropped = prior_dropped_;
  uint64_t gaps = prior_gaps_, unfilled = prior_gaps_unfilled_, restarts = prior_restarts_,
           replayed = prior_replayed_;
  auto add = [&](const std::vector<publisher_metrics>& ms) {
    for (const publisher_metrics& m : ms) {
      for (size_t c = 0; c < drop_cause_count; ++c)
        dropped[c] += m.dropped[c];
      gaps += m.gaps;
      unfilled += m.gaps_unfilled;
      restarts += m.restarts;
      replayed += m.replayed;
    }
  };
  add(kv_);
  add(counts_);
  nlohmann::json j;
  j["dropped"] = nlohmann::json::object();
  for (size_t c = 0; c < drop_cause_count; ++c)
    j["dropped"][to_string(static_cast<drop_cause>(c))] = dropped[c];
  j["gaps"] = gaps;
  j["gaps_unfilled"] = unfilled;
  j["restarts"] = restarts;
  j["replayed"] = replayed;
  return j.dump();
}

status ingest::commit() {
  cache_.expire(work_.expire_per_commit > 0 ? work_.expire_per_commit : SIZE_MAX);
  cache_.stage_metadata(metrics_key, metrics_json());
  return cache_.commit();
}

}  // namespace eldr
