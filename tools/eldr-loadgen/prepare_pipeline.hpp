// prepare_pipeline: one request made ready before it is due. Everything that does not depend on
// timing (the prompt plan, the prefill cache's outcome, which depends on request order alone, the
// KV-event batch and the route request) is encoded ahead, so that the generator's thread only
// publishes, sends, receives and stamps during the timed phase.
//
// Preparation runs on its own thread, ahead of the generator, holding at most a budget of bytes of
// prepared requests; the timed phase starts once every request is prepared or the budget is full
// (runs whose prepared data fits, i.e. nearly all, prepare everything before the clock starts).
// Its budget is --prepare-budget-mib (1 GiB).
//
// Threads: start() and stop() from the owner's thread; the consumer (the generator) reads
// ready(), item() and calls release() from one thread; totals are read after stop().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/status.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

struct prepared_request {
  double handoff = 0.0;  // model time the route request is due
  uint32_t publisher = 0;
  std::vector<uint8_t> kv_payload;  // encoded kv_batch; empty = no events
  std::vector<uint8_t> route_bytes;
  std::size_t footprint() const {
    return sizeof(*this) + kv_payload.capacity() + route_bytes.capacity();
  }
};

// Totals of the prefill emulation over the run's requests.
struct prefill_totals {
  uint64_t kv_blocks_stored = 0, kv_blocks_removed = 0, blocks_total = 0, blocks_hit = 0;
};

class prepare_pipeline {
 public:
  // Prepares s's workload's requests, named run_id + "-" + index, within --prepare-budget-mib.
  // `s` must outlive the pipeline.
  prepare_pipeline(const session& s, std::string run_id);
  ~prepare_pipeline() { stop(); }
  prepare_pipeline(const prepare_pipeline&) = delete;
  prepare_pipeline& operator=(const prepare_pipeline&) = delete;

  // Starts the preparing thread and returns once every request is prepared, the budget is full,
  // preparation failed or `stop`.
  void start(const std::atomic<bool>& stop);
  // Ends and joins the thread (idempotent).
  void stop();

  bool failed() const { return failed_.load(); }
  // Why it failed; only meaningful once failed() (written before the flag).
  const status& failure() const { return failure_; }
  // items [0, ready()) are prepared.
  uint32_t ready() const { return ready_.load(std::memory_order_acquire); }
  // Waits up to 200 us for request i to be prepared (or a failure, or `stop`).
  void wait_for(uint32_t i, const std::atomic<bool>& stop);
  // Request i, prepared (i < ready()).
  prepared_request& item(uint32_t i) { return items_[i]; }
  // Request i is sent: its memory goes back to the budget.
  void release(uint32_t i);
  // Read after stop().
  const prefill_totals& totals() const { return totals_; }

 private:
  void run();

  const session& s_;
  const std::string run_id_;
  const std::size_t budget_bytes_;
  std::vector<prepared_request> items_;
  std::atomic<uint32_t> ready_{0};
  std::atomic<std::size_t> bytes_{0};
  std::atomic<bool> quit_{false}, failed_{false};
  status failure_;  // written before `failed_`
  std::mutex mu_;
  std::condition_variable cv_;  // room freed (consumer) or an item made (producer)
  prefill_totals totals_;
  std::thread thread_;
};

}  // namespace eldr::loadgen
