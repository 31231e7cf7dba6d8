// An eldr-node process for integration tests: written config (ports chosen by the node: port 0),
// started, its bound endpoints read from its "eldr-node ready {json}" line, stopped with SIGTERM
// (or killed) and reaped at destruction. Waits are bounded by deadlines, never sleeps.
#pragma once

#include <signal.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/child_process.hpp"

namespace eldr::testing {

inline std::string node_binary() {
  return std::string(ELDR_BINARY_DIR) + "/tools/eldr-node/eldr-node";
}

// A TOML config for one node on loopback with free ports, data under `data_dir`, and `models`
// as raw TOML ([[models]] tables).
inline std::string node_toml(const std::string& data_dir, const std::string& models,
                             const std::string& extra = "") {
  return "[node]\nname = \"test-node\"\ndata_dir = \"" + data_dir +
         "\"\n[endpoints]\nroute = \"tcp://127.0.0.1:0\"\nworker = \"tcp://127.0.0.1:0\"\n"
         "admin = \"tcp://127.0.0.1:0\"\nmetrics = \"127.0.0.1:0\"\n[runtime]\nlog_level = "
         "\"warn\"\n" +
         extra + models;
}

class node_process {
 public:
  // Writes `toml` to config_path and starts the node; ok() tells whether it became ready.
  // `wrapper`: a command line the node's own is appended to (e.g. unshare ... to give it a PID
  // namespace); empty = run the node directly.
  node_process(const std::string& config_path, const std::string& toml,
               std::vector<std::string> wrapper = {}) {
    std::ofstream(config_path) << toml;
    for (const auto& a : {node_binary(), std::string("--config"), config_path})
      wrapper.push_back(a);
    child_ = std::make_unique<child_process>(std::move(wrapper));
    // Start-up opens RocksDB and binds sockets: seconds at most, even on a loaded CI machine.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      auto line = child_->read_line(std::chrono::seconds(60));
      if (!line) break;
      const std::string prefix = "eldr-node ready ";
      if (line->rfind(prefix, 0) == 0) {
        ready_ = nlohmann::json::parse(line->substr(prefix.size()), nullptr, false);
        break;
      }
    }
  }
  ~node_process() { stop(); }

  bool ok() const { return ready_.is_object(); }
  std::string route() const { return ready_.value("route", ""); }
  std::string worker() const { return ready_.value("worker", ""); }
  std::string admin() const { return ready_.value("admin", ""); }
  std::string metrics() const { return ready_.value("metrics", ""); }
  std::string cluster() const { return ready_.value("cluster", ""); }  // "" when standalone
  // The endpoint a model's KV-event publishers connect to (models[].kv_events.bind), or "".
  std::string kv_events(const std::string& model) const {
    return ready_.contains("kv_events") ? ready_["kv_events"].value(model, "") : "";
  }
  pid_t pid() const { return child_ ? child_->pid() : -1; }
  // The node's next stdout line after its ready line (its log too, with a wrapper that sends
  // stderr there), or nullopt at the deadline or EOF.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    return child_ ? child_->read_line(timeout) : std::nullopt;
  }

  // SIGTERM and wait: a clean stop (the node commits what is staged). Returns the exit status.
  int stop() {
    if (!child_ || !child_->running()) return exit_code_;
    child_->signal(SIGTERM);
    exit_code_ = child_->wait();
    return exit_code_;
  }
  void kill() {
    if (!child_ || !child_->running()) return;
    child_->signal(SIGKILL);
    exit_code_ = child_->wait();
  }

 private:
  std::unique_ptr<child_process> child_;
  nlohmann::json ready_;
  int exit_code_ = -1;
};

}  // namespace eldr::testing
