// file_io: whole-file reads and crash-safe whole-file writes, for the formats core/ owns
// (eldr-trace, centroid files).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// The whole file. Errors (io_error / not_found) name the path and the OS's reason. max_bytes
// guards against reading something absurd by mistake (out_of_range when exceeded).
result<std::vector<uint8_t>> read_file(const std::string& path,
                                       uint64_t max_bytes = uint64_t{4} << 30);

// Writes bytes to a temporary file beside `path`, flushes it, then renames it over `path`: a
// crash leaves either the old file or the new one, never half of one.
status write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace eldr
