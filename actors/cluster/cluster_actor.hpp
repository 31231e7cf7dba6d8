// cluster_actor: one node's membership in the cluster -- the gate other nodes join through, the
// dialler that joins the seeds and every member it learns of (a full mesh), and the watcher that
// tells the node's own actors who is alive (docs/cluster.md).
//
// Join handshake (both sides prove the shared secret, and no actor handle is sent before the
// other side has proved it):
//   joiner -> gate  hello(joiner name, joiner nonce)
//   gate -> joiner  join_challenge(gate name, gate nonce, HMAC(secret, "gate" | nonces | gate))
//   joiner -> gate  join(gate nonce, HMAC(secret, "join" | nonces | joiner), joiner member_info)
//   gate -> joiner  join_welcome(gate member_info, live members)
// Then both sides trust each other's CAF node, monitor each other's cluster actor, and tell their
// local actors. A peer is dead when its monitor fires: at once when its process dies (the socket
// closes), within cluster.connection_timeout_ms when the network is cut (CAF's heartbeat). Dead
// peers and the seeds are dialled again every cluster.reconnect_ms, so a healed partition
// rejoins by itself.
#pragma once

#include <caf/all.hpp>
#include <caf/io/middleman_actor.hpp>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/messages.hpp"
#include "actors/node_context.hpp"
#include "core/base/status.hpp"

namespace eldr {

struct cluster_setup {
  std::string secret;           // the cluster secret (cluster.secret_file's contents)
  caf::io::middleman_actor mm;  // dials peers (plain or TLS)
  member_info self;  // name, roles, incarnation and role actors; the cluster handle and the
                     // address are filled in by the actor itself
  // What peers dial (host:port). Written by the node once the gate is published, before it sends
  // the actor its first dial_atom: the actor reads it then.
  std::shared_ptr<std::string> address;
  std::vector<caf::actor> watchers;  // local actors told (members_atom, vector<member_info>)
                                     // whenever the set of live peers changes
  // Where this node's refit-leadership vote is kept (read_vote_file), and what it holds now.
  std::string vote_file;
  uint64_t voted_term = 0;
  std::string voted_for;
};

// This node's vote in refit-leadership elections (core/membership/leadership.hpp's vote_box), kept
// in
// `<node.data_dir>/cluster-vote` so that a restarted node cannot vote twice in one term.
struct vote_record {
  uint64_t term = 0;
  std::string candidate;
};
// The record in `path`; {0, ""} when the file does not exist. A file that exists but does not
// parse is an error naming it (the node must not start and forget its vote).
result<vote_record> read_vote_file(const std::string& path);
// Replaces the record in `path` (written beside it and renamed, so never half-written).
status write_vote_file(const std::string& path, const vote_record& v);

// Reads the secret file: at least 16 bytes once a trailing newline is dropped. Errors name the
// key cluster.secret_file.
result<std::string> read_cluster_secret(const std::string& path);

caf::actor spawn_cluster(caf::actor_system& sys, node_context_ptr ctx, cluster_setup setup);

}  // namespace eldr
