// zmq_ingest: the ZeroMQ side of the signature cache's ingest -- one SUB socket per vLLM KV-event
// publisher and per counts publisher, and a DEALER per replay endpoint (vllm-kv-events.md).
//
// Each poll_once() waits for messages, drains what is ready (up to a budget), hands it to the
// ingest logic and commits once: a group commit, so that RocksDB writes one WAL record per round,
// not per message. When poll_once() returns ok, every message it received is acknowledged.
//
// Thread safety: none; ZeroMQ sockets belong to the thread that polls them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cluster/ingest/ingest.hpp"
#include "core/base/status.hpp"
#include "storage/signature_cache.hpp"

namespace eldr {

struct zmq_ingest_options {
  std::vector<std::string> kv_endpoints;      // connected to (vLLM binds tcp://*:5557 by default)
  std::vector<std::string> replay_endpoints;  // i-th serves the i-th kv endpoint; "" = none
  std::vector<std::string> counts_endpoints;
  int replay_timeout_ms = 2000;                   // per reply; then the gap resynchronises
  int64_t max_message_bytes = int64_t{64} << 20;  // larger frames are dropped by ZeroMQ
  size_t max_messages_per_commit = 4096;
  kv_decode_limits limits;
};

class zmq_ingest {
 public:
  // Connects every socket. `cache` must outlive the result. Errors: an endpoint ZeroMQ refuses.
  static result<std::unique_ptr<zmq_ingest>> create(signature_cache& cache,
                                                    zmq_ingest_options options,
                                                    clock_fn clock = {});
  ~zmq_ingest();

  // Waits up to timeout_ms for a message, handles everything ready, commits. Returns the number
  // of messages handled. Error: the commit failed (nothing since the last ok is acknowledged).
  result<size_t> poll_once(int timeout_ms);

  const ingest& logic() const;

  class impl;

 private:
  explicit zmq_ingest(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace eldr
