// sigcache_actor_internal: the signature-cache actor's own files
// (actors/sigcache/sigcache_actor.cpp, publishers.cpp, sigcache_cluster.cpp) and what they call in
// each other. Everything here sends or receives CAF messages; the logic they wire lives in the
// plain modules beside them (signing, handoff, sigcache_status, model_caches).
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/cluster/cluster_protocol.hpp"
#include "actors/messages.hpp"
#include "actors/sigcache/sigcache_state.hpp"

namespace eldr::sigcache {

using sigcache_actor_t = caf::stateful_actor<sigcache_state>;

// The actor to itself: the next slice of a model's ingest backlog (cluster/ingest/ingest.hpp).
// Route requests queued meanwhile are answered between two slices.
using ingest_more_atom = caf::atom_constant<caf::atom("ingmore")>;
// The actor to itself: the next slice of the hand-off with this id (sigcache_cluster.cpp).
using handoff_step_atom = caf::atom_constant<caf::atom("hostep")>;

// --- publishers.cpp: subscriptions, replay, persistence, forgetting, ingest ---

// The model's registered publishers, in its database's metadata (durable at the next commit).
constexpr const char* publishers_metadata_key = "publishers";

// A registration's answer: 0 and "" = subscribed, else a wire_error_code and why.
using follow_answer = std::pair<uint8_t, std::string>;

// Stages the model's registered publishers in its database's metadata.
void persist_publishers(sigcache_state& st, uint32_t model);

// Takes a publisher in; the answer now, or nullopt when it comes with the socket (then `rp`, if
// any, waits for it).
std::optional<follow_answer> follow(sigcache_actor_t* self, const publisher_registration& r,
                                    bool configured, const caf::response_promise* rp);

// How often publishers are checked for silence (and their metrics section rendered).
int64_t publishers_tick_ms(const node_config& c);

// The frontend's answer to a subscription: `code` 0 and the socket's `id`, or why not.
void on_subscribed(sigcache_actor_t* self, const std::string& endpoint, uint32_t id, uint8_t code,
                   const std::string& message);

// A replayed batch (or a replay's end) for a KV-event publisher.
void on_replay(sigcache_actor_t* self, const replay_message_ptr& m);

// Silent registered publishers are forgotten; the publishers section of /metrics is rendered.
void on_publishers_tick(sigcache_actor_t* self);

// A publisher's message, applied to its model's ingest (the first slice of it).
void on_publisher_frames(sigcache_actor_t* self, const publisher_frames_ptr& f);

// The next slice of a model's ingest backlog.
void on_ingest_more(sigcache_actor_t* self, uint32_t model);

// --- sigcache_cluster.cpp: the cluster's shards ---

// The cache of the model named `name`, or nullptr.
model_cache* find_model(sigcache_state& st, const std::string& name);

// The cluster's live members: the ring of signature-cache nodes is rebuilt and this node's blocks
// handed to their new owners.
void on_members(sigcache_actor_t* self, const std::vector<member_info>& members);

// Blocks this node now owns, from a node that held them; answered with the number stored (the
// sender sends its next batch then).
caf::result<uint64_t> on_handoff(sigcache_actor_t* self, const std::string& model,
                                 const model_geometry& g, const std::vector<handoff_block>& blocks);
// The actor to itself: the next slice of a hand-off (sigcache_cluster.cpp).
void on_handoff_step(sigcache_actor_t* self, uint64_t id);
// This node's router asks to be told when a hand-off finishes.
void on_handoff_watch(sigcache_actor_t* self);

}  // namespace eldr::sigcache
