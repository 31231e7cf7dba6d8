// route_fallback: why a decision of a locality policy ("eldr", "eldr-adaptive") was made by load
// only, the warnings a route reply carries about it, and a rate limit for the log lines they cause.
// A precise scorer that quietly degrades to load balancing looks healthy while it is not; the
// router names every such decision in the reply (`fallback`, `warnings`), counts it and logs it
// (docs/protocol.md section 3, docs/node.md). Plain logic, so it is tested without actors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/geometry.hpp"

namespace eldr {

// Wire-stable names (to_string) travel in route_reply.fallback and in metric labels.
enum class fallback_reason : uint8_t {
  none = 0,            // the configured policy decided (or it is not a locality policy)
  no_centroid_set,     // "eldr*" without a centroid set of the pool's K: routed JSQ
  no_signature_cache,  // signing failed (no signature-cache node, or it did not answer)
  no_counts,           // no block of the request has known counts (none sent, none cached)
  counts_geometry,     // the request's counts are of another geometry than the model's
  signature_unusable,  // blocks had counts but no signature came of them (the cache holds
                       // another geometry than the centroid set, a shard's sums did not fit)
};
inline constexpr std::size_t fallback_reason_count = 6;

const char* to_string(fallback_reason r);

// What the router knows about one decision.
struct fallback_facts {
  bool locality_policy = false;  // the model's policy needs centroids ("eldr", "eldr-adaptive")
  bool set_active = false;       // a centroid set of the pool's K is installed
  bool cache_answered = false;   // the signature cache signed the request
  uint32_t covered = 0;          // blocks with known counts
  bool have_signature = false;   // a signature under the current spec, used by the decision
  bool counts_refused = false;   // the request's own counts were refused for their geometry
};

// The reason the decision was by load only, or none. A signature wins over refused counts: the
// cached blocks' counts still made one (the warning about the counts stands).
fallback_reason classify_fallback(const fallback_facts& f);

// "counts_geometry: counts are L=48 E=64 k=6, the model is L=48 E=128 k=8; routed by load"
// (`routed_by_load` false: "; routed on the cached blocks' counts").
std::string counts_geometry_warning(const model_geometry& counts, const model_geometry& model,
                                    bool routed_by_load);
// The same when only the signature cache knows the model's geometry: its refusal, verbatim.
std::string counts_geometry_warning(const std::string& refusal, bool routed_by_load);

// At most one line per interval; the lines held back in between are counted, so the next line
// can say how many there were. Time is passed in (milliseconds, any monotonic origin).
class log_limiter {
 public:
  log_limiter() = default;  // 10 s
  explicit log_limiter(int64_t interval_ms) : interval_ms_(interval_ms) {}
  // True when a line may be written at now_ms; `suppressed` gets the lines held back since the
  // last one written (0 on the first).
  bool allow(int64_t now_ms, uint64_t& suppressed);
  // The end of a line written after `suppressed` were held back: " [N more since the last
  // line]", or "" when none were.
  static std::string held_note(uint64_t suppressed);

 private:
  int64_t interval_ms_ = 10000;
  bool logged_ = false;
  int64_t last_ms_ = 0;
  uint64_t held_ = 0;
};

}  // namespace eldr
