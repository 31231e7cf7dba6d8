// metrics_http: a minimal HTTP/1.1 server for Prometheus scrapes and probes -- GET /metrics (text
// exposition format 0.0.4), GET /healthz ("ok": liveness, the process answers; nothing else is
// consulted, so it stays cheap) and GET /readyz (readiness: 200 or 503 with a JSON body, from the
// ready function).
//
// Why not cpp-httplib's server (the node links cpp-httplib for its scraper, a client): its server
// gives each connection a pool thread that blocks in reads until a timeout, so slow or idle
// clients can hold every thread and stall the scrape that matters; the bounds below (one thread,
// oldest connection evicted, a deadline on every request) are what a node exposed to a cluster
// network needs, and tests/fuzz's live node checks them.
//
// One background thread multiplexes the listening socket and every connection with poll(). It is
// built to survive hostile or broken clients without growing memory or stalling other clients:
//   - a request (request line + headers) larger than 8 KiB is answered 431 and closed;
//   - a connection that has not sent a complete request within 2 s is closed; a response not
//     written within 10 s is abandoned;
//   - at most 64 connections are kept; a new one evicts the oldest.
// Every response carries "Connection: close" (one request per connection: Prometheus reconnects
// cheaply, and it keeps the state machine small). Answers: 200 for GET/HEAD of /metrics and
// /healthz (a query string is ignored), 200 or 503 for /readyz (404 when the server has no ready
// function), 404 for another path, 405 for another method, 400 for anything that is not an
// HTTP/1.x request line.
//
// Optionally, read-only pages: `/` and every path under `/api/` are handed to the page function
// (the node's operator page, actors/operator_page.hpp), 404 when it has none for the path. The
// function must be cheap and bounded (it runs on the server's thread, between other clients):
// the node's hands out snapshots it rendered earlier, never waiting on an actor.
//
// Thread safety: start() and the destructor from one thread; render() is called on the server's
// thread, one call at a time, so it must be safe to run concurrently with the rest of the program;
// so is ready().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/base/status.hpp"

namespace eldr {

// "host:port" split and checked: host non-empty (a name, an IPv4 address or a bracketed IPv6
// address such as "[::1]", brackets removed in `host`), port decimal 0..65535. Shared with the
// node configuration so that what validates there is exactly what start() accepts.
struct host_port {
  std::string host;
  uint16_t port = 0;
};
result<host_port> parse_host_port(std::string_view text);

// The content type of Prometheus' text exposition format, sent with /metrics.
inline constexpr std::string_view prometheus_content_type =
    "text/plain; version=0.0.4; charset=utf-8";

class metrics_http_server {
 public:
  // The whole /metrics body, in Prometheus text format. An exception escaping it is answered 500.
  using render_fn = std::function<std::string()>;
  // /readyz: whether the node is ready, and the JSON body to send (200 when ready, else 503). An
  // exception escaping it is answered 500.
  struct readiness {
    bool ready = false;
    std::string json;
  };
  using ready_fn = std::function<readiness()>;
  // `/` and `/api/...`: the body and its content type for a path (no query string), or nullopt
  // (404). An exception escaping it is answered 500.
  struct page {
    std::string content_type;
    std::string body;
  };
  using page_fn = std::function<std::optional<page>(std::string_view path)>;

  // Binds `address` ("127.0.0.1:9700"; port 0 picks a free port, see port()), listens and starts
  // the server thread. Errors: invalid_argument (malformed address, empty render), io_error (the
  // name does not resolve, or socket/bind/listen fail -- e.g. the port is taken), naming the
  // address and the OS's reason.
  // `ready` may be empty: /readyz is then 404; `pages` too: `/` and `/api/...` are then 404.
  static result<std::unique_ptr<metrics_http_server>> start(const std::string& address,
                                                            render_fn render, ready_fn ready = {},
                                                            page_fn pages = {});

  // Stops the thread (wakes its poll(); no waiting on timeouts), closes every socket.
  ~metrics_http_server();
  metrics_http_server(const metrics_http_server&) = delete;
  metrics_http_server& operator=(const metrics_http_server&) = delete;

  // The port actually bound: the configured one, or the one the OS picked for port 0.
  uint16_t port() const;

  struct impl;

 private:
  explicit metrics_http_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
