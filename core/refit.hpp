// refit: the online refit's core (docs/method.md section 6) -- the reservoir of live signatures it
// fits on, the fit of a candidate centroid_set aligned to the current worker identities, and the
// validation that decides whether the candidate may replace the current set.
//
// A refit reruns balanced K-means on a sample of live signatures, matches the new centroids to the
// workers that own the old ones (so each worker keeps its region and its warm caches), and
// hot-swaps the set. A candidate that fails validation -- non-finite or zero centroids, degenerate
// clusters, broken balance, or a predicted distinct-expert score worse than the current set's on
// the same sample -- is rejected with a reason, and the current set stays.
//
// Everything here is a pure function of its inputs and seeds: no clocks, no globals.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/balanced_kmeans.hpp"
#include "core/base/random.hpp"
#include "core/base/status.hpp"
#include "core/centroid_set.hpp"
#include "core/signature.hpp"

namespace eldr {

// A sample of at most `capacity` live request signatures, stored dense and unit-norm, width floats
// per row, row-major, ready for balanced_kmeans.
//
// Up to `horizon` signatures offered it is uniform (Vitter's algorithm R: after n offers each is
// held with probability capacity / n). Beyond the horizon each new signature is kept with the
// fixed probability capacity / horizon and replaces a uniformly chosen row, so a held signature
// survives the next a offers with probability about exp(-a / horizon): the sample leans to the
// last `horizon` signatures and follows a change of traffic within a few horizons (Aggarwal's
// biased reservoir, VLDB 2006). Why: refits fit the traffic the router sees now; a uniform sample
// of a router's whole history (horizon = whole_history) barely moves after days of requests.
// The cost is a row written for a fraction capacity / horizon of the signatures, for ever.
//
// Empty signatures (no entries; an all-zero dense row) carry no locality and are left out: they
// are neither held nor counted in seen() (counted in skipped()). Signatures of another width are
// refused: a centroid set with a new layer mask changes the width, and the owner then reset()s the
// sample.
//
// Thread safety: none (the router actor owns it and hands a copy of points() to the refit).
class signature_sample {
 public:
  static constexpr uint64_t whole_history = UINT64_MAX;  // algorithm R over every offer

  // Errors: capacity == 0 or width == 0 (invalid_argument); capacity * width above 2^30 floats
  // (out_of_range: a 4 GiB sample is a configuration mistake); horizon < capacity
  // (invalid_argument).
  static result<signature_sample> make(uint32_t capacity, uint32_t width, uint64_t seed,
                                       uint64_t horizon = whole_history);

  uint32_t capacity() const { return capacity_; }
  uint32_t width() const { return width_; }
  uint64_t horizon() const { return horizon_; }
  std::size_t size() const { return width_ == 0 ? 0 : points_.size() / width_; }  // rows held
  uint64_t seen() const { return seen_; }        // non-empty signatures offered since clear()
  uint64_t skipped() const { return skipped_; }  // empty signatures offered since clear()

  // Offers one signature: empty (no entries) is skipped. Errors (invalid_argument, nothing
  // changes but the random stream): width differs from width(); index and value lengths differ;
  // and, for a signature the sample keeps, indices not strictly increasing or >= width, a NaN/Inf
  // value, or entries that are all zero. The reservoir's draw comes first, and an offer it drops
  // is not read: checking and norming ~6,000 entries was most of an offer's cost (4.5 us of
  // 4.6 at width 6,144 past the automatic horizon; 0.9 us now), paid by every decision of a
  // router for a sample that keeps a few of them.
  // Values are re-normalised before storing (they are unit already when built by
  // signature_builder; this keeps float drift from tripping the fit's unit-norm check).
  status add(const signature& s);
  // Offers a dense vector of width() floats (e.g. replayed from a trace). Same errors and
  // normalisation as add(); an all-zero vector is skipped.
  status add_dense(std::span<const float> v);

  // Forgets every held row and the counts; the random stream continues (not reseeded), so a
  // cleared sample does not replay the draws it made before.
  void clear();
  // clear() and change the width (a new layer mask). Errors: width == 0, or capacity * width
  // above 2^30 floats; the sample is unchanged on error.
  status reset(uint32_t width);

  // The held rows, size() * width() floats, row-major, each unit norm. Row order is not
  // meaningful. Valid until the next non-const call.
  std::span<const float> points() const { return points_; }

 private:
  signature_sample(uint32_t capacity, uint32_t width, uint64_t seed, uint64_t horizon);
  // The reservoir step for one more non-empty signature: the row to overwrite with it, or
  // nullptr when it is not kept. undo_claim() takes the step back (the count, and the row
  // appended during the fill) when the signature turns out malformed.
  float* claim_row();
  void undo_claim();
  result<double> squared_norm(const signature& s) const;
  // The row a signature of this squared norm goes into, and the factor that scales it to unit
  // norm; no row for a zero signature (counted as skipped) or an offer the reservoir drops.
  std::pair<float*, double> admit(double squared);

  uint32_t capacity_ = 0;
  uint32_t width_ = 0;
  uint64_t horizon_ = whole_history;
  uint64_t seen_ = 0;
  uint64_t skipped_ = 0;
  rng_engine rng_;
  std::vector<float> points_;
};

// The checks a candidate must pass, and the knobs of the distinct-expert score.
struct refit_validation_options {
  // A cluster (argmax assignment of the sample to the candidate) with fewer members is degenerate.
  // 0 = max(1, N / (10 K)): a worker that almost no live request prefers.
  uint32_t min_cluster_points = 0;
  // Largest allowed argmax cluster size over its worker's share of the sample. Must be >= 1.
  double max_balance_ratio = 3.0;
  // Relative capacities of heterogeneous workers (as kmeans_options::worker_weights): worker k's
  // share is N * w_k / sum(w). Empty = equal shares N / K. refit_candidate fills it from the
  // fit's weights when left empty.
  std::vector<double> worker_weights;
  // Decode batch size of the distinct-expert score. Must be >= 1.
  uint32_t batch_size = 16;
  // The candidate is accepted only when it improves on the current set by more than this
  // fraction: candidate score * (1 + score_tolerance) < current score. 0 means "strictly
  // better" (an equal score is rejected). Must be >= 0 and finite.
  double score_tolerance = 0.0;
  // Seed of the batch draws: same seed, same inputs => same score.
  uint64_t seed = 0;
  // Threads for scoring the sample against K centroids; 0 = hardware concurrency, capped at 16.
  // The figures do not depend on it.
  uint32_t threads = 1;
};

// The outcome of validate_refit, for the admin "refit" command and the logs.
struct refit_report {
  bool accepted = false;
  // Empty when accepted; else starts with the failed check -- "sample too small",
  // "non-finite centroid", "zero centroid", "degenerate clusters", "balance broken",
  // "distinct-expert score worse", "distinct-expert score not better" -- followed by ": " and the
  // figures that failed it.
  std::string reason;

  uint32_t k = 0;
  uint64_t points = 0;              // N, sample rows
  uint32_t min_cluster_points = 0;  // the threshold used (after defaulting)
  // Argmax assignment of the sample to the candidate (ties to the lower index).
  uint32_t min_cluster_size = 0;
  uint32_t max_cluster_size = 0;
  // max over workers of cluster size / share (N / K, or weighted); the worst worker's ratio.
  double balance_ratio = 0.0;
  double objective = 0.0;  // mean cosine of every point to its best candidate centroid
  // Distinct-expert score of the candidate and of the current set on the sample (lower is
  // better). current_score is meaningful only when score_checked.
  double candidate_score = 0.0;
  double current_score = 0.0;
  bool score_checked = false;
  std::string score_note;  // why the comparison was skipped (no current set, another width)
};

// The predicted number of distinct experts a decode batch touches: the quantity ELDR's routing
// lowers (docs/method.md sections 1 and 5; a nonzero signature dimension is one expert in one kept
// layer). On the sample: every point goes to its best-scoring centroid's worker (argmax, ties to
// the lower index: where the locality band concentrates traffic); each worker with m > 0 points
// shuffles them (seeded per worker, so a worker's draw does not depend on the others) and forms
// ceil(m / B) batches of min(B, m) members, taking its shuffled list cyclically; a batch's count is
// the number of dimensions nonzero in at least one member. The score is the mean count over all
// batches of all workers (busier workers weigh more, as they run more batches).
// Errors (invalid_argument): width != set.width(); points empty or not a multiple of width;
// batch_size == 0; a non-finite coordinate.
result<double> predicted_distinct_experts(const centroid_set& set, std::span<const float> points,
                                          uint32_t width, const refit_validation_options& options);

// Runs the checks listed above, in that order, stopping at the first that fails (figures already
// computed stay filled in). `points` are N unit-norm rows of `width` floats; `current` may be null
// (the first fit): the score comparison is then skipped and score_note says so, as it is when
// current's width differs from width (a new layer mask: the two sets score different spaces). A
// current set of another K (a membership change) is still compared: the score is per batch.
// Errors (invalid_argument; a rejection is not an error): width == 0; points not a multiple of
// width; candidate.width() != width; bad options (max_balance_ratio < 1, batch_size == 0,
// score_tolerance negative or not finite, worker_weights neither empty nor K positive finite
// values); a non-finite coordinate.
result<refit_report> validate_refit(const centroid_set& candidate, const centroid_set* current,
                                    std::span<const float> points, uint32_t width,
                                    const refit_validation_options& options = {});

struct refit_options {
  uint32_t k = 0;      // workers; 0 = current->k() (required when there is no current set)
  uint64_t epoch = 0;  // the candidate's epoch; 0 = current->epoch() + 1, or 1 without a current
  // The fit. When initial_centroids is empty and the current set has the same K and width, the fit
  // starts from the current centroids (section 6: "seeded from the current centroids").
  kmeans_options kmeans;
  // Match the new centroids to the current workers (align_centroids) when K and width agree.
  bool align = true;
  refit_validation_options validation;
};

struct refit_outcome {
  // The aligned candidate, stamped with its epoch; null when the fit could not run (sample too
  // small) or produced unusable rows. Install it only when report.accepted.
  std::shared_ptr<const centroid_set> candidate;
  refit_report report;
  bool aligned = false;  // worker identities were matched to the current set
  uint32_t iterations = 0;
  bool converged = false;
  std::vector<uint32_t> fit_cluster_sizes;  // the balanced fit's own cluster sizes (aligned)
};

// Fits K centroids to the sample with balanced_kmeans, aligns them to the current set, builds the
// candidate and validates it. A candidate that fails a check is returned with accepted = false;
// the caller keeps the current set.
// Errors: width == 0 or points not a multiple of width, k unresolvable (0 without a current set),
// bad validation options (invalid_argument); anything balanced_kmeans refuses in the sample
// (zero or non-unit rows, NaN) or in options.kmeans, passed through.
result<refit_outcome> refit_candidate(std::span<const float> points, uint32_t width,
                                      const centroid_set* current, const refit_options& options);
// The same on a signature_sample's rows.
result<refit_outcome> refit_candidate(const signature_sample& sample, const centroid_set* current,
                                      const refit_options& options);

// models.sample_horizon as configured (0: automatic) -> signature_sample's horizon. Automatic is
// 8 x sample_size: a held signature is 1/e likely to be gone after 8 x sample_size more, and
// an eighth of the signatures offered past the horizon is written into the sample.
uint64_t resolved_sample_horizon(uint32_t sample_size, uint64_t configured);

// The node's refit rule: the [[models]] knobs that shape one online refit (docs/configuration.md),
// in one place for the node's refit actor and the simulator's online refit, so that eldr-sim's
// eldr-online refits exactly as a node with the same knobs would.
struct refit_rule {
  uint32_t min_sample = 256;       // models.min_sample: no refit on fewer live signatures
  double max_balance_ratio = 3.0;  // models.max_balance_ratio
  double score_tolerance = 0.0;    // models.score_tolerance
  uint32_t batch_size = 16;        // models.refit_batch_size
  uint64_t seed = 1;               // models.seed

  // "" when a sample of `rows` live signatures may be refitted on, else the rejection reason
  // ("sample too small: ...").
  std::string sample_shortfall(std::size_t rows) const;
  // The options of the run-th refit against `current` (K = current's, the fit seeded with
  // seed + run on one thread, the validation as the rule says). worker_weights: the current set's
  // relative capacities (centroid_file::worker_weights), empty for equal workers.
  refit_options options(const centroid_set& current, std::span<const float> worker_weights,
                        uint64_t run) const;
};

}  // namespace eldr
