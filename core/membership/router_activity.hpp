// router_activity: which routers are taking traffic now, as the load authorities' vectors show
// it -- the R of the peer estimate (load_exchange.hpp, peer_estimate; docs/cluster.md, "Peer
// estimate").
//
// The peer estimate counts each of a router's own decisions the vectors do not include yet R - 1
// more times, for its peers' decisions meanwhile. R as the membership's routers is wrong whenever
// traffic does not reach every router: a standby router, a client or proxy that prefers one node,
// a router that just joined. Then the routers that do decide count decisions nobody makes and
// spread their traffic as if R routers herded (measured: BENCHMARKS.md, "Routers without
// traffic"). What a router can see of its peers' traffic without a new message: every vector says,
// per router, the last delta its authority applied (load_vector::included), and a router sends an
// authority a delta only when it routed to that authority's workers since its last one. So a
// router whose included delta advanced between two vectors of one authority decided in that time;
// R is the routers seen doing so within `window_ms`, plus the caller itself (it is deciding).
//
// What it does not see: how much each active router routes (R counts a router at 1% of the
// traffic like one at 50%), and a peer's traffic before the first vector that shows it.
//
// Nothing here reads a clock or does I/O. Cost: on_vector is O(routers in the two vectors);
// active() is O(1) except when an active router's window lapses (then O(active routers)).
// Thread safety: none; one owner (the router actor, or the simulator).
#pragma once

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "core/membership/load_exchange.hpp"

namespace eldr {

// How long a router counts after a vector last showed it deciding, for the node's routers and the
// simulator alike: the load vectors' heartbeat period (250 ms, actors/router/router_load.cpp), so
// a router that stops (or gets no more requests) drops out within about one heartbeat, while one
// that routes even one request every few load intervals (5 ms each by default) stays counted.
inline constexpr int64_t peer_activity_window_ms = 250;

class router_activity {
 public:
  // window_ms > 0: how long a router counts as active after a vector last showed it deciding.
  explicit router_activity(int64_t window_ms) : window_ms_(window_ms > 0 ? window_ms : 1) {}

  // An authority's new vector lists `next` as the deltas it includes; `previous` is what its
  // last vector listed (nullptr: the first seen from this authority, or from a new incarnation
  // of it: nothing to compare, nobody counted). A router whose entry changed (a newer delta, or
  // a restarted router's first) decided since; one listed anew counts too.
  void on_vector(const std::map<std::string, included_delta>* previous,
                 const std::map<std::string, included_delta>& next, int64_t now_ms);
  // The caller itself decided at now_ms (the simulator, which has no vectors' included maps,
  // marks each router that decided in a load interval this way).
  void on_decided(const std::string& router, int64_t now_ms);

  // Routers active within the window at now_ms, `self` counted once whether or not seen: >= 1.
  uint32_t active(const std::string& self, int64_t now_ms) const;

  int64_t window_ms() const { return window_ms_; }
  // Routers held: those seen within the window of the last on_vector (bounded by the routers that
  // decided in one window, not by every router ever seen).
  size_t tracked() const { return last_seen_.size(); }

 private:
  void seen(const std::string& router, int64_t now_ms);
  void recount(const std::string& self, int64_t now_ms) const;

  int64_t window_ms_;
  std::unordered_map<std::string, int64_t> last_seen_;  // router -> when last seen deciding
  // active()'s answer for cached_self_, good while now < valid_until_ (the first lapse of a
  // counted router); a change to last_seen_ invalidates it.
  mutable uint32_t cached_ = 1;
  mutable int64_t valid_until_ = INT64_MIN;
  mutable std::string cached_self_;
};

}  // namespace eldr
