// block_events: the signature cache's KV events and counts coming in (docs/signature-cache.md):
// holders with reference counts, the per-publisher quota, counts put by prefill or handed over by
// another node, the grace periods and expiry. Every change is made in memory at once and marked
// dirty for the next commit (store_writer.cpp). Members of signature_cache and of
// signature_cache::impl (signature_cache_impl.hpp).
#include <algorithm>
#include <iterator>
#include <numeric>

#include "storage/signature_cache_impl.hpp"

namespace eldr {

void signature_cache::impl::read_failure(block_hash hash, const status& why, bool forget) {
  ++read_errors;
  last_read_error = why.message();
  if (!forget) return;
  auto it = blocks.find(hash);
  if (it == blocks.end() || !it->second.has_counts) return;
  write_meta(hash, it->second);
  it->second.has_counts = false;
  --with_counts;
  lru.erase(hash);
  enqueue_grace(it->second, hash);
}

uint64_t& signature_cache::impl::held(uint32_t worker) {
  if (worker >= held_by_worker.size()) {
    held_by_worker.resize(size_t{worker} + 1);
    refused_quota_by_worker.resize(size_t{worker} + 1);
  }
  return held_by_worker[worker];
}

bool signature_cache::impl::holds(const record::meta& m, uint32_t worker) {
  return std::any_of(m.holders.begin(), m.holders.end(),
                     [&](const holder& x) { return x.key.worker == worker; });
}

void signature_cache::impl::account_holders(const record::meta& m, int delta) {
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

void signature_cache::impl::erase_block(
    std::unordered_map<block_hash, record::meta, hash_mix>::iterator it) {
  const block_hash h = it->first;
  account_holders(it->second, -1);  // an uncounted block that expires still has holders
  holder_entries -= it->second.holders.size();
  if (it->second.has_counts) --with_counts;
  write_meta(h, it->second);  // records what RocksDB holds, for the deletes at commit
  lru.erase(h);
  memo.erase(h);
  blocks.erase(it);
}

void signature_cache::impl::enqueue_grace(const record::meta& m, block_hash h) {
  const bool orphan = m.has_counts && m.holders.empty();
  const bool uncounted = !m.has_counts && !m.holders.empty();
  if (orphan && opt.orphan_counts_grace_ms > 0)
    orphan_queue.emplace_back(m.created_ms + opt.orphan_counts_grace_ms, h);
  if (uncounted && opt.uncounted_block_grace_ms > 0)
    uncounted_queue.emplace_back(m.created_ms + opt.uncounted_block_grace_ms, h);
}

void signature_cache::impl::rebuild_queues() {
  orphan_queue.clear();
  uncounted_queue.clear();
  for (const auto& [h, m] : blocks)
    enqueue_grace(m, h);
  auto by_deadline = [](const auto& a, const auto& b) { return a.first < b.first; };
  std::sort(orphan_queue.begin(), orphan_queue.end(), by_deadline);
  std::sort(uncounted_queue.begin(), uncounted_queue.end(), by_deadline);
}

void signature_cache::impl::maybe_compact_queues() {
  const size_t bound = 2 * std::max<size_t>(blocks.size(), 1024);
  if (orphan_queue.size() > bound || uncounted_queue.size() > bound) rebuild_queues();
}

void signature_cache::impl::store_counts(block_hash hash, std::optional<block_hash> parent,
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
    lru.put(hash, std::move(bytes));
    changed = true;
  }
  // Counts of a block already stored as they are (a prefill whose cache was cleared sends them
  // again) change nothing: no record to rewrite.
  if (changed) write_meta(hash, it->second);
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

bool signature_cache::expire_pending() const {
  const int64_t now = impl_->now();
  auto due = [&](const auto& q) { return !q.empty() && q.front().first <= now; };
  return due(impl_->orphan_queue) || due(impl_->uncounted_queue);
}

publisher_usage signature_cache::usage(uint32_t worker) const {
  if (worker >= impl_->held_by_worker.size()) return {};
  return {impl_->held_by_worker[worker], impl_->refused_quota_by_worker[worker]};
}

}  // namespace eldr
