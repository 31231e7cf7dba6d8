// model_policy: a model's routing policy and centroid set -- building a policy, checking a set
// before it is stored, and installing it. Every check runs before the model changes, so a refused
// change leaves the model routing as it was (issue 12 defect 7). Plain functions over
// router_state / model_state: unit tests drive them without an actor system.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "actors/router/router_state.hpp"
#include "core/base/status.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr::router {

// A routing policy built for a model and the flag saying it is the locality band.
struct built_policy {
  std::unique_ptr<routing_policy> policy;
  bool eldr_active = false;
};

// The admin surface's and the config's rule for tau: finite, >= 0 and within float's range.
status check_tau(double tau);

// Builds (without installing) the policy `name` with `tau` over `set` for a pool of k workers. A
// locality policy ("eldr", "eldr-adaptive": needs_centroids) without a set of the pool's K routes
// by load (JSQ) until one is installed. Refuses 'domain' (eldr-sim only) and unknown names, naming
// the policies the node serves.
result<built_policy> build_policy(const model_state& m, const std::string& name, float tau,
                                  bool widen_single, const centroid_set_ptr& set, uint32_t k);

// Rebuilds the model's policy after a change of K, set, policy name or tau; on error the model
// keeps routing with its current policy.
status rebuild_policy(model_state& m);

// Tells the readiness board (/readyz) whether the model can be routed: called where the pool,
// the set or the policy changes.
void publish_readiness(const router_state& st, const model_state& m);

// Can `file` become the model's set? K must match a fixed pool, and no registered worker may lie
// outside it.
status check_installable(const model_state& m, const centroid_file& file);

// Can the model's policy route with `file` installed? Checked before the set is stored, so that a
// refused import leaves no epoch behind.
status check_policy_accepts(const model_state& m, const centroid_file& file);

// Does an imported `file` belong to model `m` (its model name, the current set's geometry, the K
// of an open pool)? Refused unless the operator forces it; what can never work is
// check_installable's and never forced.
status check_import_fits(const model_state& m, const centroid_file& file);

// Makes `file` (stored as `epoch`) the model's current set, recorded in its rollback history with
// `cause` ("import", "refit", "swap", "rollback", "peer", "start") and persisted once the model
// is among st.models. On error the model is as it was.
status install(router_state& st, model_state& m, const centroid_file& file, uint64_t epoch,
               std::string_view cause);

}  // namespace eldr::router
