// cluster_protocol: what eldr nodes send each other over CAF's middleman (docs/cluster.md) -- the
// atoms, the message types with their `inspect` functions, and the set of peers a node trusts.
//
// Unlike messages.hpp (shared pointers that never leave the process), everything here is
// serialized: every type is registered with the actor system (register_cluster_types) in every
// node, or remote_actor fails with unexpected_actor_messaging_interface. Atom texts are the wire
// identity: renaming one breaks mixed-version clusters.
//
// Trust: a node accepts cluster messages only from nodes that proved the cluster secret during
// the join handshake (cluster_actor.hpp). Every handler of a message in this file checks the
// sender with `trusted_sender` first; a message from anyone else is counted (the cluster event
// "untrusted") and dropped. One message is stricter: a member list (members_atom) is made only by
// this node's own cluster actor, the one actor that knows the membership, and no peer ever sends
// one. So every actor takes it through `accept_member_list`, which accepts it from an actor of
// this node only and counts and drops any other -- a trusted peer's too: every member holds this
// node's actor handles and could otherwise rewrite this node's view of the cluster.
#pragma once

#include <bit>
#include <caf/all.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "core/base/resident_buffer.hpp"

namespace eldr {

class node_metrics;

// The cluster protocol this build speaks: everything in this file, as serialized. CAF encodes a
// type's fields by position, so a node that reads another build's worker_row or load_vector_msg
// with one field more or less misreads it or drops it. Nodes of different protocols therefore
// never form one cluster: a joiner says its protocol in its hello, and the gate refuses another
// one, both sides log an error and count it (status `cluster.refused_protocol`, the cluster event
// "protocol"). Bump it when a type here changes its fields or a message its arguments; the
// layouts' fingerprint in tests/unit/cluster_protocol_test.cpp fails until you do. Builds before
// 2026-12-05 sent no protocol (a three-argument hello): they are refused the same way.
inline constexpr uint32_t cluster_protocol_version = 1;

// Membership: joiner -> gate (hello with the joiner's cluster_protocol_version, join), gate ->
// local actors (members).
using hello_atom = caf::atom_constant<caf::atom("ehello")>;
using join_atom = caf::atom_constant<caf::atom("ejoin")>;
using leave_atom = caf::atom_constant<caf::atom("eleave")>;
using members_atom = caf::atom_constant<caf::atom("emembers")>;
using dial_atom = caf::atom_constant<caf::atom("edial")>;
// Router <-> router: shared decisions and load, pool snapshots, centroid epochs.
using decisions_atom = caf::atom_constant<caf::atom("edecide")>;
using peer_worker_atom = caf::atom_constant<caf::atom("eworker")>;
using pool_sync_atom = caf::atom_constant<caf::atom("esync")>;
using epoch_atom = caf::atom_constant<caf::atom("eepoch")>;
using flush_atom = caf::atom_constant<caf::atom("eflush")>;
// A router -> another router: (model, request id) -> the decision it remembers for that id, as a
// vector of zero or one shared_decision; asked for a client's marked failover resend that the
// asking router does not remember (core/membership/recall_gather.hpp).
using recall_atom = caf::atom_constant<caf::atom("erecall")>;
// cluster.load_sharing = "authority": router -> a worker's authority (load_delta_msg), authority
// -> every router (load_vector_msg), and a router's own interval timer.
using load_delta_atom = caf::atom_constant<caf::atom("eldelta")>;
using load_vector_atom = caf::atom_constant<caf::atom("elvector")>;
using load_tick_atom = caf::atom_constant<caf::atom("eltick")>;
// Router -> signature-cache shards: sum some blocks' counts, or store the counts a request carried
// (one-way, to every owner of their blocks).
using shard_sign_atom = caf::atom_constant<caf::atom("eshsign")>;
using shard_store_atom = caf::atom_constant<caf::atom("eshstore")>;
// A router's own timer: send the replica stores batched since the last one (store_batch.hpp).
using store_flush_atom = caf::atom_constant<caf::atom("eshflush")>;
// Signature-cache node -> the new owners of its blocks after a ring change.
using handoff_atom = caf::atom_constant<caf::atom("ehandoff")>;
// A signature-cache node finished handing its blocks for a ring (its name, the ring's members) ->
// every router, which stops reading the ring before the join once every sender did
// (core/membership/handoff_progress.hpp); and a router -> its own node's cache: send me those.
using handoff_done_atom = caf::atom_constant<caf::atom("ehodone")>;
using handoff_watch_atom = caf::atom_constant<caf::atom("ehowatch")>;
// Refit leadership: leader -> refit actors and routers (term), leader -> routers (samples).
using leader_atom = caf::atom_constant<caf::atom("eleader")>;
using peer_sample_atom = caf::atom_constant<caf::atom("esample")>;
// A candidate's refit actor -> every member's cluster actor (its own included): (candidate, term)
// -> bool, the member's vote for that term (core/membership/leadership.hpp's vote_box).
using vote_atom = caf::atom_constant<caf::atom("evote")>;
// A router -> the refit leader's router: (model, command, encoded centroid file, epoch) -> (the
// epoch the set was installed as, the stored epoch it came from or 0). In a cluster only the
// leader numbers epochs, so every change of the current set goes through it: "import" (the
// file), "swap" (a stored epoch) and "rollback" (core/formats/centroid_history.hpp).
using set_change_atom = caf::atom_constant<caf::atom("esetchg")>;

// One node as the others know it. The actor handles are those of the roles it holds (invalid
// otherwise); they are sent only to nodes that proved the secret.
struct member_info {
  std::string name;     // node.name, unique among live members
  std::string address;  // host:port peers dial (cluster.advertise or listen)
  std::vector<std::string> roles;
  uint64_t incarnation = 0;  // differs at every start: a restarted node is a new incarnation
  caf::actor cluster;        // its cluster actor (membership)
  caf::actor router;
  caf::actor load_monitor;
  caf::actor sigcache;
  caf::actor refit;

  bool has_role(const std::string& r) const {
    for (const auto& x : roles)
      if (x == r) return true;
    return false;
  }
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("eldr::member_info"), x.name, x.address, x.roles, x.incarnation,
           x.cluster, x.router, x.load_monitor, x.sigcache, x.refit);
}

// The gate's answer to hello: its name, its nonce, and its proof that it knows the secret.
struct join_challenge {
  std::string gate;
  std::string gate_nonce;
  std::string gate_proof;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_challenge& x) {
  return f(caf::meta::type_name("eldr::join_challenge"), x.gate, x.gate_nonce, x.gate_proof);
}

// The gate's answer to an accepted join: itself and the live members it knows.
struct join_welcome {
  member_info gate;
  std::vector<member_info> members;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, join_welcome& x) {
  return f(caf::meta::type_name("eldr::join_welcome"), x.gate, x.members);
}

// A routing decision one router made, for the others' load views and decision memories.
struct shared_decision {
  std::string request;
  uint32_t worker = 0;
  uint64_t epoch = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shared_decision& x) {
  return f(caf::meta::type_name("eldr::shared_decision"), x.request, x.worker, x.epoch);
}

// cluster.load_sharing = "authority" (core/membership/load_exchange.hpp): a router's cumulative
// decision totals for one authority's workers (load_delta), and an authority's load vector
// (load_vector), flattened for the wire; parallel vectors of equal length (checked on receipt).
struct load_delta_msg {
  std::string model;
  std::string router;
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  std::vector<uint32_t> workers;
  std::vector<uint64_t> totals;
  bool resync = false;  // load_delta::resync (core/membership/load_exchange.hpp)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_delta_msg& x) {
  return f(caf::meta::type_name("eldr::load_delta_msg"), x.model, x.router, x.incarnation, x.seq,
           x.workers, x.totals, x.resync);
}

struct load_vector_msg {
  std::string model;
  std::string authority;
  uint64_t incarnation = 0;  // the authority's (core/membership/load_exchange.hpp)
  uint64_t seq = 0;
  std::vector<uint32_t> workers;
  std::vector<uint32_t> in_flight;
  std::vector<uint8_t> alive;
  std::vector<uint8_t> anchors;  // load_vector_entry::anchors
  std::vector<uint64_t> claim;   // each worker's, encoded (core/membership/authority_map.hpp)
  std::vector<std::string> routers;
  std::vector<uint64_t> router_incarnations;
  std::vector<uint64_t> included;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_vector_msg& x) {
  return f(caf::meta::type_name("eldr::load_vector_msg"), x.model, x.authority, x.incarnation,
           x.seq, x.workers, x.in_flight, x.alive, x.anchors, x.claim, x.routers,
           x.router_incarnations, x.included);
}

// One registered decode worker as a router sees it, for a router that joins late: with its
// metrics URL (so that the joiner can scrape it should it become its authority) and, with load
// authorities, its authority's claim (the node's name, "" when unknown, and encode_claim's
// number; core/membership/authority_map.hpp), so that a node restarted under its old name takes
// back the workers it was the authority of.
struct worker_row {
  uint32_t worker = 0;
  std::string endpoint;
  uint32_t capacity = 0;
  uint32_t load = 0;
  bool draining = false;
  std::string metrics_url;
  std::string authority;
  uint64_t claim = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_row& x) {
  return f(caf::meta::type_name("eldr::worker_row"), x.worker, x.endpoint, x.capacity, x.load,
           x.draining, x.metrics_url, x.authority, x.claim);
}

// A model's pool and current centroid set (encoded centroid file; empty when none).
struct pool_snapshot {
  std::string model;
  uint64_t epoch = 0;
  uint64_t term = 0;  // the refit term the epoch was published in
  std::vector<uint8_t> centroids;
  std::vector<worker_row> workers;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, pool_snapshot& x) {
  return f(caf::meta::type_name("eldr::pool_snapshot"), x.model, x.epoch, x.term, x.centroids,
           x.workers);
}

// A router's reservoir of live signatures for the refit leader: rows of `width` floats, signed
// under the spec of centroid epoch `epoch` (the leader uses rows of its own epoch only). The
// floats travel as bytes (IEEE-754 binary32, little-endian): CAF 0.17 serialises a vector of
// anything else value by value, and a full reservoir (4,096 rows of thousands of floats) would
// hold the sending and the receiving node's network thread for tens of milliseconds per million
// values, delaying every other cross-node message behind it (shard requests time out at 100 ms).
struct sample_reply {
  uint64_t epoch = 0;
  uint32_t width = 0;
  uint64_t seen = 0;
  std::vector<uint8_t> points;  // pack_points / unpack_points
};

static_assert(std::endian::native == std::endian::little,
              "sample_reply.points is little-endian binary32, copied as is");

// On the asked router's thread, up to 100 MB: copied into memory made resident first, as the
// router's own refit copy (core/base/resident_buffer.hpp).
inline std::vector<uint8_t> pack_points(std::span<const float> rows) {
  const auto bytes = std::as_bytes(rows);
  std::vector<uint8_t> out;
  make_resident(out, bytes.size());
  const auto* first = reinterpret_cast<const uint8_t*>(bytes.data());
  out.assign(first, first + bytes.size());
  return out;
}

// Appends the floats in `bytes` to `out`; false (nothing appended) unless the bytes are whole
// rows of `width` floats.
inline bool unpack_points(std::span<const uint8_t> bytes, uint32_t width, std::vector<float>& out) {
  if (width == 0 || bytes.size() % (sizeof(float) * width) != 0) return false;
  const size_t at = out.size();
  out.resize(at + bytes.size() / sizeof(float));
  if (!bytes.empty()) std::memcpy(out.data() + at, bytes.data(), bytes.size());
  return true;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_reply& x) {
  return f(caf::meta::type_name("eldr::sample_reply"), x.epoch, x.width, x.seen, x.points);
}

// One shard's part of a route request: the blocks of the prompt this shard is asked to sum (some
// of those it owns, prompt order; core/membership/shard_plan.hpp) and the layers the router's
// signature uses. `counts` (an encoded eldr counts message, stored before the sum) is empty from
// this version's routers, which sum the counts a request carries themselves and send them to the
// blocks' owners with shard_store_atom; a shard still honours it.
struct shard_sign_request {
  std::string model;
  std::vector<uint64_t> blocks;
  std::vector<uint8_t> counts;
  // Ascending: the reply sums only these layers (those of them the store keeps). Empty: coverage
  // only, the reply carries no sums.
  std::vector<uint32_t> layers;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_sign_request& x) {
  return f(caf::meta::type_name("eldr::shard_sign_request"), x.model, x.blocks, x.counts, x.layers);
}

// The shard's sum of the counts of the blocks it knew, over the requested layers its store keeps
// (`layer_mask`, ascending; layer-major, |layer_mask| * experts values), packed by
// core/membership/shard_plan.hpp's pack_sums (`value_bytes` 2 or 4 bytes a value: a byte vector is
// what CAF 0.17 serializes fast). Empty when no block had counts or the request asked for coverage
// only. A router adds it with add_common_layers, so a store lacking a layer leaves that layer to
// others.
struct shard_sign_reply {
  uint32_t covered = 0;
  uint32_t experts = 0;
  std::vector<uint32_t> layer_mask;
  uint8_t value_bytes = 0;
  std::vector<uint8_t> sums;
  std::string problem;  // counts refused (geometry), for the logs; "" when none
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_sign_reply& x) {
  return f(caf::meta::type_name("eldr::shard_sign_reply"), x.covered, x.experts, x.layer_mask,
           x.value_bytes, x.sums, x.problem);
}

// One block's counts handed to a node that became one of its owners: already restricted to the
// store's layer mask (every node runs the same configuration, so the same geometry and mask),
// dense, one byte per (layer, expert) -- a block's count of an expert is at most its tokens, at
// most 255 (block_counts keeps them in a byte too): a quarter of the uint32 form (6 KiB a block at
// 48 x 128, not 24).
struct handoff_block {
  uint64_t hash = 0;
  bool has_parent = false;
  uint64_t parent = 0;
  std::vector<uint8_t> masked;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, handoff_block& x) {
  return f(caf::meta::type_name("eldr::handoff_block"), x.hash, x.has_parent, x.parent, x.masked);
}

// Registers every type above with the actor system; call before the system starts.
void register_cluster_types(caf::actor_system_config& cfg);

// The CAF nodes that proved the cluster secret. Written by the cluster actor, read by every
// actor that handles cluster messages (from any scheduler thread).
class cluster_trust {
 public:
  void add(const caf::node_id& n);
  void remove(const caf::node_id& n);
  bool contains(const caf::node_id& n) const;

 private:
  mutable std::shared_mutex mu_;
  std::set<caf::node_id> nodes_;
};

// True when the message being handled comes from this node or a trusted one. Anonymous messages
// from another node are not trusted (they could come from anyone who can reach the port).
bool trusted_sender(caf::local_actor* self, const cluster_trust* trust);
// True when the message comes from an actor of this node (status queries: only the node's own
// admin actor asks them; an actor whose handle went to a peer is reachable from the network).
bool local_sender(caf::local_actor* self);
// The rule for member lists (see "Trust" above): true when the members_atom message being handled
// comes from an actor of this node. Otherwise counts it -- the cluster event "untrusted" in
// `metrics`, and `dropped` when given (an actor's own status counter) -- and the caller drops it.
bool accept_member_list(caf::local_actor* self, node_metrics& metrics, uint64_t* dropped = nullptr);

}  // namespace eldr
