// Helpers shared by the benchmark programs.
#pragma once

#include <cstdlib>
#include <cstring>

namespace eldr::bench {

// True when run by the bench-smoke CTest label: register tiny sizes only, to prove it works.
inline bool smoke() {
  const char* v = std::getenv("ELDR_BENCH_SMOKE");
  return v != nullptr && std::strcmp(v, "0") != 0;
}

}  // namespace eldr::bench
