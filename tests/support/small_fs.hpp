// A small tmpfs for tests of a full file system. It is mounted in a private mount namespace of
// the test process when the process is still single-threaded (ctest runs every test in its own
// process), so that it vanishes with the process even if that aborts; as a user that is not
// root, inside a user namespace of its own. Otherwise (root, threads running) it is mounted
// where the test runs and unmounted at destruction. `why` says what failed when neither works:
// tests skip with it.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace eldr::testing {

inline bool private_mount_namespace() {
  static const bool done = [] {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto threads =
        std::distance(fs::directory_iterator("/proc/self/task", ec), fs::directory_iterator());
    if (ec || threads != 1) return false;
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (uid != 0) {
      if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return false;
      std::ofstream("/proc/self/setgroups") << "deny";
      std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
      std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
    } else if (::unshare(CLONE_NEWNS) != 0) {
      return false;
    }
    return ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  }();
  return done;
}

struct small_fs {
  std::string dir;
  bool mounted = false;
  bool private_ns = false;
  std::string why;

  small_fs(const std::string& where, const std::string& size) : dir(where) {
    std::filesystem::create_directories(dir);
    private_ns = private_mount_namespace();
    if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, ("size=" + size).c_str()) == 0)
      mounted = true;
    else
      why = std::string("cannot mount a tmpfs: ") + std::strerror(errno) +
            " (needs root, as in CI, or unprivileged user namespaces)";
  }
  ~small_fs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
  small_fs(const small_fs&) = delete;
  small_fs& operator=(const small_fs&) = delete;

  // Writes `path` until the file system is full.
  static bool fill(const std::string& path) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return false;
    std::vector<char> buf(64 << 10, 'f');
    for (size_t chunk : {buf.size(), size_t{4096}, size_t{512}, size_t{1}})
      while (::write(fd, buf.data(), chunk) == static_cast<ssize_t>(chunk)) {
      }
    const bool full = errno == ENOSPC;
    ::close(fd);
    return full;
  }
};

}  // namespace eldr::testing
