// admin_actor: serves the admin protocol (docs/protocol.md section 5) by sending each command to
// the actor that owns the state it reads or changes -- the router (pools, policies, centroid
// sets), the signature cache (centroid history, export), the refit actor -- and composes `status`
// from all of them. Every command is answered exactly once, success or error.
#pragma once

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"

namespace eldr {

// Any of the handles may be invalid when the node does not hold that role (or is standalone, for
// `cluster`): commands for it are refused by name and `status` leaves its part out.
caf::actor spawn_admin(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                       caf::actor sigcache, caf::actor refit, caf::actor cluster = {});

}  // namespace eldr
