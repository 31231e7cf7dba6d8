// A vLLM-style KV-event publisher for integration tests: tests/integration/py/kv_publisher.py
// (vLLM's ZmqEventPublisher wire format: PUB topic/seq/payload and a ROUTER replay socket) run as
// a child process and driven by JSON commands on its stdin, one JSON answer per command.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/child_process.hpp"

namespace eldr::testing {

class kv_publisher {
 public:
  // replay_shape: how the replay socket answers ("new", "old", "mute": see kv_publisher.py).
  explicit kv_publisher(const std::string& replay_shape)
      : proc_({"/usr/bin/python3",
               std::string(ELDR_SOURCE_DIR) + "/tests/integration/py/kv_publisher.py",
               replay_shape}) {
    if (auto line = proc_.read_line(std::chrono::seconds(20)))
      endpoints_ = nlohmann::json::parse(*line, nullptr, false);
  }

  // Whether the publisher started and printed its endpoints.
  bool ok() const { return endpoints_.is_object(); }
  std::string pub() const { return endpoints_.value("pub", ""); }
  std::string replay() const { return endpoints_.value("replay", ""); }
  std::string counts() const { return endpoints_.value("counts", ""); }

  // Sends one command and returns its answer (null when none came within the deadline).
  nlohmann::json cmd(const nlohmann::json& c) {
    proc_.write_line(c.dump());
    auto line = proc_.read_line(std::chrono::seconds(30));
    return line ? nlohmann::json::parse(*line, nullptr, false) : nlohmann::json();
  }

 private:
  child_process proc_;
  nlohmann::json endpoints_;
};

}  // namespace eldr::testing
