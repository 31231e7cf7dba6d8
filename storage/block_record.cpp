// block_record: see block_record.hpp.
#include "storage/block_record.hpp"

#include <cstring>
#include <type_traits>

// The lookup's summation gets an x86-64-v3 clone beside the baseline, as core's kernels do.
#include "core/base/multiversion.hpp"

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
  const uint8_t format = counts_format_for(experts);
  out.clear();
  out.push_back(static_cast<char>(format));
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
    if (format == counts_format_narrow) {
      for (uint32_t i = b; i < e; ++i) {
        out.push_back(static_cast<char>(c.ids()[i]));
        out.push_back(static_cast<char>(c.counts()[i]));
      }
      continue;
    }
    for (uint32_t i = b; i < e; ++i) {
      put_le(out, c.ids()[i], 2);
      out.push_back(static_cast<char>(c.counts()[i]));
    }
  }
}

status validate_counts(std::string_view bytes, uint32_t layers, uint32_t experts) {
  cursor c(bytes);
  uint64_t format = 0, tokens = 0, n = 0;
  if (!c.get(format, 1) || (format != counts_format_narrow && format != counts_format_wide))
    return status::corrupt("block counts: unknown format " + std::to_string(format));
  const int id_bytes = format == counts_format_narrow ? 1 : 2;
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
    // The entry width as a constant in each loop, as it was when there was one format.
    auto sparse = [&](auto width) -> status {
      uint64_t prev = 0;
      for (uint32_t i = 0; i < z; ++i) {
        uint64_t id = 0, count = 0;
        if (!c.get(id, decltype(width)::value) || !c.get(count, 1))
          return status::corrupt("block counts: truncated");
        if (id >= experts) return status::corrupt("block counts: expert id out of range");
        // add_counts relies on distinct ids within a layer.
        if (i > 0 && id <= prev) return status::corrupt("block counts: ids not increasing");
        prev = id;
      }
      return {};
    };
    const status layer = id_bytes == 1 ? sparse(std::integral_constant<int, 1>{})
                                       : sparse(std::integral_constant<int, 2>{});
    if (!layer.ok()) return layer;
  }
  if (!c.done()) return status::corrupt("block counts: trailing bytes");
  return {};
}

namespace {

// add_counts for one record format: sparse entries of (id, count) with an id of IdBytes bytes.
// Inlined into each of add_counts's clones, so that it is compiled for their instruction sets.
// Ids are distinct within a layer, so four read-modify-writes are independent: unrolled, they
// overlap instead of waiting on each other (the lookup's inner loop).
template <int IdBytes>
[[gnu::always_inline]] inline void add_counts_as(const uint8_t* p, uint32_t experts,
                                                 uint32_t* out) {
  constexpr uint32_t entry = IdBytes + 1;
  auto id = [](const uint8_t* d) {
    if constexpr (IdBytes == 1)
      return uint32_t{d[0]};
    else
      return uint32_t{d[0]} | (uint32_t{d[1]} << 8);
  };
  const uint32_t n = uint32_t{p[3]} | (uint32_t{p[4]} << 8);
  const uint8_t* sizes = p + 5;
  const uint8_t* data = sizes + 2 * size_t{n};
  for (uint32_t l = 0; l < n; ++l) {
    const uint32_t z = uint32_t{sizes[2 * l]} | (uint32_t{sizes[2 * l + 1]} << 8);
    uint32_t* row = out + size_t{l} * experts;
    if (z & dense_layer) {
      for (uint32_t e = 0; e < experts; ++e)
        row[e] += data[e];
      data += experts;
      continue;
    }
    uint32_t i = 0;
    for (; i + 4 <= z; i += 4, data += 4 * entry) {
      const uint32_t i0 = id(data), i1 = id(data + entry);
      const uint32_t i2 = id(data + 2 * entry), i3 = id(data + 3 * entry);
      const uint32_t a = row[i0] + data[IdBytes], b = row[i1] + data[entry + IdBytes];
      const uint32_t c = row[i2] + data[2 * entry + IdBytes];
      const uint32_t d = row[i3] + data[3 * entry + IdBytes];
      row[i0] = a;
      row[i1] = b;
      row[i2] = c;
      row[i3] = d;
    }
    for (; i < z; ++i, data += entry)
      row[id(data)] += data[IdBytes];
  }
}

}  // namespace

ELDR_MULTIVERSION void add_counts(std::string_view bytes, uint32_t experts,
                                  std::span<uint32_t> masked_sum) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (p[0] == counts_format_narrow)
    add_counts_as<1>(p, experts, masked_sum.data());
  else
    add_counts_as<2>(p, experts, masked_sum.data());
}

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
  return block_key('e', epoch);
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

}  // namespace eldr::record
