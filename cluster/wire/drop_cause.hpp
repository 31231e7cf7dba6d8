// drop_cause: why a message, an event or a block was dropped on ingest. Counted per publisher and
// per cause, logged once per cause with rate limiting, and shown by `eldr-sigcache dump`.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace eldr {

enum class drop_cause : uint8_t {
  bad_frames,           // not the expected frame count, or a sequence frame that is not 8 bytes
  bad_msgpack,          // the payload is not one well-formed MessagePack value
  bad_batch,            // the outer batch has the wrong shape or field types
  bad_event,            // an event of a known type with wrong field types (the event is skipped)
  oversized,            // an event or message beyond the configured limits (e.g. too many hashes)
  unknown_event_type,   // an event type this version does not know (skipped, as vLLM asks)
  bad_counts,           // a counts block that does not validate (ids >= E, sums, layer sizes)
  counts_geometry,      // counts of another model geometry than the cache's
  unsupported_version,  // a counts message of a version this build does not read
  capacity,             // refused by a storage bound (max blocks, max holders, ingest backlog)
  publisher_quota,      // blocks refused because their publisher holds its share of max_blocks
};
inline constexpr size_t drop_cause_count = 11;

const char* to_string(drop_cause c);

// Per-cause counters.
using drop_counters = std::array<uint64_t, drop_cause_count>;

}  // namespace eldr
