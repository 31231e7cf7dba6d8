// centroid_history: what `centroids rollback` undoes -- the newest change, whatever the epoch
// numbers (a swap to an older epoch is undone by going forward again); a cluster's renumbered
// rollback recorded alike on every router; the digest ignores only the epoch number; capacity;
// the persisted text round-trips and refuses what it cannot read, naming the line.
#include "core/formats/centroid_history.hpp"

#include <gtest/gtest.h>

#include <string>

namespace eldr {
namespace {

// A set whose centroids differ by `tag` (content), numbered `epoch`.
centroid_file set_of(float tag, uint64_t epoch) {
  centroid_file f;
  f.model_name = "m";
  f.spec = *signature_spec::make(model_geometry{1, 2, 1}, signature_transform::count, {}, {});
  f.workers = 1;
  f.centroids = {tag, 1.0f - tag};
  f.epoch = epoch;
  return f;
}

centroid_change change(uint64_t epoch, float tag, std::string cause) {
  return {epoch, content_digest(set_of(tag, epoch)), std::move(cause), 0};
}

TEST(ContentDigest, IgnoresTheEpochNumberAndSeesEveryOtherDifference) {
  EXPECT_EQ(content_digest(set_of(0.25f, 1)), content_digest(set_of(0.25f, 7)));
  EXPECT_NE(content_digest(set_of(0.25f, 1)), content_digest(set_of(0.5f, 1)));
  auto named = set_of(0.25f, 1);
  named.provenance.source = "another fit";
  EXPECT_NE(content_digest(named), content_digest(set_of(0.25f, 1)));
}

TEST(CentroidHistory, RollbackReturnsToTheSetTheNewestChangeReplaced) {
  centroid_history h;
  EXPECT_FALSE(h.previous().ok());
  EXPECT_FALSE(h.record(change(1, 0.1f, "import")));
  auto none = h.previous();
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), status_code::not_found);
  EXPECT_NE(none.error().message().find("nothing to undo"), std::string::npos);
  h.record(change(2, 0.2f, "import"));
  ASSERT_TRUE(h.previous().ok());
  EXPECT_EQ(h.previous()->epoch, 1u);
  // The rollback installs epoch 1 again: the import of 2 is undone, not stacked.
  EXPECT_TRUE(h.record(change(1, 0.1f, "rollback")));
  ASSERT_EQ(h.changes().size(), 1u);
  EXPECT_EQ(h.changes().back().epoch, 1u);
  EXPECT_EQ(h.changes().back().cause, "import");
}

// The case: after `swap 1` from 2, rollback goes back to 2 (the older epoch number is not
// "the previous set").
TEST(CentroidHistory, ASwapToAnOlderEpochIsUndoneByGoingForward) {
  centroid_history h;
  h.record(change(1, 0.1f, "import"));
  h.record(change(2, 0.2f, "import"));
  EXPECT_FALSE(h.record(change(1, 0.1f, "swap")));  // a swap is a change, never an undo
  ASSERT_EQ(h.changes().size(), 3u);
  ASSERT_TRUE(h.previous().ok());
  EXPECT_EQ(h.previous()->epoch, 2u);
  EXPECT_TRUE(h.record(change(2, 0.2f, "rollback")));
  EXPECT_EQ(h.previous()->epoch, 1u);  // and the next rollback undoes the import of 2
}

// In a cluster the leader re-publishes the older set as a new epoch: the entry below takes the new
// number (where the store now keeps the set), and repeated rollbacks walk further back.
TEST(CentroidHistory, ARenumberedRollbackTakesTheNewEpochAndWalksBack) {
  centroid_history h;
  h.record(change(3000001, 0.1f, "import"));
  h.record(change(3000002, 0.2f, "refit"));
  h.record(change(3000003, 0.3f, "import"));
  EXPECT_TRUE(h.record(change(3000004, 0.2f, "rollback")));
  ASSERT_EQ(h.changes().size(), 2u);
  EXPECT_EQ(h.changes().back().epoch, 3000004u);
  EXPECT_EQ(h.changes().back().digest, content_digest(set_of(0.2f, 0)));
  EXPECT_EQ(h.previous()->epoch, 3000001u);
  EXPECT_TRUE(h.record(change(3000005, 0.1f, "rollback")));
  EXPECT_FALSE(h.previous().ok());
}

// A router whose history diverged (it missed changes) records a rollback that matches nothing as
// a change; a restart installing the current set records nothing.
TEST(CentroidHistory, AnUnmatchedRollbackIsAChangeAndARepeatIsNothing) {
  centroid_history h;
  h.record(change(1, 0.1f, "start"));
  EXPECT_FALSE(h.record(change(1, 0.1f, "start")));
  EXPECT_EQ(h.changes().size(), 1u);
  EXPECT_FALSE(h.record(change(5, 0.9f, "rollback")));
  EXPECT_EQ(h.changes().size(), 2u);
  // A cause that is not a word is recorded as "other" (the text format writes it unquoted).
  h.record(change(6, 0.6f, "two words"));
  EXPECT_EQ(h.changes().back().cause, "other");
}

TEST(CentroidHistory, ForgetsTheOldestBeyondItsCapacity) {
  centroid_history h(3);
  for (uint64_t e = 1; e <= 5; ++e)
    h.record(change(e, 0.1f * static_cast<float>(e), "refit"));
  ASSERT_EQ(h.changes().size(), 3u);
  EXPECT_EQ(h.changes().front().epoch, 3u);
  h.record(change(4, 0.4f, "rollback"));
  h.record(change(3, 0.3f, "rollback"));
  auto none = h.previous();
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message().find("forgotten"), std::string::npos);
}

TEST(CentroidHistory, TextRoundTripsAndBadTextNamesTheLine) {
  centroid_history h;
  h.record({7, 0xfedcba9876543210ull, "import", 1234});
  h.record({3000001, 0x1ull, "rollback", -5});
  const std::string text = h.encode();
  auto back = centroid_history::parse(text);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_EQ(back->changes().size(), 2u);
  EXPECT_EQ(back->changes()[0].digest, 0xfedcba9876543210ull);
  EXPECT_EQ(back->changes()[0].at_ms, 1234);
  EXPECT_EQ(back->changes()[1].epoch, 3000001u);
  EXPECT_EQ(back->changes()[1].cause, "rollback");
  EXPECT_EQ(back->encode(), text);

  EXPECT_FALSE(centroid_history::parse("").ok());
  EXPECT_FALSE(centroid_history::parse("something else\n").ok());
  for (const char* bad : {"x 0000000000000001 0 import", "0 0000000000000001 0 import",
                          "1 01 0 import", "1 000000000000000g 0 import", "1 0000000000000001 z a",
                          "1 0000000000000001 0 Import", "1 0000000000000001 0", "1 2 3 4 5"}) {
    auto r = centroid_history::parse("eldr-centroid-history 1\n" + std::string(bad) + "\n");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("line 2"), std::string::npos) << r.error().message();
  }
}

}  // namespace
}  // namespace eldr
