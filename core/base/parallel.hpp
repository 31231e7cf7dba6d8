// parallel: the one fork-join helper core/ uses to spread independent work over a few threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace eldr {

// Runs fn(begin, end) over contiguous slices of [0, count), one per thread, the last on the
// caller. Slices never share output, so results do not depend on the thread count. If the OS
// refuses a thread, the caller takes over the rest: slower, never an exception.
template <class Fn>
void parallel_slices(uint32_t threads, std::size_t count, const Fn& fn) {
  std::vector<std::thread> pool;
  std::size_t begin = 0;
  if (threads > 1 && count > 1) {
    pool.reserve(threads - 1);
    const std::size_t step = (count + threads - 1) / threads;
    for (uint32_t t = 0; t + 1 < threads && begin + step < count; ++t, begin += step) {
      try {
        pool.emplace_back([&fn, begin, step] { fn(begin, begin + step); });
      } catch (const std::system_error&) {
        break;
      }
    }
  }
  fn(begin, count);
  for (auto& th : pool)
    th.join();
}

// Runs fn(i) for every i in [0, count), split as parallel_slices does.
template <class Fn>
void parallel_for_each_index(uint32_t threads, std::size_t count, const Fn& fn) {
  parallel_slices(threads, count, [&fn](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      fn(i);
  });
}

}  // namespace eldr
