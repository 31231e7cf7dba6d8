// consumer: a program outside eldr's tree built against the installed client library
// (find_package(eldr), eldr::client). It compiles README.md's C++ client snippet verbatim
// (readme_snippet.inc, extracted by client_package_test.py) and makes a real round trip with an
// eldr-node: registers a decode worker, routes a request, and checks the node picked that worker.
//
//   consumer ROUTE_ENDPOINT WORKER_ENDPOINT      exit 0 when the round trip worked
#include <cstdint>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include "cluster/zmq/client.hpp"

namespace {

void hand_kv_cache_to(const std::string& endpoint) {
  std::printf("hand the KV cache to %s\n", endpoint.c_str());
}

// The README's snippet with the names it takes from its surroundings. Compiled, not run: its
// endpoints are an example's.
[[maybe_unused]] void readme_snippet(const std::vector<uint64_t>& hashes,
                                     const eldr::counts_message& counts_of_computed_blocks) {
  uint64_t seq = 0;
#include "readme_snippet.inc"
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer ROUTE_ENDPOINT WORKER_ENDPOINT\n");
    return 2;
  }
  eldr::client_options options;
  options.timeout_ms = 10000;
  auto node = eldr::worker_client::connect(argv[2], options);
  if (!node.ok()) {
    std::fprintf(stderr, "worker_client::connect: %s\n", node.error().to_string().c_str());
    return 1;
  }
  eldr::worker_register reg;
  reg.model = "default";
  reg.worker = 0;
  reg.endpoint = "tcp://10.0.0.3:5600";
  reg.capacity = 8;
  auto ack = (*node)->call(reg);
  if (!ack.ok() || !std::holds_alternative<eldr::worker_ack>(*ack)) {
    std::fprintf(stderr, "register: %s\n",
                 ack.ok() ? std::get<eldr::error_reply>(*ack).message.c_str()
                          : ack.error().to_string().c_str());
    return 1;
  }

  auto router = eldr::route_client::connect(argv[1], options);
  if (!router.ok()) {
    std::fprintf(stderr, "route_client::connect: %s\n", router.error().to_string().c_str());
    return 1;
  }
  eldr::route_request req;
  req.id = "consumer-1";
  req.model = "default";
  req.block_hashes = {11, 12, 13};
  auto answer = (*router)->route(req);
  if (!answer.ok() || !std::holds_alternative<eldr::route_reply>(*answer)) {
    std::fprintf(stderr, "route: %s\n",
                 answer.ok() ? std::get<eldr::error_reply>(*answer).message.c_str()
                             : answer.error().to_string().c_str());
    return 1;
  }
  const auto& reply = std::get<eldr::route_reply>(*answer);
  std::printf("routed %s to worker %u at %s\n", reply.id.c_str(), reply.worker,
              reply.endpoint.c_str());
  return reply.id == req.id && reply.worker == reg.worker && reply.endpoint == reg.endpoint ? 0 : 1;
}
