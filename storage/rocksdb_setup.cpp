// rocksdb_setup: see rocksdb_setup.hpp.
#include "storage/rocksdb_setup.hpp"

#include <rocksdb/filter_policy.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string_view>

namespace eldr::rocks {

status from_rocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return {};
  if (s.IsCorruption()) return status::corrupt(what + ": " + s.ToString());
  return status::io_error(what + ": " + s.ToString());
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

rocksdb::ReadOptions checked_reads() {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  return ro;
}

rocksdb::Options store_options(const signature_cache_options& opt) {
  rocksdb::Options ro;
  ro.create_if_missing = !opt.read_only;
  if (opt.background_writes) {
    // Serving beside RocksDB (the node): its flushes and compactions yield the CPU to lookups
    // instead of competing with them at equal priority on a small machine. Process-wide (the
    // default Env's pools), and only ever lowered.
    rocksdb::Env::Default()->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW);
    rocksdb::Env::Default()->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::HIGH);
  }
  ro.max_background_jobs = 2;
  ro.write_buffer_size = 16 << 20;
  // Block keys are random 64-bit hashes: in the default skiplist memtable every insert is a
  // chain of cache misses (two thirds of ingest CPU). A hash-bucketed memtable, bucketed by the
  // key's first 3 bytes (tag + the hash's low 16 bits), makes puts and point reads O(1); full
  // scans (open, dump) pay a sort instead, once. Every key is at least 3 bytes long.
  ro.prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(3));
  ro.memtable_factory.reset(rocksdb::NewHashSkipListRepFactory(1 << 18));
  ro.allow_concurrent_memtable_write = false;  // not supported by that memtable; one writer
  // Room for bursts while a flush (which sorts a hash memtable) runs on a busy machine, instead
  // of stalling the ingest thread: at most 4 x 16 MiB of memtables.
  ro.max_write_buffer_number = 4;
  rocksdb::BlockBasedTableOptions table;
  // Point lookups of counts dominate reads: a bloom filter saves the misses a disk read.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  ro.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Faults (docs/signature-cache.md, "Faults"). Any corruption RocksDB finds stops writes instead
  // of being skipped. The WAL replays up to its first bad record and drops the rest: a
  // consistent state after some commit (each commit is one batch with its sequence numbers),
  // which the store reports (health().recovery_notes) rather than refusing to start, since
  // everything it holds can be recomputed by prefill and resent by the publishers.
  ro.paranoid_checks = true;
  // RocksDB's own retries of retryable I/O errors would Resume() behind the store's back.
  ro.max_bgerror_resume_count = 0;
  ro.wal_recovery_mode = rocksdb::WALRecoveryMode::kPointInTimeRecovery;
  return ro;
}

store_logger::store_logger(const std::string& path)
    : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL) {
  if (!path.empty()) {
    // The previous run's log is kept beside, as RocksDB does (one generation here).
    (void)std::rename(path.c_str(), (path + ".old").c_str());
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  }
}

store_logger::~store_logger() {
  if (fd_ >= 0) ::close(fd_);
}

void store_logger::Logv(const char* format, va_list ap) {
  char line[2048];
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  size_t n = std::strftime(line, sizeof(line), "%Y/%m/%d-%H:%M:%S ", &tm);
  const int body = std::vsnprintf(line + n, sizeof(line) - n - 1, format, ap);
  if (body < 0) return;
  const size_t text_start = n;
  n = std::min(n + static_cast<size_t>(body), sizeof(line) - 2);
  if (line[n - 1] != '\n') line[n++] = '\n';
  const std::string_view text(line + text_start, n - text_start - 1);
  // What WAL replay at open reports losing: "<file>: dropping N bytes; <reason>" (a corrupt
  // record and, in point-in-time recovery, everything after it) and "Point in time recovered
  // to log #N seq #S" (db/db_impl/db_impl_open.cc, RecoverLogFiles).
  if (text.find("dropping ") != std::string_view::npos ||
      text.find("Point in time recovered") != std::string_view::npos) {
    std::lock_guard lock(mutex_);
    ++events_;
    if (notes_.size() < 16) notes_.emplace_back(text);
  }
  if (fd_ >= 0 && ::write(fd_, line, n) != static_cast<ssize_t>(n))
    write_errors_.fetch_add(1, std::memory_order_relaxed);
}

void store_logger::recovery(uint64_t& events, std::vector<std::string>& notes) const {
  std::lock_guard lock(mutex_);
  events = events_;
  notes = notes_;
}

}  // namespace eldr::rocks
