// messages: the atoms and payloads the node's actors exchange, in one place (CAF's habit: one
// header per protocol). Everything here stays inside one process in this version, so payloads
// travel as shared pointers to immutable data (CAF_ALLOW_UNSAFE_MESSAGE_TYPE): a route job is
// handed from actor to actor without a copy.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster/zmq/zmq_frontend.hpp"
#include "core/centroid_set.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/signature.hpp"

namespace eldr {

// Route path: frontend -> router -> signature cache (sign: a sign_job, or in a cluster a
// shard_job for this node's shard) -> router.
using route_atom = caf::atom_constant<caf::atom("route")>;
using sign_atom = caf::atom_constant<caf::atom("sign")>;
// Worker messages: frontend -> load monitor -> router.
using worker_atom = caf::atom_constant<caf::atom("worker")>;
// Admin: frontend -> admin actor -> the actor that owns the state.
using admin_atom = caf::atom_constant<caf::atom("admin")>;
// Publisher frames and subscriptions: frontend -> signature cache.
using publisher_atom = caf::atom_constant<caf::atom("publisher")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;
// Publisher subscriptions, frontend thread -> signature cache: a SUB socket made or refused, a
// replay's answers; and the cache's own tick that forgets silent publishers.
using subscribed_atom = caf::atom_constant<caf::atom("subscribed")>;
using replay_atom = caf::atom_constant<caf::atom("replay")>;
using publishers_tick_atom = caf::atom_constant<caf::atom("pubtick")>;
// Signature cache housekeeping and centroid history.
using commit_atom = caf::atom_constant<caf::atom("commit")>;
using store_set_atom = caf::atom_constant<caf::atom("storeset")>;
// (model, epoch, make_current) -> the stored set of that epoch; make_current also makes it the
// store's current epoch (a swap on a node outside a cluster).
using load_set_atom = caf::atom_constant<caf::atom("loadset")>;
using history_atom = caf::atom_constant<caf::atom("history")>;
using cache_stats_atom = caf::atom_constant<caf::atom("cstats")>;
// Refit: refit actor <-> router.
using refit_atom = caf::atom_constant<caf::atom("refit")>;
using sample_atom = caf::atom_constant<caf::atom("sample")>;
using install_atom = caf::atom_constant<caf::atom("install")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
// Router -> itself: a change of the current set (import, swap, rollback) waiting for a refit
// leader to be known (cluster).
using set_change_retry_atom = caf::atom_constant<caf::atom("scretry")>;
// Router -> itself: time to scrape a model's workers' metrics (model index), and one scrape's
// outcome, posted from the scraper's thread (model, worker, issued_ms, ok, running, waiting,
// kv_usage, error message).
using scrape_tick_atom = caf::atom_constant<caf::atom("scrtick")>;
using scraped_atom = caf::atom_constant<caf::atom("scraped")>;
// The operator page (operator_page.hpp): admin actor -> itself, every sample interval
// (page_tick_atom); admin actor -> router (every model's worker rows) and -> refit actor (recent
// refit outcomes), each answered with a JSON text.
using page_tick_atom = caf::atom_constant<caf::atom("pagetick")>;
using page_atom = caf::atom_constant<caf::atom("page")>;

using route_job_ptr = std::shared_ptr<const route_job>;
using worker_job_ptr = std::shared_ptr<const worker_job>;
using admin_job_ptr = std::shared_ptr<const admin_job>;
using publisher_frames_ptr = std::shared_ptr<const publisher_frames>;
using replay_message_ptr = std::shared_ptr<const replay_message>;
using spec_ptr = std::shared_ptr<const signature_spec>;
using centroid_set_ptr = std::shared_ptr<const centroid_set>;

// What the router asks the signature cache for one request: store the counts it carries and sum
// the counts of all its blocks under `spec` (null: coverage only, no signature).
struct sign_job {
  uint32_t model = 0;
  spec_ptr spec;
  route_job_ptr job;
};
using sign_job_ptr = std::shared_ptr<const sign_job>;

struct sign_result {
  spec_ptr spec;         // the spec the signature was built under (the job's)
  signature sig;         // empty when spec was null or no block had counts
  uint32_t covered = 0;  // blocks whose counts were known (sent or cached)
  std::string problem;   // why counts were refused (geometry), for the logs; "" when none
};
using sign_result_ptr = std::shared_ptr<const sign_result>;

// Cluster: the part of one route request that this node's own signature-cache shard sums (the
// blocks of it this node owns; core/membership/shard_plan.hpp), handed over without encoding. The
// reply is a shard_sign_reply (cluster_protocol.hpp), as a remote shard's, but never leaves the
// process.
struct shard_job {
  uint32_t model = 0;
  // The layers to sum, ascending (the router's spec's mask); empty: coverage only, no sums.
  std::vector<uint32_t> layers;
  route_job_ptr job;             // the request; keeps the blocks `counts` points into alive
  std::vector<uint64_t> blocks;  // this shard's blocks of the request to sum, in prompt order
  // Blocks of job->request.counts this shard stores (it owns them): sent on their own, one-way
  // (shard_store_atom), or before the sum of `blocks`.
  std::vector<const counts_block*> counts;
};
using shard_job_ptr = std::shared_ptr<const shard_job>;

// A centroid file to store. epoch = 0: the cache assigns max(newest stored + 1, at_least);
// otherwise it stores exactly that epoch (a set adopted from a peer router keeps its number).
struct stored_set {
  uint64_t epoch = 0;
  centroid_file file;
  uint64_t at_least = 0;
};
using stored_set_ptr = std::shared_ptr<const stored_set>;

// The router's sample handed to the refit actor: a copy, so the fit runs without the router.
struct refit_input {
  uint32_t model = 0;
  std::string model_name;
  uint32_t k = 0;
  uint64_t seen = 0;
  std::vector<float> points;  // row-major, spec->width() floats each
  spec_ptr spec;
  centroid_set_ptr current;
  std::optional<centroid_file> current_file;  // provenance and weights of the current set
};
using refit_input_ptr = std::shared_ptr<const refit_input>;

}  // namespace eldr

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::route_job_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::worker_job_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::admin_job_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::publisher_frames_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::replay_message_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::sign_job_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::sign_result_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::shard_job_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::stored_set_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::refit_input_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::centroid_set_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(eldr::spec_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<uint8_t>>)
