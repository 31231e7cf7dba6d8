// metrics_scraper against a real local HTTP server (cpp-httplib's, bound to port 0): vLLM-format
// bodies read, one scrape in flight per worker, HTTP errors, refused connections, timeouts and
// oversized bodies reported per worker. Results are awaited with a deadline, never a sleep.
#include "cluster/http/metrics_scraper.hpp"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace eldr {
namespace {

using namespace std::chrono_literals;

std::string vllm_body(int running, int waiting) {
  return "# TYPE vllm:num_requests_running gauge\n"
         "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} " +
         std::to_string(running) +
         ".0\n# TYPE vllm:num_requests_waiting gauge\n"
         "vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} " +
         std::to_string(waiting) +
         ".0\nvllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.5\n";
}

// A local HTTP server: /metrics serves `body`, /slow waits until release(), /error answers 500,
// /big streams more than any cap, /garbage is not Prometheus text.
class fake_metrics_server {
 public:
  fake_metrics_server() {
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(body_, "text/plain; version=0.0.4");
    });
    server_.Get("/slow", [this](const httplib::Request&, httplib::Response& res) {
      std::unique_lock<std::mutex> lock(mu_);
      ++slow_waiting_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return released_; });
      res.set_content(body_, "text/plain");
    });
    // A body trickled in small chunks, paced by the server (not by the test), forever.
    server_.Get("/trickle", [this](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [this](size_t, httplib::DataSink& sink) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(20), [this] { return released_; });
        if (released_) {
          sink.done();
          return true;
        }
        lock.unlock();
        return sink.write("# padding\n", 10);
      });
    });
    server_.Get("/error", [](const httplib::Request&, httplib::Response& res) {
      res.status = 500;
      res.set_content("boom", "text/plain");
    });
    server_.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(64 * 1024, '#'), "text/plain");
    });
    server_.Get("/garbage", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("vllm:num_requests_running{model_name=\"m\" 1\n", "text/plain");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    // Bound and listening: connections queue until the accept loop runs.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() before the accept loop runs would be lost (httplib 0.11 has no wait_until_ready):
    // wait for the loop, with a deadline.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  ~fake_metrics_server() {
    release();
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  void set_body(std::string b) {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = std::move(b);
  }
  bool wait_slow_requests(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, 10s, [&] { return slow_waiting_ >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  http_url url(const std::string& path) const {
    auto u = parse_http_url("http://127.0.0.1:" + std::to_string(port_) + path);
    EXPECT_TRUE(u.ok());
    return *u;
  }

 private:
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string body_ = vllm_body(3, 2);
  int slow_waiting_ = 0;
  bool released_ = false;
};

// Collects callbacks; wait() returns a key's next result within a deadline.
class inbox {
 public:
  metrics_scraper::callback sink() {
    return [this](uint64_t key, result<vllm_load> r) {
      std::lock_guard<std::mutex> lock(mu_);
      results_.emplace(key, std::move(r));
      cv_.notify_all();
    };
  }
  result<vllm_load> wait(uint64_t key) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, 15s, [&] { return results_.count(key) > 0; }))
      return status::io_error("test: no result within the deadline");
    auto it = results_.find(key);
    auto r = std::move(it->second);
    results_.erase(it);
    return r;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<uint64_t, result<vllm_load>> results_;
};

TEST(MetricsScraper, ReadsVllmLoadFromAServer) {
  fake_metrics_server server;
  metrics_scraper scraper;
  inbox in;
  ASSERT_TRUE(scraper.scrape(7, server.url("/metrics"), "m", in.sink()));
  auto r = in.wait(7);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->running, 3u);
  EXPECT_EQ(r->waiting, 2u);
  EXPECT_FLOAT_EQ(r->kv_usage, 0.5f);
  server.set_body(vllm_body(10, 4));
  ASSERT_TRUE(scraper.scrape(7, server.url("/metrics"), "m", in.sink()));
  r = in.wait(7);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->in_flight(), 14u);
}

TEST(MetricsScraper, OneScrapeInFlightPerKey) {
  fake_metrics_server server;
  metrics_scraper scraper;
  inbox in;
  ASSERT_TRUE(scraper.scrape(1, server.url("/slow"), "m", in.sink()));
  ASSERT_TRUE(server.wait_slow_requests(1));
  EXPECT_FALSE(scraper.scrape(1, server.url("/metrics"), "m", in.sink()));
  // Other workers are not held up by the slow one.
  ASSERT_TRUE(scraper.scrape(2, server.url("/metrics"), "m", in.sink()));
  EXPECT_TRUE(in.wait(2).ok());
  EXPECT_EQ(scraper.in_flight(), 1u);
  server.release();
  auto r = in.wait(1);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->in_flight(), 5u);
  // The key is free again once its callback ran.
  ASSERT_TRUE(scraper.scrape(1, server.url("/metrics"), "m", in.sink()));
  EXPECT_TRUE(in.wait(1).ok());
}

TEST(MetricsScraper, FailuresAreReportedPerWorker) {
  fake_metrics_server server;
  metrics_scraper_options o;
  o.max_body_bytes = 4096;
  o.read_timeout_ms = 200;
  metrics_scraper scraper(o);
  inbox in;
  ASSERT_TRUE(scraper.scrape(1, server.url("/error"), "m", in.sink()));
  ASSERT_TRUE(scraper.scrape(2, server.url("/big"), "m", in.sink()));
  ASSERT_TRUE(scraper.scrape(3, server.url("/garbage"), "m", in.sink()));
  ASSERT_TRUE(scraper.scrape(4, server.url("/slow"), "m", in.sink()));  // never answered in time
  auto e = in.wait(1);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), status_code::io_error);
  EXPECT_NE(e.error().message().find("500"), std::string::npos) << e.error().message();
  auto big = in.wait(2);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code(), status_code::out_of_range) << big.error().to_string();
  auto garbage = in.wait(3);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.error().code(), status_code::corrupt) << garbage.error().to_string();
  auto slow = in.wait(4);
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.error().code(), status_code::io_error) << slow.error().to_string();
}

TEST(MetricsScraper, ATricklingServerIsCutOffAtTheTotalTimeout) {
  fake_metrics_server server;
  metrics_scraper_options o;
  o.read_timeout_ms = 5000;  // every read is quick: only the total bounds the body
  o.total_timeout_ms = 300;
  metrics_scraper scraper(o);
  inbox in;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(scraper.scrape(6, server.url("/trickle"), "m", in.sink()));
  auto r = in.wait(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::io_error);
  EXPECT_NE(r.error().message().find("within 300 ms"), std::string::npos) << r.error().message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(MetricsScraper, RefusedConnectionIsAnError) {
  http_url dead;
  {
    fake_metrics_server server;  // a port that was bound, then closed
    dead = server.url("/metrics");
  }
  metrics_scraper scraper;
  inbox in;
  ASSERT_TRUE(scraper.scrape(5, dead, "m", in.sink()));
  auto r = in.wait(5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::io_error) << r.error().to_string();
  EXPECT_NE(r.error().message().find(dead.to_string()), std::string::npos);
}

}  // namespace
}  // namespace eldr
