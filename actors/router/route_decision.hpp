// route_decision: one route request decided -- the locality band (or the configured policy) over
// the model's load view and the request's signature, the answer sent through the node's edge,
// the decision remembered for retries and counted for the peers, and every fallback said out loud
// (a warning in the reply, a counter, a rate-limited log line). Plain functions over
// router_state / model_state: unit tests drive them with a fake reply_sink and no actor system.
#pragma once

#include <string>

#include "actors/router/router_state.hpp"

namespace eldr::router {

// The key of request id `request` of model `m` in router_state::decisions and ::deciding.
std::string decision_key(const model_state& m, const std::string& request);

// Counts error `code` and answers the request with it.
void send_route_error(const node_context& ctx, const route_job& job, wire_error_code code,
                      std::string message);

// The request carries counts of another geometry than the model's current centroid set: they can
// make no signature, and must not reach a store (an empty one would adopt their geometry).
bool counts_of_other_geometry(const model_state& m, const route_request& req);

// The job as the signature cache should see it: without counts of another geometry.
route_job_ptr job_to_sign(const model_state& m, const route_job_ptr& job);

// What a decision leaves to the router actor.
enum class decided {
  answered,    // the reply (or an error) is sent
  arm_flush,   // sent, and the first decision since the last flush is queued for the peers:
               // flush them in cluster.load_sync_ms
  sign_again,  // nothing sent: a swap changed the spec while the request was signed; sign it
               // again under the current one (attempt 1; a second change is decided as it is)
};

// Decides `job` with the signature `signed_` (null: the cache did not answer) and answers it.
// `attempt`: 0, or 1 when the request is signed again after a swap.
decided decide(router_state& st, model_state& m, const route_job& job, const sign_result* signed_,
               int attempt);

// A route whose request id this router (or a peer) already decided: the same answer again, and no
// second count in the load view. False when the id is not remembered. Counts the requests a
// client marked as a failover resend (route_request.retry), and which of them were remembered.
bool answer_retry(router_state& st, model_state& m, const route_job& job);

// A marked retry this router did not remember, answered with the decision a peer remembered
// (core/membership/recall_gather.hpp): the same answer, remembered here too. With shared
// decisions the peer's decision is counted in this router's load view now (the shared copy, when
// it arrives, finds the id remembered and is skipped); in the authority mode the deciding router
// counts it. False, and nothing sent, when the decision names a worker this model does not have
// (the caller then decides afresh).
bool answer_recalled(router_state& st, model_state& m, const route_job& job,
                     const remembered& decision);

}  // namespace eldr::router
