// Registrations a client may send that are refused as malformed where they arrive, each with the
// message it is refused with. The decoder's test (tests/unit/edge_validation_test.cpp) and the
// running node's (tests/integration/node_edge_test.cpp) check the same table, so that the node
// answers a client in the decoder's words.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/wire/worker_protocol.hpp"

namespace eldr::testing {

struct refused_registration {
  worker_message message;
  std::string error;  // the error reply's message (code: malformed)
};

// Endpoints that would break what the node later prints (a quote or newline in a metrics label,
// bytes that are not UTF-8) or reach inside it (inproc://), registered for `model` and, for
// workers, worker `worker`.
inline std::vector<refused_registration> refused_registrations(const std::string& model,
                                                               uint32_t worker) {
  return {
      {worker_register{"", model, worker, "tcp://x\"\nINJECTED 1", 0, ""},
       "worker_register.endpoint: contains byte 7 (0x22); an endpoint is printable ASCII without "
       "whitespace, quotes or backslashes"},
      {worker_register{"", model, worker, "tcp://\xff\xfe", 0, ""},
       "worker_register.endpoint: not valid UTF-8 at byte 6 (0xff)"},
      {publisher_register{"", model, "tcp://h:1\"} 1\nx{a=\"", ""},
       "publisher_register.endpoint: contains byte 9 (0x22); an endpoint is printable ASCII "
       "without whitespace, quotes or backslashes"},
      {publisher_register{"", model, "inproc://zeromq.zap.01", ""},
       "publisher_register.endpoint: \"inproc://zeromq.zap.01\" is not tcp://HOST:PORT or "
       "ipc://PATH"},
  };
}

}  // namespace eldr::testing
