// metrics_scraper: see metrics_scraper.hpp.
#include "cluster/http/metrics_scraper.hpp"

#include <httplib.h>

#include <algorithm>
#include <chrono>

namespace eldr {

metrics_scraper::metrics_scraper(const metrics_scraper_options& options) : options_(options) {
  options_.threads = std::clamp<uint32_t>(options_.threads, 1, 64);
  options_.connect_timeout_ms = std::max<int64_t>(options_.connect_timeout_ms, 1);
  options_.read_timeout_ms = std::max<int64_t>(options_.read_timeout_ms, 1);
  options_.total_timeout_ms = std::max<int64_t>(options_.total_timeout_ms, 1);
  threads_.reserve(options_.threads);
  for (uint32_t i = 0; i < options_.threads; ++i)
    threads_.emplace_back([this] { run(); });
}

metrics_scraper::~metrics_scraper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_)
    t.join();
}

bool metrics_scraper::scrape(uint64_t key, const http_url& url, std::string model_name,
                             callback done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !busy_.insert(key).second) return false;
    queue_.push_back(job{key, url, std::move(model_name), std::move(done)});
  }
  cv_.notify_one();
  return true;
}

size_t metrics_scraper::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_.size();
}

void metrics_scraper::run() {
  for (;;) {
    job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      j = std::move(queue_.front());
      queue_.pop_front();
    }
    auto r = fetch(j);
    {
      // Free the key before the callback, so that the callback's owner may scrape it again at
      // once.
      std::lock_guard<std::mutex> lock(mu_);
      busy_.erase(j.key);
    }
    j.done(j.key, std::move(r));
  }
}

result<vllm_load> metrics_scraper::fetch(const job& j) const {
  httplib::Client client(j.url.host, j.url.port);
  client.set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
  client.set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  client.set_write_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  client.set_keep_alive(false);
  client.set_follow_location(false);
  std::string body;
  bool too_large = false, too_slow = false;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.total_timeout_ms);
  int http_status = 0;
  auto res = client.Get(
      j.url.path,
      [&](const httplib::Response& response) {
        http_status = response.status;
        return response.status == 200;
      },
      [&](const char* data, size_t n) {
        if (body.size() + n > options_.max_body_bytes) {
          too_large = true;
          return false;
        }
        if (std::chrono::steady_clock::now() > deadline) {
          too_slow = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
  const std::string where = j.url.to_string();
  if (too_large)
    return status::out_of_range(where + ": body exceeds " +
                                std::to_string(options_.max_body_bytes) + " bytes");
  if (too_slow)
    return status::io_error(where + ": body not received within " +
                            std::to_string(options_.total_timeout_ms) + " ms");
  if (http_status != 0 && http_status != 200)
    return status::io_error(where + ": HTTP status " + std::to_string(http_status));
  if (!res) return status::io_error(where + ": " + httplib::to_string(res.error()));
  auto load = parse_vllm_metrics(body, j.model, options_.max_body_bytes);
  if (!load.ok()) return status(load.error().code(), where + ": " + load.error().message());
  return load;
}

}  // namespace eldr
