// metrics_scraper: fetches decode workers' vLLM /metrics over HTTP (cpp-httplib's client) on a
// small fixed pool of threads and hands each worker's load (cluster/http/vllm_metrics.hpp) to a
// callback. The node's router issues one scrape per registered worker every scrape_interval_ms
// and applies the results to its load view (core/load_view.hpp, on_scrape); this class knows
// nothing of actors, so it is tested with a local HTTP server.
//
// Bounds: at most one scrape in flight per key (a scrape of a worker whose previous one has not
// finished is skipped, so a slow worker never queues up work), a connect, a per-read and a
// whole-body timeout, a body size cap (the transfer is cut when exceeded), no redirects, no
// keep-alive.
//
// Thread safety: scrape() and in_flight() may be called from any thread. Callbacks run on a pool
// thread, never under the scraper's lock; they must be quick (the node's posts a message to its
// actor) and must not destroy the scraper. The destructor stops the pool: queued scrapes are
// dropped without their callback, and running ones finish (within their timeouts) first.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cluster/http/http_url.hpp"
#include "cluster/http/vllm_metrics.hpp"
#include "core/base/status.hpp"

namespace eldr {

struct metrics_scraper_options {
  uint32_t threads = 4;              // 1..64
  int64_t connect_timeout_ms = 500;  // TCP connect
  int64_t read_timeout_ms = 1000;    // each read and write on the connection
  // The whole body: a server that trickles it is cut off once this has passed since the request
  // started (checked as data arrives, so a scrape ends by total + read timeout at most).
  int64_t total_timeout_ms = 2000;
  size_t max_body_bytes = default_max_metrics_bytes;
};

class metrics_scraper {
 public:
  // The outcome of one scrape: the load, or why not (io_error: unreachable, timed out, an HTTP
  // status other than 200; out_of_range: body too large; vllm_metrics's errors otherwise).
  using callback = std::function<void(uint64_t key, result<vllm_load> load)>;

  // Starts the threads. Options are clamped to their ranges (threads 1..64, timeouts >= 1 ms).
  explicit metrics_scraper(const metrics_scraper_options& options = {});
  ~metrics_scraper();
  metrics_scraper(const metrics_scraper&) = delete;
  metrics_scraper& operator=(const metrics_scraper&) = delete;

  // Queues a GET of `url` for `key` (the caller's name for a worker), to be read for model
  // `model_name` (parse_vllm_metrics). Returns false, and queues nothing, when a scrape for `key`
  // is queued or running. `done` is called once per accepted scrape (unless the scraper is
  // destroyed first).
  bool scrape(uint64_t key, const http_url& url, std::string model_name, callback done);

  // Scrapes queued or running.
  size_t in_flight() const;

 private:
  struct job {
    uint64_t key = 0;
    http_url url;
    std::string model;
    callback done;
  };
  void run();
  result<vllm_load> fetch(const job& j) const;

  metrics_scraper_options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::deque<job> queue_;
  std::unordered_set<uint64_t> busy_;  // keys queued or running
  std::vector<std::thread> threads_;
};

}  // namespace eldr
