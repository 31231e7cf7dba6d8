// Locating the shared, read-only data (../shared/data) from tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace eldr::testing {

// Full path of a file in the shared data folder, or nullopt when it is not there. The folder is
// $ELDR_SHARED_DATA when set, else ../shared/data beside the source tree.
inline std::optional<std::string> shared_data_file(const std::string& name) {
  const char* env = std::getenv("ELDR_SHARED_DATA");
  std::filesystem::path dir = env != nullptr ? env : ELDR_DEFAULT_SHARED_DATA;
  std::filesystem::path p = dir / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  return p.string();
}

}  // namespace eldr::testing

// Skips the current test, saying which file is missing, when shared data is absent.
#define ELDR_REQUIRE_SHARED_DATA(var, name)                            \
  auto var##_opt = ::eldr::testing::shared_data_file(name);            \
  if (!var##_opt)                                                      \
    GTEST_SKIP() << "shared data file " << (name)                      \
                 << " not found (set ELDR_SHARED_DATA to its folder)"; \
  const std::string var = *var##_opt
