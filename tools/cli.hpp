// cli: the command-line parse every eldr program shares, so that they all exit alike.
//
// CLI11's own exit codes (105 "extras", 106 "validation", 109 "required", ...) are not the
// documented contract: every eldr program exits 2 on a usage error and 0 for --help, after
// CLI11 has printed its message. Header-only, so that every tool takes it without linking
// tools/common (the options only the workload tools share, tools/common/cli_options.hpp).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

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

// An option whose --help shows its default, checked by `valid`.
template <typename T>
CLI::Option* add_defaulted(CLI::App& app, const std::string& name, T& value,
                           const std::string& help, const CLI::Validator& valid) {
  return app.add_option(name, value, help)->capture_default_str()->check(valid);
}

}  // namespace eldr
