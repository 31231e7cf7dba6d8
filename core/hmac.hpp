// hmac: SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), standard library only.
//
// Nodes joining a cluster prove they hold the cluster's shared secret by challenge-response: the
// acceptor sends a fresh nonce, the joiner answers hmac_sha256(secret, nonce || context), and the
// acceptor compares the answer with its own computation through equal_constant_time, so the time a
// rejection takes does not reveal how many leading bytes of a forged answer were right.
//
// This is an authenticator, not a cipher: nothing here keeps traffic secret. Thread safety: the
// free functions are pure; a sha256_hasher has one owner.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"

namespace eldr {

inline constexpr std::size_t sha256_digest_bytes = 32;
inline constexpr std::size_t sha256_block_bytes = 64;
using sha256_digest = std::array<uint8_t, sha256_digest_bytes>;

// Incremental SHA-256 for input that arrives in pieces: update() any number of times (pieces may
// be empty and need not align to blocks), then finish() once. The digest equals sha256() of the
// concatenated pieces. Messages longer than 2^61 - 1 bytes are outside FIPS 180-4 and not
// detected.
class sha256_hasher {
 public:
  sha256_hasher();

  void update(std::span<const uint8_t> bytes);
  void update(std::string_view bytes);
  // Pads, returns the digest and resets the hasher to the empty message, so it can be reused.
  sha256_digest finish();

 private:
  void compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, sha256_block_bytes> buffer_{};
  std::size_t buffered_ = 0;  // bytes waiting in buffer_, always < sha256_block_bytes
  uint64_t total_bytes_ = 0;  // message length so far, for the length field of the padding
};

// SHA-256 of `bytes`. The string_view form hashes the string's bytes as they are (no terminator,
// no encoding conversion).
sha256_digest sha256(std::span<const uint8_t> bytes);
sha256_digest sha256(std::string_view bytes);

// HMAC-SHA256(key, message). Keys longer than the 64-byte block are first hashed (RFC 2104); any
// key length is accepted, including empty, though a shared secret should have at least 32 bytes of
// entropy for the 256-bit tag to mean anything.
sha256_digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);
sha256_digest hmac_sha256(std::string_view key, std::string_view message);

// True iff a and b have the same length and the same bytes. For equal lengths the running time
// does not depend on where (or whether) they differ; a length mismatch returns at once, since
// digest lengths are public. Use it for every comparison of a received tag with an expected one.
bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Lower-case hex, two characters per byte ("" for no bytes): how digests appear in logs, config
// and text protocols.
std::string to_hex(std::span<const uint8_t> bytes);
// The inverse of to_hex; accepts upper- and lower-case digits.
// Errors (invalid_argument): odd length, or a character that is not a hex digit.
result<std::vector<uint8_t>> from_hex(std::string_view hex);

}  // namespace eldr
