// random: seeded, portable random numbers for everything in eldr that must be deterministic.
//
// std::uniform_int_distribution and friends are implementation-defined, so the same seed gives
// different draws under libstdc++ and libc++; results that must reproduce (pair samples for rho,
// K-means seeds, synthetic traces, random routing) draw through these helpers instead.
#pragma once

#include <cstdint>
#include <random>

namespace eldr {

using rng_engine = std::mt19937_64;

// Uniform integer in [0, n), n >= 1, without modulo bias: draws that fall in the incomplete last
// stretch of 2^64 are rejected.
inline uint64_t uniform_index(rng_engine& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % n + 1) % n;  // last accepted draw
  uint64_t r = rng();
  while (r > limit)
    r = rng();
  return r % n;
}

// Uniform double in [0, 1) with 53 random bits.
inline double uniform_unit(rng_engine& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace eldr
