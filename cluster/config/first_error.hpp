// first_error: keeps the first failed status of a sequence of checks, so that the config readers
// (node_config.cpp, node_files.cpp) are flat lists of fields and files, each checked in turn.
#pragma once

#include <utility>

#include "core/base/status.hpp"

namespace eldr {

// Later steps still run but cannot replace the first error; get() is ok when none failed.
class first_error {
 public:
  void operator()(status s) {
    if (first_.ok() && !s.ok()) first_ = std::move(s);
  }
  const status& get() const { return first_; }

 private:
  status first_;
};

}  // namespace eldr
