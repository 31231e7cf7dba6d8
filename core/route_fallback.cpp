// route_fallback: see route_fallback.hpp.
#include "core/route_fallback.hpp"

namespace eldr {

const char* to_string(fallback_reason r) {
  switch (r) {
    case fallback_reason::none:
      return "";
    case fallback_reason::no_centroid_set:
      return "no_centroid_set";
    case fallback_reason::no_signature_cache:
      return "no_signature_cache";
    case fallback_reason::no_counts:
      return "no_counts";
    case fallback_reason::counts_geometry:
      return "counts_geometry";
    case fallback_reason::signature_unusable:
      return "signature_unusable";
  }
  return "unknown";
}

fallback_reason classify_fallback(const fallback_facts& f) {
  if (!f.locality_policy) return fallback_reason::none;
  if (!f.set_active) return fallback_reason::no_centroid_set;
  if (f.have_signature) return fallback_reason::none;
  if (f.counts_refused) return fallback_reason::counts_geometry;
  if (!f.cache_answered) return fallback_reason::no_signature_cache;
  if (f.covered == 0) return fallback_reason::no_counts;
  return fallback_reason::signature_unusable;
}

namespace {
const char* outcome(bool routed_by_load) {
  return routed_by_load ? "; routed by load" : "; routed on the cached blocks' counts";
}
}  // namespace

std::string counts_geometry_warning(const model_geometry& counts, const model_geometry& model,
                                    bool routed_by_load) {
  return "counts_geometry: counts are " + counts.to_string() + ", the model is " +
         model.to_string() + outcome(routed_by_load);
}

std::string counts_geometry_warning(const std::string& refusal, bool routed_by_load) {
  return "counts_geometry: " + refusal + outcome(routed_by_load);
}

std::string log_limiter::held_note(uint64_t suppressed) {
  return suppressed > 0 ? " [" + std::to_string(suppressed) + " more since the last line]" : "";
}

bool log_limiter::allow(int64_t now_ms, uint64_t& suppressed) {
  if (logged_ && now_ms - last_ms_ < interval_ms_) {
    ++held_;
    return false;
  }
  suppressed = held_;
  held_ = 0;
  logged_ = true;
  last_ms_ = now_ms;
  return true;
}

}  // namespace eldr
