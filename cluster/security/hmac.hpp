// hmac: SHA-256, HMAC-SHA256 and random bytes from OpenSSL's libcrypto, and the constant-time
// compare and hex that go with them.
//
// Nodes joining a cluster prove they hold the cluster's shared secret by challenge-response: the
// acceptor sends a fresh nonce (random_bytes), the joiner answers hmac_sha256(secret, nonce ||
// context), and the acceptor compares the answer with its own computation through
// equal_constant_time, so the time a rejection takes does not reveal how many leading bytes of a
// forged answer were right.
//
// Crypto comes from OpenSSL, never by hand: an earlier version carried its own SHA-256, which was
// correct against the FIPS and RFC 4231 vectors but was code nobody audits. This is an
// authenticator, not a cipher: nothing here keeps traffic secret. Thread safety: every function
// is pure or uses OpenSSL's thread-safe RNG.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

inline constexpr std::size_t sha256_digest_bytes = 32;
using sha256_digest = std::array<uint8_t, sha256_digest_bytes>;

// SHA-256 of `bytes`. The string_view form hashes the string's bytes as they are (no terminator,
// no encoding conversion).
sha256_digest sha256(std::span<const uint8_t> bytes);
sha256_digest sha256(std::string_view bytes);

// HMAC-SHA256(key, message) (RFC 2104). Any key length is accepted, including empty, though a
// shared secret should have at least 32 bytes of entropy for the 256-bit tag to mean anything.
sha256_digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);
sha256_digest hmac_sha256(std::string_view key, std::string_view message);

// n bytes from OpenSSL's CSPRNG (RAND_bytes), for nonces.
// Errors (failed_precondition): the generator is not seeded or failed (with OpenSSL's error).
result<std::vector<uint8_t>> random_bytes(std::size_t n);

// True iff a and b have the same length and the same bytes (CRYPTO_memcmp). For equal lengths the
// running time does not depend on where (or whether) they differ; a length mismatch returns at
// once, since digest lengths are public. Use it for every comparison of a received tag with an
// expected one.
bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b);

// Lower-case hex, two characters per byte ("" for no bytes): how digests appear in logs, config
// and text protocols.
std::string to_hex(std::span<const uint8_t> bytes);
// The inverse of to_hex; accepts upper- and lower-case digits.
// Errors (invalid_argument): odd length, or a character that is not a hex digit.
result<std::vector<uint8_t>> from_hex(std::string_view hex);

}  // namespace eldr
