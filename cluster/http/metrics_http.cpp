// metrics_http: see metrics_http.hpp.
#include "cluster/http/metrics_http.hpp"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

namespace eldr {
namespace {

// Bounds on what one client can cost (see the header).
constexpr size_t max_request_bytes = 8 * 1024;
constexpr size_t max_connections = 64;
constexpr auto read_timeout = std::chrono::seconds(2);
constexpr auto write_timeout = std::chrono::seconds(10);
// After the response, unread input is drained (not left in the socket) so that close() does not
// send a reset that could destroy the response before the client reads it; bounded by this much.
constexpr auto linger_timeout = std::chrono::seconds(2);
constexpr size_t max_linger_bytes = 64 * 1024;
// How long accepting pauses when accept() fails for lack of resources (EMFILE, ENOBUFS, ...).
constexpr auto accept_pause = std::chrono::milliseconds(100);

using clock_type = std::chrono::steady_clock;

std::string os_error(int err) {
  return std::strerror(err);
}

// A file descriptor closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

enum class conn_state { reading, writing, lingering };

struct connection {
  unique_fd fd;
  conn_state state = conn_state::reading;
  std::string in;   // the request so far (reading only)
  std::string out;  // the response (writing)
  size_t written = 0;
  size_t drained = 0;  // bytes discarded while lingering
  clock_type::time_point accepted;
  clock_type::time_point deadline;
};

const char* reason_phrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

std::string make_response(int code, std::string_view content_type, std::string_view body,
                          bool head_only, std::string_view extra_headers = {}) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason_phrase(code) + "\r\n";
  r += "Content-Type: ";
  r += content_type;
  r += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  r += extra_headers;
  r += "Connection: close\r\n\r\n";
  if (!head_only) r += body;
  return r;
}

std::string error_response(int code, bool head_only = false, std::string_view extra_headers = {}) {
  return make_response(code, "text/plain; charset=utf-8", std::string(reason_phrase(code)) + "\n",
                       head_only, extra_headers);
}

// A method is an HTTP token: visible ASCII except separators (RFC 9110 section 5.6.2).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c > 32 && c < 127 &&
           std::string_view("\"(),/:;<=>?@[\\]{}").find(c) == std::string_view::npos;
  });
}

struct request_line {
  std::string_view method;
  std::string_view path;  // the target without its query string
};

// METHOD SP request-target SP HTTP-version, exactly one space each (RFC 9112 section 3); `line`
// without its line end. nullopt when it is not one.
std::optional<request_line> parse_request_line(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == line.npos ? line.npos : line.find(' ', sp1 + 1);
  if (sp2 == line.npos || line.find(' ', sp2 + 1) != line.npos) return std::nullopt;
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method) || target.empty() || target.front() != '/' ||
      (version != "HTTP/1.1" && version != "HTTP/1.0"))
    return std::nullopt;
  return request_line{method, target.substr(0, target.find('?'))};
}

// The response to a complete request head (request line + headers; headers are not needed).
std::string respond(std::string_view head, const metrics_http_server::render_fn& render,
                    const metrics_http_server::ready_fn& ready,
                    const metrics_http_server::page_fn& pages) {
  const auto req = parse_request_line(head.substr(0, head.find('\n')));
  if (!req) return error_response(400);
  const bool head_only = req->method == "HEAD";
  const bool is_metrics = req->path == "/metrics";
  const bool is_health = req->path == "/healthz";
  const bool is_ready = req->path == "/readyz" && ready;
  const bool is_page = pages && (req->path == "/" || req->path.starts_with("/api/"));
  if (!is_metrics && !is_health && !is_ready && !is_page) return error_response(404, head_only);
  if (req->method != "GET" && !head_only) return error_response(405, false, "Allow: GET, HEAD\r\n");
  if (is_health) return make_response(200, "text/plain; charset=utf-8", "ok", head_only);
  if (is_page) {
    std::optional<metrics_http_server::page> p;
    try {
      p = pages(req->path);
    } catch (...) {
      return error_response(500, head_only);
    }
    if (!p) return error_response(404, head_only);
    // Snapshots of live state: never cached; a JSON body is never sniffed as HTML.
    return make_response(200, p->content_type, p->body, head_only,
                         "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n");
  }
  if (is_ready) {
    metrics_http_server::readiness r;
    try {
      r = ready();
    } catch (...) {
      return error_response(500, head_only);
    }
    return make_response(r.ready ? 200 : 503, "application/json", r.json, head_only);
  }
  std::string body;
  try {
    body = render();
  } catch (...) {
    // The process must not die because one scrape failed; the scraper records the failure.
    return error_response(500, head_only);
  }
  return make_response(200, prometheus_content_type, body, head_only);
}

// The end of the request head ("\r\n\r\n", or bare "\n\n" from lenient clients), or npos.
size_t head_end(const std::string& in) {
  const size_t crlf = in.find("\r\n\r\n");
  const size_t lf = in.find("\n\n");
  return std::min(crlf, lf);
}

}  // namespace

result<host_port> parse_host_port(std::string_view text) {
  const auto bad = [&](const std::string& why) {
    return status::invalid_argument("\"" + std::string(text) + "\": " + why +
                                    " (expected host:port, e.g. 127.0.0.1:9700)");
  };
  const size_t colon = text.rfind(':');
  if (colon == text.npos) return bad("no port");
  std::string_view host = text.substr(0, colon);
  const std::string_view port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != host.npos) {
    return bad("an IPv6 address must be in brackets");
  }
  if (host.empty()) return bad("empty host");
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
    return bad("port must be a number in 0..65535");
  return host_port{std::string(host), static_cast<uint16_t>(value)};
}

struct metrics_http_server::impl {
  unique_fd listener;
  unique_fd wake;  // eventfd: the destructor writes it to end poll() at once
  uint16_t bound_port = 0;
  render_fn render;
  ready_fn ready_check;
  page_fn pages;
  std::atomic<bool> stopping{false};
  std::vector<connection> conns;
  // Out of file descriptors: the listener stays readable but accept() keeps failing, so it is
  // left out of poll() until then instead of spinning.
  clock_type::time_point accept_paused_until{};
  std::thread thread;

  void run();
  void accept_all(clock_type::time_point now);
  // Advances one connection; false when it is finished and must be closed.
  bool on_readable(connection& c, clock_type::time_point now);
  bool on_writable(connection& c, clock_type::time_point now);
  void start_response(connection& c, std::string response, clock_type::time_point now);
};

void metrics_http_server::impl::start_response(connection& c, std::string response,
                                               clock_type::time_point now) {
  c.state = conn_state::writing;
  c.in.clear();
  c.in.shrink_to_fit();
  c.out = std::move(response);
  c.written = 0;
  c.deadline = now + write_timeout;
}

bool metrics_http_server::impl::on_readable(connection& c, clock_type::time_point now) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (n == 0) {
      // The client closed its side: while reading, the request is incomplete (nothing to answer);
      // while lingering, we are done.
      return false;
    }
    if (c.state == conn_state::lingering) {
      c.drained += static_cast<size_t>(n);
      if (c.drained > max_linger_bytes) return false;
      continue;
    }
    c.in.append(buf, static_cast<size_t>(n));
    const size_t end = head_end(c.in);
    if (end != std::string::npos && end <= max_request_bytes) {
      start_response(c, respond(std::string_view(c.in).substr(0, end), render, ready_check, pages),
                     now);
      return on_writable(c, now);
    }
    // Garbage is refused as soon as its first line is complete, not after 8 KiB or the timeout.
    const size_t eol = c.in.find('\n');
    if (eol != std::string::npos && eol <= max_request_bytes &&
        !parse_request_line(std::string_view(c.in).substr(0, eol))) {
      start_response(c, error_response(400), now);
      return on_writable(c, now);
    }
    if (c.in.size() > max_request_bytes) {
      start_response(c, error_response(431), now);
      return on_writable(c, now);
    }
  }
}

bool metrics_http_server::impl::on_writable(connection& c, clock_type::time_point now) {
  while (c.written < c.out.size()) {
    const ssize_t n =
        ::send(c.fd.get(), c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    c.written += static_cast<size_t>(n);
  }
  // Response sent: half-close so the client sees the end, then drain what it still sends.
  ::shutdown(c.fd.get(), SHUT_WR);
  c.out.clear();
  c.out.shrink_to_fit();
  c.state = conn_state::lingering;
  c.deadline = now + linger_timeout;
  return true;
}

void metrics_http_server::impl::accept_all(clock_type::time_point now) {
  for (;;) {
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) accept_paused_until = now + accept_pause;
      return;
    }
    if (conns.size() >= max_connections) {
      // Evict the oldest: a flood of idle connections then delays nobody for long.
      auto oldest = std::min_element(conns.begin(), conns.end(), [](const auto& a, const auto& b) {
        return a.accepted < b.accepted;
      });
      conns.erase(oldest);
    }
    connection c;
    c.fd = unique_fd(fd);
    c.accepted = now;
    c.deadline = now + read_timeout;
    conns.push_back(std::move(c));
  }
}

void metrics_http_server::impl::run() {
  std::vector<pollfd> fds;
  while (!stopping.load(std::memory_order_acquire)) {
    auto now = clock_type::now();
    // Expire connections past their deadline, then wait until the next deadline at most.
    std::erase_if(conns, [&](const connection& c) { return c.deadline <= now; });
    int timeout_ms = -1;
    const auto wait_until = [&](clock_type::time_point t) {
      const auto left =
          static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(t - now).count());
      timeout_ms = timeout_ms < 0 ? left : std::min(timeout_ms, left);
    };
    for (const connection& c : conns)
      wait_until(c.deadline);
    const bool accepting = accept_paused_until <= now;
    if (!accepting) wait_until(accept_paused_until);

    fds.clear();
    fds.push_back({wake.get(), POLLIN, 0});
    fds.push_back({accepting ? listener.get() : -1, POLLIN, 0});  // poll() skips a negative fd
    for (const connection& c : conns)
      fds.push_back(
          {c.fd.get(), static_cast<short>(c.state == conn_state::writing ? POLLOUT : POLLIN), 0});
    const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) {
      // Only ENOMEM is possible with valid descriptors; better a dead endpoint than a spin.
      spdlog::error("metrics server on port {}: poll failed ({}); no longer serving", bound_port,
                    os_error(errno));
      break;
    }
    if (ready <= 0) continue;
    if (fds[0].revents != 0) continue;  // woken: the loop condition sees `stopping`

    now = clock_type::now();
    // Connections first (the indices of fds match conns), then accept, which appends to conns.
    for (size_t i = 0; i < conns.size(); ++i) {
      const short re = fds[i + 2].revents;
      if (re == 0) continue;
      connection& c = conns[i];
      bool keep = false;
      if (re & POLLNVAL) {
        keep = false;
      } else if (c.state == conn_state::writing) {
        keep = (re & (POLLERR | POLLHUP)) == 0 && on_writable(c, now);
      } else {
        // POLLHUP/POLLERR come with POLLIN semantics here: recv() reports the end or the error.
        keep = on_readable(c, now);
      }
      if (!keep) c.fd.reset();
    }
    std::erase_if(conns, [](const connection& c) { return c.fd.get() < 0; });
    if (fds[1].revents & POLLIN) accept_all(now);
  }
  conns.clear();
}

metrics_http_server::metrics_http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

metrics_http_server::~metrics_http_server() {
  impl_->stopping.store(true, std::memory_order_release);
  const uint64_t one = 1;
  // Cannot fail short of a counter overflow; the thread also checks `stopping` on every wake.
  [[maybe_unused]] const ssize_t n = ::write(impl_->wake.get(), &one, sizeof one);
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t metrics_http_server::port() const {
  return impl_->bound_port;
}

result<std::unique_ptr<metrics_http_server>> metrics_http_server::start(const std::string& address,
                                                                        render_fn render,
                                                                        ready_fn ready,
                                                                        page_fn pages) {
  if (!render) return status::invalid_argument("metrics server: no render function");
  auto hp = parse_host_port(address);
  if (!hp.ok()) return status::invalid_argument("metrics server address " + hp.error().message());

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(hp->port);
  if (const int rc = ::getaddrinfo(hp->host.c_str(), port_text.c_str(), &hints, &found); rc != 0)
    return status::io_error("metrics server " + address +
                            ": cannot resolve host: " + ::gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, &::freeaddrinfo);

  auto p = std::make_unique<impl>();
  std::string last_error = "no address";
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    unique_fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (fd.get() < 0) {
      last_error = "socket: " + os_error(errno);
      continue;
    }
    // A restarted node can rebind while old connections sit in TIME_WAIT.
    const int on = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last_error = "bind: " + os_error(errno);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      last_error = "listen: " + os_error(errno);
      continue;
    }
    p->listener = std::move(fd);
    break;
  }
  if (p->listener.get() < 0)
    return status::io_error("metrics server " + address + ": " + last_error);

  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(p->listener.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0)
    return status::io_error("metrics server " + address + ": getsockname: " + os_error(errno));
  p->bound_port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);

  p->wake = unique_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (p->wake.get() < 0)
    return status::io_error("metrics server " + address + ": eventfd: " + os_error(errno));
  p->render = std::move(render);
  p->ready_check = std::move(ready);
  p->pages = std::move(pages);
  impl* raw = p.get();
  p->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<metrics_http_server>(new metrics_http_server(std::move(p)));
}

}  // namespace eldr
