// node_call: the admin connection and call of eldrctl, and the messages of their failures.
#include "tools/eldrctl/node_call.hpp"

#include <cstdint>
#include <iostream>
#include <string>

#include "cluster/security/curve_keys.hpp"

namespace eldr::ctl {
namespace {

// The node's refusals come back from admin_client::call as "<code name>: <message>"
// (cluster/zmq/client.hpp); anything else (timeout, refused connection, a corrupt answer) failed
// before the node could answer. The exit code tells the two apart for scripts.
bool is_node_error(const eldr::status& s) {
  // Every code this build names ("unknown" for the rest, which is also what a code newer than this
  // build prints as).
  for (int code = 1; code <= UINT8_MAX; ++code) {
    const std::string name = eldr::to_string(static_cast<eldr::wire_error_code>(code));
    if (s.message().rfind(name + ": ", 0) == 0) return true;
  }
  return false;
}

// What to do when --node is not the admin endpoint: the route and worker endpoints answer an
// admin request with unknown_type naming their own message type.
std::string endpoint_hint(const std::string& node_error) {
  auto names = [&](const char* what) {
    return node_error.find("unknown_type: " + std::string(what)) != std::string::npos;
  };
  const char* which = names("route_request.type")    ? "route"
                      : names("worker message.type") ? "worker"
                                                     : nullptr;
  if (!which) return "";
  return std::string("\neldrctl: that is the node's ") + which +
         " endpoint; eldrctl needs its admin endpoint ([endpoints].admin, by default "
         "tcp://127.0.0.1:5702; eldr-node prints all three in its ready line)";
}

}  // namespace

eldr::result<std::unique_ptr<eldr::admin_client>> connect_admin(const global_options& g) {
  eldr::client_options o;
  o.timeout_ms = g.timeout_ms;
  if (!g.curve_server_key.empty()) {
    eldr::curve_client_keys keys;
    keys.server_public_key = g.curve_server_key;
    if (!g.curve_secret_key_file.empty()) {
      auto mine = eldr::read_curve_secret_key(g.curve_secret_key_file);
      if (!mine.ok())
        return eldr::status::invalid_argument("--curve-secret-key-file: " + mine.error().message());
      keys.public_key = mine->public_key;
      keys.secret_key = mine->secret_key;
    }
    o.curve = std::move(keys);
  }
  if (g.node.find("://") == std::string::npos)
    return eldr::status::invalid_argument(
        "--node " + g.node + ": not a ZeroMQ endpoint; did you mean tcp://" + g.node + "?");
  auto client = eldr::admin_client::connect(g.node, o);
  if (!client.ok())
    return eldr::status::invalid_argument("--node " + g.node + ": " + client.error().message());
  return client;
}

outcome call_node(const global_options& g, const std::string& command, json args) {
  auto client = connect_admin(g);
  if (!client.ok()) {
    std::cerr << "eldrctl: " << client.error().message() << "\n";
    return {exit_usage, {}};
  }
  auto r = (*client)->call(command, std::move(args));
  if (r.ok()) return {exit_ok, std::move(*r)};
  if (is_node_error(r.error())) {
    std::cerr << "eldrctl: " << command << ": " << r.error().message()
              << endpoint_hint(r.error().message()) << "\n";
    return {exit_node_error, {}};
  }
  std::cerr << "eldrctl: " << g.node << ": " << r.error().message() << "\n";
  // A node with CURVE on drops a plain client's connection without a word: say so.
  if (g.curve_server_key.empty())
    std::cerr << "eldrctl: no answer: check that --node is the admin endpoint and the node is up;"
                 " a node with CURVE on answers only clients given --curve-server-key "
                 "(docs/security.md)\n";
  return {exit_transport, {}};
}

}  // namespace eldr::ctl
