// failover_budget: rare shard timeouts always fail over; when most parts time out (a saturated
// cluster), failovers stop after a few and stay at about token_ratio per answered part, so the
// shards' work cannot double; answers refill the budget; bad settings are refused.
#include "core/membership/failover_budget.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

failover_budget make_default() {
  auto b = failover_budget::make();
  EXPECT_TRUE(b.ok());
  return *b;
}

TEST(FailoverBudget, RefusesBadSettings) {
  EXPECT_FALSE(failover_budget::make(0.0, 0.1).ok());
  EXPECT_FALSE(failover_budget::make(-1.0, 0.1).ok());
  EXPECT_FALSE(failover_budget::make(10.0, 0.0).ok());
  EXPECT_FALSE(failover_budget::make(10.0, 11.0).ok());
  EXPECT_TRUE(failover_budget::make(10.0, 10.0).ok());
}

TEST(FailoverBudget, RareTimeoutsAlwaysFailOver) {
  auto b = make_default();
  // One part in 20 times out, for a long time: every one of them is asked elsewhere.
  for (int i = 0; i < 20000; ++i) {
    if (i % 20 == 19)
      EXPECT_TRUE(b.on_timeout()) << "timeout " << i / 20;
    else
      b.on_answer();
  }
  EXPECT_EQ(b.allowed(), 1000u);
  EXPECT_EQ(b.refused(), 0u);
}

// What went wrong on a saturated 3-node cluster: every part timed out, and each one was asked of
// the next owner, which timed out too. The budget lets the first few through, then refuses.
TEST(FailoverBudget, AStormOfTimeoutsIsCutAfterAFew) {
  auto b = make_default();
  int allowed = 0;
  for (int i = 0; i < 1000; ++i)
    allowed += b.on_timeout() ? 1 : 0;
  EXPECT_EQ(allowed, 4);  // 10 tokens: 9, 8, 7, 6 are above half; 5 is not
  EXPECT_EQ(b.refused(), 996u);
  EXPECT_DOUBLE_EQ(b.tokens(), 0.0);
}

TEST(FailoverBudget, WithHalfThePartsTimingOutFailoversStayNearTheRatio) {
  auto b = make_default();
  // Half the parts time out: failovers are bounded by about token_ratio per answer once the
  // initial tokens are spent (here 10,000 answers: at most 4 + 0.1 x 10,000).
  for (int i = 0; i < 20000; ++i) {
    if (i % 2 == 0)
      b.on_answer();
    else
      (void)b.on_timeout();
  }
  EXPECT_LE(b.allowed(), 4u + 1000u);
  EXPECT_GE(b.refused(), 9000u);
}

TEST(FailoverBudget, AnswersRefillTheBudget) {
  auto b = make_default();
  for (int i = 0; i < 10; ++i)
    (void)b.on_timeout();
  EXPECT_FALSE(b.on_timeout());
  // 0 tokens: 50 answers make 5, not above half of 10 once the next timeout takes 1.
  for (int i = 0; i < 50; ++i)
    b.on_answer();
  EXPECT_FALSE(b.on_timeout());  // 5.0 - 1 = 4.0
  for (int i = 0; i < 1000; ++i)
    b.on_answer();
  EXPECT_DOUBLE_EQ(b.tokens(), 10.0);  // capped
  EXPECT_TRUE(b.on_timeout());
}

}  // namespace
}  // namespace eldr
