// file_io: whole-file reads and atomic writes with errors that name the path.
#include "core/base/file_io.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace eldr {

result<std::vector<uint8_t>> read_file(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory)
      return status::not_found(path + ": no such file");
    return status::io_error(path + ": " + ec.message());
  }
  if (size > max_bytes)
    return status::out_of_range(path + ": " + std::to_string(size) +
                                " bytes exceeds the limit of " + std::to_string(max_bytes));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return status::io_error(path + ": " + std::strerror(errno));
  std::vector<uint8_t> bytes(static_cast<std::size_t>(size));
  const std::size_t got = bytes.empty() ? 0 : std::fread(bytes.data(), 1, bytes.size(), f);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed || got != bytes.size())
    return status::io_error(path + ": short read (" + std::to_string(got) + " of " +
                            std::to_string(bytes.size()) + " bytes)");
  return bytes;
}

status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  const std::string temp = path + ".tmp";
  std::FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) return status::io_error(temp + ": " + std::strerror(errno));
  const std::size_t put = bytes.empty() ? 0 : std::fwrite(bytes.data(), 1, bytes.size(), f);
  const bool flushed = std::fflush(f) == 0;
  const bool closed = std::fclose(f) == 0;
  if (put != bytes.size() || !flushed || !closed) {
    std::remove(temp.c_str());
    return status::io_error(temp + ": write failed: " + std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::remove(temp.c_str());
    return status::io_error(path + ": cannot replace it with " + temp + ": " + ec.message());
  }
  return {};
}

}  // namespace eldr
