// router_status: the router's state as JSON for the operator -- a model's counters (`eldrctl
// status`), its workers (`eldrctl workers`, the operator page), its centroid set's spec
// (`centroids show`), its policy, one recent decision (`eldrctl explain`) and the router's own
// counters. Plain functions over router_state / model_state; the keys are documented in
// docs/operations.md and scripts rely on them.
#pragma once

#include <nlohmann/json.hpp>

#include "actors/router/router_state.hpp"

namespace eldr::router {

nlohmann::json model_json(const router_state& st, const model_state& m);
nlohmann::json spec_json(const model_state& m);
nlohmann::json workers_json(const router_state& st, const model_state& m);
nlohmann::json policy_json(const model_state& m);
nlohmann::json explain_json(const model_state& m, const explained& e);
// The router's part of `status`: every model's model_json and the router's counters.
nlohmann::json router_json(const router_state& st);

}  // namespace eldr::router
