// fit: the offline calibration pipeline of ELDR in one call, shared by eldr-fit and the simulator
// (docs/method.md sections 1-4): IDF, rho per signature transform, greedy layer selection, the
// signatures of the calibration prompts, and one balanced centroid per decode worker.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/balanced_kmeans.hpp"
#include "core/base/status.hpp"
#include "core/formats/trace.hpp"
#include "core/signature.hpp"
#include "core/signature_quality.hpp"

namespace eldr {

// Dense prefill (prompt tokens) and decode (output tokens) counts of the given requests of a
// trace, in the order given; an empty `requests` means every request. Errors: an index out of
// range, or ids that do not match the geometry (name the request).
result<calibration_counts> count_trace(const trace& t, std::span<const uint32_t> requests = {});

struct fit_options {
  uint32_t workers = 0;  // K >= 1
  // nullopt: pick the transform with the best rho over all layers (the paper's Fig. 7 measure).
  std::optional<signature_transform> transform;
  bool all_layers = false;  // keep every layer instead of the selected N*
  // Skip greedy layer selection entirely (the curve stays empty); implies all_layers.
  bool skip_layer_selection = false;
  kmeans_variant variant = kmeans_variant::balanced;
  bool fit_other_variant = false;      // also fit the other variant, for comparison
  std::vector<double> worker_weights;  // empty or K positive capacities (balanced only)
  uint32_t pairs = default_rho_pairs;
  uint64_t seed = 1;  // rho's pairs and k-means++
  uint32_t threads = 2;
};

struct fit_result {
  std::array<double, 4> rho{};  // rho over all layers, indexed like all_transforms
  signature_transform transform = signature_transform::count;
  layer_curve curve;        // empty when layer selection was skipped
  double rho_masked = 0.0;  // rho of the chosen transform over the kept layers
  std::shared_ptr<const signature_spec> spec;
  std::size_t zero_signatures = 0;  // calibration prompts left out of K-means (all-zero)
  std::size_t fit_points = 0;
  kmeans_result kmeans;                // of options.variant
  std::optional<kmeans_result> other;  // the other variant, when asked for
  double layer_seconds = 0.0, kmeans_seconds = 0.0, other_seconds = 0.0;
  // The pairs behind rho (the chosen transform's evaluator; every transform draws the same ones):
  // requested (options.pairs), how many distinct unordered pairs that was, and how many the
  // calibration requests with decode tokens (rho_requests) allow.
  uint32_t rho_pairs_requested = 0;
  std::size_t rho_pairs_distinct = 0;
  uint64_t rho_pairs_possible = 0;
  std::size_t rho_requests = 0;
};

// Below this many distinct pairs a rank correlation is noise, whatever --pairs says.
inline constexpr std::size_t min_reliable_rho_pairs = 100;

// "" when rho stands on enough distinct pairs; else a one-line warning naming the figures: the
// trace repeats pairs (distinct < 90% of requested, e.g. 3 requests give 3 distinct pairs however
// many are drawn) or too few pairs exist for a reliable rho (< min_reliable_rho_pairs).
std::string rho_pairs_warning(const fit_result& r);

// Runs the pipeline on calibration counts. Errors: fewer than 2 requests with decode tokens (rho),
// workers == 0, fewer non-zero signatures than workers, and those of the steps it calls.
result<fit_result> fit_centroids(const calibration_counts& cal, const fit_options& options);

// Dense signatures (spec.width() floats each) of the non-zero rows of N dense L * E count rows,
// back to back; all-zero signatures are skipped and counted in *zero_rows when given.
std::vector<float> signature_points(const signature_spec& spec, std::span<const uint32_t> counts,
                                    std::size_t* zero_rows = nullptr);

}  // namespace eldr
