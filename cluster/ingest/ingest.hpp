// ingest: applies vLLM KV-event messages and eldr counts messages to a signature_cache, with the
// per-publisher ordering rules of ../shared/reference/vllm-kv-events.md. No sockets here: the
// ZeroMQ loop (zmq_ingest.hpp) feeds it frames, tests feed it bytes, and a replay is a callback:
// synchronous (replay_fn, the standalone tool) or asynchronous (replay_request_fn, the node).
//
// Per publisher (one vLLM PUB socket = one worker):
// - the first message ever seen is applied whatever its sequence number;
// - seq == last + 1 is applied;
// - seq <= last means the engine restarted: the worker's blocks are dropped, then it is applied;
// - seq > last + 1 is a gap: the missing batches are fetched through the replay callback when one
//   is configured and applied in order; whatever is still missing resynchronises the worker (its
//   blocks dropped, as after a restart) and counts a gap.
// The last applied sequence is staged with the events, so a commit makes both durable together.
//
// Work splitting (ingest_limits::hashes_per_turn): a large batch is applied in slices of a
// bounded number of hashes, so that the thread that also answers route requests (the node's
// signature-cache actor) never spends long on one message. on_kv_message applies at most one
// slice and keeps the rest in a backlog; resume() applies the next slice, and pending() says
// whether any remains. While a backlog exists, later messages wait in it (in arrival order, the
// sequence rules applied when they reach the front), so events still apply in order. A
// batch's sequence is noted once its last slice is applied: a commit between two slices makes
// part of a batch durable with the previous sequence, so after a crash the batch is applied
// again (replay: its stores count twice) or the worker is resynchronised (no replay).
//
// Thread safety: none; one thread owns the ingest, the cache and the sockets.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "cluster/wire/counts_message.hpp"
#include "cluster/wire/drop_cause.hpp"
#include "cluster/wire/kv_events.hpp"
#include "storage/signature_cache.hpp"

namespace eldr {

struct publisher_metrics {
  std::string name;
  drop_counters dropped{};     // per cause
  uint64_t messages = 0;       // applied batches (live and replayed)
  uint64_t block_events = 0;   // blocks stored or removed
  uint64_t gaps = 0;           // gaps seen
  uint64_t gaps_unfilled = 0;  // gaps that resynchronised the worker
  uint64_t replayed = 0;       // batches applied from a replay
  uint64_t restarts = 0;       // sequence went backwards
};

// Fetches batches with seq >= start from a publisher's replay socket and hands each to `deliver`
// in order (seq, payload); returns false when the replay failed or is not configured.
using replay_fn = std::function<bool(
    uint64_t start, const std::function<void(uint64_t, std::span<const uint8_t>)>& deliver)>;
// Asks for a replay from `start` without waiting for it (the node: the frontend thread owns the
// replay socket). Its batches come back through on_replay_batch and its end through
// on_replay_end, tagged with `token`. Returns false when no request could be made.
using replay_request_fn = std::function<bool(uint64_t token, uint64_t start)>;

// How much work one call may do. The defaults do everything at once (a program whose thread
// serves nothing else, e.g. `eldr-sigcache ingest`); the node bounds both.
struct ingest_limits {
  size_t hashes_per_turn = 0;  // hashes applied per on_kv_message/resume; 0 = all at once
  // Bytes of messages waiting behind a backlog; beyond it a message is dropped (capacity), which
  // the next one sees as a sequence gap (replay or resynchronisation).
  size_t max_backlog_bytes = size_t{64} << 20;
  size_t expire_per_commit = 0;  // grace deadlines examined per commit(); 0 = all that are due
};

class ingest {
 public:
  // `cache` must outlive the ingest. `clock` drives log rate limiting.
  ingest(signature_cache& cache, kv_decode_limits limits = {}, clock_fn clock = {},
         ingest_limits work = {});

  // Registers a vLLM publisher; returns its index (== its worker id in the cache's registry is
  // kept separately). `replay` may be empty.
  uint32_t add_kv_publisher(const std::string& name, replay_fn replay = {});
  // Registers a counts publisher; returns its index among counts publishers.
  uint32_t add_counts_publisher(const std::string& name);

  // Asynchronous replay, instead of a replay_fn (empty: none). With it, a gap asks for a replay
  // and holds the publisher's live messages (in order, at most max_held_bytes of payload) until
  // the replay ends: the batches that close the gap are applied as they come, then the held
  // messages; a gap still open at the end (a failed or short replay, or too much held)
  // resynchronises the worker and counts as unfilled, as without replay.
  void set_replay_requester(uint32_t publisher, replay_request_fn request);
  // One replayed batch (ignored unless it answers the replay in progress and is the next one
  // missing) and the end of a replay (`ok`: the publisher's end marker came).
  void on_replay_batch(uint32_t publisher, uint64_t token, uint64_t seq,
                       std::span<const uint8_t> payload);
  void on_replay_end(uint32_t publisher, uint64_t token, bool ok);
  // Whether the publisher waits for a replay (its live messages are held).
  bool replay_pending(uint32_t publisher) const;
  // Forgets a replay in progress and the messages it held (the publisher is being dropped).
  void drop_replay(uint32_t publisher);
  static constexpr size_t max_held_bytes = size_t{64} << 20;

  // One live vLLM message (all its frames: topic, seq, payload). Applies at most one slice.
  void on_kv_message(uint32_t publisher, std::span<const std::span<const uint8_t>> frames);
  // Applies the next slice of the backlog, if any.
  void resume();
  // Whether a backlog remains (resume() has work), and whether grace deadlines are due that the
  // last commit() left for the next (expire_per_commit).
  bool pending() const { return !backlog_.empty(); }
  bool expiry_pending() const { return cache_.expire_pending(); }
  // Hashes applied since construction (stores and removals; for progress in tests and metrics).
  uint64_t hashes_applied() const { return hashes_applied_; }
  // One counts message (frames: topic, payload).
  void on_counts_message(uint32_t publisher, std::span<const std::span<const uint8_t>> frames);

  // Expires grace periods, stages the metrics and commits (see signature_cache::commit: after
  // ok, everything handed in so far is acknowledged).
  status commit();

  const std::vector<publisher_metrics>& kv_metrics() const { return kv_; }
  const std::vector<publisher_metrics>& counts_metrics() const { return counts_; }
  // Totals over all publishers, plus those carried over from earlier runs (persisted in the
  // cache under "ingest_metrics"), as one JSON object string.
  std::string metrics_json() const;

 private:
  struct held_message {
    uint64_t seq = 0;
    std::vector<uint8_t> payload;
  };
  // An asynchronous replay in progress: the gap [next, until) and the live messages held.
  struct pending_replay {
    uint64_t token = 0;
    uint64_t next = 0, until = 0;
    std::vector<held_message> held;
    size_t held_bytes = 0;
  };
  struct kv_publisher {
    uint32_t worker = 0;
    replay_fn replay;
    replay_request_fn request_replay;
    std::optional<pending_replay> pending;
  };
  // When each cause was last logged for one publisher, for rate limiting.
  using log_times = std::array<int64_t, drop_cause_count>;

  // Starts an asynchronous replay of [from, seq) holding the message `seq`; false when the
  // publisher has no requester or the request failed (then nothing is held).
  bool start_replay(uint32_t publisher, uint64_t from, uint64_t seq,
                    std::span<const uint8_t> payload);
  void hold(uint32_t publisher, uint64_t seq, std::span<const uint8_t> payload);
  // Ends the replay in progress: an open gap resynchronises, then the held messages are applied.
  void finish_replay(uint32_t publisher);
  // A decoded batch, applied from (event, offset) on.
  struct batch_work {
    uint32_t publisher = 0;
    uint64_t seq = 0;
    bool decoded = false;  // false: dropped at decode, only its sequence is noted
    int32_t dp_rank = -1;
    kv_batch batch;
    size_t event = 0, offset = 0;
    uint64_t refused_capacity = 0, refused_quota = 0;  // so far, reported when it completes
  };
  // A restart or an unfilled gap: the worker's blocks are dropped.
  struct clear_work {
    uint32_t publisher = 0;
  };
  // A message that arrived behind a backlog, accepted when it reaches the front.
  struct waiting_message {
    uint32_t publisher = 0;
    std::vector<std::vector<uint8_t>> frames;
  };
  using work_item = std::variant<batch_work, clear_work, waiting_message>;

  // The sequence rules for one message: appends the work it implies to staged_.
  void accept_kv(uint32_t publisher, std::span<const std::span<const uint8_t>> frames);
  void stage_batch(uint32_t publisher, uint64_t seq, std::span<const uint8_t> payload);
  // Applies up to hashes_per_turn hashes of the backlog.
  void run_turn();
  // Applies `budget` hashes of b at most; returns those used. Done when b.event == events.
  size_t apply_some(batch_work& b, size_t budget);
  void finish(batch_work& b);
  // Queues p's items in front of p's first message waiting in the backlog (replays, see .cpp).
  void queue_for(uint32_t publisher, std::vector<work_item> items);
  bool has_waiting(uint32_t publisher) const;
  void drop(publisher_metrics& m, log_times& logged, drop_cause cause, const std::string& detail);

  signature_cache& cache_;
  kv_decode_limits limits_;
  clock_fn clock_;
  ingest_limits work_;
  std::deque<work_item> backlog_;
  std::vector<work_item> staged_;
  size_t backlog_bytes_ = 0;
  uint64_t hashes_applied_ = 0;
  std::vector<kv_publisher> kv_pubs_;
  std::vector<publisher_metrics> kv_;
  std::vector<publisher_metrics> counts_;
  std::vector<std::optional<uint64_t>> counts_last_seq_;
  // Totals from earlier runs: dropped per cause, gaps, restarts.
  drop_counters prior_dropped_{};
  uint64_t prior_gaps_ = 0, prior_gaps_unfilled_ = 0, prior_restarts_ = 0, prior_replayed_ = 0;
  uint64_t next_token_ = 1;
  std::vector<log_times> kv_logged_, counts_logged_;
  std::vector<kv_decode_issue> issues_;
};

}  // namespace eldr
