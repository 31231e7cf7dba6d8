// A child process that a test talks to while it runs: argv exec'd with its stdin and stdout on
// pipes, lines read with a bounded deadline (an external process must catch up; no sleeps),
// killed and reaped on destruction. For run-to-completion programs see process.hpp.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace eldr::testing {

class child_process {
 public:
  // stdin and stdout are pipes; stderr is inherited (the test's log).
  explicit child_process(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe(in) != 0) return;
    if (::pipe(out) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return;
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::close(in[0]);
      ::close(in[1]);
      ::close(out[0]);
      ::close(out[1]);
      std::vector<char*> args;
      for (const std::string& a : argv)
        args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
  }
  ~child_process() {
    if (to_child_ >= 0) ::close(to_child_);
    if (running()) {
      signal(SIGKILL);
      wait();
    }
    if (from_child_ >= 0) ::close(from_child_);
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exit_status_; }

  bool write_line(const std::string& line) {
    const std::string s = line + "\n";
    return ::write(to_child_, s.data(), s.size()) == static_cast<ssize_t>(s.size());
  }
  // Next line of the child's stdout, or nullopt at EOF or after `timeout`.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{from_child_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char chunk[4096];
      const ssize_t n = ::read(from_child_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }
  void signal(int sig) {
    if (running()) ::kill(pid_, sig);
  }
  // Reaps the child; returns its wait status (see WIFEXITED and friends).
  int wait() {
    if (!exit_status_ && pid_ > 0) {
      int st = 0;
      ::waitpid(pid_, &st, 0);
      exit_status_ = st;
    }
    return exit_status_.value_or(-1);
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffer_;
  std::optional<int> exit_status_;
};

}  // namespace eldr::testing
