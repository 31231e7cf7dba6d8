// http_url: see http_url.hpp.
#include "cluster/http/http_url.hpp"

#include <charconv>

namespace eldr {
namespace {

status bad(std::string_view why) {
  return status::invalid_argument(std::string(why));
}

bool host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

bool ipv6_char(char c) {
  return (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || (c >= '0' && c <= '9') || c == ':' ||
         c == '.';
}

}  // namespace

std::string http_url::to_string() const {
  const bool v6 = host.find(':') != std::string::npos;
  // The default port is left out, so that the text is never longer than what was parsed but for
  // a '/' added to an empty path (parse_http_url checks that this still fits the limit).
  return "http://" + (v6 ? "[" + host + "]" : host) +
         (port == 80 ? std::string() : ":" + std::to_string(port)) + path;
}

result<http_url> parse_http_url(std::string_view s) {
  if (s.empty()) return bad("empty");
  if (s.size() > max_http_url_bytes)
    return bad("longer than " + std::to_string(max_http_url_bytes) + " bytes");
  for (char c : s)
    if (c <= ' ' || c > '~') return bad("holds a space, a control or a non-ASCII byte");
  constexpr std::string_view scheme = "http://";
  if (s.substr(0, scheme.size()) != scheme) return bad("must start with http://");
  s.remove_prefix(scheme.size());
  const size_t slash = s.find('/');
  std::string_view authority = s.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view("/") : s.substr(slash);
  if (path.find('#') != std::string_view::npos) return bad("must not hold a fragment ('#')");
  if (authority.find('@') != std::string_view::npos) return bad("must not hold user info ('@')");
  if (authority.empty()) return bad("has no host");
  http_url u;
  std::string_view port;
  if (authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("has an unclosed '[' in its host");
    const std::string_view host = authority.substr(1, close - 1);
    if (host.empty()) return bad("has no host");
    for (char c : host)
      if (!ipv6_char(c)) return bad("has a bad IPv6 host");
    u.host = std::string(host);
    const std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("has bytes after its IPv6 host");
      port = rest.substr(1);
      if (port.empty()) return bad("has an empty port");
    }
  } else {
    const size_t colon = authority.find(':');
    const std::string_view host = authority.substr(0, colon);
    if (host.empty()) return bad("has no host");
    for (char c : host)
      if (!host_char(c)) return bad("has a bad host (letters, digits, '-', '.', '_' only)");
    u.host = std::string(host);
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("has an empty port");
    }
  }
  if (!port.empty()) {
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535)
      return bad("has a port outside 1..65535");
    u.port = static_cast<uint16_t>(value);
  }
  u.path = std::string(path);
  // What is accepted must print to a URL that parses again (to_string): "http://h" of exactly
  // the limit gains a '/'.
  if (u.to_string().size() > max_http_url_bytes)
    return bad("longer than " + std::to_string(max_http_url_bytes) + " bytes with its path '/'");
  return u;
}

}  // namespace eldr
