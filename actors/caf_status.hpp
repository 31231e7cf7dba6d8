// caf_status: the one mapping between eldr's status and CAF's errors, for the answers actors send
// each other (a status crosses an actor boundary as a caf::error and comes back as a status). Its
// counterpart for the wire is cluster/wire/wire_error.hpp.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/sec.hpp>

#include "core/base/status.hpp"

namespace eldr {

// A failed status as the error an actor answers with: sec::runtime_error carrying the status's
// text ("invalid_argument: ..."), which the requester's log and admin reply show unchanged.
inline caf::error to_caf_error(const status& s) {
  return caf::make_error(caf::sec::runtime_error, s.to_string());
}

// A CAF error (a peer's answer, a timeout, a dead actor) as a status: io_error with CAF's own
// rendering, since a failed exchange between actors is the environment failing, not the input.
inline status to_status(const caf::actor_system& sys, const caf::error& e) {
  return status::io_error(sys.render(e));
}

}  // namespace eldr
