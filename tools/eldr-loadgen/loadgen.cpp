// loadgen: setup against the node (status, centroids, registrations, publishers), the generator
// loop (prefill emulation and pipelined route requests), the decode loop, and the results.
#include "tools/eldr-loadgen/loadgen.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <limits>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <span>
#include <thread>
#include <unordered_map>
#include <variant>

#include <poll.h>
#include <sys/resource.h>
#include <zmq.hpp>

#include "cluster/client.hpp"
#include "cluster/counts_message.hpp"
#include "cluster/route_protocol.hpp"
#include "core/centroid_file.hpp"
#include "core/expert_counts.hpp"
#include "core/parallel.hpp"
#include "core/sim_policies.hpp"
#include "core/simulator.hpp"
#include "core/synthetic.hpp"
#include "core/trace.hpp"
#include "core/version.hpp"
#include "core/workload.hpp"
#include "tools/eldr-loadgen/decode_emulator.hpp"
#include "tools/eldr-loadgen/prefill_emulator.hpp"

namespace eldr::loadgen {
namespace {

using json = nlohmann::json;
using wall_clock = std::chrono::steady_clock;

void say(const loadgen_options& o, const std::string& m) {
  if (!o.quiet) std::fprintf(stderr, "eldr-loadgen: %s\n", m.c_str());
}

std::string fmt(double v, int digits = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

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
double process_cpu_s() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// Milliseconds until a wall time, rounded up, clamped to [0, cap].
int ms_until(wall_clock::time_point t, int cap) {
  const auto d = std::chrono::duration<double, std::milli>(t - wall_clock::now()).count();
  if (d <= 0.0) return 0;
  return static_cast<int>(std::min<double>(cap, std::ceil(d)));
}

// The status result names its endpoints as bound; a wildcard host is reached through the admin
// endpoint's host.
std::string reachable(const std::string& endpoint, const std::string& admin) {
  auto host_of = [](const std::string& e) -> std::pair<std::size_t, std::size_t> {
    const std::size_t a = e.find("://");
    if (a == std::string::npos) return {std::string::npos, 0};
    const std::size_t b = e.rfind(':');
    if (b == std::string::npos || b <= a + 3) return {std::string::npos, 0};
    return {a + 3, b - (a + 3)};
  };
  const auto [start, len] = host_of(endpoint);
  if (start == std::string::npos) return endpoint;
  const std::string host = endpoint.substr(start, len);
  if (host != "*" && host != "0.0.0.0" && host != "[::]" && host != "::") return endpoint;
  const auto [astart, alen] = host_of(admin);
  if (astart == std::string::npos) return endpoint;
  return endpoint.substr(0, start) + admin.substr(astart, alen) + endpoint.substr(start + len);
}

// One source request's prompt, as the prefill side sees it.
struct prompt_plan {
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> hashes;
  std::vector<block_counts> counts;  // per block; empty when counts are not sent
};

result<std::shared_ptr<const prompt_plan>> make_plan(const workload& w, const sim_request& r,
                                                     uint32_t block_size, bool with_counts,
                                                     std::vector<expert_id>& ids) {
  auto p = std::make_shared<prompt_plan>();
  prompt_tokens(r.source, r.prompt_tokens, p->tokens);
  p->hashes = block_hashes(p->tokens, block_size);
  if (with_counts && r.prompt_tokens > 0) {
    w.source->prompt_experts(r.source, ids);
    auto c = count_blocks(w.geometry(), ids, 0, r.prompt_tokens, block_size);
    if (!c.ok()) return c.error();
    p->counts = std::move(c).value();
  }
  return std::shared_ptr<const prompt_plan>(std::move(p));
}

// An emulated prefill worker's KV-event publisher. XPUB so that the node's subscription can be
// awaited instead of slept for; subscribers see exactly a PUB's frames.
struct publisher {
  zmq::socket_t socket;
  std::string endpoint;
  uint64_t seq = 0;

  void publish(const std::vector<kv_event>& events) { publish_encoded(encode_events(events)); }

  // A batch's payload, encoded ahead of its publication (the timestamp is the encoding time).
  static std::vector<uint8_t> encode_events(const std::vector<kv_event>& events) {
    if (events.empty()) return {};
    kv_batch b;
    b.ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    b.data_parallel_rank = 0;
    b.events = events;
    return encode_kv_batch(b);
  }

  void publish_encoded(const std::vector<uint8_t>& payload) {
    if (payload.empty()) return;
    const auto seq8 = encode_sequence(seq++);
    // PUB/XPUB sends never block: without a subscriber, or above the HWM, frames are dropped,
    // as vLLM's would be.
    (void)socket.send(zmq::const_buffer("", 0), zmq::send_flags::sndmore);
    (void)socket.send(zmq::buffer(seq8), zmq::send_flags::sndmore);
    (void)socket.send(zmq::buffer(payload), zmq::send_flags::none);
    // Subscription notices pile up in an XPUB: read them.
    zmq::message_t m;
    while (socket.recv(m, zmq::recv_flags::dontwait)) {
    }
  }

  // Waits until a subscriber joins (a subscription notice arrives), up to timeout_ms.
  bool wait_subscriber(int timeout_ms) {
    const auto deadline = wall_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
      const int left = ms_until(deadline, timeout_ms);
      if (zmq::poll(&item, 1, std::chrono::milliseconds(left)) <= 0) return false;
      zmq::message_t m;
      if (socket.recv(m, zmq::recv_flags::dontwait) && m.size() >= 1 &&
          static_cast<const uint8_t*>(m.data())[0] == 1)
        return true;
    }
  }
};

// Everything a run shares: the node, the workload, the sockets made once.
struct session {
  const loadgen_options* o = nullptr;
  std::string model;
  std::string route_endpoint, worker_endpoint;
  // Where route requests go, round robin per request: --node's route endpoint, or those of
  // --routers.
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

status prepare_plans(session& s) {
  const loadgen_options& o = *s.o;
  const workload& w = *s.w;
  std::vector<uint32_t> firsts;  // the first request of each distinct source, in arrival order
  std::unordered_map<uint64_t, bool> seen;
  for (uint32_t i = 0; i < w.requests.size() && firsts.size() < max_plans; ++i)
    if (seen.emplace(w.requests[i].source, true).second) firsts.push_back(i);
  std::vector<std::shared_ptr<const prompt_plan>> made(firsts.size());
  std::vector<status> errors(firsts.size());
  parallel_slices(o.threads, firsts.size(), [&](std::size_t begin, std::size_t end) {
    std::vector<expert_id> ids;
    for (std::size_t j = begin; j < end; ++j) {
      auto p = make_plan(w, w.requests[firsts[j]], o.block_size, o.send_counts, ids);
      if (p.ok()) {
        made[j] = std::move(p).value();
      } else {
        errors[j] = p.error();
      }
    }
  });
  for (std::size_t j = 0; j < firsts.size(); ++j) {
    if (!errors[j].ok()) return errors[j];
    s.plans.emplace(w.requests[firsts[j]].source, std::move(made[j]));
  }
  return {};
}

// A decided request handed to the decode loop.
struct handoff {
  uint32_t request;
  uint32_t worker;
  double t;  // model time of decode arrival (reply + KV transfer)
};

struct handoff_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<handoff> items;
  bool producer_done = false;
};

// Drains pipelined worker acks without waiting; counts error replies.
void drain_acks(worker_client& c, uint64_t& errors) {
  for (;;) {
    auto r = c.receive(0);
    if (!r.ok()) return;
    if (std::holds_alternative<error_reply>(*r)) ++errors;
  }
}

struct decode_stats {
  uint64_t messages = 0, errors = 0;
};

// The decode loop: every emulated decode worker, against the wall clock.
void decode_loop(session& s, decode_emulator& emu, handoff_queue& q, const run_clock& clock,
                 const std::atomic<bool>& stop, const std::string& run_id, decode_stats& out) {
  const loadgen_options& o = *s.o;
  client_options co;
  co.timeout_ms = o.route_timeout_ms;
  auto wc = worker_client::connect(s.worker_endpoint, co);
  if (!wc.ok()) {
    ++out.errors;
    return;
  }
  worker_client& c = **wc;
  const uint32_t D = o.decode_workers;
  std::vector<handoff> taken;
  std::vector<decode_finish> finished;
  const double report_s = o.report_ms / 1000.0 * o.time_scale;  // in model time
  double next_report = clock.model_now();
  wall_clock::time_point drain_deadline = wall_clock::time_point::max();
  auto send_reports = [&] {
    for (uint32_t wi = 0; wi < D; ++wi) {
      const decode_worker_load l = emu.load(wi);
      load_report m;
      m.model = s.model;
      m.worker = wi;
      m.in_flight = l.in_flight();
      m.running = l.running;
      m.waiting = l.waiting;
      m.kv_usage =
          o.max_batch > 0
              ? std::min(1.0f, static_cast<float>(l.running) / static_cast<float>(o.max_batch))
              : 0.0f;
      m.seq = ++s.report_seq[wi];
      if (c.send(m).ok()) {
        ++out.messages;
      } else {
        ++out.errors;
      }
    }
  };
  for (;;) {
    bool done = false;
    {
      std::unique_lock lock(q.mu);
      taken.swap(q.items);
      done = q.producer_done;
      if (done && drain_deadline == wall_clock::time_point::max())
        drain_deadline = wall_clock::now() + std::chrono::duration_cast<wall_clock::duration>(
                                                 std::chrono::duration<double>(o.drain_s));
    }
    for (const handoff& h : taken)
      emu.arrive(h.request, h.worker, h.t);
    taken.clear();
    const double now = clock.model_now();
    emu.advance_to(now, finished);
    if (!finished.empty()) {
      // One finished message per worker with every request it completed since the last one.
      std::sort(finished.begin(), finished.end(),
                [](const decode_finish& a, const decode_finish& b) { return a.worker < b.worker; });
      for (std::size_t j = 0; j < finished.size();) {
        finished_requests m;
        m.model = s.model;
        m.worker = finished[j].worker;
        for (; j < finished.size() && finished[j].worker == m.worker; ++j)
          m.requests.push_back(run_id + "-" + std::to_string(finished[j].request));
        if (c.send(m).ok()) {
          ++out.messages;
        } else {
          ++out.errors;
        }
      }
      finished.clear();
    }
    if (now >= next_report) {
      send_reports();
      next_report = now + report_s;
    }
    drain_acks(c, out.errors);
    if (stop.load() || (done && emu.idle()) || wall_clock::now() >= drain_deadline) break;
    const double next = std::min(emu.next_event_time(), next_report);
    std::unique_lock lock(q.mu);
    q.cv.wait_until(lock, std::min(clock.wall_at(next), drain_deadline),
                    [&] { return !q.items.empty() || (q.producer_done && !done) || stop.load(); });
  }
  send_reports();  // the final view: whatever is left
  drain_acks(c, out.errors);
}

result<std::vector<uint8_t>> swap_centroid_bytes(session& s);

// The per-request record of the generator.
enum class route_fate : uint8_t { unsent, outstanding, replied, error_reply, timeout, send_error };

struct request_record {
  wall_clock::time_point sent_at{};
  wall_clock::time_point received_at{};
  uint64_t epoch = 0;  // of the reply (decisions only)
  route_fate fate = route_fate::unsent;
  bool outstanding() const { return fate == route_fate::outstanding; }
};

struct pending_route {
  double handoff;
  uint32_t request;
  bool operator>(const pending_route& o) const {
    return handoff != o.handoff ? handoff > o.handoff : request > o.request;
  }
};

// One request made ready before it is due: everything that does not depend on timing (the
// prompt plan, the prefill cache's outcome, which depends on request order alone, the KV-event
// batch and the route request) is encoded ahead, so that the generator's thread only publishes,
// sends, receives and stamps during the timed phase.
struct prepared_request {
  double handoff = 0.0;  // model time the route request is due
  uint32_t publisher = 0;
  std::vector<uint8_t> kv_payload;  // encoded kv_batch; empty = no events
  std::vector<uint8_t> route_bytes;
  std::size_t footprint() const {
    return sizeof(*this) + kv_payload.capacity() + route_bytes.capacity();
  }
};

// Preparation runs on its own thread, ahead of the generator, holding at most a budget of bytes of
// prepared requests; the timed phase starts once every request is prepared or the budget is full
// (runs whose prepared data fits, i.e. nearly all, prepare everything before the clock starts).
// Its budget is --prepare-budget-mib (1 GiB).
struct prepare_pipeline {
  std::vector<prepared_request> items;
  std::atomic<uint32_t> ready{0};  // items[0, ready) are prepared
  std::atomic<std::size_t> bytes{0};
  std::atomic<bool> quit{false}, failed{false};
  status failure;  // written before `failed`
  std::mutex mu;
  std::condition_variable cv;  // room freed (consumer) or an item made (producer)
  // Totals of the prefill emulation (read after join).
  uint64_t kv_blocks_stored = 0, kv_blocks_removed = 0, blocks_total = 0, blocks_hit = 0;
};

// The admin-side hot swap of one run (--swap-at): its own thread and admin socket.
struct swap_state {
  std::vector<uint8_t> file;          // the second centroid set
  std::atomic<bool> run_over{false};  // the run ended: give up waiting for swap_at
  bool done = false;
  status failure;
  wall_clock::time_point t_sent{}, t_acked{};
  uint64_t epoch_after = 0;
};

result<policy_result> run_policy(session& s, const std::string& policy, uint32_t run_index,
                                 const std::atomic<bool>& stop) {
  const loadgen_options& o = *s.o;
  const workload& w = *s.w;
  const model_geometry& g = w.geometry();
  const uint32_t D = o.decode_workers;
  const uint32_t N = static_cast<uint32_t>(w.requests.size());
  const std::string run_id = "r" + std::to_string(run_index) + "." + s.id_nonce;
  policy_result res;
  res.policy = policy;
  res.decisions.assign(D, 0);

  // The route socket: the loadgen's own DEALER (as route_client's), so that requests encoded
  // ahead are sent as bytes, and replies are stamped the moment they are read.
  const route_protocol_limits limits{};
  zmq::socket_t route(s.ctx, zmq::socket_type::dealer);
  int route_fd = -1;  // ZMQ_FD: readable when the socket's events may have changed
  try {
    route.set(zmq::sockopt::linger, 0);
    route.set(zmq::sockopt::sndhwm, 100000);
    route.set(zmq::sockopt::rcvhwm, 100000);
    route.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(limits.max_payload_bytes));
    route.set(zmq::sockopt::sndtimeo, o.route_timeout_ms);
    // Several endpoints: a DEALER sends round robin over its peers, one request each in turn
    // (ZMQ_IMMEDIATE is off, so every peer's pipe exists from connect() on).
    for (const std::string& e : s.route_endpoints)
      route.connect(e);
    route_fd = route.get(zmq::sockopt::fd);
  } catch (const std::exception& e) {
    return status::io_error(std::string("route socket: ") + e.what());
  }
  client_options co;
  co.timeout_ms = o.route_timeout_ms;
  std::unique_ptr<worker_client> finisher;  // route-only: finishes every decided request
  if (o.route_only) {
    auto wc = worker_client::connect(s.worker_endpoint, co);
    if (!wc.ok()) return wc.error();
    finisher = std::move(wc).value();
  }

  // Fresh prefill caches per run, so every policy sees the same hits; the node is told.
  for (uint32_t p = 0; p < o.prefill_workers; ++p) {
    kv_event cleared;
    cleared.type = kv_event_type::all_blocks_cleared;
    s.publishers[p].publish({cleared});
  }

  // Preparation, ahead of the timed phase (see prepare_pipeline).
  const std::size_t prepare_budget_bytes =
      static_cast<std::size_t>(std::max<uint64_t>(1, o.prepare_budget_mib)) << 20;
  prepare_pipeline prep;
  prep.items.resize(N);
  std::thread preparer([&] {
    std::vector<prefix_cache> caches;
    for (uint32_t p = 0; p < o.prefill_workers; ++p)
      caches.emplace_back(o.prefill_cache_blocks, o.block_size);
    prefill_clock prefill(o.prefill_workers, o.route_only ? 0.0 : o.prefill_base_ms,
                          o.route_only ? 0.0 : o.prefill_per_token_ms);
    std::vector<expert_id> ids;
    for (uint32_t i = 0; i < N && !prep.quit.load(); ++i) {
      if (prep.bytes.load() >= prepare_budget_bytes) {
        std::unique_lock lock(prep.mu);
        // The consumer frees memory without the lock: wait in short slices, not for a notify
        // that may come between the check and the wait.
        while (prep.bytes.load() >= prepare_budget_bytes && !prep.quit.load())
          prep.cv.wait_for(lock, std::chrono::milliseconds(1));
        if (prep.quit.load()) break;
      }
      const sim_request& r = w.requests[i];
      std::shared_ptr<const prompt_plan> plan;
      if (auto it = s.plans.find(r.source); it != s.plans.end()) plan = it->second;
      if (!plan) {
        auto made = make_plan(w, r, o.block_size, o.send_counts, ids);
        if (!made.ok()) {
          prep.failure = made.error();
          prep.failed.store(true);
          break;
        }
        plan = std::move(made).value();
      }
      // A prefix-aware prefill router: a prompt's first block picks its prefill worker.
      const uint32_t pw =
          plan->hashes.empty() ? 0 : static_cast<uint32_t>(plan->hashes[0] % o.prefill_workers);
      const prefill_outcome po = caches[pw].prefill(plan->hashes, plan->tokens);
      for (const kv_event& e : po.events)
        (e.type == kv_event_type::block_stored ? prep.kv_blocks_stored : prep.kv_blocks_removed) +=
            e.block_hashes.size();
      prep.blocks_total += plan->hashes.size();
      prep.blocks_hit += po.hit_blocks;
      route_request req;
      req.id = run_id + "-" + std::to_string(i);
      req.model = s.model;
      req.block_hashes = plan->hashes;
      if (r.label >= 0) req.label = static_cast<uint32_t>(r.label);
      if (o.send_counts && po.hit_blocks < plan->hashes.size()) {
        counts_message m;
        m.geometry = g;
        for (std::size_t b = po.hit_blocks; b < plan->hashes.size(); ++b) {
          counts_block cb;
          cb.hash = plan->hashes[b];
          if (b > 0) cb.parent = plan->hashes[b - 1];
          cb.counts = plan->counts[b];
          m.blocks.push_back(std::move(cb));
        }
        req.counts = std::move(m);
      }
      const uint32_t uncached =
          r.prompt_tokens - std::min(r.prompt_tokens, po.hit_blocks * o.block_size);
      prepared_request& pr = prep.items[i];
      pr.handoff = prefill.handoff(r.arrival_s, uncached);
      pr.publisher = pw;
      pr.kv_payload = publisher::encode_events(po.events);
      pr.route_bytes = encode_route_request(req);
      prep.bytes.fetch_add(pr.footprint());
      prep.ready.store(i + 1, std::memory_order_release);
      if (((i + 1) & 63) == 0 || i + 1 == N) prep.cv.notify_all();
    }
    prep.cv.notify_all();
  });
  auto stop_preparer = [&] {
    prep.quit.store(true);
    { std::lock_guard lock(prep.mu); }
    prep.cv.notify_all();
    if (preparer.joinable()) preparer.join();
  };
  {
    std::unique_lock lock(prep.mu);
    while (!(prep.ready.load() >= N || prep.bytes.load() >= prepare_budget_bytes ||
             prep.failed.load() || stop.load()))
      prep.cv.wait_for(lock, std::chrono::milliseconds(20));
  }
  if (prep.failed.load()) {
    stop_preparer();
    return prep.failure;
  }

  std::unique_ptr<decode_emulator> emu;
  if (!o.route_only) {
    decode_emulator_config dc;
    dc.workers = D;
    dc.max_batch = o.max_batch;
    dc.kv_capacity_tokens = o.kv_capacity_tokens;
    dc.cost = o.cost;
    auto e = decode_emulator::make(w, dc);
    if (!e.ok()) {
      stop_preparer();
      return e.error();
    }
    emu = std::move(e).value();
  }

  // The hot swap (--swap-at), for the eldr policy: its admin client connects before the clock
  // starts; its own socket and thread leave the route socket's timing alone.
  const bool swapping = o.swap_at.has_value() && policy == "eldr" && s.have_imported;
  swap_state sw;
  const uint64_t epoch_before = s.current_epoch;
  std::unique_ptr<admin_client> swap_admin;
  if (swapping) {
    auto f = swap_centroid_bytes(s);
    if (!f.ok()) {
      stop_preparer();
      return f.error();
    }
    sw.file = std::move(f).value();
    client_options ao;
    ao.timeout_ms = 30000;
    auto a = admin_client::connect(o.node, ao);
    if (!a.ok()) {
      stop_preparer();
      return a.error();
    }
    swap_admin = std::move(a).value();
  }

  run_clock clock;
  clock.scale = o.time_scale;
  handoff_queue q;
  decode_stats dstats;
  std::thread decoder;
  if (emu) decoder = std::thread([&] { decode_loop(s, *emu, q, clock, stop, run_id, dstats); });
  std::thread swapper;
  if (swapping)
    swapper = std::thread([&] {
      const auto at = clock.start + std::chrono::duration_cast<wall_clock::duration>(
                                        std::chrono::duration<double>(*o.swap_at));
      while (!stop.load() && !sw.run_over.load() && wall_clock::now() < at)
        std::this_thread::sleep_for(
            std::min<wall_clock::duration>(at - wall_clock::now(), std::chrono::milliseconds(20)));
      if (stop.load() || sw.run_over.load()) return;
      json args = {{"model", s.model}, {"file", json::binary(sw.file)}};
      sw.t_sent = wall_clock::now();
      auto r = swap_admin->call("centroids.import", std::move(args));
      sw.t_acked = wall_clock::now();
      if (!r.ok()) {
        sw.failure = r.error();
      } else if (!r->is_object() || !r->contains("epoch") || !(*r)["epoch"].is_number_unsigned()) {
        sw.failure =
            status::invalid_argument("centroids.import answered without an epoch: " + r->dump());
      } else {
        sw.epoch_after = (*r)["epoch"].get<uint64_t>();
      }
      sw.done = true;
    });

  std::vector<request_record> rec(N);
  std::priority_queue<pending_route, std::vector<pending_route>, std::greater<>> pending;
  std::deque<uint32_t> in_order;  // sent requests, oldest first, for timeouts
  std::vector<std::vector<std::string>> to_finish(D);
  wall_clock::time_point next_finish_flush = wall_clock::now();
  std::set<uint64_t> epochs;
  std::vector<double> rtts;  // after the warm-up
  rtts.reserve(N);
  std::vector<std::vector<double>> rtts_by_second;
  double coverage_sum = 0;
  uint64_t decisions = 0, outstanding = 0;
  wall_clock::time_point first_send{}, last_reply{};
  uint32_t next_arrival = 0;
  status failure;

  auto handle_reply = [&](const route_outcome& out, wall_clock::time_point now) {
    const std::string* id = nullptr;
    if (const auto* rr = std::get_if<route_reply>(&out)) {
      id = &rr->id;
    } else if (const auto& er = std::get<error_reply>(out); er.id) {
      id = &*er.id;
    }
    uint32_t i = UINT32_MAX;
    if (id != nullptr && id->size() > run_id.size() + 1 && id->rfind(run_id + "-", 0) == 0) {
      uint32_t v = 0;
      const char* b = id->data() + run_id.size() + 1;
      if (std::from_chars(b, id->data() + id->size(), v).ec == std::errc{} && v < N) i = v;
    }
    const auto* er = std::get_if<error_reply>(&out);
    if (er != nullptr) {
      ++res.error_replies;
      ++res.error_codes[to_string(er->code)];
    }
    // Unmatched, a foreign id, or a late reply to a request already counted as timed out.
    if (i == UINT32_MAX || !rec[i].outstanding()) return;
    request_record& rr = rec[i];
    rr.fate = er != nullptr ? route_fate::error_reply : route_fate::replied;
    rr.received_at = now;
    --outstanding;
    const double rtt_us = std::chrono::duration<double, std::micro>(now - rr.sent_at).count();
    const double sent_s = std::chrono::duration<double>(rr.sent_at - first_send).count();
    if (sent_s >= o.warmup_s) rtts.push_back(rtt_us);
    const auto second = static_cast<size_t>(std::max(0.0, sent_s));
    if (second >= rtts_by_second.size()) rtts_by_second.resize(second + 1);
    rtts_by_second[second].push_back(rtt_us);
    ++res.replied;
    last_reply = now;
    const auto* d = std::get_if<route_reply>(&out);
    if (d == nullptr) return;
    if (d->worker >= D) {
      ++res.error_replies;
      ++res.error_codes["worker_out_of_range"];
      rr.fate = route_fate::error_reply;
      return;
    }
    ++decisions;
    ++res.decisions[d->worker];
    rr.epoch = d->epoch;
    epochs.insert(d->epoch);
    if (d->total_blocks > 0)
      coverage_sum += static_cast<double>(d->covered_blocks) / d->total_blocks;
    if (emu) {
      const double t = clock.model_now() + o.kv_transfer_ms / 1000.0;
      {
        std::lock_guard lock(q.mu);
        q.items.push_back({i, d->worker, t});
      }
      q.cv.notify_one();
    } else {
      to_finish[d->worker].push_back(d->id);
    }
  };

  // Reads every reply already queued on the route socket; each is stamped as it is read, before
  // it is decoded.
  zmq::message_t msg;
  auto receive_all = [&] {
    for (;;) {
      zmq::recv_result_t got;
      try {
        got = route.recv(msg, zmq::recv_flags::dontwait);
      } catch (const std::exception&) {
        ++res.errors;
        return;
      }
      if (!got) return;
      const auto now = wall_clock::now();
      const std::span<const uint8_t> b(static_cast<const uint8_t*>(msg.data()), msg.size());
      auto r = decode_route_reply(b, limits);
      if (r.ok()) {
        handle_reply(route_outcome(std::move(*r)), now);
      } else if (r.error().code() == status_code::not_found) {
        auto e = decode_error_reply(b, limits);
        if (e.ok()) {
          handle_reply(route_outcome(std::move(*e)), now);
        } else {
          ++res.errors;  // a reply that does not decode
        }
      } else {
        ++res.errors;
      }
    }
  };

  // Route-only: the decided requests are finished at once, and every worker reports an empty
  // load each report interval (a node drops workers that stay silent).
  wall_clock::time_point next_report = wall_clock::now();
  auto flush_finished = [&] {
    if (!finisher) return;
    if (wall_clock::now() >= next_report) {
      next_report = wall_clock::now() + std::chrono::milliseconds(o.report_ms);
      for (uint32_t wi = 0; wi < D; ++wi) {
        load_report m;
        m.model = s.model;
        m.worker = wi;
        m.seq = ++s.report_seq[wi];
        ++res.worker_messages;
        if (!finisher->send(m).ok()) ++res.worker_errors;
      }
    }
    for (uint32_t wi = 0; wi < D; ++wi) {
      if (to_finish[wi].empty()) continue;
      finished_requests m;
      m.model = s.model;
      m.worker = wi;
      m.requests.swap(to_finish[wi]);
      ++res.worker_messages;
      if (!finisher->send(m).ok()) ++res.worker_errors;
    }
    drain_acks(*finisher, res.worker_errors);
  };

  // Waiting. The thread that sends also receives (a ZeroMQ socket belongs to one thread), so it
  // must never be busy when a reply arrives: preparation runs elsewhere (above), and while requests
  // are outstanding the thread sleeps in ppoll(2) on the route socket's ZMQ_FD with a nanosecond
  // timeout up to the next send, so it wakes the moment a reply arrives and is on time for the
  // next send (zmq_poll's millisecond timeout would make sends up to 1 ms late, and spinning
  // through the last millisecond was measured to cost the node CPU on a 2-core machine: p99 of
  // both the node and the client doubled). A dedicated receive thread would need the sends handed
  // across threads (an inproc hop and a context switch per request) on cores the node needs.
  const auto t0 = wall_clock::now();
  const double cpu0 = process_cpu_s();
  while (!stop.load()) {
    const double now = clock.model_now();
    while (next_arrival < N && w.requests[next_arrival].arrival_s <= now) {
      if (prep.ready.load(std::memory_order_acquire) <= next_arrival) {
        // Preparation fell behind (only when the run exceeds the preparation budget).
        if (prep.failed.load()) {
          failure = prep.failure;
          break;
        }
        ++res.prepare_stalls;
        std::unique_lock lock(prep.mu);
        prep.cv.wait_for(lock, std::chrono::microseconds(200), [&] {
          return prep.ready.load() > next_arrival || prep.failed.load() || stop.load();
        });
        break;
      }
      pending.push({prep.items[next_arrival].handoff, next_arrival});
      ++next_arrival;
    }
    if (!failure.ok()) break;
    while (!pending.empty() && pending.top().handoff <= now && outstanding < o.max_outstanding) {
      const uint32_t i = pending.top().request;
      pending.pop();
      prepared_request& pr = prep.items[i];
      // KV events first: the node must have them before the route request that needs them.
      s.publishers[pr.publisher].publish_encoded(pr.kv_payload);
      rec[i].sent_at = wall_clock::now();
      if (res.sent == 0) first_send = rec[i].sent_at;
      ++res.sent;
      bool sent = false;
      try {
        sent = route.send(zmq::buffer(pr.route_bytes), zmq::send_flags::none).has_value();
      } catch (const std::exception&) {
        sent = false;
      }
      const std::size_t freed = pr.footprint();
      pr = prepared_request{};
      if (prep.bytes.fetch_sub(freed) >= prepare_budget_bytes) prep.cv.notify_all();
      if (!sent) {
        rec[i].fate = route_fate::send_error;
        ++res.errors;  // counted as an error, not retried
        continue;
      }
      rec[i].fate = route_fate::outstanding;
      ++outstanding;
      in_order.push_back(i);
    }
    // Requests without a reply after the timeout are given up on.
    const auto now_wall = wall_clock::now();
    while (!in_order.empty()) {
      request_record& r = rec[in_order.front()];
      if (r.outstanding() && now_wall - r.sent_at < std::chrono::milliseconds(o.route_timeout_ms))
        break;
      if (r.outstanding()) {
        r.fate = route_fate::timeout;
        --outstanding;
        ++res.timeouts;
      }
      in_order.pop_front();
    }
    if (finisher && (now_wall >= next_finish_flush)) {
      flush_finished();
      next_finish_flush = now_wall + std::chrono::milliseconds(10);
    }
    if (next_arrival >= N && pending.empty() && outstanding == 0) break;
    // Wait for a reply, at most until the next arrival or handoff is due.
    double next_due = std::numeric_limits<double>::infinity();
    if (next_arrival < N) next_due = w.requests[next_arrival].arrival_s;
    if (!pending.empty() && outstanding < o.max_outstanding)
      next_due = std::min(next_due, pending.top().handoff);
    auto wake = wall_clock::now() + std::chrono::milliseconds(50);
    if (std::isfinite(next_due)) wake = std::min(wake, clock.wall_at(next_due));
    if (finisher) wake = std::min(wake, next_finish_flush);
    const double left_ms =
        std::chrono::duration<double, std::milli>(wake - wall_clock::now()).count();
    if (outstanding == 0) {
      // Nothing to receive: wait on the clock alone.
      if (left_ms > 0) std::this_thread::sleep_until(wake);
      continue;
    }
    // Sleep until a reply is readable or the wake time, with sub-millisecond precision: ppoll on
    // the socket's ZMQ_FD (edge-triggered: ZMQ_EVENTS is checked before every sleep).
    try {
      while ((route.get(zmq::sockopt::events) & ZMQ_POLLIN) == 0) {
        const auto left = wake - wall_clock::now();
        if (left <= wall_clock::duration::zero()) break;
        const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
        timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
        pollfd pfd{route_fd, POLLIN, 0};
        (void)::ppoll(&pfd, 1, &ts, nullptr);
      }
    } catch (const std::exception&) {
      ++res.errors;
    }
    receive_all();
  }
  flush_finished();
  stop_preparer();
  sw.run_over.store(true);
  if (swapper.joinable()) swapper.join();
  res.interrupted = stop.load();
  if (decoder.joinable()) {
    {
      std::lock_guard lock(q.mu);
      q.producer_done = true;
    }
    q.cv.notify_one();
    decoder.join();
  }
  if (!failure.ok()) return failure;
  if (swapping) {
    swap_result x;
    x.attempted = sw.done;
    x.epoch_before = epoch_before;
    if (sw.done && !sw.failure.ok()) x.error = sw.failure.message();
    if (sw.done && sw.failure.ok()) {
      x.epoch_after = sw.epoch_after;
      s.current_epoch = sw.epoch_after;
      auto ms = [&](wall_clock::time_point t) {
        return std::chrono::duration<double, std::milli>(t - sw.t_sent).count();
      };
      x.import_ms = ms(sw.t_acked);
      const auto window = std::chrono::seconds(1);
      for (const request_record& r : rec) {
        if (r.fate == route_fate::unsent) continue;
        const bool near = r.sent_at >= sw.t_sent - window && r.sent_at <= sw.t_sent + window;
        if (near) {
          ++x.requests_in_window;
          if (r.fate != route_fate::replied) ++x.failed_during_swap;
        }
        if (r.fate != route_fate::replied) continue;
        if (r.epoch == x.epoch_after) {
          const double t = ms(r.received_at);
          if (!x.first_new_epoch_ms || t < *x.first_new_epoch_ms) x.first_new_epoch_ms = t;
        } else if (r.epoch < x.epoch_after) {
          const double t = ms(r.received_at);
          if (!x.last_old_epoch_ms || t > *x.last_old_epoch_ms) x.last_old_epoch_ms = t;
          if (r.sent_at > sw.t_acked) ++x.old_epoch_after_ack;
        }
      }
    }
    res.swap = x;
  }
  res.wall_s = std::chrono::duration<double>(wall_clock::now() - t0).count();
  res.cpu_s = process_cpu_s() - cpu0;

  // Results.
  res.errors += res.error_replies + res.timeouts;
  res.route_max_us = rtts.empty() ? 0.0 : *std::max_element(rtts.begin(), rtts.end());
  res.route_p50_us = percentile(rtts, 0.50);
  res.route_p99_us = percentile(rtts, 0.99);
  std::vector<double> every;
  for (auto& sec : rtts_by_second) {
    policy_result::route_second rs;
    rs.replies = sec.size();
    if (!sec.empty()) {
      rs.max_us = *std::max_element(sec.begin(), sec.end());
      rs.p50_us = percentile(sec, 0.50);
      rs.p99_us = percentile(sec, 0.99);
    }
    res.route_seconds.push_back(rs);
    every.insert(every.end(), sec.begin(), sec.end());
  }
  res.route_p99_all_us = percentile(every, 0.99);
  const double span_s = std::chrono::duration<double>(last_reply - first_send).count();
  res.route_rps = span_s > 0 ? static_cast<double>(res.replied) / span_s : 0.0;
  // Offered in wall time, like route_rps: the model-time rate times the time scale.
  if (N > 1 && w.requests.back().arrival_s > w.requests.front().arrival_s)
    res.offered_rps =
        (N - 1) / (w.requests.back().arrival_s - w.requests.front().arrival_s) * o.time_scale;
  res.coverage_mean = decisions > 0 ? coverage_sum / static_cast<double>(decisions) : 0.0;
  uint64_t max_d = 0;
  for (uint64_t d : res.decisions)
    max_d = std::max(max_d, d);
  res.decision_imbalance =
      decisions > 0 ? static_cast<double>(max_d) * D / static_cast<double>(decisions) : 0.0;
  if (decisions > 0) {
    const double mean = static_cast<double>(decisions) / D;
    double var = 0;
    for (uint64_t d : res.decisions)
      var += (static_cast<double>(d) - mean) * (static_cast<double>(d) - mean);
    res.decision_cv = std::sqrt(var / D) / mean;
  }
  res.epochs.assign(epochs.begin(), epochs.end());
  res.kv_blocks_stored = prep.kv_blocks_stored;
  res.kv_blocks_removed = prep.kv_blocks_removed;
  res.prefix_hit_fraction = prep.blocks_total > 0 ? static_cast<double>(prep.blocks_hit) /
                                                        static_cast<double>(prep.blocks_total)
                                                  : 0.0;
  if (emu) {
    std::vector<uint32_t> all(N);
    for (uint32_t i = 0; i < N; ++i)
      all[i] = i;
    const latency_summary ls = summarize_latency(w, *emu, all);
    res.tpot_p50_ms = ls.tpot_p50_ms;
    res.tpot_p95_ms = ls.tpot_p95_ms;
    res.tpot_p99_ms = ls.tpot_p99_ms;
    res.ttft_p50_ms = ls.ttft_p50_ms;
    res.ttft_p99_ms = ls.ttft_p99_ms;
    res.completed = ls.completed;
    res.incomplete = ls.incomplete;
    res.decode_steps = emu->decode_steps();
    res.distinct_experts_per_layer = emu->distinct_experts_per_layer();
    res.batch_size_mean = emu->batch_size_mean();
    res.token_imbalance = emu->load_imbalance();
    res.inflight_imbalance = emu->inflight_imbalance();
    res.inflight_mean = emu->inflight_mean();
    res.worker_messages += dstats.messages;
    res.worker_errors += dstats.errors;
  }
  return res;
}

// Parses status, picks the model, checks K.
status read_status(session& s, const json& st) {
  const loadgen_options& o = *s.o;
  if (!st.is_object() || !st.contains("endpoints") || !st["endpoints"].is_object())
    return status::invalid_argument("the node's status has no endpoints");
  const json& ep = st["endpoints"];
  for (const char* k : {"route", "worker"})
    if (!ep.contains(k) || !ep[k].is_string() || ep[k].get<std::string>().empty())
      return status::invalid_argument(std::string("the node's status names no ") + k + " endpoint");
  s.route_endpoint = reachable(ep["route"].get<std::string>(), o.node);
  s.worker_endpoint = reachable(ep["worker"].get<std::string>(), o.node);
  const json models = st.value("models", json::array());
  const json* chosen = nullptr;
  if (models.is_array())
    for (const json& m : models) {
      if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) continue;
      if (o.model.empty() || m["name"].get<std::string>() == o.model) {
        chosen = &m;
        break;
      }
    }
  if (chosen != nullptr) {
    s.model = (*chosen)["name"].get<std::string>();
    // Only a pool whose size the node's config fixes must match; an open pool takes K from
    // the centroid set the loadgen imports and from the workers it registers.
    const bool k_fixed = !chosen->contains("k_fixed") ||
                         ((*chosen)["k_fixed"].is_boolean() && (*chosen)["k_fixed"].get<bool>());
    if (k_fixed && chosen->contains("k") && (*chosen)["k"].is_number_unsigned() &&
        (*chosen)["k"].get<uint32_t>() != 0 && (*chosen)["k"].get<uint32_t>() != o.decode_workers)
      return status::invalid_argument("the node's model " + s.model +
                                      " has K = " + std::to_string((*chosen)["k"].get<uint32_t>()) +
                                      " decode workers, but " + "--decode-workers is " +
                                      std::to_string(o.decode_workers));
    if (chosen->contains("epoch") && (*chosen)["epoch"].is_number_unsigned())
      s.import_epoch = (*chosen)["epoch"].get<uint64_t>() + 1;
  } else if (!o.model.empty()) {
    return status::invalid_argument("the node serves no model named " + o.model);
  } else {
    s.model = "default";
  }
  if (s.import_epoch == 0) s.import_epoch = 1;
  return {};
}

// The workload: the same requests eldr-sim draws for the same options.
status build_workload(session& s) {
  const loadgen_options& o = *s.o;
  const uint32_t requests =
      static_cast<uint32_t>(std::max(1.0, std::ceil(o.rate_rps * o.duration_s)));
  uint64_t source_size = 0;
  if (!o.trace_path.empty()) {
    auto t = read_trace_file(o.trace_path);
    if (!t.ok()) return t.error();
    source_size = t->requests.size();
    s.source_name = o.trace_path;
    s.source = make_trace_source(std::make_shared<const trace>(std::move(t).value()));
  } else {
    auto p = synthetic_preset(o.synthetic);
    if (!p.ok()) return p.error();
    p->seed = o.seed;
    p->prompt_min = o.prompt_min;
    p->prompt_max = o.prompt_max;
    p->output_min = p->output_max = o.output_tokens;
    // The lazy model draws request i from (seed, i) alone; params.requests only bounds the size
    // of a written trace (2^34 bytes of ids). A long route benchmark exceeds that bound, so it
    // is capped, which changes no request.
    const uint64_t longest =
        (uint64_t{p->prompt_max} + p->output_max) * p->geometry.layers * p->geometry.top_k;
    const uint64_t bound = (uint64_t{1} << 34) / std::max<uint64_t>(1, longest);
    p->requests = static_cast<uint32_t>(
        std::max<uint64_t>(1, std::min<uint64_t>(uint64_t{requests} + o.calibration, bound)));
    p->threads = o.threads;
    auto m = synthetic_model::make(*p);
    if (!m.ok()) return m.error();
    s.source_name = "synthetic:" + o.synthetic;
    s.source = make_synthetic_source(std::make_shared<const synthetic_model>(std::move(m).value()),
                                     o.decode_pool);
  }
  workload_options wo;
  wo.requests = requests;
  wo.calibration = o.calibration;
  wo.rate_rps = o.rate_rps;
  wo.seed = o.seed;
  wo.calibration_fraction = o.calibration_fraction;
  wo.prompt_pool = o.prompt_pool;
  wo.threads = o.threads;
  auto w = make_workload(s.source, source_size, wo);
  if (!w.ok()) return w.error();
  s.w = std::make_unique<workload>(std::move(w).value());
  return {};
}

// The centroid file to import: --centroids, or a fit on the workload's calibration requests (the
// fit eldr-sim's plain "eldr" uses).
result<std::vector<uint8_t>> centroid_bytes(session& s) {
  const loadgen_options& o = *s.o;
  centroid_file f;
  if (!o.centroids.empty()) {
    auto read = read_centroid_file(o.centroids);
    if (!read.ok()) return read.error();
    f = std::move(read).value();
  } else {
    policy_factory_options fo;
    fo.workers = o.decode_workers;
    fo.seed = o.seed;
    fo.threads = o.threads;
    fo.pairs = o.pairs;
    auto factory = policy_factory::make(*s.w, fo, [&](const std::string& m) { say(o, m); });
    if (!factory.ok()) return factory.error();
    auto fit = factory->default_fit();
    if (!fit.ok()) return fit.error();
    const fit_result& fr = **fit;
    f.model_name = s.model;
    f.spec = *fr.spec;
    f.workers = o.decode_workers;
    f.centroids = fr.kmeans.centroids;
    f.provenance = {s.source_name, "eldr-loadgen " + std::string(eldr::version),
                    o.seed,        static_cast<uint32_t>(s.w->calibration.size()),
                    fr.rho_masked, fr.kmeans.objective,
                    "balanced"};
  }
  f.model_name = s.model;
  f.epoch = std::max(f.epoch, s.import_epoch);
  if (f.spec.geometry() != s.w->geometry())
    return status::invalid_argument("the centroid file is for a model of " +
                                    f.spec.geometry().to_string() + " but the workload is " +
                                    s.w->geometry().to_string());
  if (f.workers != o.decode_workers)
    return status::invalid_argument("the centroid file has " + std::to_string(f.workers) +
                                    " centroids for " + std::to_string(o.decode_workers) +
                                    " decode workers");
  if (status st = validate_centroid_file(f); !st.ok()) return st;
  s.imported = f;
  s.have_imported = true;
  return encode_centroid_file(f);
}

// --swap-at's second centroid set: the imported set with every coordinate scaled by a factor in
// [0.95, 1.05] (seeded), rows re-normalised: valid, same K and spec, slightly different routing.
result<std::vector<uint8_t>> swap_centroid_bytes(session& s) {
  centroid_file f = s.imported;
  const uint32_t width =
      static_cast<uint32_t>(f.centroids.size() / std::max<uint32_t>(1, f.workers));
  uint64_t x = s.o->seed * 0x9E3779B97F4A7C15ULL + s.current_epoch + 1;
  auto next = [&x] {  // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (uint32_t k = 0; k < f.workers; ++k) {
    float* row = f.centroids.data() + std::size_t{k} * width;
    double norm = 0;
    for (uint32_t j = 0; j < width; ++j) {
      const double u = static_cast<double>(next() >> 11) / 9007199254740992.0;  // [0, 1)
      row[j] = static_cast<float>(row[j] * (0.95 + 0.1 * u));
      norm += static_cast<double>(row[j]) * row[j];
    }
    norm = std::sqrt(norm);
    if (norm > 0)
      for (uint32_t j = 0; j < width; ++j)
        row[j] = static_cast<float>(row[j] / norm);
  }
  f.epoch = s.current_epoch + 1;
  f.provenance.tool = "eldr-loadgen " + std::string(eldr::version) + " (--swap-at: perturbed)";
  if (status st = validate_centroid_file(f); !st.ok()) return st;
  return encode_centroid_file(f);
}

// eldr-sim's command line for the workload and cluster this run plays.
std::string eldr_sim_command(const loadgen_options& o, std::size_t requests) {
  std::string c = "eldr-sim " +
                  (o.trace_path.empty() ? "--synthetic " + o.synthetic : "--trace " + o.trace_path);
  c += " --rate " + fmt(o.rate_rps, 3) + " --requests " + std::to_string(requests) +
       " --calibration-requests " + std::to_string(o.calibration) + " --pairs " +
       std::to_string(o.pairs) + " --decode-workers " + std::to_string(o.decode_workers) +
       " --prefill-workers " + std::to_string(o.prefill_workers) + " --seed " +
       std::to_string(o.seed) + " --max-batch " + std::to_string(o.max_batch) + " --kv-capacity " +
       std::to_string(o.kv_capacity_tokens) + " --prefill-base-ms " + fmt(o.prefill_base_ms, 3) +
       " --prefill-per-token-ms " + fmt(o.prefill_per_token_ms, 4) + " --kv-transfer-ms " +
       fmt(o.kv_transfer_ms, 3) + " --cost-base-ms " + fmt(o.cost.base_ms, 4) +
       " --cost-expert-ms " + fmt(o.cost.per_distinct_expert_ms, 6) + " --cost-sequence-ms " +
       fmt(o.cost.per_sequence_ms, 5) + " --cost-kilotoken-ms " +
       fmt(o.cost.per_context_kilotoken_ms, 5);
  if (o.trace_path.empty())
    c += " --prompt-min " + std::to_string(o.prompt_min) + " --prompt-max " +
         std::to_string(o.prompt_max) + " --output-tokens " + std::to_string(o.output_tokens) +
         " --decode-pool " + std::to_string(o.decode_pool);
  else
    c += " --calibration-fraction " + fmt(o.calibration_fraction, 3);
  if (o.prompt_pool > 0)
    c += " --prefix-caching --prompt-pool " + std::to_string(o.prompt_pool) + " --block-size " +
         std::to_string(o.block_size);
  std::string policies;
  for (const std::string& n : o.policies)
    policies += (policies.empty() ? "" : ",") + n;
  if (o.tau) c += " --tau " + fmt(*o.tau, 3);
  return c + " --policies " + policies + " --out DIR";
}

status check_options(const loadgen_options& o) {
  if (o.trace_path.empty() == o.synthetic.empty())
    return status::invalid_argument("give exactly one of --trace and --synthetic");
  if (!(o.rate_rps > 0 && std::isfinite(o.rate_rps)))
    return status::invalid_argument("--rate must be > 0");
  if (!(o.duration_s > 0 && std::isfinite(o.duration_s)))
    return status::invalid_argument("--duration must be > 0");
  if (o.decode_workers == 0) return status::invalid_argument("--decode-workers must be >= 1");
  if (o.prefill_workers == 0) return status::invalid_argument("--prefill-workers must be >= 1");
  if (o.block_size == 0 || o.block_size > 255)
    return status::invalid_argument("--block-size must be in 1..255");
  if (!(o.time_scale > 0 && std::isfinite(o.time_scale)))
    return status::invalid_argument("--time-scale must be > 0");
  if (o.policies.empty()) return status::invalid_argument("--policies is empty");
  if (o.max_outstanding == 0) return status::invalid_argument("--max-outstanding must be >= 1");
  if (o.prompt_min > o.prompt_max)
    return status::invalid_argument("--prompt-min must be <= --prompt-max");
  if (o.report_ms == 0) return status::invalid_argument("--report-ms must be >= 1");
  if (o.swap_at && !(*o.swap_at >= 0 && std::isfinite(*o.swap_at)))
    return status::invalid_argument("--swap-at must be >= 0");
  if (o.swap_at && o.no_import)
    return status::invalid_argument(
        "--swap-at needs the centroid set the loadgen imports "
        "(not --no-import)");
  if (!o.synthetic.empty())
    if (auto p = synthetic_preset(o.synthetic); !p.ok()) return p.error();
  return o.cost.validate();
}

}  // namespace

json to_json(const policy_result& r) {
  json j;
  j["policy"] = r.policy;
  j["interrupted"] = r.interrupted;
  j["sent"] = r.sent;
  j["received"] = r.replied;
  j["replied"] = r.replied;
  j["errors"] = r.errors;
  j["error_replies"] = r.error_replies;
  j["timeouts"] = r.timeouts;
  j["error_codes"] = r.error_codes;
  j["offered_rps"] = r.offered_rps;
  j["route_rps"] = r.route_rps;
  j["route_p50_us"] = r.route_p50_us;
  j["route_p99_us"] = r.route_p99_us;
  j["route_max_us"] = r.route_max_us;
  j["route_p99_all_us"] = r.route_p99_all_us;
  json seconds = json::array();
  for (const auto& s : r.route_seconds)
    seconds.push_back(
        {{"replies", s.replies}, {"p50_us", s.p50_us}, {"p99_us", s.p99_us}, {"max_us", s.max_us}});
  j["route_seconds"] = std::move(seconds);
  j["tpot_p50_ms"] = r.tpot_p50_ms;
  j["tpot_p95_ms"] = r.tpot_p95_ms;
  j["tpot_p99_ms"] = r.tpot_p99_ms;
  j["ttft_p50_ms"] = r.ttft_p50_ms;
  j["ttft_p99_ms"] = r.ttft_p99_ms;
  j["completed"] = r.completed;
  j["incomplete"] = r.incomplete;
  j["coverage_mean"] = r.coverage_mean;
  j["decisions_per_worker"] = r.decisions;
  j["decision_imbalance"] = r.decision_imbalance;
  j["decision_cv"] = r.decision_cv;
  j["inflight_imbalance"] = r.inflight_imbalance;
  j["inflight_mean"] = r.inflight_mean;
  j["epochs_seen"] = r.epochs;
  j["prefix_hit_fraction"] = r.prefix_hit_fraction;
  j["kv_blocks_stored"] = r.kv_blocks_stored;
  j["kv_blocks_removed"] = r.kv_blocks_removed;
  j["decode_steps"] = r.decode_steps;
  j["distinct_experts_per_layer"] = r.distinct_experts_per_layer;
  j["batch_size_mean"] = r.batch_size_mean;
  j["token_imbalance"] = r.token_imbalance;
  j["worker_messages"] = r.worker_messages;
  j["worker_errors"] = r.worker_errors;
  j["wall_s"] = r.wall_s;
  j["loadgen_cpu_s"] = r.cpu_s;
  j["prepare_stalls"] = r.prepare_stalls;
  if (r.swap) {
    const swap_result& x = *r.swap;
    auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    json sj = {{"attempted", x.attempted},
               {"epoch_before", x.epoch_before},
               {"epoch_after", x.epoch_after},
               {"import_ms", x.import_ms},
               {"first_new_epoch_ms", opt(x.first_new_epoch_ms)},
               {"last_old_epoch_ms", opt(x.last_old_epoch_ms)},
               {"old_epoch_after_ack", x.old_epoch_after_ack},
               {"failed_during_swap", x.failed_during_swap},
               {"requests_in_window", x.requests_in_window}};
    if (!x.error.empty()) sj["error"] = x.error;
    j["swap"] = std::move(sj);
  }
  return j;
}

std::string format_table(const std::vector<policy_result>& results) {
  std::string t;
  char line[512];
  std::snprintf(line, sizeof line, "%-12s %8s %8s %7s %10s %10s %10s %9s %9s %9s %9s %8s %9s\n",
                "policy", "sent", "replied", "errors", "route/s", "rtt p50us", "rtt p99us",
                "TPOT p50", "TPOT p99", "TTFT p50", "TTFT p99", "coverage", "imbalance");
  t += line;
  const policy_result* eldr = nullptr;
  const policy_result* jsq = nullptr;
  for (const policy_result& r : results) {
    std::snprintf(line, sizeof line,
                  "%-12s %8llu %8llu %7llu %10.1f %10.1f %10.1f %9.2f %9.2f %9.1f %9.1f %8.3f "
                  "%9.3f%s\n",
                  r.policy.c_str(), static_cast<unsigned long long>(r.sent),
                  static_cast<unsigned long long>(r.replied),
                  static_cast<unsigned long long>(r.errors), r.route_rps, r.route_p50_us,
                  r.route_p99_us, r.tpot_p50_ms, r.tpot_p99_ms, r.ttft_p50_ms, r.ttft_p99_ms,
                  r.coverage_mean, r.decision_imbalance, r.interrupted ? " (interrupted)" : "");
    t += line;
    if (r.policy == "eldr") eldr = &r;
    if (r.policy == "jsq") jsq = &r;
  }
  t += "(TPOT and TTFT in model milliseconds; rtt = route round trip)\n";
  for (const policy_result& r : results) {
    if (!r.swap) continue;
    const swap_result& x = *r.swap;
    if (!x.attempted) {
      t += r.policy + " swap: not attempted (the run ended first)\n";
      continue;
    }
    if (!x.error.empty()) {
      t += r.policy + " swap: failed: " + x.error + "\n";
      continue;
    }
    auto opt = [](const std::optional<double>& v) { return v ? fmt(*v, 1) + " ms" : "none"; };
    t += r.policy + " swap: epoch " + std::to_string(x.epoch_before) + " -> " +
         std::to_string(x.epoch_after) + ", import " + fmt(x.import_ms, 1) +
         " ms, first new-epoch reply at " + opt(x.first_new_epoch_ms) +
         ", last old-epoch reply at " + opt(x.last_old_epoch_ms) + ", old epoch after ack " +
         std::to_string(x.old_epoch_after_ack) + ", failed within 1 s " +
         std::to_string(x.failed_during_swap) + " of " + std::to_string(x.requests_in_window) +
         "\n";
  }
  if (eldr != nullptr && jsq != nullptr && jsq->tpot_p50_ms > 0 && eldr->tpot_p50_ms > 0)
    t += "eldr / jsq median TPOT: " + fmt(eldr->tpot_p50_ms / jsq->tpot_p50_ms, 4) + " (" +
         fmt(100.0 * (1.0 - eldr->tpot_p50_ms / jsq->tpot_p50_ms), 1) + "% lower)\n";
  return t;
}

// What the loadgen changes on the node (policies, the current centroid epoch) and how to put it
// back: recorded before the first change, restored once whatever way the run ended (done, error,
// SIGINT), with its own admin clients so that nothing of the run needs to be alive.
struct node_restore {
  struct router {
    std::string node;  // admin endpoint
    std::unique_ptr<admin_client> admin;
    json policy;  // its `policy` answer before the run: policy, tau, policy_source
    bool changed = false;
  };
  std::vector<router> routers;
  std::string model;
  bool imported = false;
  uint64_t epoch_before = 0;  // the node's epoch before the loadgen's first import (0: none)
  uint64_t epoch_now = 0;     // the last epoch the loadgen made current

  // Connects to `node` and records its policy for `model`.
  status record(const std::string& node, const std::string& m) {
    client_options co;
    // The same client restores the node after the run, when a node may still be draining the
    // run's queues (and a swap in a cluster goes through the refit leader and its store).
    co.timeout_ms = 30000;
    auto a = admin_client::connect(node, co);
    if (!a.ok()) return a.error();
    auto p = (*a)->call("policy", {{"model", m}});
    if (!p.ok())
      return status::io_error("policy of " + m + " at " + node + ": " + p.error().message());
    routers.push_back(router{node, std::move(a).value(), std::move(p).value(), false});
    return {};
  }
  router* find(const std::string& node) {
    for (auto& r : routers)
      if (r.node == node) return &r;
    return nullptr;
  }

  void restore(const loadgen_options& o, loadgen_outcome& out) {
    auto failed = [&](const std::string& what) {
      say(o, "warning: " + what);
      out.restored.push_back("NOT restored: " + what);
      if (out.exit_code == 0) {
        out.exit_code = 1;
        out.error = what;
      }
    };
    for (auto& r : routers) {
      if (!r.changed) continue;
      const json& was = r.policy;
      json args = {{"model", model}};
      const bool from_config = was.value("policy_source", std::string("admin")) == "config";
      if (from_config) {
        args["reset"] = true;
      } else {
        args["policy"] = was.value("policy", std::string("eldr"));
        if (was.contains("tau") && was["tau"].is_number()) args["tau"] = was["tau"];
      }
      auto back = r.admin->call("policy", args);
      const std::string what = "policy of " + model + " at " + r.node + " back to " +
                               was.value("policy", std::string("?")) + " tau " +
                               (was.contains("tau") ? was["tau"].dump() : std::string("?")) +
                               (from_config ? " (the node's config)" : "");
      if (!back.ok()) {
        failed(what + ": " + back.error().message());
        continue;
      }
      say(o, "restored the " + what);
      out.restored.push_back(what);
    }
    if (imported && !routers.empty()) {
      if (o.keep_centroids) {
        const std::string what =
            "kept the loadgen's centroid set current as epoch " + std::to_string(epoch_now) +
            " (--keep-centroids; the node was on " + "epoch " + std::to_string(epoch_before) + ")";
        say(o, what);
        out.restored.push_back(what);
      } else if (epoch_before == 0) {
        const std::string what = "the node had no centroid set before; the loadgen's epoch " +
                                 std::to_string(epoch_now) +
                                 " stays current (no command removes a set)";
        say(o, "warning: " + what);
        out.restored.push_back(what);
      } else if (epoch_now != epoch_before) {
        auto back = routers.front().admin->call("centroids.swap",
                                                {{"model", model}, {"epoch", epoch_before}});
        const std::string what = "centroid epoch of " + model + " back to " +
                                 std::to_string(epoch_before) + " (the loadgen's epoch " +
                                 std::to_string(epoch_now) + " stays stored)";
        if (!back.ok())
          failed(what + ": " + back.error().message());
        else {
          // In a cluster the leader re-publishes the set as a new epoch (docs/cluster.md).
          const std::string renumbered =
              back->is_object() && back->contains("set_of_epoch")
                  ? " (in the cluster: the set of epoch " + std::to_string(epoch_before) +
                        " as epoch " + std::to_string(back->value("epoch", uint64_t{0})) + ")"
                  : "";
          say(o, "restored the " + what + renumbered);
          out.restored.push_back(what + renumbered);
        }
      }
    }
    if (out.report.is_object() || out.report.is_null())
      out.report["node_changes"] = {{"changed", out.changed}, {"restored", out.restored}};
  }
};

loadgen_outcome play(const loadgen_options& o, const std::atomic<bool>& stop,
                     node_restore& restore);

loadgen_outcome run_loadgen(const loadgen_options& o, const std::atomic<bool>& stop) {
  node_restore restore;
  loadgen_outcome out = play(o, stop, restore);
  restore.restore(o, out);
  return out;
}

loadgen_outcome play(const loadgen_options& o, const std::atomic<bool>& stop,
                     node_restore& restore) {
  loadgen_outcome out;
  auto fail = [&](int code, const std::string& m) {
    out.exit_code = code;
    out.error = m;
    return out;
  };
  if (status st = check_options(o); !st.ok()) return fail(2, st.message());
  session s;
  {
    std::random_device rd;
    char nonce[17];
    std::snprintf(nonce, sizeof nonce, "%08x%08x", rd(), rd());
    s.id_nonce = nonce;
  }
  s.o = &o;

  // 1. The node.
  client_options probe_opts;
  probe_opts.timeout_ms = 3000;
  auto probe = admin_client::connect(o.node, probe_opts);
  if (!probe.ok()) return fail(3, "cannot connect to " + o.node + ": " + probe.error().message());
  auto st = (*probe)->call("status");
  if (!st.ok())
    return fail(3, "node unreachable at " + o.node + " (admin status): " + st.error().message());
  client_options admin_opts;  // importing a centroid file may take the node a while
  admin_opts.timeout_ms = 30000;
  auto admin = admin_client::connect(o.node, admin_opts);
  if (!admin.ok()) return fail(3, "cannot connect to " + o.node + ": " + admin.error().message());
  if (status rs = read_status(s, *st); !rs.ok()) return fail(2, rs.message());
  // What the run will change, recorded before any change (step 3 imports, step 5 sets policies).
  restore.model = s.model;
  restore.epoch_before = s.import_epoch > 0 ? s.import_epoch - 1 : 0;
  if (status rs = restore.record(o.node, s.model); !rs.ok()) return fail(3, rs.message());
  for (const std::string& r : o.routers)
    if (r != o.node)
      if (status rs = restore.record(r, s.model); !rs.ok()) return fail(3, rs.message());
  say(o, "node " + o.node + ": model " + s.model + ", route " + s.route_endpoint + ", worker " +
             s.worker_endpoint);
  if (o.routers.empty()) s.route_endpoints.push_back(s.route_endpoint);
  for (const std::string& r : o.routers) {
    if (r == o.node) {
      s.route_endpoints.push_back(s.route_endpoint);
      continue;
    }
    auto a = admin_client::connect(r, probe_opts);
    if (!a.ok()) return fail(3, "cannot connect to router " + r + ": " + a.error().message());
    auto rs = (*a)->call("status");
    if (!rs.ok())
      return fail(3, "router unreachable at " + r + " (admin status): " + rs.error().message());
    const json ep = rs->is_object() ? rs->value("endpoints", json::object()) : json::object();
    if (!ep.is_object() || !ep.contains("route") || !ep["route"].is_string() ||
        !ep.contains("worker") || !ep["worker"].is_string())
      return fail(2, "router " + r + ": its status names no route and worker endpoints");
    s.route_endpoints.push_back(reachable(ep["route"].get<std::string>(), r));
    s.other_workers.push_back(reachable(ep["worker"].get<std::string>(), r));
    s.other_admins.push_back(std::move(a).value());
    say(o, "router " + r + ": route " + s.route_endpoints.back());
  }

  // 2. The workload.
  say(o, "preparing the workload (" +
             std::to_string(static_cast<uint64_t>(std::ceil(o.rate_rps * o.duration_s))) +
             " requests)");
  if (status ws = build_workload(s); !ws.ok()) return fail(2, ws.message());
  s.report_seq.assign(o.decode_workers, 0);
  if (status ps = prepare_plans(s); !ps.ok()) return fail(2, ps.message());

  // 3. Centroids.
  if (!o.no_import) {
    auto bytes = centroid_bytes(s);
    if (!bytes.ok()) return fail(2, bytes.error().message());
    // Forced: the set is fitted on this run's workload, whose geometry or K may differ from the
    // node's current set (an earlier run's); the node's epoch is swapped back at the end.
    json args = {
        {"model", s.model}, {"file", json::binary(std::move(bytes).value())}, {"force", true}};
    auto imported = (*admin)->call("centroids.import", std::move(args));
    if (!imported.ok()) return fail(1, "centroids.import: " + imported.error().message());
    say(o, "imported centroids: " + imported->dump());
    if (imported->is_object() && imported->contains("epoch") &&
        (*imported)["epoch"].is_number_unsigned())
      s.current_epoch = (*imported)["epoch"].get<uint64_t>();
    restore.imported = true;
    restore.epoch_now = s.current_epoch;
    out.changed.push_back("imported a centroid set for " + s.model + " as epoch " +
                          std::to_string(s.current_epoch) + " (the node was on epoch " +
                          std::to_string(restore.epoch_before) + ")");
    say(o, "changed: " + out.changed.back());
  }

  // 4. Emulated decode workers register; emulated prefill workers announce their publishers.
  client_options wopts;
  wopts.timeout_ms = 5000;
  auto workers = worker_client::connect(s.worker_endpoint, wopts);
  if (!workers.ok()) return fail(3, "worker endpoint: " + workers.error().message());
  for (uint32_t wi = 0; wi < o.decode_workers; ++wi) {
    worker_register m;
    m.model = s.model;
    m.worker = wi;
    m.endpoint = "loadgen://decode/" + std::to_string(wi);
    // Unbounded by default, like core/simulator's decode workers, whose waiting queue has no
    // limit (max_batch bounds the running batch only): a node refusing requests as "full" would
    // make the run's requests differ from the simulation's.
    m.capacity = o.capacity.value_or(0);
    auto r = (*workers)->call(m);
    if (!r.ok()) return fail(3, "worker_register: " + r.error().message());
    if (const auto* e = std::get_if<error_reply>(&*r))
      return fail(1, "worker_register " + std::to_string(wi) + " refused: " + e->message);
  }
  for (uint32_t p = 0; p < o.prefill_workers; ++p) {
    publisher pub{zmq::socket_t(s.ctx, zmq::socket_type::xpub), "", 0};
    pub.socket.set(zmq::sockopt::xpub_verbose, 1);
    pub.socket.set(zmq::sockopt::sndhwm, 100000);
    pub.socket.set(zmq::sockopt::linger, 0);
    pub.socket.bind("tcp://127.0.0.1:*");
    pub.endpoint = pub.socket.get(zmq::sockopt::last_endpoint);
    publisher_register m;
    m.model = s.model;
    m.endpoint = pub.endpoint;
    auto r = (*workers)->call(m);
    if (!r.ok()) return fail(3, "publisher_register: " + r.error().message());
    if (const auto* e = std::get_if<error_reply>(&*r))
      return fail(1, "publisher_register refused: " + e->message);
    if (!pub.wait_subscriber(o.subscribe_timeout_ms))
      say(o, "warning: the node did not subscribe to " + pub.endpoint + " within " +
                 std::to_string(o.subscribe_timeout_ms) + " ms; its first events may be lost");
    // Every router's signature cache follows the prefill side's KV events.
    for (const std::string& we : s.other_workers) {
      auto oc = worker_client::connect(we, wopts);
      if (!oc.ok()) return fail(3, "worker endpoint " + we + ": " + oc.error().message());
      auto orr = (*oc)->call(m);
      if (!orr.ok()) return fail(3, "publisher_register at " + we + ": " + orr.error().message());
      if (const auto* e = std::get_if<error_reply>(&*orr))
        return fail(1, "publisher_register at " + we + " refused: " + e->message);
      if (!pub.wait_subscriber(o.subscribe_timeout_ms))
        say(o, "warning: " + we + "'s node did not subscribe to " + pub.endpoint);
    }
    s.publishers.push_back(std::move(pub));
  }

  if (o.swap_at && std::find(o.policies.begin(), o.policies.end(), "eldr") == o.policies.end())
    say(o,
        "warning: --swap-at applies to the eldr policy's run only, and eldr is not in --policies");

  // 5. Every policy over the same workload.
  for (std::size_t pi = 0; pi < o.policies.size() && !stop.load(); ++pi) {
    const std::string& name = o.policies[pi];
    json args = {{"model", s.model}, {"policy", name}};
    if (o.tau) args["tau"] = *o.tau;
    // Marked changed before the call: a command that timed out may still have been applied.
    if (auto* r = restore.find(o.node)) r->changed = true;
    auto set = (*admin)->call("policy", args);
    if (!set.ok()) return fail(1, "policy " + name + ": " + set.error().message());
    for (auto& r : restore.routers)
      r.changed = true;
    for (auto& a : s.other_admins) {
      auto other = a->call("policy", args);
      if (!other.ok()) return fail(1, "policy " + name + " (router): " + other.error().message());
    }
    if (pi == 0) {
      const json& was = restore.routers.front().policy;
      out.changed.push_back("set the policy of " + s.model + " for each run (was " +
                            was.value("policy", std::string("?")) + " tau " +
                            (was.contains("tau") ? was["tau"].dump() : std::string("?")) + ")");
      say(o, "changed: " + out.changed.back());
    }
    say(o, "playing " + std::to_string(s.w->requests.size()) + " requests at " +
               fmt(o.rate_rps, 1) + " req/s under " + name);
    auto r = run_policy(s, name, static_cast<uint32_t>(pi), stop);
    restore.epoch_now = s.current_epoch;  // --swap-at imports another set
    if (!r.ok()) return fail(1, name + ": " + r.error().message());
    say(o, "  " + name + ": " + std::to_string(r->replied) + " replies, " +
               std::to_string(r->errors) + " errors, route p99 " + fmt(r->route_p99_us, 0) +
               " us, TPOT p50 " + fmt(r->tpot_p50_ms) + " ms");
    out.results.push_back(std::move(r).value());
  }

  // 6. The report.
  json report = out.results.empty() ? json::object() : to_json(out.results.front());
  json policies = json::object();
  for (const policy_result& r : out.results)
    policies[r.policy] = to_json(r);
  report["policies"] = policies;
  report["node"] = o.node;
  report["route_endpoints"] = s.route_endpoints;
  report["model"] = s.model;
  report["source"] = s.source_name;
  report["rate_rps"] = o.rate_rps;
  report["duration_s"] = o.duration_s;
  report["requests"] = s.w->requests.size();
  report["decode_workers"] = o.decode_workers;
  report["prefill_workers"] = o.prefill_workers;
  report["time_scale"] = o.time_scale;
  report["route_only"] = o.route_only;
  report["seed"] = o.seed;
  report["imported_epoch"] = o.no_import ? json(nullptr) : json(s.import_epoch);
  // The offline simulation of the same workload, for the end-to-end comparison.
  if (!o.route_only) report["eldr_sim_command"] = eldr_sim_command(o, s.w->requests.size());
  out.report = std::move(report);
  if (stop.load()) out.exit_code = 130;
  return out;
}

}  // namespace eldr::loadgen
