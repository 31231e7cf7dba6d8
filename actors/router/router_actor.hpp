// router_actor: answers route requests for every model of the node (docs/method.md section 5).
//
// Per model it holds the decode pool's load view, the current routing policy and centroid set
// (with its signature spec and epoch), the reservoir of live signatures the refit samples, and
// the recent decisions `eldrctl explain` shows. A route request goes to the signature-cache actor
// (store the counts it carries, sum the cached prefix) and comes back here for the decision.
// The actor only wires messages: its logic lives in plain modules in actors/router/
// (router_actor_internal.hpp lists the actor's own files and what each holds).
//
// Hot swap: a new centroid set is installed by a message, handled between two decisions, so each
// decision sees exactly one set and reports its epoch; nothing ever waits for a swap. The
// signature is built under the spec of the set the router held when it asked the cache; if a swap
// with a new spec lands in between, the request is signed again under the new one.
#pragma once

#include <caf/all.hpp>
#include <optional>
#include <vector>

#include "actors/messages.hpp"
#include "actors/node_context.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr {

// A model's state at start-up, read from the store before any actor runs (warm restart).
struct router_model_init {
  std::optional<centroid_file> current;  // the current centroid set, if one is stored
};

// Spawns the router. `sigcache` answers sign_atom; models are ctx->config.models, in order, with
// `init` of the same size.
caf::actor spawn_router(caf::actor_system& sys, node_context_ptr ctx, caf::actor sigcache,
                        std::vector<router_model_init> init);

}  // namespace eldr
