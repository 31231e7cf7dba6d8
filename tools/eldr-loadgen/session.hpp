// session: what every part of a loadgen run shares -- the node's endpoints, the workload, the
// prompt plans computed before the runs, the KV-event publishers and the ZeroMQ context made
// once -- and the small helpers (the run clock, progress lines, number formatting).
//
// Not thread-safe: the setup and the generator's thread write it; the preparation and decode
// threads only read it (the decode loop also bumps report_seq, which nothing else touches while it
// runs).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <zmq.hpp>

#include "cluster/wire/kv_events.hpp"
#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/sim/workload.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"

namespace eldr::loadgen {

using wall_clock = std::chrono::steady_clock;

// A progress line on stderr, unless --quiet.
void say(const loadgen_options& o, const std::string& m);

// v with `digits` decimals ("%.*f").
std::string fmt(double v, int digits = 2);

// Model time = wall time since start * scale.
struct run_clock {
  wall_clock::time_point start = wall_clock::now();
  double scale = 1.0;
  double model_now() const {
    return std::chrono::duration<double>(wall_clock::now() - start).count() * scale;
  }
  wall_clock::time_point wall_at(double model_s) const {
    return start + std::chrono::duration_cast<wall_clock::duration>(
                       std::chrono::duration<double>(model_s / scale));
  }
};

// CPU seconds (user + system) this process has used so far, all threads.
double process_cpu_s();

// Milliseconds until a wall time, rounded up, clamped to [0, cap].
int ms_until(wall_clock::time_point t, int cap);

// The status result names its endpoints as bound; a wildcard host is reached through the admin
// endpoint's host.
std::string reachable(const std::string& endpoint, const std::string& admin);

// One source request's prompt, as the prefill side sees it.
struct prompt_plan {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> hashes;
  std::vector<block_counts> counts;  // per block; empty when counts are not sent
};

// Request r's prompt plan: its synthetic tokens, block hashes and, with_counts, per-block expert
// counts (ids is scratch space).
result<std::shared_ptr<const prompt_plan>> make_plan(const workload& w, const sim_request& r,
                                                     uint32_t block_size, bool with_counts,
                                                     std::vector<expert_id>& ids);

// An emulated prefill worker's KV-event publisher. XPUB so that the node's subscription can be
// awaited instead of slept for; subscribers see exactly a PUB's frames.
struct publisher {
  zmq::socket_t socket;
  std::string endpoint;
  uint64_t seq = 0;

  void publish(const std::vector<kv_event>& events) { publish_encoded(encode_events(events)); }

  // A batch's payload, encoded ahead of its publication (the timestamp is the encoding time).
  static std::vector<uint8_t> encode_events(const std::vector<kv_event>& events);

  // Sends one encoded batch (nothing for an empty payload); never blocks.
  void publish_encoded(const std::vector<uint8_t>& payload);

  // Waits until a subscriber joins (a subscription notice arrives), up to timeout_ms.
  bool wait_subscriber(int timeout_ms);
};

// Everything a run shares: the node, the workload, the sockets made once.
struct session {
  const loadgen_options* o = nullptr;
  std::string model;
  std::string route_endpoint, worker_endpoint;
  // Where route requests go, round robin per request (weighted by --router-weights): --node's
  // route endpoint, or those of --routers, in --routers' order.
  std::vector<std::string> route_endpoints;
  // --routers other than --node: their admin clients (policy commands) and worker endpoints
  // (publisher registrations).
  std::vector<std::unique_ptr<admin_client>> other_admins;
  std::vector<std::string> other_workers;
  std::shared_ptr<const request_source> source;
  std::unique_ptr<workload> w;
  zmq::context_t ctx{1};
  std::vector<publisher> publishers;
  std::vector<uint64_t> report_seq;  // per decode worker, increasing across runs
  // Request ids are "r<run>.<nonce>-<i>": the nonce, random per process, keeps two loadgen
  // processes against one node from sending the same ids -- the node answers a repeated id with
  // the decision it remembers (a client's retry), which would measure that path instead.
  std::string id_nonce;
  uint64_t import_epoch = 0;
  // The centroid set imported at setup (the base of --swap-at's second set) and the epoch the
  // node serves now.
  centroid_file imported;
  bool have_imported = false;
  uint64_t current_epoch = 0;
  std::string source_name;
  // Prompt plans computed before the runs (shared by every policy's run), so the generator does
  // not fall behind its arrivals while it draws prompts: up to max_plans distinct prompts, the
  // rest on arrival.
  std::unordered_map<uint64_t, std::shared_ptr<const prompt_plan>> plans;
};

constexpr std::size_t max_plans = 4096;

// Computes s.plans: the first max_plans distinct sources' plans, on o.workload.threads threads.
status prepare_plans(session& s);

}  // namespace eldr::loadgen
