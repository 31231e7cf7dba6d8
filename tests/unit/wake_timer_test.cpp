// Unit tests of wake_timer (core/base/wake_timer.hpp): a job that runs within fast_ms of an
// event, every slow_ms while idle, with at most one current timer.
#include "core/base/wake_timer.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

TEST(WakeTimer, AnEventArmsOneFastTimerAndLaterEventsNone) {
  wake_timer t(5, 250);
  const auto first = t.wake(100);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->delay_ms, 5);
  EXPECT_EQ(t.due_ms(), 105);
  EXPECT_FALSE(t.wake(101).has_value());  // the armed one goes off at 105: soon enough
  EXPECT_FALSE(t.wake(100).has_value());
  EXPECT_TRUE(t.fired(first->token));
  EXPECT_FALSE(t.armed());
}

TEST(WakeTimer, BusyStaysFastIdleGoesSlowAndAnEventSupersedesTheSlowTimer) {
  wake_timer t(5, 250);
  auto a = *t.wake(0);
  ASSERT_TRUE(t.fired(a.token));
  a = t.ran(5, true);  // still work to do
  EXPECT_EQ(a.delay_ms, 5);
  ASSERT_TRUE(t.fired(a.token));
  const auto slow = t.ran(10, false);  // idle: the heartbeat only
  EXPECT_EQ(slow.delay_ms, 250);
  EXPECT_EQ(t.due_ms(), 260);
  // A decision at 20 cannot wait until 260: a fast timer supersedes the slow one.
  const auto fast = t.wake(20);
  ASSERT_TRUE(fast.has_value());
  EXPECT_EQ(fast->delay_ms, 5);
  EXPECT_NE(fast->token, slow.token);
  EXPECT_FALSE(t.wake(22).has_value());
  EXPECT_TRUE(t.fired(fast->token));
  const auto next = t.ran(25, false);
  // The superseded slow timer goes off later: ignored, the current one stays armed.
  EXPECT_FALSE(t.fired(slow.token));
  EXPECT_TRUE(t.armed());
  EXPECT_TRUE(t.fired(next.token));
  EXPECT_FALSE(t.fired(next.token));  // once
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
