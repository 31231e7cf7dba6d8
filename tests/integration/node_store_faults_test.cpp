// eldr-node with its data directory on a full file system (a small tmpfs, see
// tests/support/small_fs.hpp; skipped when none can be mounted): routes keep being answered, the
// status shows the signature store degraded, and once space returns the store recovers and what
// was routed meanwhile, and after, persists across a restart (docs/signature-cache.md, "Faults").
// Before the fix the node aborted (SIGABRT in RocksDB's info LOG) as the disk filled.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "cluster/zmq/client.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/node_fixture.hpp"
#include "tests/support/small_fs.hpp"
#include "tests/support/toy_model.hpp"

namespace eldr {
namespace {

using testing::small_fs;

const model_geometry& toy = testing::toy_geometry;

route_request request_for(const std::string& id, uint64_t first, size_t n, bool send_counts) {
  route_request r;
  r.id = id;
  r.model = "toy";
  for (size_t i = 0; i < n; ++i)
    r.block_hashes.push_back(first + i);
  if (send_counts) {
    counts_message c;
    c.geometry = toy;
    std::optional<uint64_t> parent;
    for (uint64_t h : r.block_hashes) {
      c.blocks.push_back({h, parent, testing::toy_block(static_cast<uint32_t>(h % 4))});
      parent = h;
    }
    r.counts = std::move(c);
  }
  return r;
}

// GET `path` from the node's metrics port (url: http://127.0.0.1:PORT/metrics); "" on failure.
std::string get_metrics(const std::string& url, const std::string& path = "/metrics") {
  const auto colon = url.rfind(':');
  if (colon == std::string::npos) return "";
  const int port = std::atoi(url.c_str() + colon + 1);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;)
        out.append(buf, static_cast<size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

const char* toy_model_toml =
    "[[models]]\nname = \"toy\"\nworkers = 4\nworker_timeout_ms = 600000\nmin_sample = 16\n"
    "sample_size = 256\nwiden_single = false\n";

// Every route is answered with a route_reply (must_route): the store's state never stops routing.
class NodeStoreFaults : public testing::node_fixture {
 protected:
  NodeStoreFaults() : node_fixture("eldr-node-store-faults") {}
  // The node stops before its file system is unmounted: disk_, a member of this class, is
  // destroyed before the fixture's node_.
  ~NodeStoreFaults() override { node_.reset(); }

  void start() {
    ASSERT_NO_FATAL_FAILURE(start_node(toy_model_toml, "", disk_->dir + "/data"));
    register_workers("toy", testing::toy_workers);
  }

  nlohmann::json store() {
    nlohmann::json s = status();
    return s.is_null() ? s : s["signature_cache"][0]["store"];
  }

  template <class F>
  bool eventually(F&& done, std::chrono::seconds limit = std::chrono::seconds(60)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling interval
    }
    return done();
  }

  std::unique_ptr<small_fs> disk_;
};

TEST_F(NodeStoreFaults, FullDiskKeepsRoutingShowsDegradedAndRecovers) {
  disk_ = std::make_unique<small_fs>(dir_.sub("fs"), "32m");
  if (!disk_->mounted) GTEST_SKIP() << disk_->why;
  start();
  EXPECT_EQ(must_route(request_for("before", 1000, 8, true)).covered_blocks, 8u);
  ASSERT_TRUE(eventually([&] { return store()["pending_changes"] == 0; }));

  ASSERT_TRUE(small_fs::fill(disk_->dir + "/filler"));
  uint64_t next = 100'000;
  int sent = 0;
  ASSERT_TRUE(eventually([&] {
    for (int i = 0; i < 20; ++i, next += 64)
      EXPECT_EQ(
          must_route(request_for("full-" + std::to_string(sent++), next, 64, true)).covered_blocks,
          64u);
    return store()["degraded"] == true;
  })) << store().dump();
  const auto degraded = store();
  EXPECT_NE(degraded["reason"].get<std::string>().find("No space left"), std::string::npos)
      << degraded.dump();
  EXPECT_GE(degraded["write_errors"].get<uint64_t>(), 1u);
  // The metrics say it too (rendered on the commit tick, at most every 250 ms).
  EXPECT_TRUE(eventually([&] {
    return get_metrics(node_->metrics()).find("eldr_store_degraded{model=\"toy\"} 1") !=
           std::string::npos;
  }));
  // /readyz lists the store as degraded, with why, and not among the reasons the node is not
  // ready: it routes on without it (this model is not ready only for want of a centroid set).
  EXPECT_TRUE(eventually([&] {
    const auto r = get_metrics(node_->metrics(), "/readyz");
    return r.find("\"degraded\":[{\"model\":\"toy\",\"part\":\"store\"") != std::string::npos &&
           r.find("No space left") != std::string::npos &&
           r.find("\"part\":\"store\"", r.find("\"reasons\"")) == std::string::npos;
  })) << get_metrics(node_->metrics(), "/readyz");
  // Routing from memory: a prompt whose counts arrived while the disk was full is covered.
  EXPECT_EQ(must_route(request_for("from-memory", next - 64, 64, false)).covered_blocks, 64u);
  EXPECT_EQ(must_route(request_for("while-full", 900'000, 8, true)).covered_blocks, 8u);

  std::filesystem::remove(disk_->dir + "/filler");
  ASSERT_TRUE(eventually([&] { return store()["degraded"] == false; })) << store().dump();
  EXPECT_EQ(store()["recoveries"], 1);
  EXPECT_TRUE(eventually([&] {
    return get_metrics(node_->metrics(), "/readyz").find("\"degraded\":[]") != std::string::npos;
  })) << get_metrics(node_->metrics(), "/readyz");
  EXPECT_TRUE(eventually([&] {
    return get_metrics(node_->metrics()).find("eldr_store_degraded{model=\"toy\"} 0") !=
           std::string::npos;
  }));
  EXPECT_EQ(must_route(request_for("after", 800'000, 8, true)).covered_blocks, 8u);
  ASSERT_TRUE(eventually([&] { return store()["pending_changes"] == 0; })) << store().dump();

  EXPECT_EQ(node_->stop(), 0);
  start();
  // Counts routed before, while degraded (held, then written at recovery) and after.
  EXPECT_EQ(must_route(request_for("before-2", 1000, 8, false)).covered_blocks, 8u);
  EXPECT_EQ(must_route(request_for("while-full-2", 900'000, 8, false)).covered_blocks, 8u);
  EXPECT_EQ(must_route(request_for("from-memory-2", next - 64, 64, false)).covered_blocks, 64u);
  EXPECT_EQ(must_route(request_for("after-2", 800'000, 8, false)).covered_blocks, 8u);
  EXPECT_EQ(store()["degraded"], false);
  node_->stop();
}

}  // namespace
}  // namespace eldr
