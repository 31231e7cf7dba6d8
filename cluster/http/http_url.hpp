// http_url: a decode worker's metrics URL (vLLM's Prometheus /metrics), validated at the edge
// before the node ever connects to it (docs/protocol.md section 4, worker_register.metrics_url).
//
// Only the plain form the scraper needs is accepted: "http://HOST:PORT/PATH" or "http://HOST/PATH"
// (port 80), HOST a DNS name, an IPv4 address or a bracketed IPv6 address, PATH absent ("/") or
// starting with '/' and made of printable ASCII without spaces or '#'. No https (the node has no
// trust store for workers), no user info, no fragment. Pure; no sockets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/status.hpp"

namespace eldr {

inline constexpr uint32_t max_http_url_bytes = 512;

struct http_url {
  std::string host;  // without brackets for IPv6
  uint16_t port = 80;
  std::string path = "/";  // with the query, if any

  // "http://host:port/path" again (IPv6 hosts bracketed; ":80", the default, left out). It parses
  // to the same parts.
  std::string to_string() const;
};

// Errors (invalid_argument, the message saying what is wrong, never echoing more than 64 bytes of
// the input): empty or longer than max_http_url_bytes, not "http://", a bad host, a port outside
// 1..65535, user info, a fragment, a byte outside printable ASCII.
result<http_url> parse_http_url(std::string_view s);

}  // namespace eldr
