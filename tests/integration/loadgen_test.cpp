// eldr-loadgen as a process against a fake node (this file's ROUTER sockets speaking the project's
// own codecs): setup (status, centroids.import, worker and publisher registration, policy), the
// route path with counts and vLLM KV events, the decode path's finished and load reports, the
// JSON report, the route-only mode, and an unreachable node.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_set>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/kv_events.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/process.hpp"

namespace {

using json = nlohmann::json;

const std::string loadgen_binary =
    std::string(ELDR_BINARY_DIR) + "/tools/eldr-loadgen/eldr-loadgen";

// What the fake node saw; read after stop().
struct node_record {
  std::vector<std::string> policies;  // policies set (not shown, not reset)
  uint32_t policy_resets = 0;         // `policy reset`: back to the node's config
  std::vector<uint64_t> swaps;        // centroids.swap epochs
  std::vector<eldr::worker_register> registers;
  std::vector<std::string> publishers;
  std::vector<eldr::centroid_file> imported;
  // Per centroids.import: from reading its request to sending its reply, on the steady clock. The
  // loadgen sends the request before that read and reads the reply after that send, so its
  // import_ms cannot be shorter.
  std::vector<double> import_handling_ms;
  std::multiset<std::string> routed, finished;
  uint64_t load_reports = 0;
  // Route blocks with neither counts in their request nor a BlockStored event from the loadgen
  // (before the request, or shortly after: the two streams travel on different sockets).
  uint64_t uncovered_blocks = 0;
  uint64_t total_blocks = 0;
  uint64_t counts_blocks = 0;
  uint64_t stored = 0, removed = 0, cleared = 0;
  uint64_t decode_errors = 0;  // any message or payload that did not decode
};

// A node with JSQ routing over K workers. One thread polls every socket with a timeout.
class fake_node {
 public:
  // install_imports: an imported centroid set becomes the epoch every later reply carries (as
  // the real node's); otherwise replies keep epoch 3.
  explicit fake_node(uint32_t k, bool install_imports = false, std::string refuse_policy = "")
      : k_(k),
        install_imports_(install_imports),
        refuse_policy_(std::move(refuse_policy)),
        load_(k, 0) {
    for (zmq::socket_t* s : {&admin_, &route_, &worker_}) {
      s->set(zmq::sockopt::linger, 0);
      s->bind("tcp://127.0.0.1:*");
    }
    sub_.set(zmq::sockopt::subscribe, "");
    thread_ = std::thread([this] { loop(); });
  }
  ~fake_node() { stop(); }

  std::string admin_endpoint() { return admin_.get(zmq::sockopt::last_endpoint); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    rec_.uncovered_blocks = uncovered_.size();
  }
  const node_record& record() const { return rec_; }

 private:
  static std::span<const uint8_t> bytes(const zmq::message_t& m) {
    return {static_cast<const uint8_t*>(m.data()), m.size()};
  }
  static void reply(zmq::socket_t& s, zmq::message_t& identity, const std::vector<uint8_t>& p) {
    (void)s.send(identity, zmq::send_flags::sndmore);
    (void)s.send(zmq::buffer(p), zmq::send_flags::none);
  }
  // [identity, payload] from a DEALER; false when the shape is wrong.
  static bool receive(zmq::socket_t& s, zmq::message_t& identity, zmq::message_t& payload) {
    if (!s.recv(identity, zmq::recv_flags::dontwait)) return false;
    if (!identity.more()) return false;
    if (!s.recv(payload, zmq::recv_flags::none)) return false;
    while (payload.more())
      (void)s.recv(payload, zmq::recv_flags::none);  // keep the last frame
    return true;
  }

  void on_admin() {
    zmq::message_t id, payload;
    if (!receive(admin_, id, payload)) return;
    const auto read_at = std::chrono::steady_clock::now();
    auto req = eldr::decode_admin_request(bytes(payload), {});
    if (!req.ok()) {
      ++rec_.decode_errors;
      return;
    }
    eldr::admin_reply r;
    r.id = req->id;
    r.ok = true;
    if (req->command == "status") {
      r.result = {
          {"endpoints",
           {{"route", wildcard(route_)},
            {"worker", wildcard(worker_)},
            {"admin", admin_endpoint()},
            {"metrics", ""}}},
          {"models",
           json::array({{{"name", "fake-model"}, {"k", k_}, {"policy", "jsq"}, {"epoch", 3}}})}};
    } else if (req->command == "centroids.import") {
      const auto& bin = req->args.at("file").get_binary();
      auto f =
          eldr::parse_centroid_file(std::span<const uint8_t>(bin.data(), bin.size()), "import");
      if (f.ok()) {
        r.result = {{"epoch", f->epoch}};
        if (install_imports_) epoch_ = f->epoch;
        rec_.imported.push_back(std::move(f).value());
      } else {
        r.ok = false;
        r.code = eldr::wire_error_code::malformed;
        r.error = f.error().message();
      }
    } else if (req->command == "policy") {
      // As the real node: set (persisted, source admin), reset (the config's again) or show.
      if (req->args.contains("policy")) {
        const std::string name = req->args.at("policy").get<std::string>();
        if (name == refuse_policy_) {
          r.ok = false;
          r.code = eldr::wire_error_code::malformed;
          r.error = "refused by the test";
        } else {
          rec_.policies.push_back(name);
          policy_ = name;
          policy_source_ = "admin";
        }
      } else if (req->args.value("reset", false)) {
        ++rec_.policy_resets;
        policy_ = "jsq";
        policy_source_ = "config";
      }
      if (r.ok) r.result = {{"policy", policy_}, {"tau", 0.1}, {"policy_source", policy_source_}};
    } else if (req->command == "centroids.swap") {
      rec_.swaps.push_back(req->args.at("epoch").get<uint64_t>());
      epoch_ = rec_.swaps.back();
      r.result = {{"epoch", epoch_}};
    } else {
      r.ok = false;
      r.code = eldr::wire_error_code::unknown_type;
      r.error = "unknown command";
    }
    reply(admin_, id, eldr::encode_admin_reply(r));
    if (req->command == "centroids.import")
      rec_.import_handling_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - read_at)
              .count());
  }

  // The node's status names bound endpoints; the loadgen must reach a wildcard through the admin
  // endpoint's host.
  static std::string wildcard(zmq::socket_t& s) {
    const std::string e = s.get(zmq::sockopt::last_endpoint);
    return "tcp://*:" + e.substr(e.rfind(':') + 1);
  }

  void on_route() {
    zmq::message_t id, payload;
    if (!receive(route_, id, payload)) return;
    std::vector<eldr::kv_decode_issue> issues;
    auto req = eldr::decode_route_request(bytes(payload), {}, issues);
    if (!req.ok() || !issues.empty()) {
      ++rec_.decode_errors;
      return;
    }
    std::unordered_set<uint64_t> counted;
    if (req->counts)
      for (const eldr::counts_block& b : req->counts->blocks)
        counted.insert(b.hash);
    rec_.counts_blocks += counted.size();
    uint32_t covered = 0;
    for (uint64_t h : req->block_hashes) {
      if (counted.count(h) != 0 || stored_.count(h) != 0) {
        ++covered;
      } else {
        uncovered_.insert(h);
      }
    }
    rec_.total_blocks += req->block_hashes.size();
    uint32_t w = 0;
    for (uint32_t i = 1; i < k_; ++i)
      if (load_[i] < load_[w]) w = i;
    ++load_[w];
    rec_.routed.insert(req->id);
    eldr::route_reply r;
    r.id = req->id;
    r.worker = w;
    r.endpoint = "loadgen://decode/" + std::to_string(w);
    r.epoch = epoch_;
    r.covered_blocks = covered;
    r.total_blocks = static_cast<uint32_t>(req->block_hashes.size());
    reply(route_, id, eldr::encode_route_reply(r));
  }

  void on_worker() {
    zmq::message_t id, payload;
    if (!receive(worker_, id, payload)) return;
    auto m = eldr::decode_worker_message(bytes(payload), {});
    if (!m.ok()) {
      ++rec_.decode_errors;
      return;
    }
    eldr::worker_ack ack;
    ack.state = "active";
    ack.epoch = 3;
    std::visit(
        [&](auto& msg) {
          using T = std::decay_t<decltype(msg)>;
          ack.id = msg.id;
          if constexpr (std::is_same_v<T, eldr::worker_register>) {
            rec_.registers.push_back(msg);
          } else if constexpr (std::is_same_v<T, eldr::load_report>) {
            ++rec_.load_reports;
            if (msg.worker < k_) load_[msg.worker] = msg.in_flight;
          } else if constexpr (std::is_same_v<T, eldr::finished_requests>) {
            for (const std::string& r : msg.requests)
              rec_.finished.insert(r);
            if (msg.worker < k_)
              load_[msg.worker] -=
                  std::min<int64_t>(load_[msg.worker], static_cast<int64_t>(msg.requests.size()));
          } else if constexpr (std::is_same_v<T, eldr::publisher_register>) {
            rec_.publishers.push_back(msg.endpoint);
            sub_.connect(msg.endpoint);
            ack.state = "subscribed";
          }
        },
        *m);
    reply(worker_, id, eldr::encode_worker_ack(ack));
  }

  void on_kv() {
    std::vector<zmq::message_t> frames;
    zmq::message_t f;
    while (sub_.recv(f, zmq::recv_flags::dontwait)) {
      const bool more = f.more();
      frames.push_back(std::move(f));
      if (!more) break;
    }
    if (frames.size() != 3 || frames[1].size() != 8) {
      ++rec_.decode_errors;
      return;
    }
    std::vector<eldr::kv_decode_issue> issues;
    auto b = eldr::decode_kv_batch(bytes(frames[2]), {}, issues);
    if (!b.ok() || !issues.empty()) {
      ++rec_.decode_errors;
      return;
    }
    for (const eldr::kv_event& e : b->events) {
      switch (e.type) {
        case eldr::kv_event_type::block_stored:
          rec_.stored += e.block_hashes.size();
          stored_.insert(e.block_hashes.begin(), e.block_hashes.end());
          for (uint64_t h : e.block_hashes)
            uncovered_.erase(h);
          break;
        case eldr::kv_event_type::block_removed:
          rec_.removed += e.block_hashes.size();
          for (uint64_t h : e.block_hashes)
            stored_.erase(h);
          break;
        case eldr::kv_event_type::all_blocks_cleared:
          ++rec_.cleared;
          stored_.clear();
          break;
      }
    }
  }

  void loop() {
    while (!stop_) {
      zmq::pollitem_t items[] = {{admin_.handle(), 0, ZMQ_POLLIN, 0},
                                 {route_.handle(), 0, ZMQ_POLLIN, 0},
                                 {worker_.handle(), 0, ZMQ_POLLIN, 0},
                                 {sub_.handle(), 0, ZMQ_POLLIN, 0}};
      if (zmq::poll(items, 4, std::chrono::milliseconds(50)) <= 0) continue;
      // KV events first: a prefill publishes a block's event before it routes the request.
      if ((items[3].revents & ZMQ_POLLIN) != 0) on_kv();
      if ((items[0].revents & ZMQ_POLLIN) != 0) on_admin();
      if ((items[2].revents & ZMQ_POLLIN) != 0) on_worker();
      if ((items[1].revents & ZMQ_POLLIN) != 0) on_route();
    }
  }

  uint32_t k_;
  bool install_imports_ = false;
  std::string refuse_policy_;
  std::string policy_ = "jsq", policy_source_ = "config";
  uint64_t epoch_ = 3;
  std::vector<int64_t> load_;
  zmq::context_t ctx_{1};
  zmq::socket_t admin_{ctx_, zmq::socket_type::router};
  zmq::socket_t route_{ctx_, zmq::socket_type::router};
  zmq::socket_t worker_{ctx_, zmq::socket_type::router};
  zmq::socket_t sub_{ctx_, zmq::socket_type::sub};
  std::unordered_set<uint64_t> stored_;
  std::unordered_set<uint64_t> uncovered_;
  node_record rec_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

json last_json_line(const std::string& output) {
  std::size_t start = output.rfind("\n{");
  start =
      start == std::string::npos ? (output.rfind('{', 0) == 0 ? 0 : std::string::npos) : start + 1;
  if (start == std::string::npos) return json();
  return json::parse(output.substr(start, output.find('\n', start) - start), nullptr, false);
}

// Runs eldr-loadgen against `node` with `args` (after --node), stops the node so that its record
// is complete, and reads the run's JSON report into `report`. Fails the test (use it under
// ASSERT_NO_FATAL_FAILURE) when the run does not exit 0 or prints no report.
void run_for_report(fake_node& node, const std::string& args, json& report) {
  const auto r =
      eldr::testing::run_command(loadgen_binary + " --node " + node.admin_endpoint() + args);
  node.stop();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  report = last_json_line(r.output);
  ASSERT_TRUE(report.is_object()) << r.output;
}

TEST(Loadgen, PlaysEveryPolicyThroughTheNode) {
  fake_node node(3);
  // 40 requests (rate * duration), short outputs, four times faster than real time.
  json j;
  ASSERT_NO_FATAL_FAILURE(run_for_report(
      node,
      " --synthetic qwen-task --rate 40 --duration 1 --decode-workers 3 --json --quiet"
      " --calibration-requests 120 --pairs 500 --prompt-max 200 --output-tokens 6 --time-scale 4"
      " --prompt-pool 8 --report-ms 20 --capacity 64",
      j));
  for (const char* key :
       {"route_rps", "route_p50_us", "route_p99_us", "errors", "tpot_p50_ms", "tpot_p99_ms",
        "ttft_p50_ms", "inflight_imbalance", "inflight_mean", "decision_cv"})
    EXPECT_TRUE(j.contains(key)) << key;
  ASSERT_TRUE(j["policies"].contains("eldr"));
  ASSERT_TRUE(j["policies"].contains("jsq"));
  EXPECT_EQ(j["policy"], "eldr");  // the top level is the first policy's
  for (const char* p : {"eldr", "jsq"}) {
    const json& q = j["policies"][p];
    EXPECT_EQ(q["sent"], 40) << p;
    EXPECT_EQ(q["replied"], 40) << p;
    EXPECT_EQ(q["errors"], 0) << p;
    EXPECT_EQ(q["completed"], 40) << p;
    EXPECT_GT(q["tpot_p50_ms"].get<double>(), 0.0) << p;
    EXPECT_GE(q["ttft_p50_ms"].get<double>(), q["tpot_p50_ms"].get<double>()) << p;
    EXPECT_GT(q["route_p50_us"].get<double>(), 0.0) << p;
    // The node's coverage: 1 unless a KV event was overtaken by the route request it precedes.
    EXPECT_GT(q["coverage_mean"].get<double>(), 0.9) << p;
    EXPECT_EQ(q["epochs_seen"], json::array({3})) << p;
    uint64_t decisions = 0;
    for (const json& d : q["decisions_per_worker"])
      decisions += d.get<uint64_t>();
    EXPECT_EQ(decisions, 40u) << p;
    EXPECT_GT(q["prefix_hit_fraction"].get<double>(), 0.0) << p;  // a pool of 8 prompts
  }

  const node_record& n = node.record();
  EXPECT_EQ(n.decode_errors, 0u);
  EXPECT_EQ(n.policies, (std::vector<std::string>{"eldr", "jsq"}));
  // Issue 12: the node was left on the last policy run and the loadgen's epoch. Both are put
  // back: the policy to the node's config (it was not an admin change), the epoch to 3.
  EXPECT_EQ(n.policy_resets, 1u);
  EXPECT_EQ(n.swaps, (std::vector<uint64_t>{3}));
  ASSERT_TRUE(j.contains("node_changes")) << j.dump();
  EXPECT_EQ(j["node_changes"]["changed"].size(), 2u) << j.dump();
  EXPECT_EQ(j["node_changes"]["restored"].size(), 2u) << j.dump();
  ASSERT_EQ(n.imported.size(), 1u);
  EXPECT_EQ(n.imported[0].workers, 3u);
  EXPECT_EQ(n.imported[0].model_name, "fake-model");
  EXPECT_EQ(n.imported[0].epoch, 4u);  // after the node's current epoch 3
  ASSERT_EQ(n.registers.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(n.registers[i].worker, i);
    EXPECT_EQ(n.registers[i].endpoint, "loadgen://decode/" + std::to_string(i));
    EXPECT_EQ(n.registers[i].model, "fake-model");
    EXPECT_EQ(n.registers[i].capacity, 64u);
  }
  EXPECT_EQ(n.publishers.size(), 2u);
  // Every routed request finished exactly once.
  EXPECT_EQ(n.routed.size(), 80u);
  EXPECT_EQ(n.finished, n.routed);
  EXPECT_GT(n.load_reports, 0u);
  // Every block of every request was either counted in the request or stored by a KV event;
  // each policy's run starts from cleared caches.
  EXPECT_EQ(n.uncovered_blocks, 0u);
  EXPECT_GT(n.stored, 0u);
  EXPECT_LT(n.counts_blocks, n.total_blocks);  // prefix hits sent no counts
  EXPECT_EQ(n.cleared, 4u);                    // 2 publishers x 2 policies
}

TEST(Loadgen, RouteOnlyFinishesEveryDecision) {
  fake_node node(2);
  json j;
  ASSERT_NO_FATAL_FAILURE(run_for_report(
      node,
      " --synthetic gpt-oss-task --rate 400 --duration 0.5 --decode-workers 2 --json --quiet"
      " --route-only --no-import --policies jsq --max-outstanding 16 --prompt-pool 16",
      j));
  EXPECT_EQ(j["sent"], 200);
  EXPECT_EQ(j["replied"], 200);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["decode_steps"], 0);
  EXPECT_GT(j["route_rps"].get<double>(), 0.0);
  EXPECT_EQ(j["prepared_at_start"], 200);  // within the default budget: all before the clock
  const node_record& n = node.record();
  EXPECT_TRUE(n.imported.empty());
  EXPECT_EQ(n.routed.size(), 200u);
  EXPECT_EQ(n.finished, n.routed);
  ASSERT_EQ(n.registers.size(), 2u);
  EXPECT_EQ(n.registers[0].capacity, 0u);  // unbounded by default
}

// A run whose encoded requests exceed --prepare-budget-mib starts its clock with part of them
// prepared and prepares the rest while it plays, on the cores the nodes it measures use too: the
// report and stderr say how many were ready, so a benchmark can tell (bench/cluster_bench.py
// warns).
TEST(Loadgen, ARunBeyondThePreparationBudgetSaysHowMuchWasPreparedBeforeTheClock) {
  fake_node node(2);
  const auto r = eldr::testing::run_command(
      loadgen_binary + " --node " + node.admin_endpoint() +
      " --synthetic qwen-task --rate 400 --duration 0.5 --decode-workers 2 --json --route-only"
      " --no-import --policies jsq --prompt-pool 0 --counts all --prepare-budget-mib 1");
  node.stop();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = last_json_line(r.output);
  ASSERT_TRUE(j.is_object()) << r.output;
  EXPECT_EQ(j["replied"], 200);  // every request still sent and answered
  EXPECT_GT(j["prepared_at_start"].get<uint64_t>(), 0u);
  EXPECT_LT(j["prepared_at_start"].get<uint64_t>(), 200u);
  EXPECT_NE(r.output.find("of 200 requests prepared before the clock"), std::string::npos)
      << r.output;
}

// Two loadgen processes against one node send disjoint request ids (a node answers a repeated id
// with the decision it remembers, as a retry), and --warmup leaves the first seconds out of the
// route percentiles but not out of the per-second series.
TEST(Loadgen, RunsUseFreshRequestIdsAndWarmupOnlyNarrowsThePercentiles) {
  fake_node node(2);
  const std::string cmd = loadgen_binary + " --node " + node.admin_endpoint() +
                          " --synthetic gpt-oss-task --rate 200 --duration 1.5 --decode-workers 2"
                          " --json --quiet --route-only --no-import --policies jsq"
                          " --prompt-pool 16";
  const auto first = eldr::testing::run_command(cmd);
  const auto second = eldr::testing::run_command(cmd + " --warmup 1");
  node.stop();
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const node_record& n = node.record();
  ASSERT_EQ(n.routed.size(), 600u);
  for (const auto& id : n.routed)
    EXPECT_EQ(n.routed.count(id), 1u) << id;

  for (const json& j : {last_json_line(first.output), last_json_line(second.output)}) {
    ASSERT_TRUE(j.is_object());
    ASSERT_TRUE(j["route_seconds"].is_array());
    uint64_t replies = 0;
    double worst = 0;
    for (const json& s : j["route_seconds"]) {
      replies += s["replies"].get<uint64_t>();
      worst = std::max(worst, s["max_us"].get<double>());
      EXPECT_LE(s["p50_us"].get<double>(), s["p99_us"].get<double>());
    }
    EXPECT_EQ(replies, 300u);  // every reply is in some second
    EXPECT_LE(j["route_p99_all_us"].get<double>(), worst);
    EXPECT_LE(j["route_max_us"].get<double>(), worst);
    EXPECT_GE(j["route_seconds"].size(), 2u);
  }
  // Without --warmup the headline p99 is the whole run's.
  const json a = last_json_line(first.output);
  EXPECT_DOUBLE_EQ(a["route_p99_us"].get<double>(), a["route_p99_all_us"].get<double>());
}

TEST(Loadgen, SwapAtImportsASecondSetUnderLoad) {
  fake_node node(2, /*install_imports=*/true);
  json j;
  ASSERT_NO_FATAL_FAILURE(run_for_report(
      node,
      " --synthetic qwen-task --rate 200 --duration 1.5 --decode-workers 2 --json --quiet"
      " --calibration-requests 120 --pairs 500 --prompt-max 200 --route-only --policies eldr"
      " --prompt-pool 16 --swap-at 0.5",
      j));
  EXPECT_EQ(j["errors"], 0);
  ASSERT_TRUE(j.contains("swap")) << j.dump();
  const json& sw = j["swap"];
  EXPECT_TRUE(sw["attempted"].get<bool>()) << sw.dump();
  EXPECT_FALSE(sw.contains("error")) << sw.dump();
  EXPECT_EQ(sw["epoch_before"], 4) << sw.dump();  // the setup's import, after the node's 3
  EXPECT_EQ(sw["epoch_after"], 5) << sw.dump();
  EXPECT_EQ(sw["old_epoch_after_ack"], 0) << sw.dump();
  EXPECT_EQ(sw["failed_during_swap"], 0) << sw.dump();
  EXPECT_GT(sw["requests_in_window"].get<uint64_t>(), 0u) << sw.dump();
  ASSERT_TRUE(sw["first_new_epoch_ms"].is_number()) << sw.dump();
  EXPECT_EQ(j["epochs_seen"], json::array({4, 5}));
  // The second set: same K and spec, valid, different rows.
  const node_record& n = node.record();
  ASSERT_EQ(n.imported.size(), 2u);
  // The import's round trip (ms from its send) holds the node's handling of it, and fits in the
  // run. The node answers routes on the thread that installs the set, after its import reply, so
  // the first reply with the new epoch also comes after the node's handling.
  ASSERT_EQ(n.import_handling_ms.size(), 2u);
  const double handling_ms = n.import_handling_ms[1];
  EXPECT_GT(handling_ms, 0.0);
  EXPECT_GE(sw["import_ms"].get<double>(), handling_ms) << sw.dump();
  EXPECT_LT(sw["import_ms"].get<double>(), j["wall_s"].get<double>() * 1000.0) << sw.dump();
  EXPECT_GT(sw["first_new_epoch_ms"].get<double>(), handling_ms) << sw.dump();
  EXPECT_LT(sw["first_new_epoch_ms"].get<double>(), j["wall_s"].get<double>() * 1000.0)
      << sw.dump();
  EXPECT_EQ(n.imported[1].workers, n.imported[0].workers);
  EXPECT_TRUE(n.imported[1].spec.geometry() == n.imported[0].spec.geometry());
  EXPECT_EQ(n.imported[1].spec.width(), n.imported[0].spec.width());
  EXPECT_EQ(n.imported[1].epoch, 5u);
  EXPECT_TRUE(eldr::validate_centroid_file(n.imported[1]).ok());
  EXPECT_NE(n.imported[1].centroids, n.imported[0].centroids);
}

// 40 requests of a small synthetic workload over routers `a` (also --node) and `b`.
std::string two_router_run(fake_node& a, fake_node& b) {
  return " --routers " + a.admin_endpoint() + "," + b.admin_endpoint() +
         " --synthetic qwen-task --rate 40 --duration 1 --decode-workers 2 --json --quiet"
         " --calibration-requests 120 --pairs 500 --prompt-max 200 --output-tokens 6"
         " --time-scale 4 --prompt-pool 8 --report-ms 20 --policies jsq";
}

TEST(Loadgen, RoutersSpreadRoutesRoundRobinWorkersStayAtTheNode) {
  fake_node a(2), b(2);
  json j;
  ASSERT_NO_FATAL_FAILURE(run_for_report(a, two_router_run(a, b), j));
  b.stop();
  EXPECT_EQ(j["sent"], 40);
  EXPECT_EQ(j["replied"], 40);
  EXPECT_EQ(j["errors"], 0);
  EXPECT_EQ(j["completed"], 40);
  EXPECT_EQ(j["route_endpoints"].size(), 2u);
  // The decode side's imbalance figures: max/mean >= 1; decision_cv is the population standard
  // deviation over the mean of decisions_per_worker, which sum to every decision.
  EXPECT_GE(j["inflight_imbalance"].get<double>(), 1.0);
  EXPECT_GT(j["inflight_mean"].get<double>(), 0.0);
  const auto decisions = j["decisions_per_worker"].get<std::vector<double>>();
  ASSERT_FALSE(decisions.empty()) << j.dump();
  double sum = 0, squares = 0;
  for (double d : decisions)
    sum += d;
  const double mean = sum / static_cast<double>(decisions.size());
  for (double d : decisions)
    squares += (d - mean) * (d - mean);
  EXPECT_EQ(sum, 40.0) << j.dump();
  EXPECT_NEAR(j["decision_cv"].get<double>(),
              std::sqrt(squares / static_cast<double>(decisions.size())) / mean, 1e-9)
      << j.dump();
  const node_record& na = a.record();
  const node_record& nb = b.record();
  // Round robin per request over the two routers.
  EXPECT_EQ(na.routed.size(), 20u);
  EXPECT_EQ(nb.routed.size(), 20u);
  // The policy and the publishers at both; workers, centroids and finished requests at --node.
  EXPECT_EQ(na.policies, (std::vector<std::string>{"jsq"}));
  EXPECT_EQ(nb.policies, (std::vector<std::string>{"jsq"}));
  // Every router's policy is restored; the epoch only at --node, where the set was imported.
  EXPECT_EQ(na.policy_resets, 1u);
  EXPECT_EQ(nb.policy_resets, 1u);
  EXPECT_EQ(na.swaps, (std::vector<uint64_t>{3}));
  EXPECT_TRUE(nb.swaps.empty());
  EXPECT_EQ(na.publishers.size(), 2u);
  EXPECT_EQ(nb.publishers.size(), 2u);
  EXPECT_EQ(na.registers.size(), 2u);
  EXPECT_TRUE(nb.registers.empty());
  EXPECT_EQ(na.imported.size(), 1u);
  EXPECT_TRUE(nb.imported.empty());
  std::multiset<std::string> routed = na.routed;
  routed.insert(nb.routed.begin(), nb.routed.end());
  EXPECT_EQ(na.finished, routed);
  EXPECT_TRUE(nb.finished.empty());
  EXPECT_EQ(na.decode_errors + nb.decode_errors, 0u);
}

// --publishers-at-node-only (a measurement of the KV events' fan-in): the publishers register at
// --node alone; routes still go to every router.
TEST(Loadgen, PublishersAtNodeOnlyRegisterThePublishersAtTheNodeAlone) {
  fake_node a(2), b(2);
  json j;
  ASSERT_NO_FATAL_FAILURE(
      run_for_report(a, two_router_run(a, b) + " --publishers-at-node-only", j));
  b.stop();
  EXPECT_EQ(j["replied"], 40);
  EXPECT_EQ(j["errors"], 0);
  const node_record& na = a.record();
  const node_record& nb = b.record();
  EXPECT_EQ(na.publishers.size(), 2u);
  EXPECT_TRUE(nb.publishers.empty());
  EXPECT_EQ(na.routed.size(), 20u);
  EXPECT_EQ(nb.routed.size(), 20u);
}

// Restored also when the run fails half way (the second policy is refused), and --keep-centroids
// leaves the imported set current while the policy is still put back.
TEST(Loadgen, TheNodeIsRestoredAfterAFailureAndKeepCentroidsKeepsTheSet) {
  const std::string args =
      " --synthetic qwen-task --rate 20 --duration 1 --decode-workers 2 --quiet"
      " --calibration-requests 120 --pairs 500 --prompt-max 200 --output-tokens 6 --time-scale 4"
      " --prompt-pool 8 --report-ms 20";
  {
    fake_node node(2, false, "jsq");
    const auto r = eldr::testing::run_command(loadgen_binary + " --node " + node.admin_endpoint() +
                                              args + " --policies eldr,jsq");
    node.stop();
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("refused by the test"), std::string::npos) << r.output;
    EXPECT_EQ(node.record().policies, (std::vector<std::string>{"eldr"}));
    EXPECT_EQ(node.record().policy_resets, 1u);
    EXPECT_EQ(node.record().swaps, (std::vector<uint64_t>{3}));
  }
  {
    fake_node node(2);
    json j;
    ASSERT_NO_FATAL_FAILURE(
        run_for_report(node, args + " --policies eldr --keep-centroids --json", j));
    EXPECT_EQ(node.record().policy_resets, 1u);
    EXPECT_TRUE(node.record().swaps.empty());
    bool kept = false;
    for (const json& line : j["node_changes"]["restored"])
      kept = kept || line.get<std::string>().find("--keep-centroids") != std::string::npos;
    EXPECT_TRUE(kept) << j.dump();
  }
}

TEST(Loadgen, UnreachableNodeExitsWithThree) {
  // A bound but never answered ROUTER: the status call times out.
  zmq::context_t ctx{1};
  zmq::socket_t silent(ctx, zmq::socket_type::router);
  silent.set(zmq::sockopt::linger, 0);
  silent.bind("tcp://127.0.0.1:*");
  const auto r = eldr::testing::run_command(
      loadgen_binary + " --node " + silent.get(zmq::sockopt::last_endpoint) +
      " --synthetic qwen-task --rate 10 --duration 1 --decode-workers 2 --json");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("unreachable"), std::string::npos) << r.output;
}

TEST(Loadgen, BadOptionsExitWithTwo) {
  const auto r = eldr::testing::run_command(
      loadgen_binary +
      " --node tcp://127.0.0.1:1 --synthetic no-such-preset --rate 10 --duration 1"
      " --decode-workers 2");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("no-such-preset"), std::string::npos) << r.output;
}

}  // namespace
