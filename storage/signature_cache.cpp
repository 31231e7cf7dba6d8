// signature_cache: the RocksDB-backed implementation (layout in docs/signature-cache.md).
//
// Every block's meta (parent, holders) is mirrored in memory, so that events never read RocksDB:
// the table is bounded by max_blocks and rebuilt by one scan at open. Counts, the large part,
// live in RocksDB and in a byte-bounded LRU in front of it.
#include "storage/signature_cache.hpp"

#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/memtablerep.h>
#include <rocksdb/slice_transform.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <numeric>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "storage/block_record.hpp"

namespace eldr {
namespace {

// A list of block hashes folded in order: equal lists give equal values; two different lists of
// the same last hash and length (a shard asked for different subsets of one prompt) collide by
// accident with probability ~2^-64. Not keyed: no defence against lists chosen to collide (a
// client can send any list ending in any hash anyway).
uint64_t list_fingerprint(uint64_t acc, uint64_t hash) {
  uint64_t x = (acc ^ hash) + 0x9e3779b97f4a7c15ULL;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Block hashes are low bits of SHA-256 in practice, but they come from the network: mix them so
// that chosen hashes cannot pile into one bucket.
struct hash_mix {
  size_t operator()(uint64_t x) const {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return static_cast<size_t>(x);
  }
};

const std::string key_geometry = "m:geometry";
const std::string key_mask = "m:mask";
const std::string key_current_epoch = "m:current_epoch";

std::string u32s(std::span<const uint32_t> v) {
  std::string out;
  for (uint32_t x : v)
    for (int i = 0; i < 4; ++i)
      out.push_back(static_cast<char>((x >> (8 * i)) & 0xff));
  return out;
}

std::vector<uint32_t> parse_u32s(std::string_view s) {
  std::vector<uint32_t> out(s.size() / 4);
  for (size_t i = 0; i < out.size(); ++i)
    for (int b = 0; b < 4; ++b)
      out[i] |= uint32_t{static_cast<uint8_t>(s[4 * i + static_cast<size_t>(b)])} << (8 * b);
  return out;
}

std::string worker_key(uint32_t id) {
  std::string k(5, 'w');
  for (int i = 0; i < 4; ++i)
    k[static_cast<size_t>(1 + i)] = static_cast<char>((id >> (24 - 8 * i)) & 0xff);
  return k;
}

std::string epoch_key(uint64_t epoch) {
  return record::block_key('e', epoch);
}

std::string u64_value(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i)
    out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

uint64_t parse_u64(std::string_view s) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i)
    v |= uint64_t{static_cast<uint8_t>(s[i])} << (8 * i);
  return v;
}

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

// Reads check RocksDB's block checksums (the default, said here because the store relies on it:
// a damaged SST block is a read error, never other counts).
rocksdb::ReadOptions checked_reads() {
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  return ro;
}

// RocksDB's info log (the LOG file in the database directory). RocksDB's own (EnvLogger) writes
// through a WritableFileWriter and, after a write of it failed (a full disk), calls Append on it
// again for the next line; Debian's librocksdb keeps asserts on, and that Append aborts the
// process in WritableFileWriter::AssertFalseAndGetStatusForPrevError (`sync_without_flush_called_`;
// docs/signature-cache.md, "Faults"). This one writes each line with write(2) and counts the lines
// it could not write. It also keeps what WAL recovery reports dropping, for health().
class store_logger : public rocksdb::Logger {
 public:
  // An empty path writes no file (read-only opens: the LOG belongs to the writing process).
  explicit store_logger(const std::string& path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL) {
    if (!path.empty()) {
      // The previous run's log is kept beside, as RocksDB does (one generation here).
      (void)std::rename(path.c_str(), (path + ".old").c_str());
      fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    }
  }
  ~store_logger() override {
    if (fd_ >= 0) ::close(fd_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
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

  void recovery(uint64_t& events, std::vector<std::string>& notes) const {
    std::lock_guard lock(mutex_);
    events = events_;
    notes = notes_;
  }
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

}  // namespace

clock_fn system_clock_ms() {
  return [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
}

class signature_cache::impl {
 public:
  signature_cache_options opt;
  std::unique_ptr<rocksdb::DB> db;
  model_geometry geometry;
  std::vector<uint32_t> mask;

  std::unordered_map<block_hash, record::meta, hash_mix> blocks;
  uint64_t holder_entries = 0;
  uint64_t with_counts = 0;

  // LRU of encoded (validated) counts: front = most recent.
  struct lru_entry {
    std::string bytes;
    std::list<block_hash>::iterator pos;
  };
  std::list<block_hash> lru_order;
  std::unordered_map<block_hash, lru_entry, hash_mix> lru;
  size_t lru_bytes = 0;

  // Remembered prefix sums (masked, dense), keyed by the prefix's last block hash: the chained
  // hash fixes the prefix's content, so its sum never changes. Byte-bounded LRU; an entry goes
  // with its block. A cluster shard is asked for subsets of prompts, and which subset depends on
  // the router asking (core/shard_plan.hpp): an entry also keeps the fingerprint of the exact list
  // it sums, and serves only that list.
  struct memo_entry {
    std::vector<uint32_t> sum;
    size_t blocks = 0;
    uint64_t fingerprint = 0;  // list_fingerprint of the `blocks` hashes summed
    std::list<block_hash>::iterator pos;
  };
  std::unordered_map<block_hash, memo_entry, hash_mix> memo;
  std::list<block_hash> memo_order;
  size_t memo_bytes = 0;
  std::vector<uint32_t> acc;           // sum_prefix's scratch
  std::vector<uint64_t> fingerprints;  // sum_prefix's scratch: [i] of the first i hashes

  static size_t memo_cost(const memo_entry& e) { return e.sum.size() * 4 + 64; }

  void memo_erase(block_hash h) {
    auto it = memo.find(h);
    if (it == memo.end()) return;
    memo_bytes -= memo_cost(it->second);
    memo_order.erase(it->second.pos);
    memo.erase(it);
  }

  void memo_put(block_hash h, const std::vector<uint32_t>& sum, size_t length,
                uint64_t fingerprint) {
    if (memo.count(h)) return;
    const size_t cost = sum.size() * 4 + 64;
    if (cost > opt.prefix_memo_bytes) return;
    while (memo_bytes + cost > opt.prefix_memo_bytes && !memo_order.empty())
      memo_erase(memo_order.back());
    memo_order.push_front(h);
    memo.emplace(h, memo_entry{sum, length, fingerprint, memo_order.begin()});
    memo_bytes += cost;
  }

  std::vector<std::string> worker_names;
  std::vector<std::optional<uint64_t>> last_seq;
  std::unordered_map<std::string, uint32_t> worker_by_name;

  // Grace queues: (deadline, hash), deadlines non-decreasing while the clock is.
  std::deque<std::pair<int64_t, block_hash>> orphan_queue, uncounted_queue;

  std::map<uint64_t, bool> epochs;  // stored epochs (value unused)
  std::optional<uint64_t> current_epoch;

  rocksdb::WriteBatch batch;

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

  ~impl() {
    if (!bg) return;
    {
      std::lock_guard lock(bg->mutex);
      bg->stop = true;
    }
    bg->wake.notify_all();
    bg->thread.join();
  }

  void start_writer() {
    bg = std::make_unique<writer>();
    bg->thread = std::thread([this] {
      writer& w = *bg;
      std::unique_lock lock(w.mutex);
      for (;;) {
        if (w.halted) {
          w.wake.wait_for(lock,
                          std::chrono::milliseconds(std::max<int64_t>(opt.retry_interval_ms, 1)),
                          [&] { return w.stop; });
          if (w.stop) return;  // what is queued is lost: health() reported it pending
          lock.unlock();
          const rocksdb::Status r = reopen();
          lock.lock();
          if (!r.ok()) {
            note_retry_failure(r);
            continue;
          }
          w.halted = false;
          if (w.queue.empty()) note_recovered();
          w.idle.notify_all();
          continue;
        }
        w.wake.wait(lock, [&] { return w.stop || w.halted || !w.queue.empty(); });
        if (w.halted) continue;
        if (w.queue.empty()) return;  // stop, and everything written
        // The front stays queued until written: a failed batch is written again, in order.
        rocksdb::WriteBatch& b = w.queue.front();  // push_back keeps references valid
        w.busy = true;
        lock.unlock();
        const rocksdb::Status s = write(b);
        lock.lock();
        w.busy = false;
        if (s.ok()) {
          w.queue.pop_front();
          bg_commits.fetch_add(1, std::memory_order_relaxed);
          if (w.queue.empty()) note_recovered();
        } else {
          note_write_failure(s, "committing a write batch");
          w.halted = true;
        }
        w.idle.notify_all();
      }
    });
  }

  // Queues the staged batch (waiting while max_queued_batches are queued).
  void hand_over() {
    writer& w = *bg;
    std::unique_lock lock(w.mutex);
    w.idle.wait(lock, [&] { return w.queue.size() < max_queued_batches || w.halted; });
    w.queue.push_back(std::move(batch));
    batch = rocksdb::WriteBatch();
    w.wake.notify_one();
  }

  // Writes a batch at once on the calling thread (centroid history), counted as a commit.
  status write_now(rocksdb::WriteBatch& b) {
    if (opt.read_only)
      return status::failed_precondition("the signature cache was opened read-only");
    if (degraded()) return degraded_error();
    const rocksdb::Status s = write(b);
    if (!s.ok()) {
      note_write_failure(s, "writing the centroid history");
      if (bg) {
        std::lock_guard lock(bg->mutex);
        bg->halted = true;  // the writer owns the retries
        bg->wake.notify_one();
      }
      return from_rocks(s, "writing the centroid history");
    }
    ++stats.commits;
    return {};
  }

  // Waits until the writer has written everything queued or halted on a failure.
  void wait_idle() {
    writer& w = *bg;
    std::unique_lock lock(w.mutex);
    w.idle.wait(lock, [&] { return (w.queue.empty() || w.halted) && !w.busy; });
  }

  status wait_written() {
    wait_idle();
    return degraded() ? degraded_error() : status();
  }

  // Whether a committed change may still be missing from RocksDB (queued or held).
  bool writes_pending() {
    if (!bg) return degraded();
    std::lock_guard lock(bg->mutex);
    return !bg->queue.empty() || bg->busy || bg->halted;
  }

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

  rocksdb::Status write(rocksdb::WriteBatch& b) {
    std::shared_lock use(db_mutex);
    std::lock_guard lock(write_mutex);
    if (db_read_only) return rocksdb::Status::NoSpace("the store is open read-only");
    rocksdb::WriteOptions wo;
    wo.sync = opt.sync_wal;
    return db->Write(wo, &b);
  }

  // Bytes the replay of the WAL needs (about its size as new table files, plus the new WAL,
  // MANIFEST and OPTIONS) against the bytes free.
  bool has_room() const {
    struct statvfs fs {};
    if (::statvfs(dir.c_str(), &fs) != 0) return true;  // unknown: try
    uint64_t wal_bytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
      if (e.path().extension() == ".log") wal_bytes += e.file_size(ec);
    const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
    return free_bytes >= wal_bytes + wal_bytes / 8 + (uint64_t{1} << 20);
  }

  static rocksdb::Status no_db() {
    return rocksdb::Status::IOError("the store could not be reopened");
  }
  rocksdb::Status get(const std::string& key, std::string& value) {
    std::shared_lock use(db_mutex);
    return db ? db->Get(checked_reads(), key, &value) : no_db();
  }

  rocksdb::Status reopen() {
    if (!has_room()) return rocksdb::Status::NoSpace("waiting for free space to reopen " + dir);
    std::unique_lock x(db_mutex);
    db.reset();  // a database stopped by an error closes without writing
    rocksdb::DB* raw = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(db_options, dir, &raw);
    if (s.ok()) {
      db.reset(raw);
      db_read_only = false;
      return s;
    }
    // Lookups go on from a read-only instance (it writes nothing) until the next try.
    const rocksdb::Status r = rocksdb::DB::OpenForReadOnly(db_options, dir, &raw);
    if (r.ok()) db.reset(raw);
    db_read_only = true;
    return s;
  }

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
  std::shared_ptr<store_logger> logger;
  std::shared_ptr<store_listener> listener;

  bool degraded() const {
    std::lock_guard lock(fault.mutex);
    return fault.degraded;
  }
  status degraded_error() const {
    std::lock_guard lock(fault.mutex);
    return status::io_error("the signature store is degraded (" + fault.reason +
                            "): changes are held in memory until it can write again");
  }
  void note_write_failure(const rocksdb::Status& s, const std::string& what) {
    std::lock_guard lock(fault.mutex);
    ++fault.write_errors;
    if (fault.degraded) return;
    fault.degraded = true;
    fault.reason = what + ": " + s.ToString();
    fault.since_ms = wall_ms();
  }
  void note_retry_failure(const rocksdb::Status& s) {
    std::lock_guard lock(fault.mutex);
    fault.retry_error = s.ToString();
  }
  void note_recovered() {
    std::lock_guard lock(fault.mutex);
    if (!fault.degraded) return;
    fault.degraded = false;
    fault.reason.clear();
    fault.retry_error.clear();
    fault.recovered_ms = wall_ms();
    ++fault.recoveries;
  }

  // Without a writer thread: resumes RocksDB and writes the held batch, at most once per
  // retry_interval_ms of the injected clock.
  void retry_now() {
    if (now() < next_retry_ms) return;
    next_retry_ms = now() + std::max<int64_t>(opt.retry_interval_ms, 0);
    const rocksdb::Status r = reopen();
    if (!r.ok()) return note_retry_failure(r);
    if (batch.Count() > 0) {
      const rocksdb::Status s = write(batch);
      if (!s.ok()) {
        note_write_failure(s, "writing held changes");
        return note_retry_failure(s);
      }
      batch.Clear();
      ++stats.commits;
    }
    note_recovered();
  }

  // A stored record of `hash` that could not be read: counted, and, unless the failure may be
  // transient (an I/O error), the block's counts are forgotten so that the next prefill stores
  // them again (and commit deletes the bad record).
  void read_failure(block_hash hash, const status& why, bool forget) {
    ++read_errors;
    last_read_error = why.message();
    if (!forget) return;
    auto it = blocks.find(hash);
    if (it == blocks.end() || !it->second.has_counts) return;
    write_meta(hash, it->second);
    it->second.has_counts = false;
    --with_counts;
    lru_erase(hash);
    enqueue_grace(it->second, hash);
  }

  std::map<std::string, std::string> metadata;  // staged or read since open
  signature_cache_stats stats;
  std::string scratch;

  int64_t now() const { return opt.clock(); }

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
  void stage_dirty() {
    for (auto& [k, v] : puts)
      batch.Put(k, v);
    puts.clear();
    for (auto& [h, p] : dirty) {
      auto it = blocks.find(h);
      if (it == blocks.end()) {
        if (p.meta_on_disk) batch.Delete(record::block_key('b', h));
        if (p.counts_on_disk) batch.Delete(record::block_key('c', h));
        continue;
      }
      record::meta& m = it->second;
      record::encode_meta(m, scratch);
      batch.Put(record::block_key('b', h), scratch);
      m.meta_on_disk = true;
      if (!p.new_counts.empty() && m.has_counts) {
        batch.Put(record::block_key('c', h), p.new_counts);
        m.counts_on_disk = true;
      } else if (!m.has_counts && (p.counts_on_disk || m.counts_on_disk)) {
        batch.Delete(record::block_key('c', h));
        m.counts_on_disk = false;
      } else if (p.counts_on_disk) {
        m.counts_on_disk = true;  // recreated in this window: the stored counts are still there
      }
    }
    dirty.clear();
  }

  void lru_erase(block_hash h) {
    auto it = lru.find(h);
    if (it == lru.end()) return;
    lru_bytes -= it->second.bytes.size();
    lru_order.erase(it->second.pos);
    lru.erase(it);
  }

  void lru_put(block_hash h, std::string bytes) {
    lru_erase(h);
    if (bytes.size() > opt.memory_cache_bytes) return;
    while (lru_bytes + bytes.size() > opt.memory_cache_bytes && !lru_order.empty()) {
      const block_hash victim = lru_order.back();
      lru_erase(victim);
    }
    lru_order.push_front(h);
    lru_bytes += bytes.size();
    lru.emplace(h, lru_entry{std::move(bytes), lru_order.begin()});
  }

  // Blocks held per worker id (a block counts once per worker, whatever its copies) and the
  // holdings refused at max_blocks_per_publisher, for the per-publisher quota.
  std::vector<uint64_t> held_by_worker, refused_quota_by_worker;

  uint64_t& held(uint32_t worker) {
    if (worker >= held_by_worker.size()) {
      held_by_worker.resize(size_t{worker} + 1);
      refused_quota_by_worker.resize(size_t{worker} + 1);
    }
    return held_by_worker[worker];
  }

  static bool holds(const record::meta& m, uint32_t worker) {
    return std::any_of(m.holders.begin(), m.holders.end(),
                       [&](const holder& x) { return x.key.worker == worker; });
  }

  // Counts (delta +1) or uncounts (-1) the block once for every distinct worker among holders.
  void account_holders(const record::meta& m, int delta) {
    for (size_t i = 0; i < m.holders.size(); ++i) {
      const uint32_t w = m.holders[i].key.worker;
      bool first = true;
      for (size_t j = 0; j < i && first; ++j)
        first = m.holders[j].key.worker != w;
      if (!first) continue;
      uint64_t& n = held(w);
      n = delta > 0 ? n + 1 : (n > 0 ? n - 1 : 0);
    }
  }

  void erase_block(std::unordered_map<block_hash, record::meta, hash_mix>::iterator it) {
    const block_hash h = it->first;
    account_holders(it->second, -1);  // an uncounted block that expires still has holders
    holder_entries -= it->second.holders.size();
    if (it->second.has_counts) --with_counts;
    write_meta(h, it->second);  // records what RocksDB holds, for the deletes at commit
    lru_erase(h);
    memo_erase(h);
    blocks.erase(it);
  }

  void enqueue_grace(const record::meta& m, block_hash h) {
    const bool orphan = m.has_counts && m.holders.empty();
    const bool uncounted = !m.has_counts && !m.holders.empty();
    if (orphan && opt.orphan_counts_grace_ms > 0)
      orphan_queue.emplace_back(m.created_ms + opt.orphan_counts_grace_ms, h);
    if (uncounted && opt.uncounted_block_grace_ms > 0)
      uncounted_queue.emplace_back(m.created_ms + opt.uncounted_block_grace_ms, h);
  }

  // Rebuilds the grace queues from the table: used at open and when churn has filled them with
  // stale entries, so that they stay bounded by the table's size.
  void rebuild_queues() {
    orphan_queue.clear();
    uncounted_queue.clear();
    for (const auto& [h, m] : blocks)
      enqueue_grace(m, h);
    auto by_deadline = [](const auto& a, const auto& b) { return a.first < b.first; };
    std::sort(orphan_queue.begin(), orphan_queue.end(), by_deadline);
    std::sort(uncounted_queue.begin(), uncounted_queue.end(), by_deadline);
  }

  void maybe_compact_queues() {
    const size_t bound = 2 * std::max<size_t>(blocks.size(), 1024);
    if (orphan_queue.size() > bound || uncounted_queue.size() > bound) rebuild_queues();
  }

  // Fixes geometry and mask once known and records them in the database (staged).
  status adopt_geometry(const model_geometry& g) {
    if (status s = g.validate(); !s.ok()) return s;
    geometry = g;
    if (opt.layer_mask.empty()) {
      mask.resize(g.layers);
      for (uint32_t l = 0; l < g.layers; ++l)
        mask[l] = l;
    } else {
      mask = opt.layer_mask;
      std::sort(mask.begin(), mask.end());
      for (size_t i = 0; i < mask.size(); ++i)
        if (mask[i] >= g.layers || (i > 0 && mask[i] == mask[i - 1]))
          return status::invalid_argument("layer mask: layer " + std::to_string(mask[i]) +
                                          " is out of range or repeated for " + g.to_string());
    }
    const uint32_t gv[3] = {g.layers, g.experts, g.top_k};
    batch.Put(key_geometry, u32s(gv));
    batch.Put(key_mask, u32s(mask));
    return {};
  }

  status load(bool& mask_changed) {
    rocksdb::ReadOptions ro;
    ro.total_order_seek = true;
    std::string value;
    rocksdb::Status s = db->Get(ro, key_geometry, &value);
    if (s.ok()) {
      const auto gv = parse_u32s(value);
      if (gv.size() != 3) return status::corrupt("stored geometry has a bad size");
      const model_geometry stored{gv[0], gv[1], gv[2]};
      if (opt.geometry.layers != 0 && opt.geometry != stored)
        return status::failed_precondition("database holds counts of " + stored.to_string() +
                                           ", not " + opt.geometry.to_string());
      geometry = stored;
      if (!(s = db->Get(ro, key_mask, &value)).ok())
        return status::corrupt("database has a geometry but no layer mask");
      mask = parse_u32s(value);
      std::vector<uint32_t> wanted = opt.layer_mask;
      std::sort(wanted.begin(), wanted.end());
      if (!wanted.empty() && wanted != mask) {
        if (!opt.reset_counts_on_mask_change)
          return status::failed_precondition(
              "database holds counts for another layer mask; reopen with the same mask or allow "
              "reset_counts_on_mask_change (drops every stored count)");
        mask_changed = true;
      }
    } else if (!s.IsNotFound()) {
      return from_rocks(s, "reading the geometry");
    } else if (opt.geometry.layers != 0) {
      if (status st = adopt_geometry(opt.geometry); !st.ok()) return st;
    }

    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(ro));
    for (it->Seek("b"); it->Valid() && it->key()[0] == 'b'; it->Next()) {
      const auto h = record::parse_block_key(it->key().ToStringView(), 'b');
      if (!h)
        return status::corrupt("bad block key of " + std::to_string(it->key().size()) + " bytes");
      auto m = record::decode_meta(it->value().ToStringView());
      if (!m.ok())
        return status::corrupt("block " + std::to_string(*h) + ": " + m.error().message());
      holder_entries += m->holders.size();
      account_holders(*m, +1);
      with_counts += m->has_counts ? 1 : 0;
      m->meta_on_disk = true;
      m->counts_on_disk = m->has_counts;
      blocks.emplace(*h, std::move(*m));
    }
    if (!it->status().ok()) return from_rocks(it->status(), "scanning blocks");
    for (it->Seek("w"); it->Valid() && it->key()[0] == 'w'; it->Next()) {
      const std::string_view v = it->value().ToStringView();
      const std::string_view k = it->key().ToStringView();
      if (k.size() != 5 || v.size() < 10 || v[0] != 1) return status::corrupt("bad worker record");
      uint32_t id = 0;
      for (size_t i = 1; i < 5; ++i)
        id = (id << 8) | static_cast<uint8_t>(k[i]);
      if (id >= (1u << 20)) return status::corrupt("worker id out of range");
      if (worker_names.size() <= id) {
        worker_names.resize(id + 1);
        last_seq.resize(id + 1);
      }
      worker_names[id] = std::string(v.substr(10));
      if (v[1] != 0) last_seq[id] = parse_u64(v.substr(2, 8));
      worker_by_name[worker_names[id]] = id;
    }
    for (it->Seek("e"); it->Valid() && it->key()[0] == 'e'; it->Next()) {
      if (auto e = record::parse_block_key(it->key().ToStringView(), 'e')) epochs[*e] = true;
    }
    if (db->Get(ro, key_current_epoch, &value).ok()) current_epoch = parse_u64(value);

    if (mask_changed) {
      // Drop every count: the stored layers no longer match what routing reads.
      for (auto& [h, m] : blocks) {
        if (!m.has_counts) continue;
        m.has_counts = false;
        write_meta(h, m);  // commit deletes the counts key
      }
      with_counts = 0;
      mask = opt.layer_mask;
      std::sort(mask.begin(), mask.end());
      batch.Put(key_mask, u32s(mask));
    }
    rebuild_queues();
    return {};
  }

  // put_counts and put_masked_counts after their checks: creates the block if new (refused and
  // counted at max_blocks), and stores counts encoded by `encode` unless the block has some.
  // Remembered prefix sums need no change: one exists only for a prefix whose blocks all had
  // counts, and a block's first counts are never replaced.
  void store_counts(block_hash hash, std::optional<block_hash> parent,
                    const std::function<void(std::string&)>& encode) {
    auto it = blocks.find(hash);
    bool changed = false;
    if (it == blocks.end()) {
      if (blocks.size() >= opt.max_blocks) {
        ++stats.refused_capacity;
        return;
      }
      record::meta fresh;
      fresh.parent = parent;
      fresh.created_ms = now();
      it = blocks.emplace(hash, std::move(fresh)).first;
      if (opt.orphan_counts_grace_ms > 0)
        orphan_queue.emplace_back(it->second.created_ms + opt.orphan_counts_grace_ms, hash);
      maybe_compact_queues();
      changed = true;
    } else if (!it->second.parent && parent) {
      it->second.parent = parent;
      changed = true;
    }
    if (!it->second.has_counts) {
      // The first counts win: a block's hash covers its tokens, so later copies are identical.
      it->second.has_counts = true;
      ++with_counts;
      std::string bytes;
      encode(bytes);
      write_meta(hash, it->second);
      dirty[hash].new_counts = bytes;
      lru_put(hash, std::move(bytes));
      changed = true;
    }
    // Counts of a block already stored as they are (a prefill whose cache was cleared sends them
    // again) change nothing: no record to rewrite.
    if (changed) write_meta(hash, it->second);
  }

  void write_worker(uint32_t id) {
    std::string v;
    v.push_back(1);
    v.push_back(last_seq[id] ? 1 : 0);
    v += u64_value(last_seq[id].value_or(0));
    v += worker_names[id];
    puts[worker_key(id)] = std::move(v);
  }
};

signature_cache::signature_cache(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
signature_cache::~signature_cache() = default;

result<std::unique_ptr<signature_cache>> signature_cache::open(const std::string& dir,
                                                               signature_cache_options options) {
  auto p = std::make_unique<impl>();
  if (!options.clock) options.clock = system_clock_ms();
  p->opt = std::move(options);

  // A reader (eldr-sigcache dump) opens what exists and never makes a store, or a directory,
  // where an operator mistyped a path.
  if (p->opt.read_only && !std::filesystem::exists(std::filesystem::path(dir) / "CURRENT"))
    return status::not_found("no signature store in " + dir +
                             " (no RocksDB CURRENT file there; the node keeps one store per model "
                             "under <data_dir>/models/<model>)");
  rocksdb::Options ro;
  ro.create_if_missing = !p->opt.read_only;
  if (p->opt.background_writes) {
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
  p->dir = dir;
  p->logger = std::make_shared<store_logger>(p->opt.read_only ? "" : dir + "/LOG");
  ro.info_log = p->logger;
  p->listener = std::make_shared<store_listener>();
  ro.listeners.push_back(p->listener);
  const std::string aside =
      ". The store only caches what prefill recomputes and publishers resend: to start empty, "
      "stop the node and move the directory aside (mv " +
      dir + " " + dir + ".broken)";
  p->db_options = ro;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status opened = p->opt.read_only ? rocksdb::DB::OpenForReadOnly(ro, dir, &raw)
                                                  : rocksdb::DB::Open(ro, dir, &raw);
  if (!opened.ok()) {
    const status s = from_rocks(opened, "cannot open the signature store in " + dir);
    return status(s.code(), s.message() + (opened.IsCorruption() ? aside : ""));
  }
  p->db.reset(raw);

  bool mask_changed = false;
  if (status s = p->load(mask_changed); !s.ok()) {
    if (s.code() != status_code::corrupt && s.code() != status_code::io_error) return s;
    return status(s.code(), "signature store in " + dir + ": " + s.message() + aside);
  }
  std::unique_ptr<signature_cache> c(new signature_cache(std::move(p)));
  if (c->impl_->opt.read_only) {
    c->impl_->batch.Clear();  // e.g. the geometry record of a fresh database: nothing to write
    return c;
  }
  if (c->impl_->opt.background_writes) c->impl_->start_writer();
  if (status s = c->commit(); !s.ok()) return s;
  return c;
}

uint32_t signature_cache::worker_id(std::string_view name) {
  impl& m = *impl_;
  auto it = m.worker_by_name.find(std::string(name));
  if (it != m.worker_by_name.end()) return it->second;
  const auto id = static_cast<uint32_t>(m.worker_names.size());
  m.worker_names.emplace_back(name);
  m.last_seq.emplace_back();
  m.worker_by_name.emplace(std::string(name), id);
  m.write_worker(id);
  return id;
}

const std::vector<std::string>& signature_cache::worker_names() const {
  return impl_->worker_names;
}

std::optional<uint64_t> signature_cache::last_sequence(uint32_t worker) const {
  if (worker >= impl_->last_seq.size()) return std::nullopt;
  return impl_->last_seq[worker];
}

void signature_cache::store_blocks(const holder_key& who, std::optional<block_hash> parent,
                                   std::span<const block_hash> hashes) {
  impl& m = *impl_;
  const int64_t now = m.now();
  std::optional<block_hash> prev = parent;
  const size_t quota = m.opt.max_blocks_per_publisher;
  for (const block_hash h : hashes) {
    auto it = m.blocks.find(h);
    // A holding new to this worker counts against its quota, checked before the block is
    // created so that a refused holding leaves nothing behind.
    const bool new_holding = it == m.blocks.end() || !impl::holds(it->second, who.worker);
    if (new_holding && quota > 0 && m.held(who.worker) >= quota) {
      ++m.stats.refused_quota;
      ++m.refused_quota_by_worker[who.worker];
      prev = h;
      continue;
    }
    if (it == m.blocks.end()) {
      if (m.blocks.size() >= m.opt.max_blocks) {
        ++m.stats.refused_capacity;
        prev = h;
        continue;
      }
      record::meta fresh;
      fresh.parent = prev;
      fresh.created_ms = now;
      it = m.blocks.emplace(h, std::move(fresh)).first;
      if (m.opt.uncounted_block_grace_ms > 0)
        m.uncounted_queue.emplace_back(now + m.opt.uncounted_block_grace_ms, h);
    } else if (!it->second.parent && prev) {
      it->second.parent = prev;
    }
    record::meta& rec = it->second;
    auto hold = std::find_if(rec.holders.begin(), rec.holders.end(),
                             [&](const holder& x) { return x.key == who; });
    if (hold != rec.holders.end()) {
      if (hold->refs != UINT32_MAX) ++hold->refs;
    } else if (rec.holders.size() >= m.opt.max_holders_per_block) {
      ++m.stats.refused_holders;
    } else {
      rec.holders.push_back(holder{who, 1});
      if (rec.holders.back().key.medium.size() > record::max_medium_bytes)
        rec.holders.back().key.medium.resize(record::max_medium_bytes);
      ++m.holder_entries;
      if (new_holding) ++m.held(who.worker);
    }
    m.write_meta(h, rec);
    prev = h;
  }
  m.maybe_compact_queues();
}

void signature_cache::remove_blocks(const holder_key& who, std::span<const block_hash> hashes) {
  impl& m = *impl_;
  for (const block_hash h : hashes) {
    auto it = m.blocks.find(h);
    if (it == m.blocks.end()) {
      ++m.stats.removed_unknown;
      continue;
    }
    auto& hs = it->second.holders;
    auto hold = std::find_if(hs.begin(), hs.end(), [&](const holder& x) { return x.key == who; });
    // Fallbacks for a removal that omits a field its BlockStored carried (see the header): any
    // medium with the same group; then the default group, where 0 and nil are one group; then,
    // without a group, the worker's copy of the lowest group.
    auto same_copy = [&](const holder& x) {
      return x.key.worker == who.worker && x.key.dp_rank == who.dp_rank &&
             (who.medium.empty() || x.key.medium == who.medium);
    };
    auto find_group = [&](int32_t group) {
      return std::find_if(hs.begin(), hs.end(),
                          [&](const holder& x) { return same_copy(x) && x.key.group == group; });
    };
    if (hold == hs.end() && who.medium.empty()) hold = find_group(who.group);
    if (hold == hs.end() && who.group <= 0) hold = find_group(who.group < 0 ? 0 : -1);
    if (hold == hs.end() && who.group < 0)
      for (auto x = hs.begin(); x != hs.end(); ++x)
        if (same_copy(*x) && (hold == hs.end() || x->key.group < hold->key.group)) hold = x;
    if (hold == hs.end()) {
      ++m.stats.removed_unknown;
      continue;
    }
    if (--hold->refs == 0) {
      hs.erase(hold);
      --m.holder_entries;
      if (!impl::holds(it->second, who.worker) && m.held(who.worker) > 0) --m.held(who.worker);
    }
    if (hs.empty())
      m.erase_block(it);
    else
      m.write_meta(h, it->second);
  }
}

void signature_cache::clear_worker(uint32_t worker, bool forget_sequence) {
  impl& m = *impl_;
  for (auto it = m.blocks.begin(); it != m.blocks.end();) {
    auto& hs = it->second.holders;
    const size_t before = hs.size();
    std::erase_if(hs, [&](const holder& x) { return x.key.worker == worker; });
    if (hs.size() == before) {
      ++it;
      continue;
    }
    m.holder_entries -= before - hs.size();
    if (m.held(worker) > 0) --m.held(worker);
    if (hs.empty()) {
      auto next = std::next(it);
      m.erase_block(it);
      it = next;
    } else {
      m.write_meta(it->first, it->second);
      ++it;
    }
  }
  if (forget_sequence && worker < m.last_seq.size()) {
    m.last_seq[worker].reset();
    m.write_worker(worker);
  }
}

status signature_cache::put_counts(block_hash hash, std::optional<block_hash> parent,
                                   const model_geometry& g, const block_counts& counts) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) {
    if (status s = m.adopt_geometry(g); !s.ok()) {
      ++m.stats.refused_counts_geometry;
      return s;
    }
  }
  if (g != m.geometry || counts.layers() != g.layers) {
    ++m.stats.refused_counts_geometry;
    return status::invalid_argument("counts of " + g.to_string() + " refused: the cache holds " +
                                    m.geometry.to_string());
  }
  m.store_counts(hash, parent, [&](std::string& bytes) {
    record::encode_counts(counts, m.mask, m.geometry.experts, bytes);
  });
  return {};
}

result<std::vector<uint32_t>> signature_cache::masked_counts(block_hash hash) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) return status::failed_precondition("no counts stored yet");
  auto it = m.blocks.find(hash);
  if (it == m.blocks.end() || !it->second.has_counts)
    return status::not_found("no counts for block " + std::to_string(hash));
  const uint32_t experts = m.geometry.experts;
  std::vector<uint32_t> out(m.mask.size() * experts, 0);
  // Where sum_prefix looks: the LRU, then counts staged since the last commit, then RocksDB.
  if (auto hit = m.lru.find(hash); hit != m.lru.end()) {
    m.lru_order.splice(m.lru_order.begin(), m.lru_order, hit->second.pos);
    record::add_counts(hit->second.bytes, experts, out);
    return out;
  }
  if (auto d = m.dirty.find(hash); d != m.dirty.end() && !d->second.new_counts.empty()) {
    record::add_counts(d->second.new_counts, experts, out);
    return out;
  }
  const std::string key = record::block_key('c', hash);
  std::string bytes;
  rocksdb::Status s = m.get(key, bytes);
  if (s.IsNotFound() && m.bg) {
    m.wait_idle();  // committed, still queued for the background writer
    s = m.get(key, bytes);
  }
  if (s.IsNotFound() && m.writes_pending())  // held by a degraded store: not an error of the data
    return status::io_error("the counts of block " + std::to_string(hash) +
                            " are not written yet (the store is degraded)");
  status bad;
  if (s.IsNotFound())
    bad = status::corrupt("block " + std::to_string(hash) + " has counts but none are stored");
  else if (!s.ok())
    bad = from_rocks(s, "reading the counts of block " + std::to_string(hash));
  else if (status v = record::validate_counts(bytes, static_cast<uint32_t>(m.mask.size()), experts);
           !v.ok())
    bad = status::corrupt("block " + std::to_string(hash) + ": " + v.message());
  if (!bad.ok()) {
    m.read_failure(hash, bad, bad.code() == status_code::corrupt);
    return bad;
  }
  record::add_counts(bytes, experts, out);
  m.lru_put(hash, std::move(bytes));
  return out;
}

status signature_cache::put_masked_counts(block_hash hash, std::optional<block_hash> parent,
                                          std::span<const uint32_t> masked) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) return status::failed_precondition("no counts stored yet");
  const auto layers = static_cast<uint32_t>(m.mask.size());
  const uint32_t experts = m.geometry.experts;
  if (masked.size() != size_t{layers} * experts) {
    ++m.stats.refused_counts_geometry;
    return status::invalid_argument("masked counts have " + std::to_string(masked.size()) +
                                    " entries, expected " +
                                    std::to_string(size_t{layers} * experts));
  }
  // Rebuilt as the counts of a model made of the masked layers only, so that from_parts applies
  // put_counts' checks and encode_counts (over every layer of that model) writes the bytes
  // put_counts would have written for the full counts and the real mask.
  uint64_t first_layer_sum = 0;
  for (uint32_t e = 0; e < experts; ++e)
    first_layer_sum += masked[e];
  const uint32_t top_k = m.geometry.top_k;
  if (first_layer_sum % top_k != 0 || first_layer_sum / top_k > 255)
    return status::invalid_argument("masked counts: layer sum " + std::to_string(first_layer_sum) +
                                    " is not tokens * top_k for a block of 1..255 tokens");
  std::vector<uint32_t> offsets = {0};
  std::vector<expert_id> ids;
  std::vector<uint8_t> counts;
  for (uint32_t l = 0; l < layers; ++l) {
    for (uint32_t e = 0; e < experts; ++e) {
      const uint32_t c = masked[size_t{l} * experts + e];
      if (c == 0) continue;
      if (c > 255)
        return status::invalid_argument("masked counts: count " + std::to_string(c) +
                                        " exceeds a block's 255 tokens");
      ids.push_back(static_cast<expert_id>(e));
      counts.push_back(static_cast<uint8_t>(c));
    }
    offsets.push_back(static_cast<uint32_t>(ids.size()));
  }
  const model_geometry masked_geometry{layers, experts, top_k};
  auto block =
      block_counts::from_parts(masked_geometry, static_cast<uint32_t>(first_layer_sum / top_k),
                               std::move(offsets), std::move(ids), std::move(counts));
  if (!block.ok()) return block.error();
  std::vector<uint32_t> all_layers(layers);
  std::iota(all_layers.begin(), all_layers.end(), 0u);
  m.store_counts(hash, parent, [&](std::string& bytes) {
    record::encode_counts(*block, all_layers, experts, bytes);
  });
  return {};
}

void signature_cache::note_sequence(uint32_t worker, uint64_t seq) {
  impl& m = *impl_;
  if (worker >= m.last_seq.size()) return;
  m.last_seq[worker] = seq;
  m.write_worker(worker);
}

status signature_cache::commit() {
  impl& m = *impl_;
  if (m.opt.read_only && !m.dirty.empty()) {
    m.dirty.clear();
    m.batch.Clear();
    return status::failed_precondition("the signature cache was opened read-only");
  }
  if (!m.opt.read_only && m.degraded()) {
    if (!m.bg) m.retry_now();  // with a writer thread, the writer retries
    if (m.degraded()) {
      // Nothing is staged: the dirty blocks and coalesced records keep their final state in
      // memory (bounded by the table), and go to RocksDB after the held batches at recovery.
      if (m.mutations != m.mutations_held) ++m.unpersisted_commits;
      m.mutations_held = m.mutations;
      return m.degraded_error();
    }
  }
  m.stage_dirty();
  if (m.batch.Count() == 0) return {};
  if (m.opt.read_only) {
    m.batch.Clear();
    return status::failed_precondition("the signature cache was opened read-only");
  }
  if (m.bg) {
    m.hand_over();
    return {};
  }
  const rocksdb::Status s = m.write(m.batch);
  if (!s.ok()) {
    // The batch is kept (later changes are added to it) and written first at recovery.
    m.note_write_failure(s, "committing a write batch");
    m.next_retry_ms = m.now() + m.opt.retry_interval_ms;
    m.mutations_held = m.mutations;
    ++m.unpersisted_commits;
    return from_rocks(s, "committing a write batch");
  }
  m.batch.Clear();
  ++m.stats.commits;
  return {};
}

status signature_cache::flush() {
  if (status s = commit(); !s.ok()) return s;
  return impl_->bg ? impl_->wait_written() : status();
}

size_t signature_cache::expire(size_t max_entries) {
  impl& m = *impl_;
  const int64_t now = m.now();
  size_t gone = 0;
  size_t examined = 0;
  auto drain = [&](auto& queue, int64_t grace, auto still_waiting, uint64_t& counter) {
    while (!queue.empty() && queue.front().first <= now && examined < max_entries) {
      ++examined;
      const block_hash h = queue.front().second;
      queue.pop_front();
      auto it = m.blocks.find(h);
      if (it == m.blocks.end() || !still_waiting(it->second) || it->second.created_ms + grace > now)
        continue;
      m.erase_block(it);
      ++counter;
      ++gone;
    }
  };
  drain(
      m.orphan_queue, m.opt.orphan_counts_grace_ms,
      [](const record::meta& r) { return r.has_counts && r.holders.empty(); },
      m.stats.expired_orphan_counts);
  drain(
      m.uncounted_queue, m.opt.uncounted_block_grace_ms,
      [](const record::meta& r) { return !r.has_counts && !r.holders.empty(); },
      m.stats.expired_uncounted);
  return gone;
}

result<prefix_sum_info> signature_cache::sum_prefix(std::span<const block_hash> hashes,
                                                    std::span<uint32_t> masked_sum) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) return status::failed_precondition("no counts stored yet");
  const size_t width = m.mask.size() * m.geometry.experts;
  if (masked_sum.size() != width)
    return status::invalid_argument("masked sum has " + std::to_string(masked_sum.size()) +
                                    " entries, expected " + std::to_string(width));
  const size_t n = hashes.size();
  const uint32_t experts = m.geometry.experts;
  prefix_sum_info info;
  info.first_missing = static_cast<uint32_t>(n);
  std::vector<uint32_t>& acc = m.acc;
  acc.assign(width, 0);

  // 1. The longest remembered prefix: the whole list, then each stride boundary below it.
  size_t start = 0;
  const size_t stride = std::max<size_t>(m.opt.prefix_memo_stride, 1);
  std::vector<uint64_t>& fp = m.fingerprints;
  if (m.opt.prefix_memo_bytes > 0) {
    fp.resize(n + 1);
    fp[0] = 0;
    for (size_t i = 0; i < n; ++i)
      fp[i + 1] = list_fingerprint(fp[i], hashes[i]);
    for (size_t end = n; end > 0; end = (end - 1) / stride * stride) {
      auto it = m.memo.find(hashes[end - 1]);
      if (it == m.memo.end() || it->second.blocks != end || it->second.fingerprint != fp[end])
        continue;
      std::copy(it->second.sum.begin(), it->second.sum.end(), acc.begin());
      m.memo_order.splice(m.memo_order.begin(), m.memo_order, it->second.pos);
      start = end;
      info.with_counts = static_cast<uint32_t>(end);
      info.memo_blocks = static_cast<uint32_t>(end);
      break;
    }
  }

  // 2. Where the other blocks' counts are: the LRU, staged bytes, or RocksDB (one MultiGet).
  std::vector<std::string_view> found(n - start);
  std::vector<block_hash> misses;
  std::vector<size_t> miss_index;
  for (size_t i = start; i < n; ++i) {
    const block_hash h = hashes[i];
    if (auto hit = m.lru.find(h); hit != m.lru.end()) {
      found[i - start] = hit->second.bytes;
      m.lru_order.splice(m.lru_order.begin(), m.lru_order, hit->second.pos);
      continue;
    }
    auto it = m.blocks.find(h);
    if (it == m.blocks.end() || !it->second.has_counts) continue;
    if (auto d = m.dirty.find(h); d != m.dirty.end() && !d->second.new_counts.empty()) {
      found[i - start] = d->second.new_counts;  // not committed yet, pushed out of the LRU
      continue;
    }
    misses.push_back(h);
    miss_index.push_back(i);
  }
  std::vector<std::string> fetched;
  if (!misses.empty()) {
    std::vector<std::string> keys;
    keys.reserve(misses.size());
    for (block_hash h : misses)
      keys.push_back(record::block_key('c', h));
    std::vector<rocksdb::Slice> slices(keys.begin(), keys.end());
    std::vector<rocksdb::Status> st;
    {
      std::shared_lock use(m.db_mutex);
      st = m.db ? m.db->MultiGet(checked_reads(), slices, &fetched)
                : std::vector<rocksdb::Status>(slices.size(), m.no_db());
      fetched.resize(slices.size());
    }
    std::optional<bool> pending;  // asked once per lookup, and only when a record is missing
    for (size_t j = 0; j < misses.size(); ++j) {
      ++info.disk_reads;
      ++m.stats.lookup_disk_reads;
      const std::string which = "block " + std::to_string(misses[j]);
      status bad;
      if (st[j].IsNotFound()) {
        if (!pending) pending = m.writes_pending();
        if (*pending) {  // committed, not written yet: a miss, not an error
          fetched[j].clear();
          continue;
        }
        bad = status::corrupt(which + " has counts but none are stored");
      } else if (!st[j].ok()) {
        bad = from_rocks(st[j], "reading the counts of " + which);
      } else if (status v = record::validate_counts(fetched[j],
                                                    static_cast<uint32_t>(m.mask.size()), experts);
                 !v.ok()) {
        bad = status::corrupt(which + ": " + v.message());
      }
      if (!bad.ok()) {
        fetched[j].clear();
        ++info.read_errors;
        m.read_failure(misses[j], bad, bad.code() == status_code::corrupt);
        continue;
      }
      found[miss_index[j] - start] = fetched[j];
    }
  }

  // 3. Sum in order, remembering complete prefixes at stride boundaries and at the end.
  for (size_t i = start; i < n; ++i) {
    const std::string_view bytes = found[i - start];
    if (bytes.empty()) {
      if (info.first_missing == n) info.first_missing = static_cast<uint32_t>(i);
      continue;
    }
    record::add_counts(bytes, experts, acc);
    ++info.with_counts;
    if (m.opt.prefix_memo_bytes > 0 && info.first_missing == n &&
        ((i + 1) % stride == 0 || i + 1 == n))
      m.memo_put(hashes[i], acc, i + 1, fp[i + 1]);
  }
  for (size_t d = 0; d < width; ++d)
    masked_sum[d] += acc[d];

  // 4. Only now may the LRU evict: the views above pointed into it.
  for (size_t j = 0; j < misses.size(); ++j)
    if (!fetched[j].empty()) m.lru_put(misses[j], std::move(fetched[j]));
  return info;
}

result<prefix_sum_info> signature_cache::add_prefix(std::span<const block_hash> hashes,
                                                    signature_builder& b) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) return status::failed_precondition("no counts stored yet");
  if (b.spec().geometry() != m.geometry)
    return status::invalid_argument("builder geometry " + b.spec().geometry().to_string() +
                                    " differs from the cache's " + m.geometry.to_string());
  const uint32_t e = m.geometry.experts;
  std::vector<uint32_t> sum(m.mask.size() * e, 0);
  auto info = sum_prefix(hashes, sum);
  if (!info.ok()) return info;
  const auto& want = b.spec().layer_mask();
  if (want == m.mask) {
    if (status s = b.add_masked(sum); !s.ok()) return s;
    return info;
  }
  std::vector<uint32_t> projected(want.size() * e, 0);
  for (size_t i = 0; i < want.size(); ++i) {
    auto pos = std::lower_bound(m.mask.begin(), m.mask.end(), want[i]);
    if (pos == m.mask.end() || *pos != want[i])
      return status::invalid_argument("the builder's layer " + std::to_string(want[i]) +
                                      " is not in the cache's layer mask");
    const size_t src = static_cast<size_t>(pos - m.mask.begin()) * e;
    std::copy_n(sum.begin() + static_cast<std::ptrdiff_t>(src), e,
                projected.begin() + static_cast<std::ptrdiff_t>(i * e));
  }
  if (status s = b.add_masked(projected); !s.ok()) return s;
  return info;
}

result<block_info> signature_cache::block(block_hash hash) const {
  auto it = impl_->blocks.find(hash);
  if (it == impl_->blocks.end()) return status::not_found("block " + std::to_string(hash));
  return block_info{hash, it->second.parent, it->second.holders, it->second.has_counts,
                    it->second.created_ms};
}

void signature_cache::for_each_block(const std::function<void(const block_info&)>& visit) const {
  std::vector<block_hash> order;
  order.reserve(impl_->blocks.size());
  for (const auto& kv : impl_->blocks)
    order.push_back(kv.first);
  std::sort(order.begin(), order.end());
  for (block_hash h : order)
    visit(*block(h));
}

status signature_cache::put_centroid_set(uint64_t epoch, std::span<const uint8_t> bytes,
                                         size_t keep) {
  impl& m = *impl_;
  if (status s = commit(); !s.ok()) return s;
  // The history is written at once in its own small batch, beside any background writes (its
  // keys are not the blocks'), so that storing a set never waits for queued block writes: a
  // node's signing goes on meanwhile.
  rocksdb::WriteBatch b;
  b.Put(epoch_key(epoch),
        rocksdb::Slice(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  b.Put(key_current_epoch, u64_value(epoch));
  std::vector<uint64_t> dropped;
  size_t kept = m.epochs.size() + (m.epochs.count(epoch) ? 0 : 1);
  for (auto it = m.epochs.begin(); kept > std::max<size_t>(keep, 1) && it != m.epochs.end(); ++it) {
    if (it->first == epoch) continue;
    b.Delete(epoch_key(it->first));
    dropped.push_back(it->first);
    --kept;
  }
  if (status s = m.write_now(b); !s.ok()) return s;
  for (uint64_t e : dropped)
    m.epochs.erase(e);
  m.epochs[epoch] = true;
  m.current_epoch = epoch;
  return {};
}

result<uint64_t> signature_cache::current_epoch() const {
  if (!impl_->current_epoch) return status::not_found("no centroid set stored");
  return *impl_->current_epoch;
}

result<std::vector<uint8_t>> signature_cache::centroid_set(uint64_t epoch) const {
  std::string value;
  const auto s = impl_->get(epoch_key(epoch), value);
  if (s.IsNotFound()) return status::not_found("no centroid set of epoch " + std::to_string(epoch));
  if (!s.ok()) return from_rocks(s, "reading a centroid set");
  return std::vector<uint8_t>(value.begin(), value.end());
}

std::vector<uint64_t> signature_cache::centroid_epochs() const {
  std::vector<uint64_t> out;
  for (const auto& kv : impl_->epochs)
    out.push_back(kv.first);
  return out;
}

status signature_cache::rollback_to(uint64_t epoch) {
  impl& m = *impl_;
  if (!m.epochs.count(epoch))
    return status::not_found("no centroid set of epoch " + std::to_string(epoch));
  if (status s = commit(); !s.ok()) return s;
  rocksdb::WriteBatch b;
  b.Put(key_current_epoch, u64_value(epoch));
  if (status s = m.write_now(b); !s.ok()) return s;
  m.current_epoch = epoch;
  return {};
}

void signature_cache::stage_metadata(std::string_view name, std::string value) {
  assert(!name.empty());  // keys are at least 3 bytes (the memtable's prefix)
  impl_->puts["x:" + std::string(name)] = value;
  impl_->metadata[std::string(name)] = std::move(value);
}

std::optional<std::string> signature_cache::metadata(std::string_view name) const {
  auto it = impl_->metadata.find(std::string(name));
  if (it != impl_->metadata.end()) return it->second;
  std::string value;
  if (impl_->get("x:" + std::string(name), value).ok()) return value;
  return std::nullopt;
}

const model_geometry& signature_cache::geometry() const {
  return impl_->geometry;
}
const std::vector<uint32_t>& signature_cache::layer_mask() const {
  return impl_->mask;
}

bool signature_cache::expire_pending() const {
  const int64_t now = impl_->now();
  auto due = [&](const auto& q) { return !q.empty() && q.front().first <= now; };
  return due(impl_->orphan_queue) || due(impl_->uncounted_queue);
}

publisher_usage signature_cache::usage(uint32_t worker) const {
  if (worker >= impl_->held_by_worker.size()) return {};
  return {impl_->held_by_worker[worker], impl_->refused_quota_by_worker[worker]};
}

signature_cache_stats signature_cache::stats() const {
  signature_cache_stats s = impl_->stats;
  s.commits += impl_->bg_commits.load(std::memory_order_relaxed);
  s.blocks = impl_->blocks.size();
  s.holders = impl_->holder_entries;
  s.blocks_with_counts = impl_->with_counts;
  return s;
}

store_health signature_cache::health() const {
  const impl& m = *impl_;
  store_health h;
  {
    std::lock_guard lock(m.fault.mutex);
    h.degraded = m.fault.degraded;
    h.reason = m.fault.reason;
    if (h.degraded && !m.fault.retry_error.empty())
      h.reason += "; last retry: " + m.fault.retry_error;
    h.degraded_since_ms = m.fault.degraded ? m.fault.since_ms : 0;
    h.recovered_at_ms = m.fault.recovered_ms;
    h.write_errors = m.fault.write_errors;
    h.recoveries = m.fault.recoveries;
  }
  if (m.listener) h.write_errors += m.listener->errors.load(std::memory_order_relaxed);
  h.unpersisted_commits = m.unpersisted_commits;
  h.pending_changes = m.dirty.size() + m.puts.size() + m.batch.Count();
  if (m.bg) {
    std::lock_guard lock(m.bg->mutex);
    for (const auto& b : m.bg->queue)
      h.pending_changes += b.Count();
  }
  h.read_errors = m.read_errors;
  h.last_read_error = m.last_read_error;
  if (m.logger) {
    m.logger->recovery(h.recovery_events, h.recovery_notes);
    h.log_write_errors = m.logger->write_errors();
  }
  return h;
}

void signature_cache::drop_memory_cache() {
  impl_->lru.clear();
  impl_->lru_order.clear();
  impl_->lru_bytes = 0;
  impl_->memo.clear();
  impl_->memo_order.clear();
  impl_->memo_bytes = 0;
}

}  // namespace eldr
