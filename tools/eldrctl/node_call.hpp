// node_call: how eldrctl reaches a node -- the global options, the exit codes scripts rely on, and
// one admin call whose failures are printed and turned into an exit code.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster/zmq/client.hpp"

namespace eldr::ctl {

using json = nlohmann::json;

constexpr int exit_ok = 0;
constexpr int exit_node_error = 1;
constexpr int exit_usage = 2;
constexpr int exit_transport = 3;

struct global_options {
  std::string node = "tcp://127.0.0.1:5702";
  int timeout_ms = 5000;
  bool json = false;
  bool wide = false;                  // status: every column and counter, not the 100-column view
  std::string curve_server_key;       // the node's CURVE public key (Z85); "" = plain TCP
  std::string curve_secret_key_file;  // our own long-term CURVE key (allowlisted nodes)
};

struct outcome {
  int exit = exit_ok;
  json result;
};

// The admin client for --node (with CURVE when asked); errors are printed and turned into the
// exit code.
eldr::result<std::unique_ptr<eldr::admin_client>> connect_admin(const global_options& g);

// One admin command: the node's result, or the exit code with the failure printed to stderr.
outcome call_node(const global_options& g, const std::string& command, json args);

}  // namespace eldr::ctl
