// A fixture for tests of signature_cache on a real RocksDB: a temporary directory for the database
// and a clock that is a variable the test advances.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "storage/signature_cache.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr::testing {

class signature_cache_fixture : public ::testing::Test {
 protected:
  signature_cache_fixture(const std::string& dir_tag, const model_geometry& geometry)
      : dir(dir_tag), geometry_(geometry) {}

  // The defaults for the fixture's geometry, on its clock; a test changes what it is about.
  signature_cache_options options() {
    signature_cache_options o;
    o.geometry = geometry_;
    o.clock = [this] { return now; };
    return o;
  }
  // Opens the cache in dir/db (again after a reset: a warm reopen); null, with a failure, when it
  // cannot.
  std::unique_ptr<signature_cache> open(signature_cache_options o) {
    auto c = signature_cache::open(dir.sub("db"), std::move(o));
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    return c.ok() ? std::move(*c) : nullptr;
  }

  temp_dir dir;
  int64_t now = 1000;  // the cache's clock, in ms

 private:
  model_geometry geometry_;
};

}  // namespace eldr::testing
