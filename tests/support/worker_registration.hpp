// Registering a model's decode workers with a running eldr-node, as a test's stand-in for them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <variant>

#include "cluster/zmq/client.hpp"

namespace eldr::testing {

// Registers workers 0..k-1 of `model` through `worker` at endpoint host_prefix + index + suffix
// (e.g. tcp://10.0.0.3:9), each acknowledged active. Fails the test, fatally (call it through
// ASSERT_NO_FATAL_FAILURE where later lines need the workers), when one is not acknowledged.
inline void register_workers(worker_client& worker, const std::string& model, uint32_t k,
                             const std::string& host_prefix = "tcp://10.0.0.",
                             const std::string& suffix = ":9") {
  for (uint32_t w = 0; w < k; ++w) {
    auto r =
        worker.call(worker_register{"", model, w, host_prefix + std::to_string(w) + suffix, 0, ""});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    ASSERT_TRUE(std::holds_alternative<worker_ack>(*r)) << "worker " << w << " not acknowledged";
    EXPECT_EQ(std::get<worker_ack>(*r).state, "active") << "worker " << w;
  }
}

// As above through a worker client connected for the purpose to `worker_endpoint`.
inline void register_workers(const std::string& worker_endpoint, const std::string& model,
                             uint32_t k, const std::string& host_prefix = "tcp://10.0.0.",
                             const std::string& suffix = ":9") {
  auto w = worker_client::connect(worker_endpoint);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  register_workers(**w, model, k, host_prefix, suffix);
}

}  // namespace eldr::testing
