// curve_keys: see curve_keys.hpp.
#include "cluster/security/curve_keys.hpp"

#include <zmq.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace eldr {
namespace {

constexpr std::string_view z85_alphabet =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

std::string_view trim(std::string_view s) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f'; };
  while (!s.empty() && blank(s.front()))
    s.remove_prefix(1);
  while (!s.empty() && blank(s.back()))
    s.remove_suffix(1);
  return s;
}

result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    if (err == ENOENT) return status::not_found(path + ": no such file");
    return status::io_error(path + ": cannot open: " + std::strerror(err));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return status::io_error(path + ": read failed");
  return out.str();
}

}  // namespace

bool curve_available() {
  return zmq_has("curve") != 0;
}

result<curve_keypair> generate_curve_keypair() {
  if (!curve_available())
    return status::failed_precondition("this libzmq is built without CURVE support");
  char pub[curve_key_z85_chars + 1] = {};
  char sec[curve_key_z85_chars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    return status::failed_precondition(std::string("zmq_curve_keypair failed: ") +
                                       zmq_strerror(zmq_errno()));
  return curve_keypair{std::string(pub, curve_key_z85_chars),
                       std::string(sec, curve_key_z85_chars)};
}

result<curve_key> decode_curve_key(std::string_view z85) {
  if (z85.size() != curve_key_z85_chars)
    return status::invalid_argument("a key is " + std::to_string(curve_key_z85_chars) +
                                    " Z85 characters, got " + std::to_string(z85.size()));
  for (size_t i = 0; i < z85.size(); ++i)
    if (z85_alphabet.find(z85[i]) == std::string_view::npos)
      return status::invalid_argument("character " + std::to_string(i + 1) +
                                      " is not in the Z85 alphabet");
  const std::string text(z85);
  curve_key key{};
  if (zmq_z85_decode(key.data(), text.c_str()) == nullptr)
    return status::invalid_argument("not a Z85 key");
  // Z85 groups can overflow 32 bits; keep only the spelling that round-trips.
  if (encode_curve_key(key) != text)
    return status::invalid_argument("not a canonical Z85 key (a group exceeds 32 bits)");
  return key;
}

std::string encode_curve_key(const curve_key& key) {
  char out[curve_key_z85_chars + 1] = {};
  zmq_z85_encode(out, key.data(), key.size());
  return std::string(out, curve_key_z85_chars);
}

result<std::string> curve_public_key(std::string_view secret_z85) {
  if (auto k = decode_curve_key(secret_z85); !k.ok()) return k.error();
  if (!curve_available())
    return status::failed_precondition("this libzmq is built without CURVE support");
  const std::string secret(secret_z85);
  char pub[curve_key_z85_chars + 1] = {};
  if (zmq_curve_public(pub, secret.c_str()) != 0)
    return status::invalid_argument(std::string("zmq_curve_public failed: ") +
                                    zmq_strerror(zmq_errno()));
  return std::string(pub, curve_key_z85_chars);
}

result<std::vector<curve_key_line>> parse_curve_key_lines(std::string_view text,
                                                          const std::string& name) {
  std::vector<curve_key_line> keys;
  size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const size_t eol = text.find('\n');
    const std::string_view line = trim(text.substr(0, eol));
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    if (line.empty()) continue;
    if (line.front() == '#') continue;  // never a canonical key (see the header)
    auto key = decode_curve_key(line);
    if (!key.ok())
      return status::invalid_argument(name + ":" + std::to_string(line_no) + ": " +
                                      key.error().message());
    keys.push_back({std::string(line), line_no});
  }
  return keys;
}

result<curve_keypair> read_curve_secret_key(const std::string& path) {
  auto text = read_text(path);
  if (!text.ok()) return text.error();
  auto keys = parse_curve_key_lines(*text, path);
  if (!keys.ok()) return keys.error();
  if (keys->empty()) return status::invalid_argument(path + ": no key in the file");
  if (keys->size() > 1)
    return status::invalid_argument(
        path + ":" + std::to_string((*keys)[1].line) + ": a second key (the first is on line " +
        std::to_string((*keys)[0].line) + "); a secret key file holds exactly one");
  std::string secret = std::move((*keys)[0].key);
  auto pub = curve_public_key(secret);
  if (!pub.ok()) return status(pub.error().code(), path + ": " + pub.error().message());
  return curve_keypair{std::move(*pub), std::move(secret)};
}

result<std::set<std::string>> read_curve_public_keys(const std::string& path) {
  auto text = read_text(path);
  if (!text.ok()) return text.error();
  auto keys = parse_curve_key_lines(*text, path);
  if (!keys.ok()) return keys.error();
  if (keys->empty())
    return status::invalid_argument(path +
                                    ": no key in the file (an empty allowlist would admit any "
                                    "client; leave the setting unset for that)");
  std::set<std::string> out;
  for (auto& k : *keys)
    out.insert(std::move(k.key));
  return out;
}

}  // namespace eldr
