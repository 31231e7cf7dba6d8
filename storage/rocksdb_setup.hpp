// rocksdb_setup: how the signature store runs RocksDB (internal to storage/): the options it opens
// with, its info logger, its event listener, and RocksDB statuses mapped to eldr's.
//
// Faults (docs/signature-cache.md, "Faults") are shaped here: paranoid checks, point-in-time WAL
// recovery, no automatic resume (the store resumes by itself, see signature_cache_impl.hpp), and
// an info logger that never aborts the process when the disk is full.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/listener.h>

#include <atomic>
#include <cstdarg>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/base/status.hpp"
#include "storage/signature_cache.hpp"

namespace eldr::rocks {

status from_rocks(const rocksdb::Status& s, const std::string& what);

// Milliseconds of the system clock (health's timestamps, never the injected clock).
int64_t wall_ms();

// Reads check RocksDB's block checksums (the default, said here because the store relies on it:
// a damaged SST block is a read error, never other counts).
rocksdb::ReadOptions checked_reads();

// The options every open of a store uses, tuned for random 64-bit block keys and for faults; the
// caller adds the info logger and the listener. With background_writes, lowers the CPU priority of
// RocksDB's process-wide thread pools (see the definition).
rocksdb::Options store_options(const signature_cache_options& opt);

// RocksDB's info log (the LOG file in the database directory). RocksDB's own (EnvLogger) writes
// through a WritableFileWriter and, after a write of it failed (a full disk), calls Append on it
// again for the next line; Debian's librocksdb keeps asserts on, and that Append aborts the
// process in WritableFileWriter::AssertFalseAndGetStatusForPrevError (`sync_without_flush_called_`;
// docs/signature-cache.md, "Faults"). This one writes each line with write(2) and counts the lines
// it could not write. It also keeps what WAL recovery reports dropping, for health().
class store_logger : public rocksdb::Logger {
 public:
  // An empty path writes no file (read-only opens: the LOG belongs to the writing process).
  explicit store_logger(const std::string& path);
  ~store_logger() override;

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override;

  void recovery(uint64_t& events, std::vector<std::string>& notes) const;
  uint64_t write_errors() const { return write_errors_.load(std::memory_order_relaxed); }

 private:
  int fd_ = -1;
  std::atomic<uint64_t> write_errors_{0};
  mutable std::mutex mutex_;
  uint64_t events_ = 0;
  std::vector<std::string> notes_;
};

// RocksDB would resume from a full disk by itself (its SstFileManager polls the free space every
// few seconds); the store does it instead, every retry_interval_ms, so that recovery has one owner
// (and one log line), and a manual DB::Resume() is not refused as Busy while RocksDB's runs.
// Counts background (flush, compaction) errors, which no Write returns at once.
class store_listener : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status,
                            bool* auto_recovery) override {
    *auto_recovery = false;
  }
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status*) override {
    // A failed Write is counted by the store already.
    if (reason != rocksdb::BackgroundErrorReason::kWriteCallback)
      errors.fetch_add(1, std::memory_order_relaxed);
  }
  std::atomic<uint64_t> errors{0};
};

}  // namespace eldr::rocks
