// expert_counts: dense per-request counts and sparse per-block counts.
#include "core/expert_counts.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <functional>
#include <optional>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace eldr {
namespace {

// block_counter reads a word's eight counts as one little-endian integer.
static_assert(std::endian::native == std::endian::little, "block_counter assumes little-endian");

// Token t's ids are [t * stride, t * stride + L * k) of an array of n_ids ids; stride 0 is L * k.
status check_range(const model_geometry& g, std::size_t n_ids, uint32_t begin, uint32_t end,
                   std::size_t stride = 0) {
  if (begin > end)
    return status::invalid_argument("token range [" + std::to_string(begin) + ", " +
                                    std::to_string(end) + ") is reversed");
  const uint64_t per_token = uint64_t{g.layers} * g.top_k;
  if (stride == 0) stride = per_token;
  if (stride < per_token)
    return status::invalid_argument(
        "a token stride of " + std::to_string(stride) +
        " ids is shorter than a token's layers * top_k = " + std::to_string(per_token));
  uint64_t last = 0;  // one past token end - 1's last id
  if (end > 0 && (__builtin_mul_overflow(uint64_t{end - 1}, uint64_t{stride}, &last) ||
                  __builtin_add_overflow(last, per_token, &last) || last > n_ids))
    return status::invalid_argument(
        "token range ends at " + std::to_string(end) + " but the expert array holds " +
        std::to_string(n_ids < per_token ? 0 : (n_ids - per_token) / stride + 1) + " tokens");
  return {};
}

status bad_id(const model_geometry& g, uint32_t token, uint32_t layer, uint32_t id) {
  return status::invalid_argument("expert id " + std::to_string(id) + " at token " +
                                  std::to_string(token) + ", layer " + std::to_string(layer) +
                                  " is >= experts (" + std::to_string(g.experts) + ")");
}

}  // namespace

status add_token_counts(const model_geometry& g, std::span<const expert_id> experts, uint32_t begin,
                        uint32_t end, std::span<uint32_t> counts) {
  if (status s = g.validate(); !s.ok()) return s;
  if (counts.size() != g.width())
    return status::invalid_argument(
        "counts array has " + std::to_string(counts.size()) +
        " entries, expected layers * experts = " + std::to_string(g.width()));
  if (status s = check_range(g, experts.size(), begin, end); !s.ok()) return s;
  const expert_id* p = experts.data() + std::size_t{begin} * g.layers * g.top_k;
  for (uint32_t t = begin; t < end; ++t)
    for (uint32_t l = 0; l < g.layers; ++l) {
      uint32_t* row = counts.data() + std::size_t{l} * g.experts;
      for (uint32_t r = 0; r < g.top_k; ++r, ++p) {
        if (*p >= g.experts) return bad_id(g, t, l, *p);
        ++row[*p];
      }
    }
  return {};
}

namespace {

struct row_summary {
  uint32_t entries = 0;  // nonzero counts written
  uint32_t sum = 0;      // of the counts
  uint32_t over = 0;     // nonzero: a count is over the block's tokens
};

// The word's sum and whether a count passes the block's tokens, four 16-bit lanes at a time (a
// lane holds one count, at most 255: no carry crosses lanes).
inline void summarise_word(uint64_t v, uint32_t tokens, row_summary& r) {
  constexpr uint64_t even = 0x00ff00ff00ff00ffULL;
  constexpr uint64_t ones = 0x0001000100010001ULL;
  const uint64_t lo = v & even, hi = (v >> 8) & even;
  r.sum += static_cast<uint32_t>(((lo + hi) * ones) >> 48);
  const uint64_t over = 0x8000800080008000ULL - ones * (tokens + 1);
  r.over |= static_cast<uint32_t>((((lo + over) | (hi + over)) & 0x8000800080008000ULL) != 0);
}

// Appends the nonzero counts of a histogram row of n_words words (ascending expert order) to ids
// and counts, which have room for 8 * n_words entries, and zeroes the row. Portable: all eight
// (id, count) pairs of a word stored, the output advanced past the nonzero ones only.
row_summary compress_row_portable(uint8_t* row, uint32_t n_words, uint32_t tokens, expert_id* ids,
                                  uint8_t* counts) {
  row_summary r;
  for (uint32_t w = 0; w < n_words; ++w) {
    uint64_t v;
    std::memcpy(&v, row + 8 * w, sizeof v);
    if (v == 0) continue;
    for (uint32_t byte = 0; byte < 8; ++byte) {
      const uint8_t c = row[8 * w + byte];
      ids[r.entries] = static_cast<expert_id>(8 * w + byte);
      counts[r.entries] = c;
      r.entries += c != 0;
    }
    summarise_word(v, tokens, r);
    std::memset(row + 8 * w, 0, sizeof v);
  }
  return r;
}

#if defined(__x86_64__)
// For every 8-bit mask of a word's nonzero bytes: their positions in ascending order (pshufb's
// byte selectors; 0x80 selects a zero past them) and how many there are.
struct word_compress_table {
  uint64_t positions[256];
  uint8_t count[256];
  constexpr word_compress_table() : positions(), count() {
    for (uint32_t m = 0; m < 256; ++m) {
      uint64_t p = 0x8080808080808080ULL;
      uint32_t n = 0;
      for (uint32_t b = 0; b < 8; ++b)
        if (m >> b & 1) {
          p &= ~(uint64_t{0xff} << (8 * n));
          p |= uint64_t{b} << (8 * n);
          ++n;
        }
      positions[m] = p;
      count[m] = static_cast<uint8_t>(n);
    }
  }
};
constexpr word_compress_table compress_table;

// compress_row_portable with SSSE3 (every x86-64 CPU since 2006, checked at run time), sixteen
// experts at a time (n_words is even: rows are whole 16-byte lines): the nonzero bytes are found
// by one compare, gathered by one pshufb per half from a table of their positions (which are the
// ids), summed by psadbw and bounded by a running pmaxub.
__attribute__((target("ssse3"))) row_summary compress_row_ssse3(uint8_t* row, uint32_t n_words,
                                                                uint32_t tokens, expert_id* ids,
                                                                uint8_t* counts) {
  const __m128i zero = _mm_setzero_si128();
  __m128i sums = zero, most = zero;
  row_summary r;
  for (uint32_t w = 0; w < n_words; w += 2) {
    auto* line = reinterpret_cast<__m128i*>(row + 8 * w);
    const __m128i v = _mm_loadu_si128(line);
    const auto zeros = static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero)));
    if (zeros == 0xffff) continue;
    sums = _mm_add_epi64(sums, _mm_sad_epu8(v, zero));
    most = _mm_max_epu8(most, v);
    for (uint32_t half = 0; half < 2; ++half) {
      const uint32_t mask = ~zeros >> (8 * half) & 0xffu;
      const __m128i positions =
          _mm_cvtsi64_si128(static_cast<long long>(compress_table.positions[mask]));
      const __m128i bytes = half == 0 ? v : _mm_srli_si128(v, 8);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(counts + r.entries),
                       _mm_shuffle_epi8(bytes, positions));
      const __m128i wide = _mm_add_epi16(_mm_unpacklo_epi8(positions, zero),
                                         _mm_set1_epi16(static_cast<short>(8 * (w + half))));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(ids + r.entries), wide);
      r.entries += compress_table.count[mask];
    }
    _mm_storeu_si128(line, zero);
  }
  r.sum = static_cast<uint32_t>(_mm_cvtsi128_si64(sums)) +
          static_cast<uint32_t>(_mm_cvtsi128_si64(_mm_srli_si128(sums, 8)));
  alignas(16) uint8_t largest[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(largest), most);
  r.over = static_cast<uint32_t>(*std::max_element(largest, largest + 16) > tokens);
  return r;
}

// compress_row_portable with AVX-512 (BW and VBMI2: Intel since Ice Lake, AMD since Zen 4,
// checked at run time), 64 experts at a time: the nonzero bytes found by one test into a mask,
// the counts and (32 at a time, 16-bit) the ids gathered by compress instructions, stored under a
// mask of as many lanes as there are entries, so nothing is written past them. Two steps for a
// 128-expert row where SSSE3 takes eight: BENCHMARKS.md, "Routed experts to counts".
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) row_summary compress_row_avx512(
    uint8_t* row, uint32_t n_words, uint32_t tokens, expert_id* ids, uint8_t* counts) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
                                        16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const auto first = [](uint32_t n) {  // a mask of the first n lanes, n <= 64
    return n == 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
  };
  __m512i sums = zero, most = zero;
  row_summary r;
  const uint32_t bytes = 8 * n_words;
  for (uint32_t at = 0; at < bytes; at += 64) {
    const __mmask64 in = first(std::min(64u, bytes - at));
    const __m512i v = _mm512_maskz_loadu_epi8(in, row + at);
    const __mmask64 nonzero = _mm512_test_epi8_mask(v, v);
    if (nonzero == 0) continue;
    sums = _mm512_add_epi64(sums, _mm512_sad_epu8(v, zero));
    most = _mm512_max_epu8(most, v);
    const auto n = static_cast<uint32_t>(__builtin_popcountll(nonzero));
    _mm512_mask_storeu_epi8(counts + r.entries, first(n), _mm512_maskz_compress_epi8(nonzero, v));
    const auto low = static_cast<__mmask32>(nonzero);
    const auto high = static_cast<__mmask32>(nonzero >> 32);
    const auto n_low = static_cast<uint32_t>(__builtin_popcount(low));
    const __m512i low_ids = _mm512_add_epi16(iota, _mm512_set1_epi16(static_cast<short>(at)));
    const __m512i high_ids = _mm512_add_epi16(low_ids, _mm512_set1_epi16(32));
    _mm512_mask_storeu_epi16(ids + r.entries, static_cast<__mmask32>(first(n_low)),
                             _mm512_maskz_compress_epi16(low, low_ids));
    _mm512_mask_storeu_epi16(ids + r.entries + n_low, static_cast<__mmask32>(first(n - n_low)),
                             _mm512_maskz_compress_epi16(high, high_ids));
    r.entries += n;
    _mm512_mask_storeu_epi8(row + at, in, zero);
  }
  alignas(64) uint64_t lane_sums[8];  // not _mm512_reduce_add_epi64: GCC 12 warns inside it
  _mm512_store_si512(lane_sums, sums);
  for (const uint64_t s : lane_sums)
    r.sum += static_cast<uint32_t>(s);
  r.over = static_cast<uint32_t>(
      _mm512_cmpgt_epu8_mask(most, _mm512_set1_epi8(static_cast<char>(tokens))) != 0);
  return r;
}
#endif

bool runs_on_this_cpu(detail::row_compressor c) {
  switch (c) {
    case detail::row_compressor::portable:
      return true;
#if defined(__x86_64__)
    case detail::row_compressor::ssse3:
      return __builtin_cpu_supports("ssse3");
    case detail::row_compressor::avx512:
      return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi2");
#endif
    default:
      return false;
  }
}

row_summary compress_row_by(detail::row_compressor c, uint8_t* row, uint32_t n_words,
                            uint32_t tokens, expert_id* ids, uint8_t* counts) {
  switch (c) {
#if defined(__x86_64__)
    case detail::row_compressor::avx512:
      return compress_row_avx512(row, n_words, tokens, ids, counts);
    case detail::row_compressor::ssse3:
      return compress_row_ssse3(row, n_words, tokens, ids, counts);
#endif
    default:
      return compress_row_portable(row, n_words, tokens, ids, counts);
  }
}

// The fastest this CPU runs, chosen once.
row_summary compress_row(uint8_t* row, uint32_t n_words, uint32_t tokens, expert_id* ids,
                         uint8_t* counts) {
  static const detail::row_compressor best = [] {
    for (detail::row_compressor c : {detail::row_compressor::avx512, detail::row_compressor::ssse3})
      if (runs_on_this_cpu(c)) return c;
    return detail::row_compressor::portable;
  }();
  return compress_row_by(best, row, n_words, tokens, ids, counts);
}

}  // namespace

// The one counting of block_counts::from_tokens and count_blocks, for two-byte and one-byte ids.
// A block's picks are read once, token by token (a token's L x k ids are contiguous), into one
// byte per (layer, expert): the whole block's histogram, L x E bytes (6 KiB for 48 x 128), stays
// in L1. Then each layer's nonzero counts are taken in ascending expert order, eight bytes at a
// time, and their bytes zeroed again, so the histogram is all zeros between blocks.
//
// A byte may wrap when a token repeats an expert in its top-k row (255 tokens x k picks can all
// name one expert), so every layer's counts must sum to tokens * k as well as stay <= tokens: a
// wrapped count fails the sum, an unwrapped repeat the bound.
class block_counter {
 public:
  // token_stride: see count_blocks; 0 is L * k.
  block_counter(const model_geometry& g, size_t token_stride)
      : g_(g),
        row_bytes_(8 * words(g)),  // see words
        token_stride_(token_stride != 0 ? token_stride : size_t{g.layers} * g.top_k) {
    scratch& s = local();
    const size_t bytes = size_t{g.layers} * row_bytes_;
    if (s.histogram.size() < bytes) s.histogram.resize(bytes, 0);
    if (s.offsets.size() < size_t{g.layers} + 1) s.offsets.resize(size_t{g.layers} + 1);
    // extract writes a whole word's eight entries past the last one kept: room for every byte.
    if (s.ids.size() < bytes) {
      s.ids.resize(bytes);
      s.counts.resize(bytes);
    }
  }

  // Tokens [begin, end) of a checked range (check_range) of a token-major id array, as a
  // block_counts of its own.
  template <class id_type>
  result<block_counts> count(const id_type* experts, uint32_t begin, uint32_t end) {
    if (status s = count_into(experts, begin, end); !s.ok()) return s;
    return own(view());
  }

  // A copy of a counted block's counts (counted here, so valid: no check again).
  static block_counts own(const block_counts_view& v) {
    block_counts b;
    b.tokens_ = v.tokens;
    b.layer_offsets_.assign(v.layer_offsets.begin(), v.layer_offsets.end());
    b.ids_.assign(v.ids.begin(), v.ids.end());
    b.counts_.assign(v.counts.begin(), v.counts.end());
    return b;
  }

  // The same counted into this thread's scratch, which view() then shows until the next count.
  // Allocates nothing: nothing may throw while the histogram holds counts.
  template <class id_type>
  status count_into(const id_type* experts, uint32_t begin, uint32_t end) {
    const uint32_t tokens = end - begin;
    if (tokens < 1 || tokens > 255)
      return status::invalid_argument("a block holds 1..255 tokens, got " + std::to_string(tokens));
    uint8_t* const histogram = local().histogram.data();
    const uint32_t n_experts = g_.experts;
    const uint32_t k = g_.top_k;
    const size_t per_token = size_t{g_.layers} * k;
    for (uint32_t t = begin; t < end; ++t) {
      const id_type* p = experts + t * token_stride_;
      // The token's largest id first, in a loop the compiler vectorises: the counting below
      // then runs without a branch per pick.
      id_type largest = 0;
      for (size_t i = 0; i < per_token; ++i)
        largest = std::max(largest, p[i]);
      if (largest >= n_experts) {
        clear();
        const size_t at = static_cast<size_t>(
            std::find_if(p, p + per_token, [&](id_type id) { return id >= n_experts; }) - p);
        return bad_id(g_, t, static_cast<uint32_t>(at / k), p[at]);
      }
      // The top-k of the models served most (8: DeepSeek-V3, Qwen3, Kimi K2; 6: DeepSeek-V2)
      // as constants: the compiler unrolls a token-layer's k increments, which then overlap
      // (distinct ids, so distinct bytes), where a loop of runtime length runs them one by one.
      // BENCHMARKS.md, "Routed experts to counts", has the figures.
      switch (k) {
        case 8:
          add_token<8>(histogram, p);
          break;
        case 6:
          add_token<6>(histogram, p);
          break;
        default:
          add_token<0>(histogram, p);
      }
    }
    return extract(tokens);
  }

  block_counts_view view() const {
    const scratch& s = local();
    const uint32_t n = s.offsets[g_.layers];
    return {tokens_, std::span(s.offsets.data(), size_t{g_.layers} + 1), std::span(s.ids.data(), n),
            std::span(s.counts.data(), n)};
  }

 private:
  // One token's picks into the histogram: L layers of k ids each, k = K, or g_.top_k if K is 0.
  template <uint32_t K, class id_type>
  void add_token(uint8_t* row, const id_type* p) const {
    const uint32_t k = K != 0 ? K : g_.top_k;
    for (uint32_t l = 0; l < g_.layers; ++l, p += k, row += row_bytes_)
      for (uint32_t r = 0; r < k; ++r)
        ++row[p[r]];
  }

  struct scratch {
    std::vector<uint8_t> histogram;  // all zeros between blocks
    std::vector<expert_id> ids;
    std::vector<uint8_t> counts;
    std::vector<uint32_t> offsets;  // the last block's layer offsets
  };
  // Per thread: the node's frontend, eldr-fit's workers and the proxy's library count at once.
  static scratch& local() {
    thread_local scratch s;
    return s;
  }
  // A layer's histogram row in words of eight counts: E rounded up to whole 16-byte lines (the
  // SSSE3 compress_row reads lines; the bytes past E are never counted, so stay zero).
  static uint32_t words(const model_geometry& g) { return 2 * ((g.experts + 15) / 16); }

  void clear() { std::memset(local().histogram.data(), 0, size_t{g_.layers} * row_bytes_); }

  // The nonzero counts of every layer in ascending expert order, a word (eight experts) at a
  // time, written out without a branch per byte: which bytes of a word are nonzero is a coin
  // flip the branch predictor loses (the proxy's hot path: 16 tokens x top-8 name about 80 of 128
  // experts). An all-zero word (most of a wide model's row) is skipped, a branch that is
  // predictable in both regimes.
  status extract(uint32_t tokens) {
    scratch& s = local();
    const uint32_t picks = tokens * g_.top_k;
    const uint32_t n_words = words(g_);
    s.offsets[0] = 0;
    expert_id* ids = s.ids.data();
    uint8_t* counts = s.counts.data();
    uint32_t n = 0;
    for (uint32_t l = 0; l < g_.layers; ++l) {
      uint8_t* row = s.histogram.data() + size_t{l} * row_bytes_;
      const row_summary r = compress_row(row, n_words, tokens, ids + n, counts + n);
      n += r.entries;
      if (r.sum != picks || r.over != 0) {  // a token picks an expert at most once per layer
        clear();
        return status::invalid_argument(
            "layer " + std::to_string(l) + ": the block's " + std::to_string(tokens) +
            " tokens pick one expert more than once each (repeated ids in a token's top-k row)");
      }
      s.offsets[l + 1] = n;
    }
    tokens_ = tokens;
    return {};
  }

  const model_geometry& g_;
  const uint32_t row_bytes_;  // a layer's histogram row: E bytes rounded up to whole words
  const size_t token_stride_;
  uint32_t tokens_ = 0;  // of the block in the scratch
};

namespace {

template <class id_type>
result<block_counts> count_one_block(const model_geometry& g, std::span<const id_type> experts,
                                     uint32_t begin, uint32_t end) {
  if (status s = g.validate(); !s.ok()) return s;
  if (status s = check_range(g, experts.size(), begin, end); !s.ok()) return s;
  return block_counter(g, 0).count(experts.data(), begin, end);
}

template <class id_type>
status each_block_count(const model_geometry& g, std::span<const id_type> experts, uint32_t begin,
                        uint32_t end, uint32_t block_size, size_t token_stride,
                        const std::function<status(uint32_t, const block_counts_view&)>& each) {
  if (block_size < 1 || block_size > 255)
    return status::invalid_argument("block size must be in 1..255, got " +
                                    std::to_string(block_size));
  if (status s = g.validate(); !s.ok()) return s;
  if (status s = check_range(g, experts.size(), begin, end, token_stride); !s.ok()) return s;
  block_counter counter(g, token_stride);
  uint32_t i = 0;
  for (uint32_t b = begin; b < end; b += block_size, ++i) {
    if (status s = counter.count_into(experts.data(), b, std::min(end, b + block_size)); !s.ok())
      return s;
    if (status s = each(i, counter.view()); !s.ok()) return s;
  }
  return {};
}

template <class id_type>
result<std::vector<block_counts>> count_all_blocks(const model_geometry& g,
                                                   std::span<const id_type> experts, uint32_t begin,
                                                   uint32_t end, uint32_t block_size,
                                                   size_t token_stride) {
  std::vector<block_counts> blocks;
  status s = each_block_count(g, experts, begin, end, block_size, token_stride,
                              [&](uint32_t i, const block_counts_view& v) {
                                if (i == 0)  // the range and block size are checked by now
                                  blocks.reserve((end - begin + block_size - 1) / block_size);
                                blocks.push_back(block_counter::own(v));
                                return status{};
                              });
  if (!s.ok()) return s;
  return blocks;
}

}  // namespace

result<block_counts> block_counts::from_tokens(const model_geometry& g,
                                               std::span<const expert_id> experts, uint32_t begin,
                                               uint32_t end) {
  return count_one_block(g, experts, begin, end);
}

result<block_counts> block_counts::from_tokens(const model_geometry& g,
                                               std::span<const uint8_t> experts, uint32_t begin,
                                               uint32_t end) {
  return count_one_block(g, experts, begin, end);
}

result<block_counts> block_counts::from_parts(const model_geometry& g, uint32_t tokens,
                                              std::vector<uint32_t> layer_offsets,
                                              std::vector<expert_id> ids,
                                              std::vector<uint8_t> counts) {
  if (status s = g.validate(); !s.ok()) return s;
  if (tokens < 1 || tokens > 255)
    return status::invalid_argument("a block holds 1..255 tokens, got " + std::to_string(tokens));
  if (layer_offsets.size() != std::size_t{g.layers} + 1)
    return status::invalid_argument(
        "block counts: " + std::to_string(layer_offsets.size()) +
        " layer offsets, expected layers + 1 = " + std::to_string(g.layers + 1));
  if (ids.size() != counts.size())
    return status::invalid_argument("block counts: " + std::to_string(ids.size()) + " ids but " +
                                    std::to_string(counts.size()) + " counts");
  if (layer_offsets.front() != 0 || layer_offsets.back() != ids.size())
    return status::invalid_argument("block counts: layer offsets must start at 0 and end at " +
                                    std::to_string(ids.size()));
  // Every block of every route request from a prefill whose cache missed comes through here, on
  // the node's frontend thread: check each layer with one branch-free pass (which the compiler
  // vectorises), and walk the layers element by element only to name what is wrong.
  auto layer_valid = [&](uint32_t l) {
    const uint32_t b = layer_offsets[l], e = layer_offsets[l + 1];
    if (b > e || e > ids.size()) return false;
    const expert_id* id = ids.data() + b;
    const uint8_t* count = counts.data() + b;
    const uint32_t n = e - b;
    uint32_t bad = 0, sum = 0;
    for (uint32_t i = 0; i < n; ++i) {
      bad |= static_cast<uint32_t>(id[i] >= g.experts);
      bad |= static_cast<uint32_t>(static_cast<uint8_t>(count[i] - 1) >= tokens);  // 1..tokens
      sum += count[i];
    }
    for (uint32_t i = 1; i < n; ++i)
      bad |= static_cast<uint32_t>(id[i] <= id[i - 1]);
    return bad == 0 && sum == tokens * g.top_k;
  };
  bool valid = true;
  for (uint32_t l = 0; l < g.layers && valid; ++l)
    valid = layer_valid(l);
  for (uint32_t l = 0; l < g.layers && !valid; ++l) {
    const uint32_t b = layer_offsets[l], e = layer_offsets[l + 1];
    if (b > e || e > ids.size())
      return status::invalid_argument(
          "block counts: layer offsets decrease or pass the end at layer " + std::to_string(l));
    uint32_t sum = 0;
    for (uint32_t i = b; i < e; ++i) {
      if (ids[i] >= g.experts) return bad_id(g, 0, l, ids[i]);
      if (i > b && ids[i] <= ids[i - 1])
        return status::invalid_argument("block counts: expert ids of layer " + std::to_string(l) +
                                        " are not strictly increasing");
      if (counts[i] < 1 || counts[i] > tokens)
        return status::invalid_argument("block counts: count " + std::to_string(counts[i]) +
                                        " at layer " + std::to_string(l) + " is not in 1.." +
                                        std::to_string(tokens));
      sum += counts[i];
    }
    // Every token picks exactly top_k distinct experts per layer.
    if (sum != tokens * g.top_k)
      return status::invalid_argument(
          "block counts: layer " + std::to_string(l) + " sums to " + std::to_string(sum) +
          ", expected tokens * top_k = " + std::to_string(tokens * g.top_k));
  }
  block_counts out;
  out.tokens_ = tokens;
  out.layer_offsets_ = std::move(layer_offsets);
  out.ids_ = std::move(ids);
  out.counts_ = std::move(counts);
  return out;
}

void block_counts::add_to(const model_geometry& g, std::span<uint32_t> dense) const {
  for (uint32_t l = 0; l + 1 < layer_offsets_.size(); ++l) {
    uint32_t* row = dense.data() + std::size_t{l} * g.experts;
    for (uint32_t i = layer_offsets_[l]; i < layer_offsets_[l + 1]; ++i)
      row[ids_[i]] += counts_[i];
  }
}

result<std::vector<block_counts>> count_blocks(const model_geometry& g,
                                               std::span<const expert_id> experts, uint32_t begin,
                                               uint32_t end, uint32_t block_size,
                                               std::size_t token_stride) {
  return count_all_blocks(g, experts, begin, end, block_size, token_stride);
}

result<std::vector<block_counts>> count_blocks(const model_geometry& g,
                                               std::span<const uint8_t> experts, uint32_t begin,
                                               uint32_t end, uint32_t block_size,
                                               std::size_t token_stride) {
  return count_all_blocks(g, experts, begin, end, block_size, token_stride);
}

status for_each_block_count(const model_geometry& g, std::span<const expert_id> experts,
                            uint32_t begin, uint32_t end, uint32_t block_size,
                            std::size_t token_stride,
                            const std::function<status(uint32_t, const block_counts_view&)>& each) {
  return each_block_count(g, experts, begin, end, block_size, token_stride, each);
}

status for_each_block_count(const model_geometry& g, std::span<const uint8_t> experts,
                            uint32_t begin, uint32_t end, uint32_t block_size,
                            std::size_t token_stride,
                            const std::function<status(uint32_t, const block_counts_view&)>& each) {
  return each_block_count(g, experts, begin, end, block_size, token_stride, each);
}

block_counts_view block_counts::view() const {
  return {tokens_, layer_offsets_, ids_, counts_};
}

namespace detail {

bool cpu_runs(row_compressor c) {
  return runs_on_this_cpu(c);
}

std::optional<compressed_row> compress_row_with(row_compressor c, std::span<const uint8_t> row,
                                                uint32_t tokens) {
  if (!cpu_runs(c)) return std::nullopt;
  // As block_counter lays a row out: whole 16-byte lines, zeros past the experts.
  const auto n_words = static_cast<uint32_t>(2 * ((row.size() + 15) / 16));
  std::vector<uint8_t> line(8 * size_t{n_words}, 0);
  std::copy(row.begin(), row.end(), line.begin());
  compressed_row out;
  out.ids.resize(line.size());
  out.counts.resize(line.size());
  const row_summary r =
      compress_row_by(c, line.data(), n_words, tokens, out.ids.data(), out.counts.data());
  out.ids.resize(r.entries);
  out.counts.resize(r.entries);
  out.sum = r.sum;
  out.over = r.over != 0;
  out.row_zeroed = std::all_of(line.begin(), line.end(), [](uint8_t b) { return b == 0; });
  return out;
}

}  // namespace detail

}  // namespace eldr
