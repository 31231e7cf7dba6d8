// ingest: applies vLLM KV-event messages and eldr counts messages to a signature_cache, with the
// per-publisher ordering rules of ../shared/reference/vllm-kv-events.md. No sockets here: the
// ZeroMQ loop (zmq_ingest.hpp) feeds it frames, tests feed it bytes, and a replay is a callback.
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
// Thread safety: none; one thread owns the ingest, the cache and the sockets.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cluster/counts_message.hpp"
#include "cluster/drop_cause.hpp"
#include "cluster/kv_events.hpp"
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

class ingest {
 public:
  // `cache` must outlive the ingest. `clock` drives log rate limiting.
  ingest(signature_cache& cache, kv_decode_limits limits = {}, clock_fn clock = {});

  // Registers a vLLM publisher; returns its index (== its worker id in the cache's registry is
  // kept separately). `replay` may be empty.
  uint32_t add_kv_publisher(const std::string& name, replay_fn replay = {});
  // Registers a counts publisher; returns its index among counts publishers.
  uint32_t add_counts_publisher(const std::string& name);

  // One live vLLM message (all its frames: topic, seq, payload).
  void on_kv_message(uint32_t publisher, std::span<const std::span<const uint8_t>> frames);
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
  struct kv_publisher {
    uint32_t worker = 0;
    replay_fn replay;
  };
  // When each cause was last logged for one publisher, for rate limiting.
  using log_times = std::array<int64_t, drop_cause_count>;

  void apply_kv(uint32_t publisher, uint64_t seq, std::span<const uint8_t> payload);
  void drop(publisher_metrics& m, log_times& logged, drop_cause cause, const std::string& detail);

  signature_cache& cache_;
  kv_decode_limits limits_;
  clock_fn clock_;
  std::vector<kv_publisher> kv_pubs_;
  std::vector<publisher_metrics> kv_;
  std::vector<publisher_metrics> counts_;
  std::vector<std::optional<uint64_t>> counts_last_seq_;
  // Totals from earlier runs: dropped per cause, gaps, restarts.
  drop_counters prior_dropped_{};
  uint64_t prior_gaps_ = 0, prior_gaps_unfilled_ = 0, prior_restarts_ = 0;
  std::vector<log_times> kv_logged_, counts_logged_;
  std::vector<kv_decode_issue> issues_;
};

}  // namespace eldr
