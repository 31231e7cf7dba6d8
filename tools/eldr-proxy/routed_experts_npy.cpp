// routed_experts_npy: strict base64 (checked here, decoded by OpenSSL) and the .npy header.
#include "tools/eldr-proxy/routed_experts_npy.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace eldr::proxy {
namespace {

constexpr std::string_view npy_magic = "\x93NUMPY";
constexpr size_t max_header = 65536;  // as eldr_routed_experts: no .npy header is near this
// OpenSSL's EVP_DecodeBlock takes an int length: whole quanta of at most this many characters.
constexpr size_t chunk_chars = size_t{1} << 20;

status refuse(const std::string& what) {
  return status::invalid_argument("routed_experts: " + what);
}

bool is_base64_char(uint8_t c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

// The first character that is not of the base64 alphabet, for the message.
status bad_character(const uint8_t* p, size_t n) {
  const size_t at = static_cast<size_t>(std::find_if_not(p, p + n, is_base64_char) - p);
  if (at == n) return refuse("not valid base64");
  return refuse("not valid base64: character " + std::to_string(unsigned{p[at]}) + " at offset " +
                std::to_string(at) + " is not of the base64 alphabet" +
                (p[at] == '=' ? " ('=' is padding, only at the end)" : ""));
}

#if defined(__x86_64__)
// The leading run of base64 text made only of the 64 alphabet characters, decoded sixteen
// characters at a time with SSSE3 (every x86-64 CPU since 2006, checked at run time): OpenSSL's
// EVP_DecodeBlock reads one character per table lookup, which made it half of the conversion's
// CPU time for a long prompt. Stops before the first 16-character line holding anything else
// ('=', whitespace, a foreign byte), and early enough that its 16-byte stores (12 bytes of output
// each) stay inside out's text_len / 4 * 3 bytes; the caller decodes the rest with OpenSSL, so
// what is refused, and why, is OpenSSL's and the checks' below. Returns the characters decoded,
// a multiple of 16; their text_len / 4 * 3 bytes are in out.
//
// Per byte c, with hi = c >> 4 and lo = c & 15: c is of the alphabet iff
// valid_lo[lo] & valid_hi[hi] == 0. valid_hi gives hi's class bit (hi 2: '+' '/', 3: digits,
// 4 and 6: letters from lo 1, 5 and 7: letters up to lo 10, else none) and valid_lo[lo] holds the
// class bits for which lo is outside the class (bit 0x10 for all: no byte with such a hi is
// valid). The sextet is c + shift[hi], '/' (hi 2, like '+') taking shift[1].
alignas(16) constexpr int8_t valid_lo_bytes[16] = {0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
                                                   0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a};
alignas(16) constexpr int8_t valid_hi_bytes[16] = {0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08,
                                                   0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10};
// 'A' -> 0, 'a' -> 26, '0' -> 52, '+' -> 62, '/' -> 63.
alignas(16) constexpr int8_t shift_bytes[16] = {
    0, 63 - '/', 62 - '+', 52 - '0', -'A', -'A', 26 - 'a', 26 - 'a', 0, 0, 0, 0, 0, 0, 0, 0};
// Four sextets a b c d of a 32-bit lane -> a << 18 | b << 12 | c << 6 | d (join_pairs, then
// join_quads), then its three bytes, most significant first, of every lane packed into the first
// twelve bytes of the 16 (pack).
constexpr int join_pairs_word = 0x01400140;
constexpr int join_quads_word = 0x00011000;
alignas(16) constexpr int8_t pack_bytes[16] = {2, 1,  0,  6,  5,  4,  10, 9,
                                               8, 14, 13, 12, -1, -1, -1, -1};

__attribute__((target("ssse3"))) __m128i load_table(const int8_t* bytes) {
  return _mm_load_si128(reinterpret_cast<const __m128i*>(bytes));
}

__attribute__((target("ssse3"))) size_t decode_base64_alphabet_run_ssse3(const uint8_t* p, size_t n,
                                                                         uint8_t* out) {
  const __m128i valid_lo = load_table(valid_lo_bytes);
  const __m128i valid_hi = load_table(valid_hi_bytes);
  const __m128i shift = load_table(shift_bytes);
  const __m128i nibble = _mm_set1_epi8(0x0f);
  const __m128i slash = _mm_set1_epi8('/');
  const __m128i join_pairs = _mm_set1_epi32(join_pairs_word);
  const __m128i join_quads = _mm_set1_epi32(join_quads_word);
  const __m128i pack = load_table(pack_bytes);
  size_t i = 0;
  // i + 24 <= n: the store at out + i / 4 * 3 writes 16 bytes, 4 past the line's 12, and at
  // least 8 characters (6 bytes) are left after the line.
  for (; i + 24 <= n; i += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(c, 4), nibble);
    const __m128i lo = _mm_and_si128(c, nibble);
    const __m128i outside =
        _mm_and_si128(_mm_shuffle_epi8(valid_lo, lo), _mm_shuffle_epi8(valid_hi, hi));
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(outside, _mm_setzero_si128())) != 0xffff) break;
    // cmpeq gives -1 for '/': hi 2 - 1 picks its shift.
    const __m128i sextets =
        _mm_add_epi8(c, _mm_shuffle_epi8(shift, _mm_add_epi8(hi, _mm_cmpeq_epi8(c, slash))));
    const __m128i joined = _mm_madd_epi16(_mm_maddubs_epi16(sextets, join_pairs), join_quads);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i / 4 * 3), _mm_shuffle_epi8(joined, pack));
  }
  return i;
}

// The same, 32 characters at a time with AVX2 (x86-64 CPUs since 2013, checked at run time): the
// SSSE3 steps on two 16-character lines at once (AVX2's byte shuffles stay within each half),
// then each half's 12 bytes moved next to each other. Stops as the SSSE3 run does, and early
// enough that its 32-byte stores (24 bytes of output) stay inside out, and 16 or more characters
// before the end; the SSSE3 run goes on from there. The same steps, plus one permute, for twice
// the characters: BENCHMARKS.md, "Routed experts to counts".
__attribute__((target("avx2"))) size_t decode_base64_alphabet_run_avx2(const uint8_t* p, size_t n,
                                                                       uint8_t* out) {
  const __m256i valid_lo = _mm256_broadcastsi128_si256(load_table(valid_lo_bytes));
  const __m256i valid_hi = _mm256_broadcastsi128_si256(load_table(valid_hi_bytes));
  const __m256i shift = _mm256_broadcastsi128_si256(load_table(shift_bytes));
  const __m256i nibble = _mm256_set1_epi8(0x0f);
  const __m256i slash = _mm256_set1_epi8('/');
  const __m256i join_pairs = _mm256_set1_epi32(join_pairs_word);
  const __m256i join_quads = _mm256_set1_epi32(join_quads_word);
  const __m256i pack = _mm256_broadcastsi128_si256(load_table(pack_bytes));
  const __m256i halves = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 7, 7);  // 12 + 12 bytes, then any
  size_t i = 0;
  // i + 48 <= n: the store at out + i / 4 * 3 writes 32 bytes, 8 past the line's 24, and at
  // least 16 characters (12 bytes) are left after the line.
  for (; i + 48 <= n; i += 32) {
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(c, 4), nibble);
    const __m256i lo = _mm256_and_si256(c, nibble);
    const __m256i outside =
        _mm256_and_si256(_mm256_shuffle_epi8(valid_lo, lo), _mm256_shuffle_epi8(valid_hi, hi));
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi8(outside, _mm256_setzero_si256())) != -1) break;
    const __m256i sextets = _mm256_add_epi8(
        c, _mm256_shuffle_epi8(shift, _mm256_add_epi8(hi, _mm256_cmpeq_epi8(c, slash))));
    const __m256i joined = _mm256_madd_epi16(_mm256_maddubs_epi16(sextets, join_pairs), join_quads);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i / 4 * 3),
                        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(joined, pack), halves));
  }
  return i;
}

size_t decode_base64_alphabet_run(const uint8_t* p, size_t n, uint8_t* out) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  static const bool ssse3 = __builtin_cpu_supports("ssse3");
  const size_t wide = avx2 ? decode_base64_alphabet_run_avx2(p, n, out) : 0;
  return ssse3 ? wide + decode_base64_alphabet_run_ssse3(p + wide, n - wide, out + wide / 4 * 3)
               : wide;
}
#else
size_t decode_base64_alphabet_run(const uint8_t*, size_t, uint8_t*) {
  return 0;
}
#endif

// Strict base64: the leading run of alphabet characters by decode_base64_alphabet_run, the rest
// (at least the last 8 characters, so the padding too, and everything from the first line that
// is not all alphabet) by OpenSSL. EVP_DecodeBlock refuses any character outside the alphabet
// but three leniencies: it skips whitespace at the start, drops whitespace, line ends and '-' at
// the end, and takes '=' anywhere as zero bits. A skipped or dropped character makes it return
// fewer bytes than the text's quanta hold, which is refused here; '=' is looked for before it.
// So every character is checked once, by the SSSE3 classes or by OpenSSL's table, with no pass of
// our own over the text but memchr's. Returns the decoded size.
result<size_t> decode_base64(std::string_view text, std::span<uint8_t> out) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  if (n % 4 != 0)
    return refuse("not valid base64: " + std::to_string(n) +
                  " characters, not a multiple of 4 (incorrect padding)");
  size_t pad = 0;
  while (pad < 2 && pad < n && p[n - 1 - pad] == '=')
    ++pad;
  if (std::memchr(p, '=', n - pad) != nullptr) return bad_character(p, n - pad);
  if (out.size() < base64_decoded_bound(n)) return refuse("the output buffer is too small");
  const size_t run = decode_base64_alphabet_run(p, n, out.data());
  size_t written = run / 4 * 3;
  for (size_t done = run; done < n; done += chunk_chars) {
    const size_t len = std::min(chunk_chars, n - done);
    const int got = EVP_DecodeBlock(out.data() + written, p + done, static_cast<int>(len));
    if (got < 0 || static_cast<size_t>(got) != len / 4 * 3) return bad_character(p, n - pad);
    written += static_cast<size_t>(got);
  }
  return written - pad;  // EVP_DecodeBlock writes the padding's quantum whole
}

// The .npy header: a Python dict literal as numpy writes it ({'descr': '<u2', 'fortran_order':
// False, 'shape': (4096, 49, 8), } padded with spaces and a newline), its three keys in any
// order, each once; nothing else.
class header_parser {
 public:
  explicit header_parser(std::string_view text) : s_(text) {}

  status parse(npy_array& a) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_space();
    if (!take('{')) return fail("does not start with '{'");
    for (;;) {
      skip_space();
      if (take('}')) break;
      std::string_view key;
      if (!string(key)) return fail("a key is not a quoted string");
      skip_space();
      if (!take(':')) return fail("no ':' after a key");
      skip_space();
      if (key == "descr" && !have_descr) {
        std::string_view descr;
        if (!string(descr)) return fail("descr is not a quoted string");
        if (descr == "|u1" || descr == "<u1")
          a.dtype = npy_dtype::u1;
        else if (descr == "<u2")
          a.dtype = npy_dtype::u2;
        else if (descr == "<i4")
          a.dtype = npy_dtype::i4;
        else if (descr == "<u4")
          a.dtype = npy_dtype::u4;
        else if (descr == "<i8")
          a.dtype = npy_dtype::i8;
        else
          return fail("dtype '" + std::string(descr.substr(0, 16)) +
                      "' is not uint8, uint16, int32, uint32 or int64 (little-endian)");
        have_descr = true;
      } else if (key == "fortran_order" && !have_order) {
        if (take_word("True")) return fail("the array is in Fortran order");
        if (!take_word("False")) return fail("fortran_order is not True or False");
        have_order = true;
      } else if (key == "shape" && !have_shape) {
        if (status st = shape(a); !st.ok()) return st;
        have_shape = true;
      } else {
        return fail("unexpected or repeated key '" + std::string(key.substr(0, 16)) + "'");
      }
      skip_space();
      if (take(',')) continue;
      skip_space();
      if (take('}')) break;
      return fail("no ',' or '}' after a value");
    }
    skip_space();
    if (i_ != s_.size()) return fail("bytes after the closing '}'");
    if (!have_descr || !have_order || !have_shape)
      return fail("descr, fortran_order and shape are not all present");
    return {};
  }

 private:
  static status fail(const std::string& what) {
    return refuse("not a readable .npy array: header " + what);
  }
  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n'))
      ++i_;
  }
  bool take(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool take_word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool string(std::string_view& out) {
    if (i_ >= s_.size() || (s_[i_] != '\'' && s_[i_] != '"')) return false;
    const char quote = s_[i_];
    const size_t end = s_.find(quote, i_ + 1);
    if (end == std::string_view::npos) return false;
    out = s_.substr(i_ + 1, end - i_ - 1);
    if (out.find('\\') != std::string_view::npos) return false;  // no escapes in numpy's keys
    i_ = end + 1;
    return true;
  }
  // A tuple of exactly three non-negative integers, a trailing comma allowed.
  status shape(npy_array& a) {
    if (!take('(')) return fail("shape is not a tuple");
    size_t dims = 0;
    for (;;) {
      skip_space();
      if (take(')')) break;
      if (i_ >= s_.size() || s_[i_] < '0' || s_[i_] > '9')
        return fail("shape holds something other than non-negative integers");
      uint64_t v = 0;
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
        v = v * 10 + static_cast<uint64_t>(s_[i_++] - '0');
        if (v > (uint64_t{1} << 40)) return fail("shape has a dimension over 2^40");
      }
      if (dims < 3) a.shape[dims] = v;
      ++dims;
      skip_space();
      if (take(',')) continue;
      skip_space();
      if (take(')')) break;
      return fail("shape is not a tuple of integers");
    }
    if (dims != 3)
      return refuse("routed experts must have 3 dimensions (tokens, layers, top_k), got " +
                    std::to_string(dims));
    return {};
  }

  std::string_view s_;
  size_t i_ = 0;
};

size_t item_size(npy_dtype d) {
  switch (d) {
    case npy_dtype::u1:
      return 1;
    case npy_dtype::u2:
      return 2;
    case npy_dtype::i4:
    case npy_dtype::u4:
      return 4;
    case npy_dtype::i8:
      return 8;
  }
  return 0;
}

template <class signed_id>
bool any_negative(const uint8_t* p, size_t count) {
  signed_id low = 0;
  for (size_t i = 0; i < count; ++i) {
    signed_id v;
    std::memcpy(&v, p + i * sizeof v, sizeof v);
    low = std::min(low, v);
  }
  return low < 0;
}

}  // namespace

size_t base64_decoded_bound(size_t text_len) {
  return text_len / 4 * 3;
}

result<npy_array> decode_routed_experts(std::string_view text, std::span<uint8_t> out) {
  auto decoded = decode_base64(text, out);
  if (!decoded.ok()) return decoded.error();
  const uint8_t* raw = out.data();
  const size_t n = *decoded;
  if (n < 10 || std::memcmp(raw, npy_magic.data(), npy_magic.size()) != 0)
    return refuse("base64 but not a .npy array (no \\x93NUMPY magic)");
  size_t header_len = 0, start = 0;
  if (raw[6] == 1) {
    header_len = size_t{raw[8]} | size_t{raw[9]} << 8;
    start = 10;
  } else if ((raw[6] == 2 || raw[6] == 3) && n >= 12) {
    header_len =
        size_t{raw[8]} | size_t{raw[9]} << 8 | size_t{raw[10]} << 16 | size_t{raw[11]} << 24;
    start = 12;
  } else {
    return refuse("a .npy array of unknown version " + std::to_string(unsigned{raw[6]}));
  }
  if (header_len > max_header || start + header_len > n)
    return refuse("not a readable .npy array: a header of " + std::to_string(header_len) +
                  " bytes");
  npy_array a;
  header_parser parser(std::string_view(reinterpret_cast<const char*>(raw + start), header_len));
  if (status s = parser.parse(a); !s.ok()) return s;
  const size_t size = item_size(a.dtype);
  uint64_t count = 0, bytes = 0;
  if (__builtin_mul_overflow(a.shape[0], a.shape[1], &count) ||
      __builtin_mul_overflow(count, a.shape[2], &count) ||
      __builtin_mul_overflow(count, uint64_t{size}, &bytes) || bytes != n - start - header_len)
    return refuse("not a readable .npy array: " + std::to_string(n - start - header_len) +
                  " data bytes for shape (" + std::to_string(a.shape[0]) + ", " +
                  std::to_string(a.shape[1]) + ", " + std::to_string(a.shape[2]) + ")");
  a.data_offset = start + header_len;
  a.data_bytes = bytes;
  const uint8_t* data = raw + a.data_offset;
  if ((a.dtype == npy_dtype::i4 && any_negative<int32_t>(data, count)) ||
      (a.dtype == npy_dtype::i8 && any_negative<int64_t>(data, count)))
    return refuse("holds a negative expert id");
  return a;
}

}  // namespace eldr::proxy
