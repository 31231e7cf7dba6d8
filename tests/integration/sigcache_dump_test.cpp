// `eldr-sigcache dump` on a store written before names were checked: a publisher name and a
// medium that are not UTF-8 are printed with U+FFFD, the dump exits 0 and every line is JSON
// (it aborted with nlohmann's type_error.316 before); an absent block and a mistyped --db are
// named on stderr.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "storage/signature_cache.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using nlohmann::json;

const std::string tool = std::string(ELDR_BINARY_DIR) + "/tools/eldr-sigcache/eldr-sigcache";

TEST(SigcacheDump, NamesThatAreNotUtf8AreReplacedNotFatal) {
  testing::temp_dir dir{"eldr-sigcache-dump"};
  const std::string db = dir.sub("db");
  {
    auto cache = signature_cache::open(db, signature_cache_options{});
    ASSERT_TRUE(cache.ok()) << cache.error().to_string();
    holder_key who;
    who.worker = (*cache)->worker_id("tcp://pub\xff\xfe:5557");
    who.medium = "G\xc0U";
    const block_hash hashes[] = {11, 12};
    (*cache)->store_blocks(who, std::nullopt, hashes);
    ASSERT_TRUE((*cache)->commit().ok());
    ASSERT_TRUE((*cache)->flush().ok());
  }
  const auto r = testing::run_command(tool + " dump --db " + db);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::istringstream in(r.output);
  std::string line;
  int blocks = 0;
  json stats;
  while (std::getline(in, line)) {
    const json j = json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    if (j.contains("stats")) stats = j["stats"];
    if (!j.contains("hash")) continue;
    ++blocks;
    ASSERT_EQ(j["holders"].size(), 1u) << line;
    EXPECT_EQ(j["holders"][0]["worker"], "tcp://pub\xef\xbf\xbd\xef\xbf\xbd:5557");
    EXPECT_EQ(j["holders"][0]["medium"], "G\xef\xbf\xbdU");
  }
  EXPECT_EQ(blocks, 2);
  ASSERT_TRUE(stats.is_object()) << r.output;
  EXPECT_EQ(stats["workers"][0]["name"], "tcp://pub\xef\xbf\xbd\xef\xbf\xbd:5557");
  // A --block that is not a number is a usage error, not an uncaught exception.
  EXPECT_EQ(testing::run_command(tool + " dump --db " + db + " --block x12").exit_code, 2);
  const auto one = testing::run_command(tool + " dump --db " + db + " --block 12");
  EXPECT_EQ(one.exit_code, 0) << one.output;
  // A block the store does not hold: exit 1, and stderr says so (it used to say nothing).
  const auto absent = testing::run_command(tool + " dump --db " + db + " --block 99");
  EXPECT_EQ(absent.exit_code, 1) << absent.output;
  EXPECT_NE(absent.output.find("block 99 is not in the store"), std::string::npos) << absent.output;
}

// A mistyped --db: a clear error, and no directory (or store) made where nothing was.
TEST(SigcacheDump, AMissingStoreIsNamedAndNotCreated) {
  testing::temp_dir dir{"eldr-sigcache-dump"};
  const std::string db = dir.sub("nosuchdb");
  const auto r = testing::run_command(tool + " dump --db " + db);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no signature store in " + db), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(db));
}

}  // namespace
}  // namespace eldr
