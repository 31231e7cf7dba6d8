// signature_cache: the RocksDB-backed implementation (layout in docs/signature-cache.md): open and
// the scan that rebuilds the in-memory table, the geometry and layer mask, worker ids, the
// centroid history, metadata and the read-only accessors. The rest of signature_cache is defined
// by concern in block_events.cpp, prefix_sum.cpp and store_writer.cpp; signature_cache_impl.hpp
// has the state they share.
#include "storage/signature_cache.hpp"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <filesystem>

#include "storage/signature_cache_impl.hpp"

namespace eldr {

using record::epoch_key;
using record::key_current_epoch;
using record::key_geometry;
using record::key_mask;
using record::parse_u32s;
using record::parse_u64;
using record::u32s;
using record::u64_value;
using record::worker_key;
using rocks::from_rocks;

clock_fn system_clock_ms() {
  return [] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
}

status signature_cache::impl::adopt_geometry(const model_geometry& g) {
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

status signature_cache::impl::load(bool& mask_changed) {
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
    if (!m.ok()) return status::corrupt("block " + std::to_string(*h) + ": " + m.error().message());
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

void signature_cache::impl::write_worker(uint32_t id) {
  std::string v;
  v.push_back(1);
  v.push_back(last_seq[id] ? 1 : 0);
  v += u64_value(last_seq[id].value_or(0));
  v += worker_names[id];
  puts[worker_key(id)] = std::move(v);
}

signature_cache::signature_cache(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
signature_cache::~signature_cache() = default;

result<std::unique_ptr<signature_cache>> signature_cache::open(const std::string& dir,
                                                               signature_cache_options options) {
  if (!options.clock) options.clock = system_clock_ms();
  auto p = std::make_unique<impl>(std::move(options));

  // A reader (eldr-sigcache dump) opens what exists and never makes a store, or a directory,
  // where an operator mistyped a path.
  if (p->opt.read_only && !std::filesystem::exists(std::filesystem::path(dir) / "CURRENT"))
    return status::not_found("no signature store in " + dir +
                             " (no RocksDB CURRENT file there; the node keeps one store per model "
                             "under <data_dir>/models/<model>)");
  rocksdb::Options ro = rocks::store_options(p->opt);
  p->dir = dir;
  p->logger = std::make_shared<rocks::store_logger>(p->opt.read_only ? "" : dir + "/LOG");
  ro.info_log = p->logger;
  p->listener = std::make_shared<rocks::store_listener>();
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

signature_cache_stats signature_cache::stats() const {
  signature_cache_stats s = impl_->stats;
  s.commits += impl_->bg_commits.load(std::memory_order_relaxed);
  s.blocks = impl_->blocks.size();
  s.holders = impl_->holder_entries;
  s.blocks_with_counts = impl_->with_counts;
  return s;
}

void signature_cache::drop_memory_cache() {
  impl_->lru.clear();
  impl_->memo.clear();
}

}  // namespace eldr
