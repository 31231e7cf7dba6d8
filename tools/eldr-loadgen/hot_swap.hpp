// hot_swap: --swap-at, a second centroid set imported under load during the eldr policy's run,
// and the measurement of the switch-over from the run's route records. The import goes through
// its own admin client on its own thread, which sleeps in 20 ms slices until the swap time, so
// that the route socket's timing is left alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/route_book.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// --swap-at's second centroid set: the imported set with every coordinate scaled by a factor in
// [0.95, 1.05] (seeded), rows re-normalised: valid, same K and spec, slightly different routing.
result<std::vector<uint8_t>> swap_centroid_bytes(session& s);

class hot_swap {
 public:
  // Makes the second set and connects the admin client to --node, before the clock starts.
  static result<std::unique_ptr<hot_swap>> prepare(session& s);
  ~hot_swap() { finish(); }
  hot_swap(const hot_swap&) = delete;
  hot_swap& operator=(const hot_swap&) = delete;

  // Starts the thread: at_s run-relative seconds after clock.start it imports the set, unless
  // `stop` or finish() comes first. `clock` and `stop` must outlive the thread.
  void start(const run_clock& clock, double at_s, const std::atomic<bool>& stop);
  // The run is over: gives up waiting for the swap time and joins (idempotent).
  void finish();

  // After finish(): the node acknowledged the import, now serving epoch_after().
  bool imported() const { return done_ && failure_.ok(); }
  uint64_t epoch_after() const { return epoch_after_; }
  // After finish(): the switch-over as the run's records saw it; times in ms relative to the
  // import's send, "near" = sent within +-1 s of it.
  swap_result measure(const std::vector<request_record>& rec, uint64_t epoch_before) const;

 private:
  hot_swap() = default;

  std::string model_;
  std::vector<uint8_t> file_;  // the second centroid set
  std::unique_ptr<admin_client> admin_;
  std::atomic<bool> run_over_{false};  // the run ended: give up waiting for swap_at
  bool done_ = false;
  status failure_;
  wall_clock::time_point t_sent_{}, t_acked_{};
  uint64_t epoch_after_ = 0;
  std::thread thread_;
};

}  // namespace eldr::loadgen
