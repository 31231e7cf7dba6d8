// prefix_sum: the signature cache's lookups (docs/signature-cache.md): a prefix's masked sum
// from the remembered prefix sums, the LRU of counts, the counts staged since the last commit and
// one RocksDB MultiGet for the rest; and one block's counts for a hand-off. A stored record that
// cannot be read is counted and reported by the lookup that hit it. Members of signature_cache
// (signature_cache_impl.hpp has the state).
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/signature_cache_impl.hpp"

namespace eldr {

using rocks::checked_reads;
using rocks::from_rocks;

result<std::vector<uint32_t>> signature_cache::masked_counts(block_hash hash) {
  impl& m = *impl_;
  if (m.geometry.layers == 0) return status::failed_precondition("no counts stored yet");
  auto it = m.blocks.find(hash);
  if (it == m.blocks.end() || !it->second.has_counts)
    return status::not_found("no counts for block " + std::to_string(hash));
  const uint32_t experts = m.geometry.experts;
  std::vector<uint32_t> out(m.mask.size() * experts, 0);
  // Where sum_prefix looks: the LRU, then counts staged since the last commit, then RocksDB.
  if (const std::string* hit = m.lru.find(hash)) {
    record::add_counts(*hit, experts, out);
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
  m.lru.put(hash, std::move(bytes));
  return out;
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
      const std::vector<uint32_t>* sum = m.memo.find(hashes[end - 1], end, fp[end]);
      if (!sum) continue;
      std::copy(sum->begin(), sum->end(), acc.begin());
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
    if (const std::string* hit = m.lru.find(h)) {
      found[i - start] = *hit;
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
      m.memo.put(hashes[i], acc, i + 1, fp[i + 1]);
  }
  for (size_t d = 0; d < width; ++d)
    masked_sum[d] += acc[d];

  // 4. Only now may the LRU evict: the views above pointed into it.
  for (size_t j = 0; j < misses.size(); ++j)
    if (!fetched[j].empty()) m.lru.put(misses[j], std::move(fetched[j]));
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

}  // namespace eldr
