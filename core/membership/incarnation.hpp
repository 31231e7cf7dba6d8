// incarnation: the number a process draws at start to tell its peers it is a new process under an
// old name (a restarted node, a restarted router; docs/cluster.md, "Membership" and "Restarts").
//
// Peers compare them: a node that restarts faster than its peers notice the old process die (its
// connection still looks alive) is admitted only with a larger incarnation than the one they
// hold, and anything else claiming a live member's name is refused. So the wall clock's
// milliseconds at start are the high bits: a restart draws a larger number than the process it
// replaces, unless the clock was set back by more than the restart took. Sixteen random bits
// below make two processes started in the same millisecond differ.
//
// Thread safety: draw_incarnation reads the clock and std::random_device; both are safe to call
// from any thread.
#pragma once

#include <cstdint>

namespace eldr {

// wall_ms (milliseconds since the Unix epoch, below 2^48) in the high bits, random_bits below.
uint64_t incarnation_at(uint64_t wall_ms, uint16_t random_bits);

// incarnation_at(the system clock now, 16 bits from std::random_device).
uint64_t draw_incarnation();

}  // namespace eldr
