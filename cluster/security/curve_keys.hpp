// curve_keys: ZeroMQ CURVE keys as eldr stores them -- Z85 text (40 characters for 32 bytes), one
// key a line in a key file -- checked, decoded and read from files. No sockets: the frontend
// (zmq_frontend.hpp) and the tools call these; docs/security.md explains the files.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

inline constexpr size_t curve_key_bytes = 32;
inline constexpr size_t curve_key_z85_chars = 40;
using curve_key = std::array<uint8_t, curve_key_bytes>;

// A CURVE key pair in Z85.
struct curve_keypair {
  std::string public_key;
  std::string secret_key;
};

// True when the linked libzmq was built with CURVE (zmq_has("curve")).
bool curve_available();

// A fresh key pair from libzmq's random source (zmq_curve_keypair). Errors: failed_precondition
// when libzmq has no CURVE.
result<curve_keypair> generate_curve_keypair();

// Decodes a Z85 key. Only the canonical form is accepted (exactly 40 characters of the Z85
// alphabet that encode back to themselves), so that one key has one spelling. Errors
// (invalid_argument) describe the problem without repeating the key, so that callers may prefix
// a field or file name and secret keys never reach a log.
result<curve_key> decode_curve_key(std::string_view z85);
// The Z85 form of a key (40 characters).
std::string encode_curve_key(const curve_key& key);

// The public key of a Z85 secret key (zmq_curve_public). Errors: as decode_curve_key;
// failed_precondition when libzmq has no CURVE.
result<std::string> curve_public_key(std::string_view secret_z85);

// A key as read from a key file, with its 1-based line number.
struct curve_key_line {
  std::string key;  // Z85, well-formed
  size_t line = 0;
};

// The keys of a key file's text, in file order (duplicates kept). One key a line; leading and
// trailing blanks (and a CR) are ignored, so are blank lines and comment lines whose first
// non-blank character is '#'. ('#' is a Z85 character, but never the first of a canonical key: a
// 5-character group starting with it exceeds 32 bits.) Errors (invalid_argument) read
// "<name>:<line>: ...", name being the file's name for messages.
result<std::vector<curve_key_line>> parse_curve_key_lines(std::string_view text,
                                                          const std::string& name);

// Reads a secret key file: exactly one key; returns it with its public key. Errors name the file
// (and the line): not_found / io_error when it cannot be read, invalid_argument for a bad or
// missing key or more than one key.
result<curve_keypair> read_curve_secret_key(const std::string& path);

// Reads an authorized-keys file: one or more public keys (Z85, as written). Errors as
// read_curve_secret_key; a file without any key is an error, not "allow everyone".
result<std::set<std::string>> read_curve_public_keys(const std::string& path);

}  // namespace eldr
