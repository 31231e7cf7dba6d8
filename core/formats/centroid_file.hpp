// centroid_file: the versioned file that carries a fitted centroid set from eldr-fit to routers
// (and to eldrctl's import, the simulator, and the signature cache's centroid history).
//
// It holds everything a router needs to turn counts into a signature and score it: the model
// geometry, the transform, the layer mask, the IDF weights (count_idf only), and one unit-norm
// centroid per decode worker, plus provenance of the fit. Format: docs/centroid-file.md
// (a MessagePack map, so any language with a MessagePack library can read it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/base/status.hpp"
#include "core/signature.hpp"

namespace eldr {

inline constexpr uint32_t centroid_file_version = 1;

// How the set was made; informational, never used for routing decisions.
struct fit_provenance {
  std::string source;  // trace file or synthetic preset
  std::string tool;    // e.g. "eldr-fit 0.1.0"
  uint64_t seed = 0;
  uint32_t calibration_requests = 0;
  double rho = 0.0;            // signature quality of the chosen transform and mask
  double objective = 0.0;      // mean cosine distance of calibration points to their centroid
  std::string kmeans_variant;  // "balanced" or "vanilla"
};

struct centroid_file {
  std::string model_name;
  signature_spec spec;
  uint64_t epoch = 0;
  uint32_t workers = 0;               // K: centroid k belongs to decode worker k
  std::vector<float> centroids;       // workers * spec.width(), row-major, unit rows
  std::vector<float> worker_weights;  // empty (equal) or `workers` positive capacities
  fit_provenance provenance;
};

// Checks sizes, finiteness and unit norms (within 1e-3). Errors name the field.
status validate_centroid_file(const centroid_file& f);

std::vector<uint8_t> encode_centroid_file(const centroid_file& f);
// name_for_errors prefixes every message (usually the path).
result<centroid_file> parse_centroid_file(std::span<const uint8_t> bytes,
                                          const std::string& name_for_errors);
result<centroid_file> read_centroid_file(const std::string& path);
// Validates, then writes atomically (never half a file).
status write_centroid_file(const centroid_file& f, const std::string& path);

}  // namespace eldr
