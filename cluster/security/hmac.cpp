// hmac: thin wrappers over libcrypto (EVP_Digest, HMAC, RAND_bytes, CRYPTO_memcmp) and hex.
#include "cluster/security/hmac.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

namespace eldr {
namespace {

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string openssl_error() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error recorded";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

// SHA-256 and HMAC over in-memory buffers fail only when libcrypto cannot allocate or its
// provider is missing: a broken installation, not an input the caller can fix, so it aborts
// rather than hand out a digest that is not one.
[[noreturn]] void crypto_failed(const char* what) {
  std::fprintf(stderr, "eldr: OpenSSL %s failed: %s\n", what, openssl_error().c_str());
  std::abort();
}

}  // namespace

sha256_digest sha256(std::span<const uint8_t> bytes) {
  sha256_digest out{};
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), out.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != out.size())
    crypto_failed("EVP_Digest(SHA-256)");
  return out;
}

sha256_digest sha256(std::string_view bytes) {
  return sha256(as_bytes(bytes));
}

sha256_digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message) {
  // HMAC() takes the key length as an int: secrets are short, but a longer key would be cut.
  if (key.size() > static_cast<std::size_t>(INT_MAX)) {
    const sha256_digest hashed = sha256(key);  // RFC 2104: a key over the block size is hashed
    return hmac_sha256(std::span<const uint8_t>(hashed), message);
  }
  sha256_digest out{};
  unsigned int len = 0;
  // A zero-length key passes a non-null pointer: HMAC() treats a null key as "reuse the last".
  static const uint8_t empty = 0;
  if (HMAC(EVP_sha256(), key.empty() ? &empty : key.data(), static_cast<int>(key.size()),
           message.data(), message.size(), out.data(), &len) == nullptr ||
      len != out.size())
    crypto_failed("HMAC(SHA-256)");
  return out;
}

sha256_digest hmac_sha256(std::string_view key, std::string_view message) {
  return hmac_sha256(as_bytes(key), as_bytes(message));
}

result<std::vector<uint8_t>> random_bytes(std::size_t n) {
  std::vector<uint8_t> out(n);
  if (n > static_cast<std::size_t>(INT_MAX))
    return status::out_of_range("random_bytes: " + std::to_string(n) + " bytes requested");
  if (n > 0 && RAND_bytes(out.data(), static_cast<int>(n)) != 1)
    return status::failed_precondition("OpenSSL RAND_bytes failed: " + openssl_error());
  return out;
}

bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (a.size() != b.size()) return false;
  return a.empty() || CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
