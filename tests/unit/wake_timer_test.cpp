// Unit tests of wake_timer (core/base/wake_timer.hpp): a job that runs as soon as an event needs
// it but at most once per fast_ms, every slow_ms while idle, with at most one current timer.
#include "core/base/wake_timer.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

TEST(WakeTimer, TheFirstEventRunsTheJobAtOnceAndLaterOnesShareThatRun) {
  wake_timer t(5, 250);
  const auto first = t.wake(100);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->delay_ms, 0);
  EXPECT_EQ(t.due_ms(), 100);
  EXPECT_FALSE(t.wake(100).has_value());  // already due
  EXPECT_TRUE(t.fired(first->token));
  EXPECT_FALSE(t.armed());
}

TEST(WakeTimer, AtMostOneRunPerFastIntervalWhileBusy) {
  wake_timer t(5, 250);
  auto a = *t.wake(0);
  ASSERT_TRUE(t.fired(a.token));
  a = t.ran(0, true);  // still work to do: again at 5
  EXPECT_EQ(a.delay_ms, 5);
  EXPECT_FALSE(t.wake(1).has_value());  // events meanwhile wait for that run
  EXPECT_FALSE(t.wake(4).has_value());
  ASSERT_TRUE(t.fired(a.token));
  const auto slow = t.ran(5, false);  // nothing left: the heartbeat only
  EXPECT_EQ(slow.delay_ms, 250);
  EXPECT_EQ(t.due_ms(), 255);
  // An event 2 ms after the last run waits until 5 ms have passed since it, not until 255.
  const auto soon = t.wake(7);
  ASSERT_TRUE(soon.has_value());
  EXPECT_EQ(soon->delay_ms, 3);
  EXPECT_EQ(t.due_ms(), 10);
  EXPECT_NE(soon->token, slow.token);
  ASSERT_TRUE(t.fired(soon->token));
  const auto idle = t.ran(10, false);
  // The superseded slow timer goes off later: ignored, the current one stays armed.
  EXPECT_FALSE(t.fired(slow.token));
  EXPECT_TRUE(t.armed());
  // After a quiet spell an event runs the job at once.
  const auto later = t.wake(100);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->delay_ms, 0);
  EXPECT_FALSE(t.fired(idle.token));
  EXPECT_TRUE(t.fired(later->token));
  EXPECT_FALSE(t.fired(later->token));  // once
}

TEST(WakeTimer, NothingArmedIgnoresEveryToken) {
  wake_timer t(5, 1);  // slow below fast: fast
  EXPECT_FALSE(t.fired(0));
  EXPECT_FALSE(t.fired(1));
  const auto a = *t.wake(0);
  ASSERT_TRUE(t.fired(a.token));
  EXPECT_EQ(t.ran(0, false).delay_ms, 5);
}

}  // namespace
}  // namespace eldr
