// signature_cache: per-KV-block expert counts, co-indexed with the KV caches of the workers that
// hold each block, persisted in RocksDB (docs/signature-cache.md; docs/method.md section 7).
//
// What it keeps per block (keyed by the block hash normalised to uint64): the parent hash, the
// holders with a reference count per (worker, dp rank, medium, group), and the block's expert
// counts restricted to the cache's layer mask. A prefix's signature is the sum of its blocks'
// counts; sum_prefix() reads them from a bounded in-memory LRU and fetches every miss with ONE
// RocksDB MultiGet, so a 64-block prefix never costs 64 separate reads.
//
// Mutations (store_blocks, remove_blocks, clear_worker, put_counts, note_sequence) change the
// in-memory state at once and are staged in one pending RocksDB write batch; commit() writes that
// batch atomically through the write-ahead log. An event is *acknowledged* when the commit() that
// follows it has returned ok: it then survives a crash of this process (WAL written to the OS on
// every commit) and, with options.sync_wal, a crash of the machine (fsync on every commit).
//
// Faults (docs/signature-cache.md, "Faults"): a failed write (a full disk) makes the store
// *degraded*: the in-memory state keeps serving lookups and taking changes, nothing more is
// written, and RocksDB is resumed every retry_interval_ms; once it writes again, the held
// changes are written in order and the store is ok. Failed reads of stored counts are counted
// and reported by the lookup that hit them; what RocksDB dropped when it recovered its WAL at
// open is reported by health(). No RocksDB error aborts the process.
//
// Thread safety: none. One owner thread calls everything (eldr-sigcache's ingest loop, or the
// node's sigcache actor: actors/sigcache/sigcache_actor.hpp), health() included. With
// background_writes the cache runs a writer thread of its own, behind that interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"
#include "core/expert_counts.hpp"
#include "core/geometry.hpp"
#include "core/signature.hpp"

namespace eldr {

using block_hash = uint64_t;

// Who holds a copy of a block. vLLM sends BlockStored again for a second physical copy and
// BlockRemoved once per copy, so a holder carries a reference count, not a flag.
struct holder_key {
  uint32_t worker = 0;   // id from signature_cache::worker_id (one per event publisher)
  int32_t dp_rank = -1;  // data-parallel rank, -1 when the batch carried none
  int32_t group = -1;    // KV-cache group (vLLM group_idx), -1 when nil
  std::string medium;    // "GPU", "CPU", ...; empty when nil. At most 32 bytes.

  bool operator==(const holder_key&) const = default;
};

struct holder {
  holder_key key;
  uint32_t refs = 0;
};

// A stored block as dump shows it.
struct block_info {
  block_hash hash = 0;
  std::optional<block_hash> parent;
  std::vector<holder> holders;
  bool has_counts = false;
  int64_t created_ms = 0;  // clock time of the first event that mentioned the block
};

// Milliseconds from an injected clock: the grace periods read it, so tests drive time by hand.
using clock_fn = std::function<int64_t()>;
clock_fn system_clock_ms();

struct signature_cache_options {
  // Geometry of the counts. Unset (layers == 0): taken from the database, or else from the first
  // put_counts; a database keeps the geometry it was created with.
  model_geometry geometry;
  // Layers whose counts are kept (ascending, each < L; empty = all). Fixed per database: opening
  // with another mask fails unless reset_counts_on_mask_change, which drops every stored count
  // (holders stay) because counts of dropped layers are gone and new layers were never stored.
  std::vector<uint32_t> layer_mask;
  bool reset_counts_on_mask_change = false;

  size_t max_blocks = size_t{1} << 22;  // beyond it new blocks are refused (counted)
  // Blocks one worker (publisher) may hold, so that one publisher cannot fill max_blocks for
  // every other: beyond it the worker's new holdings are refused and counted for that worker
  // (refused_quota, publisher_usage). A block counts once per worker that holds a copy of it,
  // whatever its medium, group or dp rank. 0 = no per-worker bound. Holders are persisted, so
  // the usage is rebuilt at open and the bound holds across restarts.
  size_t max_blocks_per_publisher = 0;
  size_t max_holders_per_block = 64;              // beyond it new holders are refused (counted)
  size_t memory_cache_bytes = size_t{256} << 20;  // LRU of encoded counts in front of RocksDB
  // Remembered prefix sums (dense, |mask| * E * 4 bytes each), taken at every
  // prefix_memo_stride-th block and at the end of each complete lookup; 0 bytes disables.
  size_t prefix_memo_bytes = size_t{64} << 20;
  size_t prefix_memo_stride = 16;
  int64_t orphan_counts_grace_ms = 30'000;  // counts for a block no worker holds
  int64_t uncounted_block_grace_ms = 0;     // a held block without counts; 0 = keep forever
  bool sync_wal = false;                    // fsync the WAL on every commit
  // While degraded, how often RocksDB is resumed (DB::Resume) and the held writes retried.
  int64_t retry_interval_ms = 1000;
  // commit() hands the staged batch to a background writer thread and returns at once, so a
  // RocksDB write (milliseconds under a flush) never delays the owner's lookups. Batches are
  // written in commit order; at most 64 wait (commit() then blocks: bounded memory). An event is
  // acknowledged once flush() has returned ok after it; a write error is reported by the next
  // commit() or flush().
  bool background_writes = false;
  // Opens without the write lock (e.g. `eldr-sigcache dump` beside a running ingest): reads
  // only; commit() of staged changes fails.
  bool read_only = false;
  clock_fn clock;  // default: system clock
};

// Counters, cumulative since open (not persisted).
struct signature_cache_stats {
  uint64_t blocks = 0;   // blocks stored now
  uint64_t holders = 0;  // holder entries now (not references)
  uint64_t blocks_with_counts = 0;
  uint64_t refused_capacity = 0;         // new blocks refused at max_blocks
  uint64_t refused_holders = 0;          // holders refused at max_holders_per_block
  uint64_t refused_quota = 0;            // holdings refused at max_blocks_per_publisher
  uint64_t refused_counts_geometry = 0;  // put_counts of another shape
  uint64_t removed_unknown = 0;          // BlockRemoved for a block or holder we do not have
  uint64_t expired_orphan_counts = 0;
  uint64_t expired_uncounted = 0;
  uint64_t commits = 0;
  uint64_t lookup_disk_reads = 0;  // counts fetched from RocksDB by sum_prefix
};

// The store's health (health()). Counters are cumulative since open.
struct store_health {
  bool degraded = false;          // a write failed and has not been retried successfully yet
  std::string reason;             // RocksDB's message for the first failed write, while degraded
  int64_t degraded_since_ms = 0;  // system clock, while degraded
  int64_t recovered_at_ms = 0;    // system clock of the last recovery, 0 = none since open
  uint64_t write_errors = 0;      // failed RocksDB writes (commits, retries, centroid history)
  uint64_t recoveries = 0;        // degraded -> ok transitions
  // commit() calls whose changes could not be written when they were made: held in memory and
  // written at recovery, lost if the process stops first.
  uint64_t unpersisted_commits = 0;
  uint64_t pending_changes = 0;  // records changed in memory and not yet written (now)
  uint64_t read_errors = 0;      // stored counts that could not be read (corrupt, I/O, missing)
  std::string last_read_error;
  // What RocksDB reported dropping while it replayed the WAL at open (each "dropping N bytes"
  // or "Point in time recovered to ..." line), at most 16.
  uint64_t recovery_events = 0;
  std::vector<std::string> recovery_notes;
  uint64_t log_write_errors = 0;  // lines of RocksDB's info LOG that could not be written
};

// One worker's share of the cache.
struct publisher_usage {
  uint64_t blocks = 0;         // blocks the worker holds a copy of now
  uint64_t refused_quota = 0;  // its holdings refused at max_blocks_per_publisher since open
};

// What sum_prefix found.
struct prefix_sum_info {
  uint32_t with_counts = 0;    // blocks whose counts were added
  uint32_t first_missing = 0;  // index of the first block without counts (== size if none)
  uint32_t disk_reads = 0;     // of them, fetched from RocksDB (0 when the LRU was warm)
  uint32_t memo_blocks = 0;    // of them, covered by one remembered prefix sum
  // Blocks whose stored counts could not be read (counted in store_health::read_errors, not in
  // with_counts; a corrupt or missing record's counts are forgotten, so the next prefill that
  // computes them stores them again).
  uint32_t read_errors = 0;
};

class signature_cache {
 public:
  // Opens (creating if missing) the database in `dir`. Errors: RocksDB refuses, the stored
  // geometry or mask differs from the options (see above), a record does not decode.
  static result<std::unique_ptr<signature_cache>> open(const std::string& dir,
                                                       signature_cache_options options);
  ~signature_cache();
  signature_cache(const signature_cache&) = delete;
  signature_cache& operator=(const signature_cache&) = delete;

  // The stable id of a publisher (e.g. its endpoint), persisted; new names get the next id.
  uint32_t worker_id(std::string_view name);
  // Names by id (index = id).
  const std::vector<std::string>& worker_names() const;
  // Last sequence number committed for the worker, if any.
  std::optional<uint64_t> last_sequence(uint32_t worker) const;

  // BlockStored: hashes[0]'s parent is `parent`, each next block's parent is the previous one.
  // Adds one reference for `who` to each block.
  void store_blocks(const holder_key& who, std::optional<block_hash> parent,
                    std::span<const block_hash> hashes);
  // BlockRemoved: drops one reference of `who` per block; a block whose last holder goes is
  // deleted with its counts. A `who` without medium matches the worker's holder of the same dp
  // rank and group whatever its medium (older vLLM versions omit it in BlockRemoved). A `who`
  // without group (-1: SGLang, vLLM's offloading connectors and several vLLM versions send no
  // group_idx in BlockRemoved) that matches no copy stored without group releases the worker's
  // copy of group 0 (0 and nil are the default group, either way), else of its lowest group:
  // a removal always releases a
  // copy when the worker holds one (of that dp rank and medium), so that no block stays held
  // for ever because the two events disagree on a field only one of them carries.
  void remove_blocks(const holder_key& who, std::span<const block_hash> hashes);
  // AllBlocksCleared, or the worker restarted: every holder of `worker` goes (and the worker's
  // sequence is forgotten when forget_sequence). Costs one pass over the blocks in memory.
  void clear_worker(uint32_t worker, bool forget_sequence);
  // Counts of one block as computed by prefill, for a model of geometry g (checked by the caller
  // against the counts: block_counts::from_parts). Error, nothing stored: g differs from the
  // cache's geometry (the first put_counts fixes it when neither options nor database had one).
  status put_counts(block_hash hash, std::optional<block_hash> parent, const model_geometry& g,
                    const block_counts& counts);
  // Records that the worker's events up to `seq` are applied (committed with the next commit).
  void note_sequence(uint32_t worker, uint64_t seq);

  // Hand-off of a block's counts between two caches of the same geometry and layer mask (the
  // hash ring moved the block to another node). Blocks that have counts are those for_each_block
  // reports with has_counts.
  //
  // The block's own counts restricted to layer_mask(): |layer_mask()| * E entries, layer-major,
  // exactly what sum_prefix adds for this one block (never a remembered prefix sum). Reads
  // RocksDB when the LRU does not hold them (and keeps them there). Errors: not_found when the
  // block is unknown or has no counts; failed_precondition with no geometry yet; corrupt or
  // io_error when the stored counts cannot be read.
  result<std::vector<uint32_t>> masked_counts(block_hash hash);
  // Stores counts given already masked (masked_counts of a cache with the same geometry and mask)
  // with the effects of put_counts: creates the block if new (refused and counted in
  // refused_capacity, still ok, at max_blocks), the first counts win, staged for the next commit.
  // The counts must be those of a real block, as put_counts' from_parts checks them: for some
  // tokens in 1..255, every masked layer sums to tokens * top_k and each count is <= tokens (so
  // an all-zero block is refused). Errors, nothing stored: failed_precondition with no geometry
  // yet; invalid_argument for a span of another size (counted in refused_counts_geometry) or
  // implausible counts.
  status put_masked_counts(block_hash hash, std::optional<block_hash> parent,
                           std::span<const uint32_t> masked);

  // Writes everything staged since the last commit in one atomic RocksDB write (WAL on); with
  // background_writes, queues that write (see the option). While degraded (see the top), writes
  // nothing and returns the io_error that made it so (retrying first when retry_interval_ms has
  // passed, without background_writes; with them the writer thread retries).
  status commit();
  // Waits until every committed batch is written; the first write error since the last flush,
  // if any. Without background_writes, the same as commit().
  status flush();
  // Deletes blocks whose grace period has ended at clock(); returns how many. Staged: commit after.
  // Examines at most `max_entries` queued deadlines per call, so that a backlog (a million
  // blocks whose grace ended together) is spread over several calls instead of stalling the
  // caller; expire_pending() says whether due entries remain.
  size_t expire(size_t max_entries = SIZE_MAX);
  bool expire_pending() const;

  // Adds the masked counts of every block of `hashes` that has counts to masked_sum
  // (|mask| * E entries, layer-major over layer_mask()). Misses in memory are fetched with one
  // MultiGet. A prefix whose blocks all had counts is remembered (as one dense sum keyed by its
  // last hash, at stride boundaries too) while that last block is stored: a later lookup through
  // it starts from that sum, even if a worker has since dropped an earlier block, since a
  // chained hash fixes its whole prefix's content and so its counts. The list need not be a whole
  // prompt (a cluster shard sums its subset of one): a remembered sum serves only the same list.
  // Error: masked_sum of the wrong size, or no geometry yet.
  result<prefix_sum_info> sum_prefix(std::span<const block_hash> hashes,
                                     std::span<uint32_t> masked_sum);
  // The same, added to a builder. The builder's mask must be a subset of layer_mask().
  result<prefix_sum_info> add_prefix(std::span<const block_hash> hashes, signature_builder& b);

  // One block, or not_found.
  result<block_info> block(block_hash hash) const;
  // Every block in hash order (reads the in-memory table).
  void for_each_block(const std::function<void(const block_info&)>& visit) const;

  // Centroid sets, versioned by epoch (docs/centroid-file.md bytes, stored as given). Putting
  // one makes it current; the newest `keep` epochs are kept for rollback.
  status put_centroid_set(uint64_t epoch, std::span<const uint8_t> bytes, size_t keep = 8);
  // not_found when none was stored.
  result<uint64_t> current_epoch() const;
  result<std::vector<uint8_t>> centroid_set(uint64_t epoch) const;
  std::vector<uint64_t> centroid_epochs() const;
  // Makes a stored epoch current again. Error: not_found.
  status rollback_to(uint64_t epoch);

  // Small named values kept with the blocks (e.g. the ingest's cumulative metrics): staged like
  // every mutation, durable at the next commit. metadata() reads what was staged or stored.
  void stage_metadata(std::string_view name, std::string value);
  std::optional<std::string> metadata(std::string_view name) const;

  const model_geometry& geometry() const;
  const std::vector<uint32_t>& layer_mask() const;
  signature_cache_stats stats() const;
  store_health health() const;
  // A worker's usage; zero for an unknown id.
  publisher_usage usage(uint32_t worker) const;
  // Drops the in-memory LRU of counts (benchmarks measure cold lookups with it).
  void drop_memory_cache();

  class impl;

 private:
  explicit signature_cache(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
