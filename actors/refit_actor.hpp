// refit_actor: reruns balanced K-means on the router's sample of live signatures, aligns the new
// centroids to the workers of the current set, validates them (core/refit.hpp) and, when they
// pass, has the router store them as a new epoch and install them (hot swap). A rejected refit is
// reported -- in the log, the metrics and the admin answer -- and the current set stays.
//
// Runs on its own thread (a detached actor): a fit takes long enough to delay decisions if it
// shared the scheduler's threads with the router.
#pragma once

#include <caf/all.hpp>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"

namespace eldr {

caf::actor spawn_refit(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                       bool detached = true);

}  // namespace eldr
