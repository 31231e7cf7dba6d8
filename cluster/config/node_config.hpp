// node_config: the configuration of one eldr-node, read from one TOML file (docs/configuration.md
// documents every key) or taken from the embedded default (no file: one node, all roles, RocksDB
// under ./eldr-data, endpoints on loopback).
//
// Validated once at start-up into this immutable struct: an unknown key, a wrong type or a value
// out of range is an error naming the file and the key ("eldr.toml: models[1].tau: must be finite
// and >= 0, got -0.5"), and the node stops before binding anything. Keys absent from the file keep
// the defaults below; the TOML key of each field is in docs/configuration.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// One model's decode pool and its routing.
struct model_config {
  std::string name;      // [models] name: what route requests name; unique, non-empty
  uint32_t workers = 0;  // K: decode workers in the pool (0 = from the centroid file, else from
                         // registrations, up to max_workers)
  uint32_t max_workers = 1024;
  std::string centroids;  // centroid file loaded at start-up when the store has none ("" = none)
  // rr, random, jsq, p2c, eldr, eldr-adaptive (the locality ones route by load only -- JSQ --
  // until a centroid set exists; eldr-adaptive never loses to the load balancers, see
  // docs/evaluation.md, so it is the default)
  std::string policy = "eldr-adaptive";
  float tau = 0.1f;  // locality band half-width
  bool widen_single = true;
  uint64_t seed = 1;                 // rr/random/p2c
  int64_t worker_timeout_ms = 3000;  // a worker silent this long leaves the candidate set
  // Workers that registered a metrics_url (vLLM's /metrics) are scraped this often; their scraped
  // load is authoritative and each scrape is a heartbeat (docs/vllm.md). 0 = automatic:
  // min(200, worker_timeout_ms / 2), see scrape_interval(). Else >= 10 and, when
  // worker_timeout_ms > 0, <= worker_timeout_ms / 2 (a timeout must span two scrapes).
  uint32_t scrape_interval_ms = 0;
  // Refit: every refit_interval_s (0 = only on `eldrctl refit`), on a reservoir of sample_size
  // live signatures, once at least min_sample have been seen.
  uint32_t refit_interval_s = 0;
  uint32_t sample_size = 4096;
  // How far back the reservoir reaches, in signatures (core/refit.hpp signature_sample): 0 =
  // automatic (8 x sample_size, resolved_sample_horizon); else >= sample_size.
  uint64_t sample_horizon = 0;
  uint32_t min_sample = 256;
  double max_balance_ratio = 3.0;
  double score_tolerance = 0.0;
  uint32_t refit_batch_size = 16;
  std::vector<std::string> kv_endpoints;      // vLLM KV-event publishers to subscribe to
  std::vector<std::string> counts_endpoints;  // eldr counts publishers to subscribe to
  // [models.kv_events] bind: an endpoint the node binds a SUB socket on, for vLLM KV-event
  // publishers that connect (vLLM's endpoint "tcp://eldr-host:PORT"); "" = none.
  std::string kv_bind;

  // scrape_interval_ms, or its automatic value when 0.
  uint32_t scrape_interval() const;
};

// [cluster]: several nodes as one control plane (docs/cluster.md). Off when `listen` is empty:
// the node is standalone and must then hold all four roles.
struct cluster_config {
  std::string listen;     // host:port the cluster transport (CAF's middleman) binds; port 0 = any
  std::string advertise;  // host:port peers dial to reach this node; "" = listen's
  std::vector<std::string> seeds;  // host:port of nodes to join through (may include this one)
  std::string secret_file;      // the shared cluster secret (>= 16 bytes); required when clustered
  uint32_t heartbeat_ms = 250;  // CAF heartbeat between connected nodes
  uint32_t connection_timeout_ms = 1500;  // a peer silent this long is dead (> heartbeat_ms)
  uint32_t reconnect_ms = 500;            // how often lost peers and seeds are dialled again
  uint32_t replication = 2;               // R: signature-cache nodes holding each block
  uint32_t vnodes = 64;                   // virtual nodes per signature-cache node on the ring
  uint32_t load_sync_ms = 5;              // routers exchange in-flight changes this often
  // How routers share load (docs/cluster.md): "authority" -- the node a worker talks to alone
  // applies its messages and publishes one load vector per interval; routers send it cumulative
  // per-worker decision totals (core/membership/load_exchange.hpp) -- or "decisions" -- every
  // router sends every decision to every other router and every worker message reaches every
  // router, a cost per router that grows with the cluster's total rate (BENCHMARKS.md,
  // "Fan-in"). The default since 2026-12-05.
  std::string load_sharing = "authority";
  // With load authorities: a router adds to a worker's load, beside each of its own decisions the
  // vectors do not include yet, (R - 1) more for its peers' decisions in that time, R being the
  // routers the vectors show deciding (core/membership/load_exchange.hpp, peer_estimate;
  // router_activity.hpp; docs/cluster.md, "Peer estimate"). Assumes the clients spread requests
  // about evenly over the routers that get any. false = own decisions only.
  bool peer_estimate = true;
  uint32_t decision_ttl_ms = 60000;   // a route retried within this returns the same decision
  uint32_t max_decisions = 1u << 20;  // decisions remembered for retries, per node
  // Per model, what a router keeps of the shards' sums by exact block list, so that a prefix
  // asked again costs no shard request (actors/router/shard_sum_cache.hpp); 0 = off.
  uint32_t shard_sum_cache_mib = 64;
  // Per model, what a router keeps of the blocks whose counts requests brought it (their counts
  // over the spec's mask), so that a later prefix hit on them is summed without a shard request
  // (actors/router/seen_blocks.hpp); 0 = off.
  uint32_t seen_blocks_mib = 64;
  // Replica stores to other nodes are batched per owner and sent this often (0 = each at once;
  // actors/router/store_batch.hpp).
  uint32_t store_batch_ms = 10;
  // After a signature-cache node joins, routers read (shard lookups) through the ring before the
  // join for this long, while the old owners hand the newcomer its blocks, and store to the owners
  // of both rings meanwhile: a prefix the cluster held is not missed during the hand-off
  // (docs/cluster.md, "Signature cache"); 0 = read the new ring at once.
  uint32_t handoff_grace_ms = 120000;
  // TLS for node-to-node traffic through CAF's openssl module: all empty = plain TCP (the secret
  // still authenticates joins). certificate and key go together; ca_file makes peers verify
  // each other's certificates.
  std::string tls_certificate;
  std::string tls_key;
  std::string tls_ca_file;
};

// [security]: ZeroMQ CURVE on the route, worker and admin endpoints (docs/security.md).
struct security_config {
  std::string curve_secret_key_file;       // the node's CURVE secret key (Z85); "" = CURVE off
  std::string curve_authorized_keys_file;  // client public keys allowed; "" = any client that
                                           // knows the node's public key
};

// [timeouts]: how long the node's actors wait for each other and for peers, in ms. Each must be
// in 1..600000 (timeouts.* in docs/configuration.md says what each bounds).
struct timeouts_config {
  uint32_t shard_sign_ms = 100;         // router -> a signature-cache shard's sum of block counts
  uint32_t recall_ms = 50;              // router -> the other routers: a marked retry's decision
  uint32_t subscribe_ms = 30'000;       // load monitor -> signature cache: follow a publisher
  uint32_t admin_query_ms = 5'000;      // admin -> router, signature cache, refit: status, history
  uint32_t dial_ms = 5'000;             // cluster: connect, hello and join of one dial
  uint32_t challenge_ttl_ms = 10'000;   // a gate's join challenge not answered within this expires
  uint32_t leader_wait_ms = 5'000;      // a set change waits this long for a refit leader
  uint32_t leader_retry_ms = 100;       // ... asking again this often while it waits
  uint32_t set_change_ms = 10'000;      // router -> the leader's router: a set change's answer
  uint32_t peer_sample_ms = 2'000;      // refit leader -> another router: its sampled signatures
  uint32_t vote_ms = 1'000;             // refit candidate -> a member: its vote
  uint32_t leadership_tick_ms = 1'000;  // the refit actor re-evaluates leadership this often
};

struct node_config {
  std::string name = "eldr-node";  // node.name: shown in status and logs
  std::vector<std::string> roles{"router", "signature-cache", "load-monitor", "refit"};
  std::string data_dir = "./eldr-data";  // node.data_dir: RocksDB stores, one per model
  // [endpoints]: ZeroMQ bind addresses; port 0 / "*" picks a free port (tests).
  std::string route_endpoint = "tcp://127.0.0.1:5700";
  std::string worker_endpoint = "tcp://127.0.0.1:5701";
  std::string admin_endpoint = "tcp://127.0.0.1:5702";
  std::string metrics_address = "127.0.0.1:9700";  // HTTP host:port for /metrics; "" = off
  // [limits]
  uint32_t max_message_bytes = 4u << 20;
  uint32_t max_blocks = 4096;
  uint32_t max_pending = 10000;              // route requests accepted and not yet answered
  uint32_t max_tracked_requests = 1u << 20;  // in-flight request ids remembered per model
  // Reply bytes held for peers that do not read, across all peers (zmq_frontend); 0 = none held.
  uint64_t max_queued_reply_bytes = uint64_t{64} << 20;
  // [runtime]
  uint32_t threads = 2;            // CAF scheduler threads
  std::string log_level = "info";  // trace, debug, info, warn, error, off
  std::string log_format =
      "text";  // "text" (spdlog's lines) or "json" (cluster/config/json_log.hpp)
  uint32_t explain_history = 4096;  // recent decisions kept for `eldrctl explain`
  // [signature_cache]
  uint64_t cache_memory_bytes = uint64_t{256} << 20;
  uint64_t cache_max_blocks = uint64_t{1} << 22;
  // Share of max_blocks one publisher may hold (docs/signature-cache.md, "Eviction and bounds").
  double cache_publisher_share = 0.25;
  // A held block that gets no counts within this time is dropped; 0 = kept for ever.
  uint64_t cache_uncounted_block_grace_ms = 60'000;
  bool sync_wal = false;
  uint32_t commit_interval_ms = 10;  // group commit of ingested events
  // Publishers followed per node (configured + registered), 1..4096; each costs a SUB socket.
  uint32_t max_publishers = 256;
  // A registered publisher silent this long is dropped with its blocks (0 = never).
  int64_t publisher_forget_ms = 3'600'000;
  uint32_t replay_timeout_ms = 2000;  // a replay silent this long ends as failed, 1..60000
  cluster_config cluster;
  security_config security;
  timeouts_config timeouts;
  std::vector<model_config> models;  // at least one

  bool clustered() const { return !cluster.listen.empty(); }
  bool has_role(std::string_view role) const;
};

// Lower bounds of the interval keys (docs/configuration.md says why).
constexpr uint32_t min_commit_interval_ms = 5;   // signature_cache.commit_interval_ms
constexpr int64_t min_worker_timeout_ms = 100;   // models[].worker_timeout_ms, unless 0 (never)
constexpr uint32_t min_scrape_interval_ms = 10;  // models[].scrape_interval_ms

// The embedded default: one model "default" (K from registrations), all roles, loopback.
node_config default_node_config();

// Parses and validates TOML text; `origin` (a path) prefixes errors ("origin: key: problem";
// syntax errors "origin: line L, column C: TOML syntax error: ..."). All errors are
// invalid_argument and report the first problem found. The file must hold at least one
// [[models]] table (the embedded default's model is not added to a file's).
// `validate` = false checks structure and types only (for a program that applies command-line
// overrides first -- e.g. cluster.advertise from a pod's IP -- and validates afterwards).
result<node_config> parse_node_config(const std::string& toml_text, const std::string& origin,
                                      bool validate = true);
// read_file + parse_node_config(text, path); a missing or unreadable file is not_found/io_error.
result<node_config> load_node_config(const std::string& path, bool validate = true);

// Checks every range and cross-field rule (unique model names, roles known, endpoints parseable,
// workers <= max_workers, ...); messages name the TOML key without an origin ("models[0].tau:
// ..."). Called by the parsers; exposed for configs built in code (tests) or changed after
// parsing (command-line overrides).
status validate_node_config(const node_config& c);

// Checks what start-up reads besides the config itself, so that --check-config (systemd's
// ExecStartPre, a CI step) fails where the node would: node.data_dir is a directory or can be
// created; cluster.secret_file (when clustered), the cluster TLS files and the CURVE key files
// exist, are regular files and parse; each model's centroid file exists and parses, and its K
// matches the model's workers (when set) and max_workers. A path that is a directory is said to
// be one. Messages name the key ("models[0].centroids: ..."). Reads files; changes nothing.
// `c` must have passed validate_node_config.
status check_node_files(const node_config& c);

}  // namespace eldr
