// Running a real program from a test: its exit code and everything it printed.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace eldr::testing {

struct process_result {
  int exit_code = -1;  // the program's exit status; -1 when it did not exit normally
  std::string output;  // stdout and stderr, interleaved
};

// Runs `command` through /bin/sh with stderr merged into stdout and waits for it.
inline process_result run_command(const std::string& command) {
  process_result r;
  std::FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
    r.output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  if (status != -1 && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

}  // namespace eldr::testing
