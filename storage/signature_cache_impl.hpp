// signature_cache_impl: the state behind signature_cache (internal to storage/; RocksDB's types
// appear here and never in signature_cache.hpp). One class, its members defined by concern in:
//   signature_cache.cpp  open and the load scan, geometry, workers, centroid history, metadata,
//                        the read-only accessors
//   block_events.cpp     KV events and counts coming in: holders, per-publisher quotas, grace
//                        periods and expiry, unreadable records
//   prefix_sum.cpp       lookups: sum_prefix, add_prefix, masked_counts
//   store_writer.cpp     durability: staging, commit, the background writer, faults, health
//
// Every block's meta (parent, holders) is mirrored in memory, so that events never read RocksDB:
// the table is bounded by max_blocks and rebuilt by one scan at open. Counts, the large part,
// live in RocksDB and in a byte-bounded LRU in front of it (memory_caches.hpp).
//
// Thread safety: as signature_cache's (one owner thread), except the members marked as shared
// with the background writer.
#pragma once

#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "storage/block_record.hpp"
#include "storage/memory_caches.hpp"
#include "storage/rocksdb_setup.hpp"
#include "storage/signature_cache.hpp"

namespace eldr {

class signature_cache::impl {
 public:
  // `options` with its clock set.
  explicit impl(signature_cache_options options)
      : opt(std::move(options)), lru(opt.memory_cache_bytes), memo(opt.prefix_memo_bytes) {}
  ~impl();  // stops the background writer (store_writer.cpp)

  signature_cache_options opt;
  std::unique_ptr<rocksdb::DB> db;
  model_geometry geometry;
  std::vector<uint32_t> mask;

  std::unordered_map<block_hash, record::meta, hash_mix> blocks;
  uint64_t holder_entries = 0;
  uint64_t with_counts = 0;

  counts_lru lru;
  prefix_memo memo;
  std::vector<uint32_t> acc;           // sum_prefix's scratch
  std::vector<uint64_t> fingerprints;  // sum_prefix's scratch: [i] of the first i hashes

  std::vector<std::string> worker_names;
  std::vector<std::optional<uint64_t>> last_seq;
  std::unordered_map<std::string, uint32_t> worker_by_name;

  // Grace queues: (deadline, hash), deadlines non-decreasing while the clock is.
  std::deque<std::pair<int64_t, block_hash>> orphan_queue, uncounted_queue;

  std::map<uint64_t, bool> epochs;  // stored epochs (value unused)
  std::optional<uint64_t> current_epoch;

  rocksdb::WriteBatch batch;

  // ---- the background writer (store_writer.cpp) ----

  // The background writer (options.background_writes): batches handed over by commit(), written
  // in order on its own thread. RocksDB's Write is safe beside the owner's reads.
  //
  // A batch that fails stays at the front of the queue and the writer halts: every
  // retry_interval_ms it resumes RocksDB (DB::Resume, which flushes the memtables to new files)
  // and, once that works, writes the queue again from that batch on, in order.
  struct writer {
    std::mutex mutex;
    std::condition_variable wake, idle;
    std::deque<rocksdb::WriteBatch> queue;
    bool busy = false;
    bool stop = false;
    bool halted = false;  // a write failed; retrying
    std::thread thread;
  };
  std::unique_ptr<writer> bg;
  std::atomic<uint64_t> bg_commits{0};
  static constexpr size_t max_queued_batches = 64;

  void start_writer();
  // Queues the staged batch (waiting while max_queued_batches are queued).
  void hand_over();
  // Writes a batch at once on the calling thread (centroid history), counted as a commit.
  status write_now(rocksdb::WriteBatch& b);
  // Waits until the writer has written everything queued or halted on a failure.
  void wait_idle();
  status wait_written();
  // Whether a committed change may still be missing from RocksDB (queued or held).
  bool writes_pending();

  // The database is reopened, not resumed, to recover from a failed write. A WAL append that
  // fails (ENOSPC) leaves RocksDB's writer of that WAL with an error mark, and any later call on
  // that writer aborts (the assertion of store_logger's comment): DB::Resume() moves to a new
  // WAL only when it has a memtable to flush and otherwise writes on into the marked one. And
  // Resume() can wait for ever in 7.8: a flush scheduled while writes were stopped fails without
  // leaving its queue (DBImpl::BackgroundFlush), and the recovery's flush request then finds the
  // column family already queued and is never run (DBImpl::FlushMemTable, WaitForFlushMemTables).
  // Closing drops the marked writers; opening replays the WAL and starts a new one. Reopening
  // takes db_mutex exclusively (every other use of `db` holds it shared), so lookups wait for one
  // open; it is tried only when the file system has room for the replayed WAL.
  std::shared_mutex db_mutex;
  std::mutex write_mutex;  // one writer at a time (the writer thread, the owner's history)
  std::string dir;
  rocksdb::Options db_options;
  bool db_read_only = false;  // reopened read-only: there was no room to open for writing

  rocksdb::Status write(rocksdb::WriteBatch& b);
  // Bytes the replay of the WAL needs (about its size as new table files, plus the new WAL,
  // MANIFEST and OPTIONS) against the bytes free.
  bool has_room() const;
  static rocksdb::Status no_db() {
    return rocksdb::Status::IOError("the store could not be reopened");
  }
  rocksdb::Status get(const std::string& key, std::string& value);
  rocksdb::Status reopen();

  // ---- faults and health (store_writer.cpp) ----

  // Health (store_health). `fault` is shared with the writer thread; the rest is the owner's.
  struct fault_state {
    mutable std::mutex mutex;
    bool degraded = false;
    std::string reason;
    std::string retry_error;  // the last failed retry's reason
    int64_t since_ms = 0, recovered_ms = 0;
    uint64_t write_errors = 0, recoveries = 0;
  } fault;
  uint64_t read_errors = 0;
  std::string last_read_error;
  uint64_t unpersisted_commits = 0;
  uint64_t mutations = 0, mutations_held = 0;  // write_meta calls; as of the last held commit
  int64_t next_retry_ms = 0;                   // without a writer thread: commit() retries
  std::shared_ptr<rocks::store_logger> logger;
  std::shared_ptr<rocks::store_listener> listener;

  bool degraded() const;
  status degraded_error() const;
  void note_write_failure(const rocksdb::Status& s, const std::string& what);
  void note_retry_failure(const rocksdb::Status& s);
  void note_recovered();
  // Without a writer thread: resumes RocksDB and writes the held batch, at most once per
  // retry_interval_ms of the injected clock.
  void retry_now();

  // A stored record of `hash` that could not be read: counted, and, unless the failure may be
  // transient (an I/O error), the block's counts are forgotten so that the next prefill stores
  // them again (and commit deletes the bad record). (block_events.cpp)
  void read_failure(block_hash hash, const status& why, bool forget);

  std::map<std::string, std::string> metadata;  // staged or read since open
  signature_cache_stats stats;
  std::string scratch;

  int64_t now() const { return opt.clock(); }

  // ---- staging (store_writer.cpp) ----

  // Blocks changed since the last commit, with what RocksDB held for them before the first
  // change: commit() writes each block's final state once (coalescing repeated changes, and
  // skipping blocks born and gone within one commit).
  struct pending {
    bool meta_on_disk = false;
    bool counts_on_disk = false;
    std::string new_counts;  // encoded counts to write, if they arrived since the last commit
  };
  std::unordered_map<block_hash, pending, hash_mix> dirty;

  void write_meta(block_hash h, const record::meta& m) {
    dirty.try_emplace(h, pending{m.meta_on_disk, m.counts_on_disk, {}});
    ++mutations;
  }

  // Worker records and metadata, coalesced by key until the next commit stages them (a degraded
  // store holds them for as long as it cannot write: bounded by their number, not by time).
  std::map<std::string, std::string> puts;

  // Stages the final state of every dirty block, and the coalesced records, into the write batch.
  void stage_dirty();

  // ---- blocks, holders and grace periods (block_events.cpp) ----

  // Blocks held per worker id (a block counts once per worker, whatever its copies) and the
  // holdings refused at max_blocks_per_publisher, for the per-publisher quota.
  std::vector<uint64_t> held_by_worker, refused_quota_by_worker;

  uint64_t& held(uint32_t worker);
  static bool holds(const record::meta& m, uint32_t worker);
  // Counts (delta +1) or uncounts (-1) the block once for every distinct worker among holders.
  void account_holders(const record::meta& m, int delta);
  void erase_block(std::unordered_map<block_hash, record::meta, hash_mix>::iterator it);
  void enqueue_grace(const record::meta& m, block_hash h);
  // Rebuilds the grace queues from the table: used at open and when churn has filled them with
  // stale entries, so that they stay bounded by the table's size.
  void rebuild_queues();
  void maybe_compact_queues();

  // put_counts and put_masked_counts after their checks: creates the block if new (refused and
  // counted at max_blocks), and stores counts encoded by `encode` unless the block has some.
  // Remembered prefix sums need no change: one exists only for a prefix whose blocks all had
  // counts, and a block's first counts are never replaced.
  void store_counts(block_hash hash, std::optional<block_hash> parent,
                    const std::function<void(std::string&)>& encode);

  // ---- open, geometry, workers (signature_cache.cpp) ----

  // Fixes geometry and mask once known and records them in the database (staged).
  status adopt_geometry(const model_geometry& g);
  status load(bool& mask_changed);
  void write_worker(uint32_t id);
};

}  // namespace eldr
