// publisher_registry: the bound, idempotent registration, conflicts, forgetting by silence, and
// the persisted form.
#include "cluster/ingest/publisher_registry.hpp"

#include <gtest/gtest.h>

namespace eldr {
namespace {

publisher_registration kv(const std::string& endpoint, const std::string& replay = "",
                          uint32_t model = 0) {
  return {model, endpoint, replay, false};
}

TEST(PublisherRegistry, RefusesBeyondTheBoundAndTakesTheSameEndpointOnce) {
  publisher_registry r(2, 0);
  EXPECT_EQ(r.admit(kv("tcp://a:1"), false, 0).outcome, admit_outcome::added);
  EXPECT_EQ(r.admit(kv("tcp://a:1"), false, 0).outcome, admit_outcome::existing);
  EXPECT_EQ(r.admit(kv("tcp://b:1"), true, 0).outcome, admit_outcome::added);
  EXPECT_EQ(r.size(), 2u);
  const auto full = r.admit(kv("tcp://c:1"), false, 0);
  EXPECT_EQ(full.outcome, admit_outcome::full);
  EXPECT_NE(full.message.find("signature_cache.max_publishers"), std::string::npos) << full.message;
  EXPECT_EQ(r.admit(kv("tcp://a:1"), false, 0).outcome, admit_outcome::existing);  // still fine
  r.remove("tcp://b:1");
  EXPECT_EQ(r.admit(kv("tcp://c:1"), false, 0).outcome, admit_outcome::added);
}

TEST(PublisherRegistry, AnotherModelOrKindConflictsANewReplayEndpointUpdates) {
  publisher_registry r(8, 0);
  ASSERT_EQ(r.admit(kv("tcp://a:1"), false, 0).outcome, admit_outcome::added);
  EXPECT_EQ(r.admit(kv("tcp://a:1", "", 1), false, 0).outcome, admit_outcome::conflict);
  EXPECT_EQ(r.admit({0, "tcp://a:1", "", true}, false, 0).outcome, admit_outcome::conflict);
  EXPECT_EQ(r.admit(kv("tcp://a:1", "tcp://a:2"), false, 0).outcome, admit_outcome::updated);
  EXPECT_EQ(r.find("tcp://a:1")->reg.replay_endpoint, "tcp://a:2");
  EXPECT_EQ(r.size(), 1u);
}

TEST(PublisherRegistry, ForgetsOnlyRegisteredActivePublishersSilentForTheInterval) {
  publisher_registry r(8, 100);
  r.admit(kv("tcp://reg:1"), false, 0);
  r.admit(kv("tcp://conf:1"), true, 0);
  r.admit(kv("tcp://pending:1"), false, 0);
  r.activate("tcp://reg:1", 0);
  r.activate("tcp://conf:1", 1);
  EXPECT_TRUE(r.silent(99).empty());
  r.note_activity("tcp://reg:1", 5, 50);  // heard from at 50
  EXPECT_TRUE(r.silent(149).empty());
  r.note_activity("tcp://reg:1", 5, 140);  // no new message: still silent since 50
  EXPECT_EQ(r.silent(150), std::vector<std::string>{"tcp://reg:1"});
  EXPECT_TRUE(publisher_registry(8, 0).silent(1'000'000).empty());  // 0 = never
}

TEST(PublisherRegistry, PersistsRegisteredEntriesOfOneModel) {
  publisher_registry r(8, 0);
  r.admit(kv("tcp://a:1", "tcp://a:2"), false, 0);
  r.admit({0, "tcp://c:1", "", true}, false, 0);
  r.admit(kv("tcp://conf:1"), true, 0);        // configured: the config file brings it back
  r.admit(kv("tcp://m1:1", "", 1), false, 0);  // another model
  auto back = publisher_registry::decode(r.encode_model(0), 0);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].endpoint, "tcp://a:1");
  EXPECT_EQ((*back)[0].replay_endpoint, "tcp://a:2");
  EXPECT_FALSE((*back)[0].counts);
  EXPECT_EQ((*back)[1].endpoint, "tcp://c:1");
  EXPECT_TRUE((*back)[1].counts);
  EXPECT_FALSE(publisher_registry::decode("{", 0).ok());
  EXPECT_FALSE(publisher_registry::decode(R"([{"endpoint": 3}])", 0).ok());
}

}  // namespace
}  // namespace eldr
