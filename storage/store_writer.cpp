// store_writer: how the signature cache's changes reach RocksDB (docs/signature-cache.md,
// "Faults"): staging each dirty block's final state, commit(), the background writer thread, and
// the degraded state with its retries and recovery; health() reports it. Members of
// signature_cache::impl (signature_cache_impl.hpp).
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <system_error>

#include "storage/signature_cache_impl.hpp"

namespace eldr {

using rocks::checked_reads;
using rocks::from_rocks;
using rocks::wall_ms;

signature_cache::impl::~impl() {
  if (!bg) return;
  {
    std::lock_guard lock(bg->mutex);
    bg->stop = true;
  }
  bg->wake.notify_all();
  bg->thread.join();
}

void signature_cache::impl::start_writer() {
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

void signature_cache::impl::hand_over() {
  writer& w = *bg;
  std::unique_lock lock(w.mutex);
  w.idle.wait(lock, [&] { return w.queue.size() < max_queued_batches || w.halted; });
  w.queue.push_back(std::move(batch));
  batch = rocksdb::WriteBatch();
  w.wake.notify_one();
}

status signature_cache::impl::write_now(rocksdb::WriteBatch& b) {
  if (opt.read_only) return status::failed_precondition("the signature cache was opened read-only");
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

void signature_cache::impl::wait_idle() {
  writer& w = *bg;
  std::unique_lock lock(w.mutex);
  w.idle.wait(lock, [&] { return (w.queue.empty() || w.halted) && !w.busy; });
}

status signature_cache::impl::wait_written() {
  wait_idle();
  return degraded() ? degraded_error() : status();
}

bool signature_cache::impl::writes_pending() {
  if (!bg) return degraded();
  std::lock_guard lock(bg->mutex);
  return !bg->queue.empty() || bg->busy || bg->halted;
}

rocksdb::Status signature_cache::impl::write(rocksdb::WriteBatch& b) {
  std::shared_lock use(db_mutex);
  std::lock_guard lock(write_mutex);
  if (db_read_only) return rocksdb::Status::NoSpace("the store is open read-only");
  rocksdb::WriteOptions wo;
  wo.sync = opt.sync_wal;
  return db->Write(wo, &b);
}

bool signature_cache::impl::has_room() const {
  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) != 0) return true;  // unknown: try
  uint64_t wal_bytes = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".log") wal_bytes += e.file_size(ec);
  const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
  return free_bytes >= wal_bytes + wal_bytes / 8 + (uint64_t{1} << 20);
}

rocksdb::Status signature_cache::impl::get(const std::string& key, std::string& value) {
  std::shared_lock use(db_mutex);
  return db ? db->Get(checked_reads(), key, &value) : no_db();
}

rocksdb::Status signature_cache::impl::reopen() {
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

bool signature_cache::impl::degraded() const {
  std::lock_guard lock(fault.mutex);
  return fault.degraded;
}

status signature_cache::impl::degraded_error() const {
  std::lock_guard lock(fault.mutex);
  return status::io_error("the signature store is degraded (" + fault.reason +
                          "): changes are held in memory until it can write again");
}

void signature_cache::impl::note_write_failure(const rocksdb::Status& s, const std::string& what) {
  std::lock_guard lock(fault.mutex);
  ++fault.write_errors;
  if (fault.degraded) return;
  fault.degraded = true;
  fault.reason = what + ": " + s.ToString();
  fault.since_ms = wall_ms();
}

void signature_cache::impl::note_retry_failure(const rocksdb::Status& s) {
  std::lock_guard lock(fault.mutex);
  fault.retry_error = s.ToString();
}

void signature_cache::impl::note_recovered() {
  std::lock_guard lock(fault.mutex);
  if (!fault.degraded) return;
  fault.degraded = false;
  fault.reason.clear();
  fault.retry_error.clear();
  fault.recovered_ms = wall_ms();
  ++fault.recoveries;
}

void signature_cache::impl::retry_now() {
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

void signature_cache::impl::stage_dirty() {
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

}  // namespace eldr
