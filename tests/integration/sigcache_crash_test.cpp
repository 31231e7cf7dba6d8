// Crash safety of a real `eldr-sigcache ingest` process: SIGKILL in the middle of a stream from a
// Python vLLM publisher, then `eldr-sigcache dump` must show exactly the state after some batch
// S >= the last acknowledged one (an ack line is printed only after its commit), never a partial
// batch; a restarted ingest then fills the lost batches through the replay socket and ends, on
// SIGTERM with exit 0, at the publisher's final state.
#include <gtest/gtest.h>

#include <iostream>

#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tests/support/child_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

const std::string tool = std::string(ELDR_BINARY_DIR) + "/tools/eldr-sigcache/eldr-sigcache";
constexpr uint64_t batches = 400, per_batch = 8;

// Batch i stores blocks i*8+1 .. i*8+8 (a chain) and, every 4th batch, removes batch i-2's.
json batch_events(uint64_t i) {
  std::vector<uint64_t> hs;
  for (uint64_t k = 1; k <= per_batch; ++k)
    hs.push_back(i * per_batch + k);
  json events = json::array();
  events.push_back({{"type", "BlockStored"},
                    {"hashes", hs},
                    {"parent", i == 0 ? json(nullptr) : json(i * per_batch)},
                    {"medium", "GPU"}});
  if (i % 4 == 3) {
    std::vector<uint64_t> old;
    for (uint64_t k = 1; k <= per_batch; ++k)
      old.push_back((i - 2) * per_batch + k);
    events.push_back({{"type", "BlockRemoved"}, {"hashes", old}, {"medium", "GPU"}});
  }
  return events;
}

std::set<uint64_t> expected_after(uint64_t last) {
  std::set<uint64_t> s;
  for (uint64_t i = 0; i <= last; ++i) {
    for (uint64_t k = 1; k <= per_batch; ++k)
      s.insert(i * per_batch + k);
    if (i % 4 == 3)
      for (uint64_t k = 1; k <= per_batch; ++k)
        s.erase((i - 2) * per_batch + k);
  }
  return s;
}

struct dump_result {
  std::set<uint64_t> blocks;
  json stats;
  bool ok = false;
};

dump_result dump(const std::string& db) {
  dump_result d;
  const auto r = testing::run_command(tool + " dump --db " + db);
  if (r.exit_code != 0) return d;
  std::istringstream in(r.output);
  std::string line;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.contains("stats")) {
      d.stats = j["stats"];
      continue;
    }
    if (!j.contains("hash")) continue;  // a log line
    d.blocks.insert(j["hash"].get<uint64_t>());
    // Every block is whole: one holder with one reference, parent chained.
    EXPECT_EQ(j["holders"].size(), 1u) << line;
    EXPECT_FALSE(j["has_counts"].get<bool>());
  }
  d.ok = d.stats.is_object();
  return d;
}

TEST(SigcacheCrash, SigkillMidStreamLosesNothingAcknowledgedAndReplayCatchesUp) {
  testing::temp_dir dir{"eldr-crash"};
  const std::string db = dir.sub("db");
  testing::child_process pub(
      {"/usr/bin/python3", std::string(ELDR_SOURCE_DIR) + "/tests/integration/py/kv_publisher.py",
       "new"});
  const json ep = json::parse(pub.read_line(20s).value_or(""), nullptr, false);
  ASSERT_TRUE(ep.is_object());
  auto cmd = [&](const json& c) {
    pub.write_line(c.dump());
    return json::parse(pub.read_line(20s).value_or(""), nullptr, false);
  };

  uint64_t last_ack = 0;
  {
    // Small group commits, so that the kill falls between many of them.
    testing::child_process ingest({tool, "ingest", "--db", db, "--kv-endpoint", ep["pub"],
                                   "--print-acks", "--max-messages-per-commit", "8"});
    ASSERT_NE(ingest.read_line(20s).value_or("").find("ready"), std::string::npos);
    ASSERT_EQ(cmd({{"cmd", "wait_subscriber"}})["ok"], true);
    for (uint64_t i = 0; i < batches / 4; ++i)
      ASSERT_EQ(cmd({{"cmd", "send"}, {"seq", i}, {"events", batch_events(i)}})["ok"], true);
    // Once the first eighth is acknowledged, start a burst of the rest, and kill the ingest as
    // soon as it acknowledges a batch past the half: mid-stream, with batches in flight.
    bool burst_sent = false, acked = false;
    while (auto line = ingest.read_line(20s)) {
      const json j = json::parse(*line, nullptr, false);
      if (!j.contains("ack")) continue;
      last_ack = j["ack"]["seq"].get<uint64_t>();
      if (!burst_sent && last_ack >= batches / 8) {
        json burst = json::array();
        for (uint64_t i = batches / 4; i < batches; ++i)
          burst.push_back({{"seq", i}, {"events", batch_events(i)}});
        pub.write_line(json{{"cmd", "burst"}, {"batches", burst}}.dump());
        burst_sent = true;
      }
      if (last_ack >= batches / 2) {
        ingest.signal(SIGKILL);
        acked = true;
        break;
      }
    }
    ASSERT_EQ(json::parse(pub.read_line(20s).value_or(""), nullptr, false)["ok"], true);
    ASSERT_TRUE(acked);
    ingest.wait();
  }

  const dump_result crashed = dump(db);
  ASSERT_TRUE(crashed.ok);
  const json seq = crashed.stats["workers"][0]["last_seq"];
  ASSERT_TRUE(seq.is_number());
  const uint64_t durable = seq.get<uint64_t>();
  EXPECT_GE(durable, last_ack);
  std::cout << "killed after ack " << last_ack << "; durable through batch " << durable << " of "
            << batches << "\n";
  EXPECT_EQ(crashed.blocks, expected_after(durable));  // exactly the state after batch `durable`
  EXPECT_EQ(crashed.stats["blocks"].get<uint64_t>(), crashed.blocks.size());

  // Restart with the replay endpoint; the next live batch reveals the gap, the replay fills it.
  testing::child_process again({tool, "ingest", "--db", db, "--kv-endpoint", ep["pub"],
                                "--replay-endpoint", ep["replay"], "--print-acks"});
  ASSERT_NE(again.read_line(20s).value_or("").find("ready"), std::string::npos);
  ASSERT_EQ(cmd({{"cmd", "wait_subscriber"}})["ok"], true);
  ASSERT_EQ(cmd({{"cmd", "send"}, {"seq", batches}, {"events", batch_events(batches)}})["ok"],
            true);
  bool caught_up = false;
  while (auto line = again.read_line(20s)) {
    const json j = json::parse(*line, nullptr, false);
    if (j.contains("ack") && j["ack"]["seq"] == batches) {
      caught_up = true;
      break;
    }
  }
  ASSERT_TRUE(caught_up);
  again.signal(SIGTERM);
  const int st = again.wait();
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);

  const dump_result final_state = dump(db);
  ASSERT_TRUE(final_state.ok);
  EXPECT_EQ(final_state.blocks, expected_after(batches));
  EXPECT_EQ(final_state.stats["gaps"], durable + 1 < batches ? 1 : 0);
  EXPECT_EQ(final_state.stats["gaps_unfilled"], 0);
  EXPECT_EQ(final_state.stats["workers"][0]["last_seq"], batches);

  // --block prints one block, and a missing one exits non-zero.
  const auto one = testing::run_command(tool + " dump --db " + db + " --block " +
                                        std::to_string(batches * per_batch + 1));
  EXPECT_EQ(one.exit_code, 0);
  EXPECT_NE(one.output.find("\"parent\":" + std::to_string(batches * per_batch)),
            std::string::npos);
  EXPECT_NE(testing::run_command(tool + " dump --db " + db + " --block 9").exit_code, 0);
  cmd({{"cmd", "exit"}});
}

}  // namespace
}  // namespace eldr
