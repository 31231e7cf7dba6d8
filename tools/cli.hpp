// cli: the command-line parse every eldr program shares, so that they all exit alike.
//
// CLI11's own exit codes (105 "extras", 106 "validation", 109 "required", ...) are not the
// documented contract: every eldr program exits 2 on a usage error and 0 for --help, after
// CLI11 has printed its message. Header-only, because tools/ has no library of its own.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>

namespace eldr {

// Parses argv into app. nullopt: go on. Otherwise the program's exit code: 0 after --help (or
// --version), 2 after a usage error; CLI11 has printed what to print.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace eldr
