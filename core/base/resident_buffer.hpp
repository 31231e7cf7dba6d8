// resident_buffer: makes a vector's whole capacity resident before it is written, for buffers
// that are filled a row at a time on a latency-sensitive path (the refit's signature sample,
// core/refit.hpp, is written by route decisions).
//
// Why: the first write to each page of a fresh allocation faults in the kernel. A 4,096-row
// sample of 6,144-float signatures is 100 MB, 25,000 pages: filling it cost the first ~4,000
// decisions of every router about 0.1 ms each on a virtual machine, in each node of a cluster at
// once (BENCHMARKS.md, "The tail at the start of each run"). Here it is paid once, when the buffer
// is made, and with transparent huge pages where the kernel offers them on request (Linux
// MADV_HUGEPAGE; THP "always" or "madvise"), in a few dozen faults instead of 25,000.
//
// The hint is best effort: where madvise is missing or refuses, the pages are still touched,
// only in 4 KiB steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace eldr {

// Reserves `n` elements in `v` (emptied first), asks for huge pages over the aligned interior of
// the allocation, and touches every page; returns with v empty and its capacity resident.
template <class T>
void make_resident(std::vector<T>& v, std::size_t n) {
  v.clear();
  v.shrink_to_fit();
  v.reserve(n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
  const std::uintptr_t first = (begin + huge - 1) & ~(huge - 1);
  const std::uintptr_t last = (begin + n * sizeof(T)) & ~(huge - 1);
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#endif
  v.resize(n);  // the zero fill touches every page
  v.clear();    // the capacity, and its pages, stay
}

}  // namespace eldr
