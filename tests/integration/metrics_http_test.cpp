// metrics_http: a real server on 127.0.0.1:0 and a plain-socket client. Every answer the server
// gives (200 with the rendered text, HEAD, 404, 405, 400, 431, 500), and the properties that keep
// it alive under bad clients: an idle or half-sent connection does not delay another client, an
// oversized request is refused without stopping the server, idle connections are closed at the
// read deadline, a flood of connections evicts the oldest, and destruction does not wait for
// connected clients. And the optional read-only pages (`/`, `/api/...`, GET and HEAD only).
#include "cluster/http/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace eldr {
namespace {

// Every blocking receive in these tests gives up after this long, so a server that fails to
// answer fails the test instead of hanging it.
constexpr int receive_timeout_s = 5;

class client_socket {
 public:
  explicit client_socket(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{receive_timeout_s, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~client_socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  client_socket(const client_socket&) = delete;
  client_socket& operator=(const client_socket&) = delete;

  bool connected() const { return connected_; }

  bool send_all(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Everything until the server closes; `closed` is false when the receive timed out or failed.
  std::string read_to_end(bool* closed = nullptr) {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = n == 0;
        return out;
      }
      out.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct http_response {
  int code = 0;
  std::string head;  // status line and headers
  std::string body;
  bool complete = false;  // the server closed the connection after it
};

http_response parse_response(const std::string& raw, bool closed) {
  http_response r;
  r.complete = closed;
  const size_t end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end == std::string::npos) return r;
  r.code = std::stoi(raw.substr(9, 3));
  r.head = raw.substr(0, end + 2);
  r.body = raw.substr(end + 4);
  return r;
}

http_response request(uint16_t port, const std::string& raw_request) {
  client_socket c(port);
  EXPECT_TRUE(c.connected());
  EXPECT_TRUE(c.send_all(raw_request));
  bool closed = false;
  const std::string raw = c.read_to_end(&closed);
  return parse_response(raw, closed);
}

http_response get(uint16_t port, const std::string& target) {
  return request(port, "GET " + target + " HTTP/1.1\r\nHost: localhost\r\n\r\n");
}

bool has_header(const http_response& r, const std::string& line) {
  return r.head.find("\r\n" + line + "\r\n") != std::string::npos;
}

const std::string metrics_text =
    "# HELP eldr_up Whether the node is up.\n# TYPE eldr_up gauge\neldr_up 1\n";

std::unique_ptr<metrics_http_server> start_server(metrics_http_server::render_fn render = [] {
  return metrics_text;
}) {
  auto s = metrics_http_server::start("127.0.0.1:0", std::move(render));
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  if (!s.ok()) return nullptr;
  EXPECT_NE((*s)->port(), 0);
  return std::move(*s);
}

TEST(MetricsHttp, ServesTheRenderedMetrics) {
  std::atomic<int> renders{0};
  auto server = start_server([&] {
    ++renders;
    return metrics_text;
  });
  ASSERT_NE(server, nullptr);
  const http_response r = get(server->port(), "/metrics");
  EXPECT_EQ(r.code, 200);
  EXPECT_TRUE(r.complete);
  EXPECT_EQ(r.body, metrics_text);
  EXPECT_TRUE(has_header(r, "Content-Type: text/plain; version=0.0.4; charset=utf-8")) << r.head;
  EXPECT_TRUE(has_header(r, "Content-Length: " + std::to_string(metrics_text.size()))) << r.head;
  EXPECT_TRUE(has_header(r, "Connection: close")) << r.head;
  EXPECT_EQ(renders.load(), 1);

  // A query string is ignored; HTTP/1.0 and bare-LF clients are served too.
  EXPECT_EQ(get(server->port(), "/metrics?name[]=eldr_up").body, metrics_text);
  EXPECT_EQ(request(server->port(), "GET /metrics HTTP/1.0\n\n").body, metrics_text);
  EXPECT_EQ(renders.load(), 3);
}

TEST(MetricsHttp, LargeBodiesAreWrittenCompletely) {
  // Far beyond a socket buffer: the response goes out over several POLLOUT rounds.
  std::string big;
  for (int i = 0; big.size() < (4u << 20); ++i)
    big += "eldr_series{i=\"" + std::to_string(i) + "\"} " + std::to_string(i) + "\n";
  auto server = start_server([&] { return big; });
  ASSERT_NE(server, nullptr);
  const http_response r = get(server->port(), "/metrics");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body.size(), big.size());
  EXPECT_TRUE(r.body == big);
}

TEST(MetricsHttp, HealthAndHead) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  const http_response h = get(server->port(), "/healthz");
  EXPECT_EQ(h.code, 200);
  EXPECT_EQ(h.body, "ok");

  const http_response head = request(server->port(), "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_EQ(head.code, 200);
  EXPECT_TRUE(head.complete);
  EXPECT_TRUE(has_header(head, "Content-Length: " + std::to_string(metrics_text.size())));
  EXPECT_EQ(head.body, "");
}

TEST(MetricsHttp, ReadyzAnswers503UntilReadyThen200WithTheJsonBody) {
  std::atomic<bool> ready{false};
  auto s = metrics_http_server::start(
      "127.0.0.1:0", [] { return metrics_text; },
      [&] {
        return metrics_http_server::readiness{
            ready.load(), ready ? R"({"ready":true})" : R"({"ready":false,"reasons":["x"]})"};
      });
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  const uint16_t port = (*s)->port();
  http_response r = get(port, "/readyz");
  EXPECT_EQ(r.code, 503);
  EXPECT_EQ(r.body, R"({"ready":false,"reasons":["x"]})");
  EXPECT_TRUE(has_header(r, "Content-Type: application/json")) << r.head;
  EXPECT_EQ(get(port, "/healthz").code, 200);  // liveness does not depend on readiness
  ready = true;
  r = get(port, "/readyz?verbose=1");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, R"({"ready":true})");
  EXPECT_EQ(request(port, "HEAD /readyz HTTP/1.1\r\n\r\n").body, "");
}

TEST(MetricsHttp, ReadyzIsNotFoundWithoutAReadyFunctionAndA500WhenItThrows) {
  auto plain = start_server();
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(get(plain->port(), "/readyz").code, 404);
  auto s = metrics_http_server::start(
      "127.0.0.1:0", [] { return metrics_text; },
      []() -> metrics_http_server::readiness { throw std::runtime_error("board broken"); });
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(get((*s)->port(), "/readyz").code, 500);
  EXPECT_EQ(get((*s)->port(), "/healthz").code, 200);
}

TEST(MetricsHttp, ErrorsForOtherPathsMethodsAndGarbage) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  EXPECT_EQ(get(port, "/").code, 404);
  EXPECT_EQ(get(port, "/metricsz").code, 404);

  const http_response post = request(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.code, 405);
  EXPECT_TRUE(has_header(post, "Allow: GET, HEAD")) << post.head;

  EXPECT_EQ(request(port, "hello\r\n\r\n").code, 400);
  EXPECT_EQ(request(port, "GET /metrics HTTP/2.0\r\n\r\n").code, 400);
  EXPECT_EQ(request(port, "GET metrics HTTP/1.1\r\n\r\n").code, 400);
  EXPECT_EQ(request(port, "GET  /metrics HTTP/1.1\r\n\r\n").code, 400);
  // A bad request line is refused as soon as it is complete, without waiting for the headers'
  // end (the client here never sends it).
  client_socket c(port);
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.send_all(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\n", 10)));
  bool closed = false;
  EXPECT_EQ(parse_response(c.read_to_end(&closed), closed).code, 400);
  EXPECT_TRUE(closed);

  EXPECT_EQ(get(port, "/metrics").code, 200);  // and the server goes on
}

TEST(MetricsHttp, PagesServeTheRootAndApiPathsOnlyReadOnly) {
  std::atomic<int> asked{0};  // calls of the page function (it runs on the server's thread)
  auto s = metrics_http_server::start(
      "127.0.0.1:0", [] { return metrics_text; }, {},
      [&](std::string_view path) -> std::optional<metrics_http_server::page> {
        ++asked;
        if (path == "/") return metrics_http_server::page{"text/html; charset=utf-8", "<html>"};
        if (path == "/api/status") return metrics_http_server::page{"application/json", "{}"};
        if (path == "/api/boom") throw std::runtime_error("snapshot broken");
        return std::nullopt;
      });
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  const uint16_t port = (*s)->port();
  http_response r = get(port, "/");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, "<html>");
  EXPECT_TRUE(has_header(r, "Content-Type: text/html; charset=utf-8")) << r.head;
  EXPECT_TRUE(has_header(r, "Cache-Control: no-store")) << r.head;
  r = get(port, "/api/status?x=1");  // the query string is not the page function's business
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, "{}");
  EXPECT_TRUE(has_header(r, "Content-Type: application/json")) << r.head;
  EXPECT_TRUE(has_header(r, "X-Content-Type-Options: nosniff")) << r.head;
  r = request(port, "HEAD /api/status HTTP/1.1\r\n\r\n");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_TRUE(has_header(r, "Content-Length: 2")) << r.head;
  EXPECT_EQ(get(port, "/api/unknown").code, 404);
  EXPECT_EQ(get(port, "/api/boom").code, 500);
  // Read-only: another method is refused before the page function is asked.
  const int asked_before = asked.load();
  const http_response post =
      request(port, "POST /api/status HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.code, 405);
  EXPECT_TRUE(has_header(post, "Allow: GET, HEAD")) << post.head;
  EXPECT_EQ(request(port, "DELETE / HTTP/1.1\r\n\r\n").code, 405);
  EXPECT_EQ(asked.load(), asked_before);
  // Other paths never reach it; the node's own endpoints stay what they were.
  EXPECT_EQ(get(port, "/index.html").code, 404);
  EXPECT_EQ(get(port, "/apistatus").code, 404);
  EXPECT_EQ(asked.load(), asked_before);
  EXPECT_EQ(get(port, "/metrics").body, metrics_text);
  EXPECT_EQ(get(port, "/healthz").code, 200);
}

TEST(MetricsHttp, RenderFailureIsAnsweredWith500) {
  std::atomic<bool> fail{true};
  auto server = start_server([&]() -> std::string {
    if (fail) throw std::runtime_error("collector broken");
    return metrics_text;
  });
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(get(server->port(), "/metrics").code, 500);
  fail = false;
  EXPECT_EQ(get(server->port(), "/metrics").body, metrics_text);
}

TEST(MetricsHttp, AnIdleClientDoesNotBlockAnother) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  client_socket idle(server->port());
  ASSERT_TRUE(idle.connected());
  client_socket half(server->port());
  ASSERT_TRUE(half.connected());
  ASSERT_TRUE(half.send_all("GET /metr"));

  // Both stay connected (their deadline is 2 s away) while this one is answered.
  const auto t0 = std::chrono::steady_clock::now();
  const http_response r = get(server->port(), "/metrics");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, metrics_text);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(MetricsHttp, IdleConnectionsAreClosedAtTheReadDeadline) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  client_socket idle(server->port());
  ASSERT_TRUE(idle.connected());
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  EXPECT_EQ(idle.read_to_end(&closed), "");  // waits for the server's 2 s deadline
  EXPECT_TRUE(closed) << "the server did not close an idle connection within " << receive_timeout_s
                      << " s";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
}

TEST(MetricsHttp, OversizedRequestIsRefusedAndTheServerGoesOn) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  const std::string huge =
      "GET /metrics HTTP/1.1\r\nX-Filler: " + std::string(16 * 1024, 'a') + "\r\n\r\n";
  const http_response r = request(server->port(), huge);
  EXPECT_EQ(r.code, 431);
  EXPECT_TRUE(r.complete);
  // Without any line end at all: the same.
  EXPECT_EQ(request(server->port(), std::string(9000, 'G')).code, 431);
  EXPECT_EQ(get(server->port(), "/metrics").body, metrics_text);
}

TEST(MetricsHttp, AFloodOfConnectionsEvictsTheOldest) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  // More idle connections than the server keeps (64): a new client is still answered at once.
  std::vector<std::unique_ptr<client_socket>> flood;
  for (int i = 0; i < 100; ++i) {
    flood.push_back(std::make_unique<client_socket>(server->port()));
    ASSERT_TRUE(flood.back()->connected());
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(get(server->port(), "/metrics").body, metrics_text);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  // The first connection was evicted: it reads the end at once, not at the 2 s read deadline.
  bool closed = false;
  EXPECT_EQ(flood.front()->read_to_end(&closed), "");
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

TEST(MetricsHttp, DestructionDoesNotWaitForConnectedClients) {
  auto server = start_server();
  ASSERT_NE(server, nullptr);
  client_socket idle(server->port());
  ASSERT_TRUE(idle.connected());
  ASSERT_EQ(get(server->port(), "/healthz").code, 200);  // `idle` has certainly been accepted
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
  bool closed = false;
  idle.read_to_end(&closed);
  EXPECT_TRUE(closed);
}

TEST(MetricsHttp, StartErrorsNameTheAddress) {
  const auto render = [] { return std::string(); };
  auto bad = metrics_http_server::start("127.0.0.1", render);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), status_code::invalid_argument);
  EXPECT_NE(bad.error().message().find("\"127.0.0.1\""), std::string::npos);

  EXPECT_FALSE(metrics_http_server::start("127.0.0.1:0", nullptr).ok());

  auto first = metrics_http_server::start("127.0.0.1:0", render);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  const std::string taken = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = metrics_http_server::start(taken, render);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code(), status_code::io_error);
  EXPECT_NE(second.error().message().find(taken), std::string::npos) << second.error().to_string();
}

TEST(MetricsHttp, ParseHostPort) {
  auto a = parse_host_port("127.0.0.1:9700");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9700);
  auto b = parse_host_port("[::1]:0");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_TRUE(parse_host_port("localhost:65535").ok());
  for (const char* bad :
       {"", "localhost", ":9700", "::1:9700", "h:65536", "h:-1", "h:", "h:9x", "[]:1", "h: 1"})
    EXPECT_FALSE(parse_host_port(bad).ok()) << bad;
}

}  // namespace
}  // namespace eldr
