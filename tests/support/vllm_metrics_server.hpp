// A decode worker's Prometheus /metrics in vLLM's format, served by cpp-httplib on a port the
// kernel picks, with a load the test sets: the stand-in for a vLLM instance's metrics endpoint in
// the node's scrape tests (tests/integration/node_scrape_test.cpp, cluster_test.cpp).
#pragma once

#include <httplib.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>

namespace eldr::testing {

// One decode worker's /metrics, in vLLM's format, with a load the test sets.
class vllm_metrics_server {
 public:
  vllm_metrics_server() {
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      res.set_content(
          "# TYPE vllm:num_requests_running gauge\n"
          "vllm:num_requests_running{engine=\"0\",model_name=\"served\"} " +
              std::to_string(running_) +
              ".0\n# TYPE vllm:num_requests_waiting gauge\n"
              "vllm:num_requests_waiting{engine=\"0\",model_name=\"served\"} " +
              std::to_string(waiting_) +
              ".0\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"served\"} 0.25\n",
          "text/plain; version=0.0.4");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() before the accept loop runs would be lost (httplib 0.11 has no wait_until_ready):
    // wait for the loop, with a deadline.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!server_.is_running() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
  }
  ~vllm_metrics_server() { stop(); }
  void stop() {
    if (!thread_.joinable()) return;
    server_.stop();
    thread_.join();
  }
  void set_load(int running, int waiting) {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = running;
    waiting_ = waiting;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/metrics"; }

 private:
  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
  std::mutex mu_;
  int running_ = 0, waiting_ = 0;
};

}  // namespace eldr::testing
