// A unique temporary directory for one test, removed with everything in it at destruction.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace eldr::testing {

class temp_dir {
 public:
  explicit temp_dir(const std::string& tag = "eldr") {
    std::string pattern = (std::filesystem::temp_directory_path() / (tag + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  // Empty when mkdtemp failed (tests assert on it).
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace eldr::testing
