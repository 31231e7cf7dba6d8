// The fixture of the single-node integration tests: one eldr-node process (node_process) with a
// connected admin, route and worker client, and the calls every such test makes -- register the
// workers, route and insist on a decision, read the status. Each test file keeps what is its own
// (its model TOML, its requests, its checks); what was written once per file lives here.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <variant>

#include "cluster/zmq/client.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/worker_registration.hpp"

namespace eldr::testing {

class node_fixture : public ::testing::Test {
 protected:
  // dir_name: the test's temp directory (its node.toml and, by default, its data directory).
  explicit node_fixture(const std::string& dir_name) : dir_(dir_name) {}

  // Starts the node with `models` (raw [[models]] TOML) and `extra` (more TOML before it), data
  // under `data_dir` (default: the temp directory's "data"), and connects the three clients.
  // Fails the test (fatally, so call it through ASSERT_NO_FATAL_FAILURE where later lines would
  // crash) when the node does not become ready or a client cannot connect.
  void start_node(const std::string& models, const std::string& extra = "",
                  const std::string& data_dir = "") {
    node_ = std::make_unique<node_process>(
        dir_.sub("node.toml"),
        node_toml(data_dir.empty() ? dir_.sub("data") : data_dir, models, extra));
    ASSERT_TRUE(node_->ok()) << "eldr-node did not become ready";
    auto a = admin_client::connect(node_->admin());
    auto r = route_client::connect(node_->route());
    auto w = worker_client::connect(node_->worker());
    ASSERT_TRUE(a.ok() && r.ok() && w.ok());
    admin_ = std::move(*a);
    route_ = std::move(*r);
    worker_ = std::move(*w);
  }

  // Registers workers 0..k-1 of `model` at endpoint host_prefix + index + suffix (e.g.
  // tcp://10.0.0.3:9), each acknowledged active.
  void register_workers(const std::string& model, uint32_t k,
                        const std::string& host_prefix = "tcp://10.0.0.",
                        const std::string& suffix = ":9") {
    testing::register_workers(*worker_, model, k, host_prefix, suffix);
  }

  // The decision for `req`; a transport error or an error reply fails the test (non-fatally)
  // and returns an empty reply.
  route_reply must_route(const route_request& req) {
    auto r = route_->route(req);
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    if (!r.ok()) return {};
    if (auto* e = std::get_if<error_reply>(&*r)) {
      ADD_FAILURE() << "error reply " << to_string(e->code) << ": " << e->message;
      return {};
    }
    return std::get<route_reply>(*r);
  }

  // The admin `status` reply; null (and a non-fatal failure) when the call fails.
  nlohmann::json status() {
    auto s = admin_->call("status");
    EXPECT_TRUE(s.ok()) << s.error().to_string();
    return s.ok() ? *s : nlohmann::json();
  }

  temp_dir dir_;
  std::unique_ptr<node_process> node_;
  std::unique_ptr<admin_client> admin_;
  std::unique_ptr<route_client> route_;
  std::unique_ptr<worker_client> worker_;
};

}  // namespace eldr::testing
