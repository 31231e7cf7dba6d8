// version: eldr's version, from CMake's project(VERSION) (core/CMakeLists.txt defines
// ELDR_VERSION for everything that links eldr_core), so the node's status, eldrctl, the tools'
// provenance and the packages all say the same.
#pragma once

#include <string_view>

namespace eldr {

inline constexpr std::string_view version = ELDR_VERSION;

}  // namespace eldr
