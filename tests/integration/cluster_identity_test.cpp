// Node identity in containers: CAF 0.17.6 derives its node id from the MAC addresses, the root
// file system's UUID in /etc/fstab and the PID, so two nodes that are PID 1 in their own PID
// namespaces on one network (the same MACs) get the same id and cannot join each other. The
// container entrypoint (deploy/docker/entrypoint.sh) writes a fresh UUID into the container's own
// /etc/fstab; this test runs two nodes exactly so -- PID 1 each, one network -- with and without
// that entrypoint. Needs root (unshare); skips with a message otherwise.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>

#include "tests/support/cluster_status.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using testing::admin_status;
using testing::eventually;
using testing::node_process;
using testing::temp_dir;

class ClusterIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root for PID and mount namespaces (unshare)";
    if (std::system("unshare --pid --fork --mount --mount-proc true >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "unshare cannot make PID and mount namespaces here";
    std::ofstream(dir_.sub("secret")) << "a-cluster-secret-of-enough-bytes\n";
  }

  std::string toml(const std::string& name, const std::string& listen,
                   const std::string& seed) const {
    return "[node]\nname = \"" + name + "\"\ndata_dir = \"" + dir_.sub(name + "-data") +
           "\"\n[endpoints]\nroute = \"tcp://127.0.0.1:0\"\nworker = \"tcp://127.0.0.1:0\"\n"
           "admin = \"tcp://127.0.0.1:0\"\nmetrics = \"\"\n[runtime]\nlog_level = \"warn\"\n"
           "[cluster]\nlisten = \"" +
           listen + "\"\nsecret_file = \"" + dir_.sub("secret") + "\"\nseeds = [\"" + seed +
           "\"]\n[[models]]\nname = \"m\"\n";
  }

  // The node as PID 1 of a new PID namespace on this machine's network. With `entrypoint`, a
  // private mount namespace gives it its own /etc/fstab (a bind mount of an empty file), which
  // deploy/docker/entrypoint.sh then fills as it does in a container.
  std::unique_ptr<node_process> start(const std::string& name, const std::string& listen,
                                      const std::string& seed, bool entrypoint) {
    std::vector<std::string> wrapper{"/usr/bin/unshare",     "--pid",   "--fork",
                                     "--kill-child=SIGTERM", "--mount", "--mount-proc"};
    if (entrypoint) {
      const std::string fstab = dir_.sub(name + ".fstab");
      std::ofstream(fstab) << "";
      wrapper.insert(wrapper.end(),
                     {"/bin/sh", "-c", "mount --bind \"$0\" /etc/fstab && exec \"$@\"", fstab,
                      std::string(ELDR_SOURCE_DIR) + "/deploy/docker/entrypoint.sh"});
    }
    return std::make_unique<node_process>(dir_.sub(name + ".toml"), toml(name, listen, seed),
                                          wrapper);
  }

  // unshare --fork ignores SIGTERM while it waits for its child: the node (PID 1 of its
  // namespace, which takes SIGTERM because it installs a handler) is stopped directly, and
  // unshare exits with it.
  static void stop(node_process& n) {
    std::ifstream children("/proc/" + std::to_string(n.pid()) + "/task/" + std::to_string(n.pid()) +
                           "/children");
    pid_t node = 0;
    if (children >> node && node > 0) ::kill(node, SIGTERM);
    n.stop();
  }

  // The first p in 30000..32766 (starting at a PID-derived offset, so that parallel runs spread
  // out) such that p and p + 1 can both be bound on 127.0.0.1 now; 0 when none.
  static int free_port_pair() {
    auto bindable = [](int port) {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) return false;
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      return ok;
    };
    const int span = 32766 - 30000;
    for (int i = 0; i < span; i += 2) {
      const int p = 30000 + (static_cast<int>(::getpid()) * 2 + i) % span;
      if (bindable(p) && bindable(p + 1)) return p;
    }
    return 0;
  }

  static bool joined(const node_process& n) {
    return testing::alive_peers(admin_status(n.admin())) == 1;
  }

  temp_dir dir_{"eldr-identity-test"};
};

TEST_F(ClusterIdentityTest, TwoPid1NodesOnOneNetworkJoinOnlyWithTheEntrypointsFstabUuid) {
  // Fixed ports: each node must name the other as its seed before either starts. From 30000 up,
  // below the kernel's ephemeral range (port-0 binds and outgoing connections) and above
  // deploy/local/eldr-cluster's default slots, and checked free first.
  const int base = free_port_pair();
  ASSERT_GT(base, 0) << "no two free consecutive ports in 30000..32766";
  const std::string a = "127.0.0.1:" + std::to_string(base),
                    b = "127.0.0.1:" + std::to_string(base + 1);
  {
    // Control: same MACs, PID 1 each, the machine's /etc/fstab -- one CAF node id for both.
    auto n1 = start("c1", a, b, false), n2 = start("c2", b, a, false);
    ASSERT_TRUE(n1->ok() && n2->ok());
    EXPECT_FALSE(
        eventually([&] { return joined(*n1) || joined(*n2); }, std::chrono::milliseconds(3000)))
        << "the nodes joined without the entrypoint: this machine does not reproduce the "
           "collision, so the second half proves nothing";
    stop(*n1);
    stop(*n2);
  }
  auto n1 = start("e1", a, b, true), n2 = start("e2", b, a, true);
  ASSERT_TRUE(n1->ok() && n2->ok());
  EXPECT_TRUE(eventually([&] { return joined(*n1) && joined(*n2); }))
      << "two PID-1 nodes with the entrypoint's fresh fstab UUIDs did not join";
  stop(*n1);
  stop(*n2);
}

}  // namespace
}  // namespace eldr
