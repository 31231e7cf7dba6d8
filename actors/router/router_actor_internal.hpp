// router_actor_internal: the router actor's own files (router_actor.cpp, router_admin.cpp,
// router_load.cpp, router_peers.cpp) and what they call in each other. Everything here sends or
// receives CAF messages; the logic they wire lives in the plain modules beside them
// (router_files, model_policy, route_decision, router_status, shard_gather).
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "actors/router/router_state.hpp"

namespace eldr::router {

using router_actor_t = caf::stateful_actor<router_state>;

// --- router_actor.cpp ---

// Signs `job` (the node's signature cache, or the cluster's shards) and decides it.
void sign_and_route(router_actor_t* self, model_state& m, route_job_ptr job, int attempt);

// Sends every batched replica store (before the shard ring changes, and on the batch timer).
void flush_stores(router_actor_t* self);
// At a load tick: sends the batched stores once the oldest has waited cluster.store_batch_ms.
// True while batches still wait (the tick then runs again within load_sync_ms).
bool flush_due_stores(router_actor_t* self, int64_t now_ms);

// Counts a message from a peer that did not prove the cluster secret.
void untrusted(router_actor_t* self);

// --- router_admin.cpp ---

void handle_admin(router_actor_t* self, const admin_job_ptr& job);

// An install's outcome: the epoch, or the error.
using install_done = std::function<void(result<uint64_t>)>;

// Runs `file` through the store (a new epoch, numbered in the refit leader's `term`; 0 outside a
// cluster) and installs it, then calls done. `cause` goes to the rollback history, `what` to the
// log.
void store_and_install(router_actor_t* self, model_state& m, centroid_file file, std::string cause,
                       std::string what, install_done done, uint64_t term);

// The outcome of a change of the current set: the epoch installed and the stored epoch it came
// from (0 for an import), or the error.
using change_done = std::function<void(result<uint64_t> epoch, uint64_t source)>;

// On the refit leader: makes `command` ("import" of `bytes`, "swap" to `epoch`, "rollback").
void change_as_leader(router_actor_t* self, model_state& m, const std::string& command,
                      const std::vector<uint8_t>& bytes, uint64_t epoch, uint64_t term,
                      change_done done);

// In a cluster: the change made by the refit leader (this router or the leader's, asked over the
// cluster), answering `job`; waits for a leader until `deadline_ms`.
void change_via_leader(router_actor_t* self, uint32_t index, admin_job_ptr job, std::string command,
                       std::vector<uint8_t> bytes, uint64_t epoch, int64_t deadline_ms);

// An install's outcome delivered to the actor that asked for it.
install_done deliver_epoch(caf::typed_response_promise<uint64_t> rp);

// --- router_load.cpp ---

// The worker's vLLM /metrics URL as registered ("" = none: it pushes load reports).
void set_metrics_url(model_state& m, uint32_t worker, const std::string& url);
// Scrapes the metrics URL of every registered worker of `m` that has one (off the actor's
// thread; the results come back as scraped_atom).
void scrape_model(router_actor_t* self, model_state& m);
void on_scraped(router_actor_t* self, uint32_t model, uint32_t worker, int64_t issued_ms, bool ok,
                const vllm_load& load, const std::string& error);

// A worker-protocol message; `answer`: false for a copy another node's load monitor answered.
void handle_worker(router_actor_t* self, const worker_job& job, bool answer);

// cluster.load_sharing = "authority": every load_sync_ms while there is load to share, this
// router's totals to each authority and this node's vectors to every router (true: something was
// sent or is still owed, so the next tick is due in load_sync_ms too); and a vector (own or a
// peer's) applied.
bool load_tick(router_actor_t* self);
// The load tick's timer: started with the router; woken by what gives a tick work (a decision, a
// delta, a worker's report, scrape or finish, a membership change); a fired timer runs the tick
// when it is the current one (wake_timer).
void start_load_tick(router_actor_t* self);
void wake_load_tick(router_actor_t* self);
void on_load_tick(router_actor_t* self, uint64_t token);
// True when the vector gives the next tick work (its authority restarted, or a claim was given up:
// totals to send again).
bool apply_vector(router_state& st, model_state& m, const load_vector& v);
// The live routers are now `peers` (by node name; this one aside): the workers of authorities that
// left go to their successors (authority_map.hpp), and this node takes over its share.
void on_authorities_left(router_state& st, model_state& m, const std::vector<std::string>& peers);
// A peer's snapshot names `claim` for a worker this router had not known: it follows it, and when
// the claim is this node's own (it restarted under its name faster than the peers noticed) it is
// the worker's authority again, from `load` (the peer's view) until its first scrape or report.
void on_snapshot_claim(router_state& st, model_state& m, uint32_t worker,
                       const authority_claim& claim, uint32_t load);

// --- router_peers.cpp ---

// Tells the other routers that `m` now routes with its epoch, and why.
void announce_epoch(caf::event_based_actor* self, const router_state& st, const model_state& m);

// Rebuilds the ring of signature-cache shards from the live members (and this node).
void rebuild_ring(router_state& st, const std::vector<member_info>& members);

// Sends the decisions queued since the last flush to every peer router.
void flush_decisions(router_actor_t* self);

// Installs a peer's set when the fence accepts it, and stores it under the same epoch.
void adopt_epoch(router_actor_t* self, model_state& m, uint64_t epoch, uint64_t term,
                 const std::vector<uint8_t>& bytes, const char* why, const std::string& cause);

// A late or returning router learns the workers and the newest set from its peers.
void merge_pools(router_actor_t* self, const std::vector<pool_snapshot>& pools);

// The cluster's live members: peers, routers by name, the shard ring.
void on_members(router_actor_t* self, const std::vector<member_info>& members);
// A signature-cache node finished handing its blocks for the ring of `ring` members: the bridge
// over a join ends once every node of the ring before did.
void on_handoff_done(router_state& st, const std::string& from,
                     const std::vector<std::string>& ring);

// A client's marked failover resend (route_request.retry) that this router does not remember:
// asks every peer for its decision (core/membership/recall_gather.hpp) and answers with the first
// one that comes back, or signs and decides afresh when none does. Signs at once without peers.
void recall_from_peers(router_actor_t* self, model_state& m, route_job_ptr job);

// A peer's question: this router's decision for `request` of `model` (zero or one): the one it
// remembers, or -- when it is deciding that request now -- the one it is about to make.
caf::result<std::vector<shared_decision>> answer_recall(router_actor_t* self,
                                                        const std::string& model,
                                                        const std::string& request);

// Enters `job` as being decided (router_state::deciding), when this router has peers.
void enter_deciding(router_state& st, const model_state& m, const route_job& job);

// `job` was answered (decided, or refused): the peers' recalls that waited for it get its
// remembered decision (none when it was refused).
void settle_deciding(router_state& st, const model_state& m, const route_job& job);

}  // namespace eldr::router
