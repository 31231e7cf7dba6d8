// signature_cache under faults, on a real RocksDB: a full file system (a small tmpfs mounted for
// the test, so root is needed; skipped otherwise), a damaged SST (4 KiB overwritten, one bit
// flipped), a damaged WAL, and a store that cannot be opened (docs/signature-cache.md, "Faults").
#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

#include "storage/signature_cache.hpp"
#include "tests/support/small_fs.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

namespace fs = std::filesystem;

// Large dense counts (8 layers x 64 experts, 512 bytes a block) so that counts fill the store's
// files: a damaged spot in the middle of an SST lands in counts, as it would in production.
const model_geometry geo{8, 64, 8};

block_counts counts_for(uint64_t seed) {
  std::vector<uint32_t> off = {0};
  std::vector<expert_id> ids;
  std::vector<uint8_t> cnt;
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (uint32_t l = 0; l < geo.layers; ++l) {
    std::vector<uint8_t> c(geo.experts, 4);  // 32 tokens x top-8 = 256 = 64 x 4
    for (int t = 0; t < 64; ++t) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const auto from = static_cast<size_t>((x >> 33) % geo.experts);
      const auto to = static_cast<size_t>((x >> 17) % geo.experts);
      if (c[from] > 1 && c[to] < 31) --c[from], ++c[to];
    }
    for (uint32_t e = 0; e < geo.experts; ++e) {
      ids.push_back(static_cast<expert_id>(e));
      cnt.push_back(c[e]);
    }
    off.push_back(static_cast<uint32_t>(ids.size()));
  }
  auto b = block_counts::from_parts(geo, 32, off, ids, cnt);
  EXPECT_TRUE(b.ok()) << b.error().to_string();
  return *b;
}

// Blocks first..first+n-1 held by worker 0, each with its counts (hash = seed).
void put_blocks(signature_cache& c, uint64_t first, size_t n) {
  const uint32_t w = c.worker_id("tcp://publisher:1");
  std::vector<block_hash> hashes(n);
  std::iota(hashes.begin(), hashes.end(), first);
  c.store_blocks(holder_key{w, 0, 0, "GPU"}, std::nullopt, hashes);
  for (block_hash h : hashes)
    ASSERT_TRUE(c.put_counts(h, std::nullopt, geo, counts_for(h)).ok());
}

std::vector<block_hash> range(uint64_t first, size_t n) {
  std::vector<block_hash> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

result<prefix_sum_info> lookup(signature_cache& c, std::span<const block_hash> hashes) {
  std::vector<uint32_t> sum(c.layer_mask().size() * geo.experts, 0);
  return c.sum_prefix(hashes, sum);
}

using testing::small_fs;

void fill(const std::string& path) {
  ASSERT_TRUE(small_fs::fill(path)) << "could not fill the file system";
}

template <class F>
bool eventually(F&& done, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling interval, not a wait
  }
  return done();
}

signature_cache_options options(bool background) {
  signature_cache_options o;
  o.geometry = geo;
  o.background_writes = background;
  o.retry_interval_ms = 20;
  return o;
}

void expect_all_counted(signature_cache& c, uint64_t first, size_t n) {
  const auto hashes = range(first, n);
  size_t with = 0;
  for (block_hash h : hashes)
    if (auto b = c.block(h); b.ok() && b->has_counts) ++with;
  EXPECT_EQ(with, n) << "blocks " << first << ".." << first + n - 1;
  auto info = lookup(c, hashes);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->with_counts, n);
  EXPECT_EQ(info->read_errors, 0u);
}

// The node's configuration (background writer). Before the fix the process aborted here
// (SIGABRT: writable_file_writer.h `sync_without_flush_called_`, from RocksDB's info LOG).
TEST(SignatureStoreFaults, FullDiskDegradesKeepsServingAndRecoversWhenSpaceReturns) {
  testing::temp_dir dir{"eldr-store-faults"};
  small_fs disk(dir.sub("fs"), "16m");
  if (!disk.mounted) GTEST_SKIP() << disk.why;
  const std::string db = disk.dir + "/db";
  {
    auto opened = signature_cache::open(db, options(true));
    ASSERT_TRUE(opened.ok()) << opened.error().to_string();
    auto& c = **opened;
    put_blocks(c, 1, 200);
    ASSERT_TRUE(c.flush().ok());
    EXPECT_FALSE(c.health().degraded);

    fill(disk.dir + "/filler");
    uint64_t next = 1000;
    for (int round = 0; round < 400 && !c.health().degraded; ++round, next += 50) {
      put_blocks(c, next, 50);
      (void)c.commit();
      (void)c.flush();
    }
    const store_health h = c.health();
    ASSERT_TRUE(h.degraded) << "the full file system took every write";
    EXPECT_NE(h.reason.find("No space left"), std::string::npos) << h.reason;
    EXPECT_GE(h.write_errors, 1u);
    EXPECT_GT(h.degraded_since_ms, 0);

    // Still serving from memory, still taking changes, which are held.
    expect_all_counted(c, 1000, next - 1000);
    put_blocks(c, 100'000, 50);
    const status held = c.commit();
    EXPECT_EQ(held.code(), status_code::io_error) << held.to_string();
    EXPECT_NE(held.message().find("degraded"), std::string::npos) << held.to_string();
    EXPECT_GE(c.health().unpersisted_commits, 1u);
    EXPECT_GE(c.health().pending_changes, 50u);
    expect_all_counted(c, 100'000, 50);

    fs::remove(disk.dir + "/filler");
    ASSERT_TRUE(eventually([&] {
      (void)c.commit();
      return !c.health().degraded;
    })) << c.health().reason;
    ASSERT_TRUE(c.flush().ok());
    const store_health after = c.health();
    EXPECT_EQ(after.recoveries, 1u);
    EXPECT_GT(after.recovered_at_ms, 0);
    EXPECT_EQ(after.pending_changes, 0u);
    put_blocks(c, 200'000, 10);  // new writes after the recovery
    ASSERT_TRUE(c.flush().ok());

    // Everything held while degraded was written: it survives a reopen.
    opened->reset();
    auto again = signature_cache::open(db, options(true));
    ASSERT_TRUE(again.ok()) << again.error().to_string();
    expect_all_counted(**again, 1, 200);
    expect_all_counted(**again, 1000, next - 1000);
    expect_all_counted(**again, 100'000, 50);
    expect_all_counted(**again, 200'000, 10);
    EXPECT_FALSE((*again)->health().degraded);
  }
}

// Without the writer thread (tools): commit() itself retries, once per retry_interval_ms of the
// injected clock.
TEST(SignatureStoreFaults, FullDiskWithoutWriterRetriesOnTheInjectedClock) {
  testing::temp_dir dir{"eldr-store-faults"};
  small_fs disk(dir.sub("fs"), "16m");
  if (!disk.mounted) GTEST_SKIP() << disk.why;
  int64_t now = 1000;
  auto o = options(false);
  o.retry_interval_ms = 5000;
  o.clock = [&] { return now; };
  auto opened = signature_cache::open(disk.dir + "/db", o);
  ASSERT_TRUE(opened.ok()) << opened.error().to_string();
  auto& c = **opened;
  fill(disk.dir + "/filler");
  uint64_t next = 1;
  status s;
  for (int round = 0; round < 400 && s.ok(); ++round, next += 50) {
    put_blocks(c, next, 50);
    s = c.commit();
  }
  ASSERT_FALSE(s.ok());
  ASSERT_TRUE(c.health().degraded);
  fs::remove(disk.dir + "/filler");
  EXPECT_FALSE(c.commit().ok()) << "retried before retry_interval_ms";
  now += 5000;
  ASSERT_TRUE(c.commit().ok()) << c.health().reason;
  EXPECT_FALSE(c.health().degraded);
  opened->reset();
  auto again = signature_cache::open(disk.dir + "/db", o);
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  expect_all_counted(**again, 1, next - 1);
}

// Damage tests: a store of 4,000 blocks whose records are in one SST (written by the flush that
// replays the WAL at the second open).
struct DamagedStore : ::testing::Test {
  testing::temp_dir dir{"eldr-store-damage"};
  std::string db() const { return dir.sub("db"); }
  static constexpr size_t n = 4000;

  void SetUp() override {
    {
      auto c = signature_cache::open(db(), options(false));
      ASSERT_TRUE(c.ok()) << c.error().to_string();
      for (uint64_t first = 1; first <= n; first += 100) {
        put_blocks(**c, first, 100);
        ASSERT_TRUE((*c)->commit().ok());
      }
    }
    auto c = signature_cache::open(db(), options(false));  // the WAL goes into an SST
    ASSERT_TRUE(c.ok()) << c.error().to_string();
  }

  std::string largest(const std::string& ext) const {
    std::string best;
    uintmax_t size = 0;
    for (const auto& e : fs::directory_iterator(db()))
      if (e.path().extension() == ext && e.file_size() > size) {
        size = e.file_size();
        best = e.path().string();
      }
    return best;
  }

  static void overwrite(const std::string& path, uintmax_t at, const std::string& bytes) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << path;
    f.seekp(static_cast<std::streamoff>(at));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  // Opens the damaged store and looks every block up: the damage must show as read errors,
  // counted by health(), never as silently missing counts.
  void expect_reported() {
    auto c = signature_cache::open(db(), options(false));
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ((*c)->stats().blocks, n);
    const auto hashes = range(1, n);
    uint32_t with = 0, errors = 0;
    for (size_t i = 0; i < n; i += 64) {
      auto info = lookup(**c, std::span(hashes).subspan(i, std::min<size_t>(64, n - i)));
      ASSERT_TRUE(info.ok());
      with += info->with_counts;
      errors += info->read_errors;
    }
    EXPECT_GT(errors, 0u) << "the damage was read as missing counts";
    EXPECT_EQ(with + errors, n) << "every block is either read or reported";
    const store_health h = (*c)->health();
    EXPECT_EQ(h.read_errors, errors);
    EXPECT_NE(h.last_read_error.find("orruption"), std::string::npos) << h.last_read_error;
    // A record that cannot be read is forgotten: the next prefill stores its counts again.
    ASSERT_TRUE((*c)->commit().ok());
    for (size_t i = 0; i < n; i += 64)
      ASSERT_TRUE(lookup(**c, std::span(hashes).subspan(i, std::min<size_t>(64, n - i))).ok());
    EXPECT_EQ((*c)->health().read_errors, errors) << "a forgotten record is not read again";
    const uint64_t lost = n - (*c)->stats().blocks_with_counts;
    EXPECT_EQ(lost, errors);
  }
};

TEST_F(DamagedStore, FourKibOverwrittenInAnSstIsReportedByTheLookupsThatHitIt) {
  const std::string sst = largest(".sst");
  ASSERT_FALSE(sst.empty());
  std::string junk(4096, '\0');
  for (size_t i = 0; i < junk.size(); ++i)
    junk[i] = static_cast<char>((i * 2654435761u) >> 13);
  overwrite(sst, fs::file_size(sst) / 2, junk);
  expect_reported();
}

TEST_F(DamagedStore, OneFlippedBitInAnSstIsReportedByTheLookupsThatHitIt) {
  const std::string sst = largest(".sst");
  ASSERT_FALSE(sst.empty());
  const uintmax_t at = fs::file_size(sst) / 2;
  std::string byte(1, '\0');
  {
    std::ifstream in(sst, std::ios::binary);
    in.seekg(static_cast<std::streamoff>(at));
    in.read(byte.data(), 1);
  }
  byte[0] = static_cast<char>(byte[0] ^ 0x10);
  overwrite(sst, at, byte);
  expect_reported();
}

// The store after a crash whose WAL was damaged in its middle: RocksDB replays up to the damage
// (point-in-time recovery), and the store says what it dropped.
TEST(SignatureStoreDamage, DamagedWalIsReplayedUpToTheDamageAndReported) {
  testing::temp_dir dir{"eldr-store-damage"};
  const std::string db = dir.sub("db");
  {
    auto c = signature_cache::open(db, options(false));
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    for (uint64_t first = 1; first <= 5000; first += 100) {
      put_blocks(**c, first, 100);
      ASSERT_TRUE((*c)->commit().ok());
    }
  }  // closed without a flush: every record is in the WAL only
  std::string wal;
  for (const auto& e : fs::directory_iterator(db))
    if (e.path().extension() == ".log" && e.file_size() > 0) wal = e.path().string();
  ASSERT_FALSE(wal.empty());
  {
    std::fstream f(wal, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(wal) / 5));
    const std::string junk(512, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto c = signature_cache::open(db, options(false));
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const auto blocks = (*c)->stats().blocks;
  EXPECT_LT(blocks, 5000u);
  EXPECT_GT(blocks, 0u);
  const store_health h = (*c)->health();
  EXPECT_GE(h.recovery_events, 1u);
  ASSERT_FALSE(h.recovery_notes.empty());
  const bool dropping =
      std::any_of(h.recovery_notes.begin(), h.recovery_notes.end(),
                  [](const std::string& s) { return s.find("dropping") != std::string::npos; });
  EXPECT_TRUE(dropping) << h.recovery_notes.front();
  // What was kept is whole commits: every loaded block has its counts.
  EXPECT_EQ((*c)->stats().blocks_with_counts, blocks);
  EXPECT_EQ(blocks % 100, 0u);
}

// A clean store reports no recovery.
TEST(SignatureStoreDamage, CleanReopenReportsNothing) {
  testing::temp_dir dir{"eldr-store-damage"};
  for (int i = 0; i < 2; ++i) {
    auto c = signature_cache::open(dir.sub("db"), options(false));
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    put_blocks(**c, 1, 10);
    ASSERT_TRUE((*c)->commit().ok());
    const auto h = (*c)->health();
    EXPECT_EQ(h.recovery_events, 0u);
    EXPECT_EQ(h.read_errors, 0u);
    EXPECT_FALSE(h.degraded);
  }
}

TEST(SignatureStoreDamage, UnopenableStoreNamesTheDirectoryAndRocksDbsReason) {
  testing::temp_dir dir{"eldr-store-damage"};
  const std::string db = dir.sub("db");
  {
    auto c = signature_cache::open(db, options(false));
    ASSERT_TRUE(c.ok());
  }
  std::ofstream(db + "/CURRENT", std::ios::trunc)
      << "MANIFEST-999999\n";  // a manifest that is gone
  auto c = signature_cache::open(db, options(false));
  ASSERT_FALSE(c.ok());
  const std::string m = c.error().message();
  EXPECT_NE(m.find(db), std::string::npos) << m;
  EXPECT_NE(m.find("MANIFEST-999999"), std::string::npos) << m;
}

}  // namespace
}  // namespace eldr
