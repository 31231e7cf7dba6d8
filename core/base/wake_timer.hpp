// wake_timer: when a periodic job must run next, for a job that has work only after events: as
// soon as an event needs it but at most once per `fast_ms` (an event after a quiet spell runs it
// at once; events close together share a run), and every `slow_ms` while idle. So an idle owner
// wakes slow_ms / fast_ms times less often than with a fixed fast timer, and an event waits
// less than with one (0 after a quiet spell, against fast_ms / 2 on average). The router's load
// tick with cluster.load_sharing = "authority": at most every 5 ms while anything is routed,
// reported or owed, the vectors' 250 ms heartbeat otherwise (BENCHMARKS.md, "An idle cluster").
//
// The owner arms a timer with the delay and token it is given and calls fired() when one goes
// off; at most one timer is current, and one superseded by an earlier wake-up is ignored when it
// fires (its token is old). Nothing here reads a clock or arms anything. Thread safety: none.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

namespace eldr {

class wake_timer {
 public:
  struct arm {
    int64_t delay_ms = 0;
    uint64_t token = 0;
  };

  // fast_ms, slow_ms >= 1 (slow below fast is taken as fast).
  wake_timer(int64_t fast_ms, int64_t slow_ms)
      : fast_ms_(std::max<int64_t>(fast_ms, 1)), slow_ms_(std::max(slow_ms, fast_ms_)) {}

  // Something needs the job: as soon as fast_ms have passed since it last ran (now, after a quiet
  // spell). A timer to arm (its delay may be 0) when none is current or the current one goes off
  // later than that; nothing when it goes off soon enough.
  std::optional<arm> wake(int64_t now_ms) {
    return arm_at(now_ms, std::max<int64_t>(0, last_ran_ms_ + fast_ms_ - now_ms));
  }

  // A timer went off: true when it is the current one (run the job, then call ran()); false for
  // a superseded one (do nothing).
  bool fired(uint64_t token) {
    if (!armed_ || token != token_) return false;
    armed_ = false;
    return true;
  }

  // The job ran at now_ms; `busy`: it still has work (it sent something, or something is owed),
  // so it runs again within fast_ms, else within slow_ms unless an event wakes it first. Returns
  // the timer to arm (there always is one: the idle job still runs every slow_ms).
  arm ran(int64_t now_ms, bool busy) {
    last_ran_ms_ = now_ms;
    return *arm_at(now_ms, busy ? fast_ms_ : slow_ms_);
  }

  bool armed() const { return armed_; }
  int64_t due_ms() const { return due_ms_; }

 private:
  std::optional<arm> arm_at(int64_t now_ms, int64_t delay_ms) {
    if (armed_ && due_ms_ <= now_ms + delay_ms) return std::nullopt;
    armed_ = true;
    due_ms_ = now_ms + delay_ms;
    return arm{delay_ms, ++token_};
  }

  int64_t fast_ms_, slow_ms_;
  bool armed_ = false;
  int64_t due_ms_ = 0;
  uint64_t token_ = 0;
  // Long enough ago that the first wake-up runs the job at once (without overflowing a sum).
  int64_t last_ran_ms_ = std::numeric_limits<int64_t>::min() / 2;
};

}  // namespace eldr
