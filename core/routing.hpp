// routing: every policy that picks a decode worker for a request after prefill, behind one
// interface that the router and the simulator call identically (docs/method.md section 5).
//
// Policies: "rr" round-robin, "random", "jsq" join-shortest-queue, "p2c" power-of-two choices,
// "domain" (the paper's oracle: JSQ inside a pool sized by the request's domain share), "eldr"
// (the paper's locality band) and "eldr-adaptive" (the locality band within a load slack that
// grows with the load). One implementation of each, never a copy for the simulator.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"
#include "core/centroid_set.hpp"
#include "core/signature.hpp"

namespace eldr {

// What a policy sees of one request and of the cluster at the moment of the decision. The spans
// are borrowed for the duration of route() only.
struct route_input {
  // The request's signature ("eldr", "eldr-adaptive"). nullptr or empty = all-zero: every eligible
  // worker is then in the band, i.e. plain JSQ (a request whose signature is missing is still
  // served).
  const signature* sig = nullptr;
  // In-flight decode requests per worker; size must be the policy's K.
  std::span<const uint32_t> load;
  // Empty = every worker may be chosen; else size K, nonzero = eligible (drained or timed-out
  // workers are 0).
  std::span<const uint8_t> eligible;
  // Domain index for "domain" (0 .. #domains-1), -1 = unknown. Ignored by the other policies.
  int32_t label = -1;
};

// The outcome of one decision.
struct route_decision {
  uint32_t worker = 0;  // chosen decode worker, < K
  // How many workers the final pick was made among: the locality band after widening ("eldr",
  // "eldr-adaptive"),
  // the request's pool restricted to eligible workers ("domain"), the eligible workers ("jsq"),
  // the sampled pair ("p2c", 1 when only one worker is eligible), 1 ("rr", "random").
  uint32_t band_size = 0;
  // "eldr": max s_k over eligible workers; "eldr-adaptive": over its load-admissible workers; 0
  // for other policies.
  float best_score = 0.0f;
  float worker_score = 0.0f;  // "eldr*": s_k of the chosen worker; 0 for other policies
  uint64_t epoch = 0;         // "eldr*": epoch of the centroid set used; 0 for other policies
};

// Why a decision went the way it did, for the admin surface's "explain". Filling it may allocate
// (vectors are reused, so only while their capacity grows); the fast path passes no trace.
struct route_trace {
  std::vector<float> score;          // "eldr*": s_k for every worker; empty for other policies
  std::vector<uint32_t> candidates;  // the workers the pick was made among, ascending
  float threshold = 0.0f;            // "eldr*": best score - tau; 0 for other policies
  bool widened = false;              // "eldr*": a single-worker band was widened to the top two
  // "eldr-adaptive": the highest load a worker could have and still be picked (min load + slack);
  // 0 for other policies.
  uint32_t load_limit = 0;
};

// "eldr-adaptive"'s default load slack (policy_config::load_slack); docs/evaluation.md has the
// sensitivity study behind it.
inline constexpr float default_load_slack = 0.5f;
// "eldr-adaptive"'s default group_min_load (policy_config::group_min_load): below this lightest
// load the rule does not group at all (docs/evaluation.md, "Where grouping starts").
inline constexpr uint32_t default_group_min_load = 3;

// Construction parameters for make_policy. Each policy reads only its own fields.
struct policy_config {
  // K, the number of decode workers (>= 1). "eldr" and "eldr-adaptive" may leave it 0 to take K
  // from their centroids; when set, it must equal centroids->k().
  uint32_t workers = 0;
  uint64_t seed = 0;  // "random", "p2c": same seed, same inputs => same decisions
  // "eldr*": band half-width, finite and >= 0 (the paper sweeps 0, 0.1, 0.2, 0.3).
  float tau = 0.1f;
  // "eldr*": when tau > 0 and the band holds one worker, widen it to the top two by score (the
  // artifact's measured recipe). Needs at least two eligible workers to have an effect.
  bool widen_single = true;
  // "eldr*": the centroid set; required.
  std::shared_ptr<const centroid_set> centroids;
  // "eldr-adaptive": how far above the least-loaded eligible worker's load a worker's load may be,
  // as a fraction of that load, for the worker to be in the band; finite and >= 0.
  float load_slack = default_load_slack;
  // "eldr-adaptive": the lightest eligible load at which grouping starts; below it the allowance
  // is 0 and the pick is the balancer's.
  uint32_t group_min_load = default_group_min_load;
  // "domain": calibration requests per domain label; its size is the number of domains.
  std::vector<uint64_t> domain_counts;
};

// The interface. route() is the same non-virtual entry point for every policy: it validates what
// all policies share (load size, eligibility mask, at least one eligible worker) once, then asks
// the policy to pick. A virtual call per decision costs nanoseconds against the scoring's
// microseconds, and it lets the router and the simulator select policies by name at run time.
//
// Thread safety: route() and install() mutate policy state (round-robin cursor, random generator,
// scratch, centroid set), so one policy object serves one thread at a time (the router's routing
// actor, or the simulator).
class routing_policy {
 public:
  virtual ~routing_policy();
  routing_policy(const routing_policy&) = delete;
  routing_policy& operator=(const routing_policy&) = delete;

  // The name make_policy knows the policy by ("rr", "random", "jsq", "p2c", "domain", "eldr",
  // "eldr-adaptive").
  virtual std::string_view name() const = 0;
  // K: every route_input must carry K loads.
  uint32_t workers() const { return workers_; }

  // Picks a worker. Never allocates when trace is nullptr and the input is valid.
  // Errors: invalid_argument when load.size() != K, eligible is neither empty nor of size K, or a
  // policy-specific field is wrong (signature width or structure, unknown label);
  // failed_precondition when no worker is eligible.
  result<route_decision> route(const route_input& in, route_trace* trace = nullptr);

 protected:
  explicit routing_policy(uint32_t workers) : workers_(workers) {}

  // Called with validated input; eligible_count >= 1 is the number of eligible workers. A non-null
  // trace holds the previous decision's data: implementations overwrite every field.
  virtual result<route_decision> pick(const route_input& in, uint32_t eligible_count,
                                      route_trace* trace) = 0;

 private:
  uint32_t workers_;
};

// The machinery shared by the policies that score a request against a centroid set ("eldr",
// "eldr-adaptive"): the set, its swap, and the scores of the current decision.
//
// install() swaps the set between two decisions, on the thread that routes (the simulator's
// refit does this). The router never swaps a set under a live policy: an import, refit or
// membership change builds a new policy and replaces the old one in its own actor.
class centroid_policy : public routing_policy {
 public:
  float tau() const { return tau_; }
  bool widen_single() const { return widen_single_; }

  // Replaces the centroid set; the next route() uses it. Like route(), not thread-safe.
  // Errors (invalid_argument): next is null, or its K differs from workers() (K is fixed for the
  // policy's life; a membership change builds a new policy). The width may change (a refit with
  // a new layer mask); signatures of the old width are then rejected by route().
  status install(std::shared_ptr<const centroid_set> next);
  // The set the next decision will use.
  const std::shared_ptr<const centroid_set>& centroids() const { return centroids_; }

 protected:
  centroid_policy(std::shared_ptr<const centroid_set> centroids, float tau, bool widen_single);
  // Errors (invalid_argument) of the constructor's arguments, naming the policy: centroids null;
  // tau NaN, infinite or negative.
  static status check(std::string_view policy, const centroid_set* centroids, float tau);

  // Fills scores() with s_k = c_k . v for every worker (all zero for a missing or all-zero
  // signature). Returns the set the decision uses, alive until the next install(). Errors: those of
  // centroid_set::score (width or structure of the signature).
  result<const centroid_set*> score(const route_input& in);
  std::span<float> scores() { return scores_; }

 private:
  float tau_;
  bool widen_single_;
  std::shared_ptr<const centroid_set> centroids_;
  std::vector<float> scores_;  // K floats of scratch, sized once: K never changes
};

// ELDR's locality band: s = scores against the current centroid set; band = eligible workers
// with s_k >= max(s) - tau (widened to the top two when enabled, see policy_config); the
// least-loaded band member wins, ties to the lowest index. Deterministic: no randomness. This is
// exactly the paper's rule: an outside comparison with the paper's artifact depends on it.
class locality_band_policy final : public centroid_policy {
 public:
  // Errors (invalid_argument): centroids is null; tau is NaN, infinite or negative.
  static result<std::unique_ptr<locality_band_policy>> make(
      std::shared_ptr<const centroid_set> centroids, float tau = 0.1f, bool widen_single = true);

  std::string_view name() const override { return "eldr"; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t eligible_count,
                              route_trace* trace) override;

 private:
  using centroid_policy::centroid_policy;
};

// "eldr-adaptive": the locality band restricted to the workers whose load is within a slack of
// the least-loaded eligible worker's, the slack growing with that load (docs/evaluation.md has the
// measurements behind the rule and its default):
//
//   m     = min load over eligible workers;  a = m >= group_min_load ? floor(load_slack * m) : 0
//   C     = eligible workers with load <= m + a                 (the load-admissible set)
//   band  = a == 0: all of C; a >= 1: members of C with s_k >= max over C of s - tau (widened
//           to C's top two by score when it holds one worker, tau > 0 and widen_single)
//   pick  = the least-loaded band member; ties to the worker this policy routed to least
//           recently, then the higher score, then the lower index.
//
// At light load (a = 0: m below group_min_load, 3 by default, or floor(load_slack * m) = 0) the
// request goes to a least-loaded worker, and among those to the one
// that received a request longest ago -- whose requests are the closest to finishing, which is
// what makes round-robin's p99 TPOT better than JSQ's lowest-index rule at light load. At heavy
// load the slack admits the request's own region, as the paper's band does, while no worker ever
// gets a request above (1 + load_slack) times the lightest load, which keeps the p99 TPOT with the
// load balancers'. State: the in-flight counts every router keeps, plus this policy's own decision
// numbers per worker (a tie-break only: nothing crosses nodes). Deterministic: no randomness.
class adaptive_band_policy final : public centroid_policy {
 public:
  // Errors (invalid_argument): centroids is null; tau or load_slack NaN, infinite or negative.
  static result<std::unique_ptr<adaptive_band_policy>> make(
      std::shared_ptr<const centroid_set> centroids, float tau = 0.1f, bool widen_single = true,
      float load_slack = default_load_slack, uint32_t group_min_load = default_group_min_load);

  std::string_view name() const override { return "eldr-adaptive"; }
  float load_slack() const { return load_slack_; }
  uint32_t group_min_load() const { return group_min_load_; }

 protected:
  result<route_decision> pick(const route_input& in, uint32_t eligible_count,
                              route_trace* trace) override;

 private:
  adaptive_band_policy(std::shared_ptr<const centroid_set> centroids, float tau, bool widen_single,
                       float load_slack, uint32_t group_min_load)
      : centroid_policy(std::move(centroids), tau, widen_single),
        load_slack_(load_slack),
        group_min_load_(group_min_load),
        last_routed_(workers(), 0) {}

  float load_slack_;
  uint32_t group_min_load_;
  // The policy's own decisions: last_routed_[w] is the number of the latest decision that chose w
  // (0 = never). Only a tie-break, so a decision the caller did not act on costs nothing.
  uint64_t decisions_ = 0;
  std::vector<uint64_t> last_routed_;
};

// A contiguous run of workers [first, first + count).
struct worker_range {
  uint32_t first = 0;
  uint32_t count = 0;
};

// The "domain" oracle's pools: workers split into contiguous runs in label order, sized in
// proportion to each domain's share of the calibration counts (largest remainder), every pool at
// least one worker when workers >= #domains (taken from the largest pools). With fewer workers than
// domains, each domain gets the single worker at the middle of its share, and pools overlap.
// Errors (invalid_argument): workers == 0; counts empty; counts all zero; their sum >= 2^32.
result<std::vector<worker_range>> split_into_pools(uint32_t workers,
                                                   std::span<const uint64_t> counts);

// The "domain" policy runs JSQ inside the request's pool. Label -1, or a pool none of whose workers
// is eligible any more, falls back to JSQ over every eligible worker (the oracle keeps serving as
// the router itself would); a label outside 0..#domains-1 is an error.

// The names make_policy accepts, in a stable order for help texts.
std::span<const std::string_view> policy_names();

// Builds a policy by name from the fields of config it reads.
// Errors (invalid_argument): unknown name (the message lists the valid ones); workers == 0 (all
// but "eldr*"); "eldr*": no centroids, workers set and != centroids->k(), bad tau or load_slack;
// "domain": see split_into_pools.
result<std::unique_ptr<routing_policy>> make_policy(std::string_view name,
                                                    const policy_config& config);

// Whether the policy routes by locality and so needs a centroid set ("eldr", "eldr-adaptive").
// Without one the router routes such a policy by load only (JSQ) and says so.
bool needs_centroids(std::string_view name);

}  // namespace eldr
