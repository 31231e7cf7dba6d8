// hmac: SHA-256 compression and padding, HMAC's inner/outer construction, constant-time compare
// and hex. Written from FIPS 180-4 section 6.2 and RFC 2104; byte order is handled explicitly so
// the result is the same on every platform.
#include "core/hmac.hpp"

#include <algorithm>
#include <cstring>

namespace eldr {
namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes (FIPS 180-4
// section 4.2.2).
constexpr std::array<uint32_t, 64> round_constants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// First 32 bits of the fractional parts of the square roots of the first 8 primes (section 5.3.3).
constexpr std::array<uint32_t, 8> initial_state = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

constexpr uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void store_be32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

sha256_hasher::sha256_hasher() : state_(initial_state) {}

void sha256_hasher::compress(const uint8_t* block) {
  std::array<uint32_t, 64> w;
  for (int t = 0; t < 16; ++t)
    w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t big_s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + big_s1 + choose + round_constants[t] + w[t];
    const uint32_t big_s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = big_s0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void sha256_hasher::update(std::span<const uint8_t> bytes) {
  // An empty span may carry a null pointer, which memcpy must not be given even for 0 bytes.
  if (bytes.empty()) return;
  total_bytes_ += bytes.size();
  const uint8_t* p = bytes.data();
  std::size_t left = bytes.size();
  if (buffered_ > 0) {
    const std::size_t take = std::min(left, sha256_block_bytes - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    left -= take;
    if (buffered_ < sha256_block_bytes) return;
    compress(buffer_.data());
    buffered_ = 0;
  }
  // Whole blocks straight from the input, without copying them through the buffer.
  for (; left >= sha256_block_bytes; p += sha256_block_bytes, left -= sha256_block_bytes)
    compress(p);
  if (left > 0) std::memcpy(buffer_.data(), p, left);
  buffered_ = left;
}

void sha256_hasher::update(std::string_view bytes) {
  update(as_bytes(bytes));
}

sha256_digest sha256_hasher::finish() {
  // Padding (section 5.1.1): a 1 bit, zeros up to 56 mod 64, then the length in bits, big-endian.
  const uint64_t bit_length = total_bytes_ * 8;
  buffer_[buffered_++] = 0x80;
  if (buffered_ > sha256_block_bytes - 8) {
    std::fill(buffer_.begin() + static_cast<std::ptrdiff_t>(buffered_), buffer_.end(), 0);
    compress(buffer_.data());
    buffered_ = 0;
  }
  std::fill(buffer_.begin() + static_cast<std::ptrdiff_t>(buffered_), buffer_.end() - 8, 0);
  store_be32(static_cast<uint32_t>(bit_length >> 32), buffer_.data() + 56);
  store_be32(static_cast<uint32_t>(bit_length), buffer_.data() + 60);
  compress(buffer_.data());

  sha256_digest digest;
  for (std::size_t i = 0; i < state_.size(); ++i)
    store_be32(state_[i], digest.data() + 4 * i);
  *this = sha256_hasher();
  return digest;
}

sha256_digest sha256(std::span<const uint8_t> bytes) {
  sha256_hasher h;
  h.update(bytes);
  return h.finish();
}

sha256_digest sha256(std::string_view bytes) {
  return sha256(as_bytes(bytes));
}

sha256_digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  // K0 (RFC 2104): the key zero-padded to one block, or its digest zero-padded if it is longer.
  std::array<uint8_t, sha256_block_bytes> k0{};
  if (key.size() > sha256_block_bytes) {
    const sha256_digest hashed = sha256(key);
    std::copy(hashed.begin(), hashed.end(), k0.begin());
  } else {
    std::copy(key.begin(), key.end(), k0.begin());
  }
  std::array<uint8_t, sha256_block_bytes> pad;
  for (std::size_t i = 0; i < pad.size(); ++i)
    pad[i] = static_cast<uint8_t>(k0[i] ^ 0x36);
  sha256_hasher inner;
  inner.update(pad);
  inner.update(message);
  const sha256_digest inner_digest = inner.finish();

  for (std::size_t i = 0; i < pad.size(); ++i)
    pad[i] = static_cast<uint8_t>(k0[i] ^ 0x5c);
  sha256_hasher outer;
  outer.update(pad);
  outer.update(inner_digest);
  return outer.finish();
}

sha256_digest hmac_sha256(std::string_view key, std::string_view message) {
  return hmac_sha256(as_bytes(key), as_bytes(message));
}

bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  // Accumulate every difference instead of returning at the first one; volatile keeps the
  // compiler from turning the loop back into an early exit.
  volatile uint8_t diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff = static_cast<uint8_t>(diff | (a[i] ^ b[i]));
  return diff == 0;
}

std::string to_hex(std::span<const uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const uint8_t b : bytes) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 0x0f]);
  }
  return out;
}

result<std::vector<uint8_t>> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0)
    return status::invalid_argument("from_hex: odd number of hex digits (" +
                                    std::to_string(hex.size()) + ")");
  std::vector<uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_value(hex[2 * i]);
    const int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return status::invalid_argument("from_hex: not a hex digit at offset " +
                                      std::to_string(hi < 0 ? 2 * i : 2 * i + 1));
    out[i] = static_cast<uint8_t>((hi << 4) | lo);
  }
  return out;
}

}  // namespace eldr
