// Every eldr program, run as built: a usage error exits 2 (the documented code, not CLI11's
// 105/106/109) after CLI11's message, and --help exits 0 (tools/cli.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/support/process.hpp"

namespace eldr {
namespace {

const std::string bin = std::string(ELDR_BINARY_DIR) + "/tools/";

class ToolUsage : public ::testing::TestWithParam<const char*> {};

TEST_P(ToolUsage, UsageErrorsExitTwoAndHelpExitsZero) {
  const std::string tool = bin + GetParam() + "/" + GetParam();
  if (!std::filesystem::exists(tool)) GTEST_SKIP() << tool << " is not built";
  const auto unknown = testing::run_command(tool + " --no-such-flag");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  // CLI11 names the first problem it finds (a missing required option may come first).
  EXPECT_NE(unknown.output.find("Run with --help for more information"), std::string::npos)
      << unknown.output;
  const auto help = testing::run_command(tool + " --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_NE(help.output.find("--help"), std::string::npos) << help.output;
}

INSTANTIATE_TEST_SUITE_P(EveryProgram, ToolUsage,
                         ::testing::Values("eldr-node", "eldrctl", "eldr-fit", "eldr-sim",
                                           "eldr-sigcache", "eldr-loadgen"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           std::string name = param.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace eldr
