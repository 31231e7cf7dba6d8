// block_record: see block_record.hpp.
#include "storage/block_record.hpp"

#include <cstring>

// The lookup's summation gets an x86-64-v3 clone beside the baseline, as core's kernels do.
#include "core/multiversion.hpp"

namespace eldr::record {
namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A bounds-checked little-endian cursor over a value.
class cursor {
 public:
  explicit cursor(std::string_view b) : b_(b) {}
  bool get(uint64_t& v, int bytes) {
    if (b_.size() - pos_ < static_cast<size_t>(bytes)) return false;
    v = 0;
    for (int i = 0; i < bytes; ++i)
      v |= uint64_t{static_cast<uint8_t>(b_[pos_ + static_cast<size_t>(i)])} << (8 * i);
    pos_ += static_cast<size_t>(bytes);
    return true;
  }
  bool get_str(std::string& s, size_t n) {
    if (b_.size() - pos_ < n) return false;
    s.assign(b_.substr(pos_, n));
    pos_ += n;
    return true;
  }
  bool done() const { return pos_ == b_.size(); }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace

std::string block_key(char tag, block_hash h) {
  std::string k(9, '\0');
  k[0] = tag;
  for (int i = 0; i < 8; ++i)
    k[static_cast<size_t>(1 + i)] = static_cast<char>((h >> (8 * i)) & 0xff);
  return k;
}

std::optional<block_hash> parse_block_key(std::string_view key, char tag) {
  if (key.size() != 9 || key[0] != tag) return std::nullopt;
  block_hash h = 0;
  for (size_t i = 8; i >= 1; --i)
    h = (h << 8) | static_cast<uint8_t>(key[i]);
  return h;
}

void encode_meta(const meta& m, std::string& out) {
  out.clear();
  out.push_back(static_cast<char>(meta_format));
  out.push_back(static_cast<char>((m.parent ? 1 : 0) | (m.has_counts ? 2 : 0)));
  put_le(out, m.parent.value_or(0), 8);
  put_le(out, static_cast<uint64_t>(m.created_ms), 8);
  put_le(out, m.holders.size(), 2);
  for (const holder& h : m.holders) {
    put_le(out, h.key.worker, 4);
    put_le(out, static_cast<uint32_t>(h.key.dp_rank), 4);
    put_le(out, static_cast<uint32_t>(h.key.group), 4);
    put_le(out, h.refs, 4);
    const size_t n = std::min(h.key.medium.size(), max_medium_bytes);
    out.push_back(static_cast<char>(n));
    out.append(h.key.medium, 0, n);
  }
}

result<meta> decode_meta(std::string_view bytes) {
  cursor c(bytes);
  uint64_t format = 0, flags = 0, parent = 0, created = 0, n = 0;
  if (!c.get(format, 1) || format != meta_format)
    return status::corrupt("block meta: unknown format " + std::to_string(format));
  if (!c.get(flags, 1) || !c.get(parent, 8) || !c.get(created, 8) || !c.get(n, 2))
    return status::corrupt("block meta: truncated header");
  meta m;
  if (flags & 1) m.parent = parent;
  m.has_counts = (flags & 2) != 0;
  m.created_ms = static_cast<int64_t>(created);
  m.holders.resize(n);
  for (holder& h : m.holders) {
    uint64_t w = 0, dp = 0, g = 0, refs = 0, len = 0;
    if (!c.get(w, 4) || !c.get(dp, 4) || !c.get(g, 4) || !c.get(refs, 4) || !c.get(len, 1) ||
        len > max_medium_bytes || !c.get_str(h.key.medium, len))
      return status::corrupt("block meta: truncated holder");
    h.key.worker = static_cast<uint32_t>(w);
    h.key.dp_rank = static_cast<int32_t>(static_cast<uint32_t>(dp));
    h.key.group = static_cast<int32_t>(static_cast<uint32_t>(g));
    h.refs = static_cast<uint32_t>(refs);
  }
  if (!c.done()) return status::corrupt("block meta: trailing bytes");
  return m;
}

void encode_counts(const block_counts& c, std::span<const uint32_t> mask, uint32_t experts,
                   std::string& out) {
  out.clear();
  out.push_back(static_cast<char>(counts_format));
  put_le(out, c.tokens(), 2);
  put_le(out, mask.size(), 2);
  // Each layer in whichever form is smaller: dense wins once over half the experts are touched,
  // and it sums with straight-line (vectorisable) code.
  auto dense = [&](uint32_t z) { return 2 * z > experts; };
  for (uint32_t l : mask) {
    const uint32_t z = c.offset(l + 1) - c.offset(l);
    put_le(out, dense(z) ? (dense_layer | z) : z, 2);
  }
  for (uint32_t l : mask) {
    const uint32_t b = c.offset(l), e = c.offset(l + 1);
    if (dense(e - b)) {
      const size_t row = out.size();
      out.append(experts, '\0');
      for (uint32_t i = b; i < e; ++i)
        out[row + c.ids()[i]] = static_cast<char>(c.counts()[i]);
      continue;
    }
    for (uint32_t i = b; i < e; ++i) {
      out.push_back(static_cast<char>(c.ids()[i]));
      out.push_back(static_cast<char>(c.counts()[i]));
    }
  }
}

status validate_counts(std::string_view bytes, uint32_t layers, uint32_t experts) {
  cursor c(bytes);
  uint64_t format = 0, tokens = 0, n = 0;
  if (!c.get(format, 1) || format != counts_format)
    return status::corrupt("block counts: unknown format " + std::to_string(format));
  if (!c.get(tokens, 2) || !c.get(n, 2)) return status::corrupt("block counts: truncated");
  if (n != layers)
    return status::corrupt("block counts: " + std::to_string(n) + " layers, expected " +
                           std::to_string(layers));
  std::vector<uint32_t> sizes(n);
  for (uint32_t& z : sizes) {
    uint64_t v = 0;
    if (!c.get(v, 2) || (v & ~uint64_t{dense_layer}) > experts)
      return status::corrupt("block counts: bad layer size");
    z = static_cast<uint32_t>(v);
  }
  for (uint32_t z : sizes) {
    if (z & dense_layer) {
      uint32_t nonzero = 0;
      for (uint32_t e = 0; e < experts; ++e) {
        uint64_t count = 0;
        if (!c.get(count, 1)) return status::corrupt("block counts: truncated");
        nonzero += count != 0 ? 1 : 0;
      }
      if (nonzero != (z & ~dense_layer))
        return status::corrupt("block counts: dense layer disagrees with its size");
      continue;
    }
    uint64_t prev = 0;
    for (uint32_t i = 0; i < z; ++i) {
      uint64_t id = 0, count = 0;
      if (!c.get(id, 1) || !c.get(count, 1)) return status::corrupt("block counts: truncated");
      if (id >= experts) return status::corrupt("block counts: expert id out of range");
      // add_counts relies on distinct ids within a layer.
      if (i > 0 && id <= prev) return status::corrupt("block counts: ids not increasing");
      prev = id;
    }
  }
  if (!c.done()) return status::corrupt("block counts: trailing bytes");
  return {};
}

ELDR_MULTIVERSION void add_counts(std::string_view bytes, uint32_t experts,
                                  std::span<uint32_t> masked_sum) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const uint32_t n = uint32_t{p[3]} | (uint32_t{p[4]} << 8);
  const uint8_t* sizes = p + 5;
  const uint8_t* data = sizes + 2 * size_t{n};
  uint32_t* out = masked_sum.data();
  for (uint32_t l = 0; l < n; ++l) {
    const uint32_t z = uint32_t{sizes[2 * l]} | (uint32_t{sizes[2 * l + 1]} << 8);
    uint32_t* row = out + size_t{l} * experts;
    if (z & dense_layer) {
      for (uint32_t e = 0; e < experts; ++e)
        row[e] += data[e];
      data += experts;
      continue;
    }
    // Ids are distinct within a layer, so four read-modify-writes are independent: unrolled,
    // they overlap instead of waiting on each other (the lookup's inner loop).
    uint32_t i = 0;
    for (; i + 4 <= z; i += 4, data += 8) {
      const uint32_t a = row[data[0]] + data[1], b = row[data[2]] + data[3];
      const uint32_t c = row[data[4]] + data[5], d = row[data[6]] + data[7];
      row[data[0]] = a;
      row[data[2]] = b;
      row[data[4]] = c;
      row[data[6]] = d;
    }
    for (; i < z; ++i, data += 2)
      row[data[0]] += data[1];
  }
}

}  // namespace eldr::record
