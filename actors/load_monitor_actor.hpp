// load_monitor_actor: receives the decode workers' messages (registration, load reports,
// finished requests, drain) and the publishers' announcements, counts them, and hands them to
// their owners: the router holds each pool's load view (it must read it at every decision without
// a message round trip), the signature cache follows announced publishers. On one node this is a
// thin relay; it is the single place where worker traffic enters, so a cluster can fan it out to
// several routers without touching the router.
#pragma once

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"

namespace eldr {

caf::actor spawn_load_monitor(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                              caf::actor sigcache);

}  // namespace eldr
