// eldrctl, the real binary, against a fake node: a ZeroMQ ROUTER on an ephemeral loopback port in
// a thread of the test, which decodes every admin request with decode_admin_request, records it,
// and answers a canned admin_reply (encode_admin_reply) chosen per command. Checked: the tables
// and --json, the arguments each subcommand sends, the exit codes (1 node error, 2 usage, 3
// transport), and that centroid files are validated locally and travel byte for byte.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "cluster/security/curve_keys.hpp"
#include "cluster/wire/admin_protocol.hpp"
#include "core/base/file_io.hpp"
#include "core/formats/centroid_file.hpp"
#include "tests/support/node_process.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using json = nlohmann::json;

const std::string eldrctl = std::string(ELDR_BINARY_DIR) + "/tools/eldrctl/eldrctl";

// The fake node. handler(request) -> the reply to send (its id is filled in here), or nullopt to
// stay silent (a node that never answers).
class fake_admin_node {
 public:
  using handler = std::function<std::optional<admin_reply>(const admin_request&)>;

  explicit fake_admin_node(handler h)
      : handler_(std::move(h)), sock_(ctx_, zmq::socket_type::router) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.bind("tcp://127.0.0.1:*");
    endpoint_ = sock_.get(zmq::sockopt::last_endpoint);
    // The socket is used by the thread only from here on (thread start is a memory barrier).
    thread_ = std::thread([this] { serve(); });
  }
  ~fake_admin_node() {
    stop_ = true;
    thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }
  std::vector<admin_request> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  std::vector<std::string> commands() {
    std::vector<std::string> out;
    for (const admin_request& r : requests())
      out.push_back(r.command);
    return out;
  }
  std::vector<std::string> errors() {
    std::lock_guard<std::mutex> lock(mu_);
    return errors_;
  }

 private:
  void serve() {
    while (!stop_) {
      zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
      // Bounded only so that the destructor's stop is noticed; requests are handled on arrival.
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(sock_, std::back_inserter(frames))) continue;
      if (frames.size() != 2) {
        record_error("request of " + std::to_string(frames.size()) + " frames");
        continue;
      }
      const std::span<const uint8_t> payload(frames[1].data<uint8_t>(), frames[1].size());
      auto req = decode_admin_request(payload, admin_protocol_limits{});
      if (!req.ok()) {
        record_error(req.error().to_string());
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(*req);
      }
      std::optional<admin_reply> reply = handler_(*req);
      if (!reply) continue;
      reply->id = req->id;
      const std::vector<uint8_t> bytes = encode_admin_reply(*reply);
      sock_.send(frames[0], zmq::send_flags::sndmore);
      sock_.send(zmq::buffer(bytes), zmq::send_flags::none);
    }
  }
  void record_error(std::string e) {
    std::lock_guard<std::mutex> lock(mu_);
    errors_.push_back(std::move(e));
  }

  handler handler_;
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  std::string endpoint_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<admin_request> requests_;
  std::vector<std::string> errors_;
  std::thread thread_;
};

admin_reply ok_reply(json result) {
  admin_reply r;
  r.ok = true;
  r.result = std::move(result);
  return r;
}

admin_reply error_reply_of(wire_error_code code, std::string message) {
  admin_reply r;
  r.ok = false;
  r.code = code;
  r.error = std::move(message);
  return r;
}

const json status_result = {
    {"node",
     {{"name", "eldr-test"},
      {"version", "0.1.0"},
      {"roles", {"router", "cache"}},
      {"uptime_s", 3725}}},
    {"endpoints",
     {{"route", "tcp://127.0.0.1:5700"},
      {"worker", "tcp://127.0.0.1:5701"},
      {"admin", "tcp://127.0.0.1:5702"},
      {"metrics", "http://127.0.0.1:9464/metrics"}}},
    {"models",
     json::array({{{"name", "qwen3-30b-a3b"},
                   {"k", 8},
                   {"policy", "eldr"},
                   {"tau", 0.1},
                   {"epoch", 12},
                   {"width", 6144},
                   {"workers", {{"registered", 8}, {"active", 7}, {"draining", 1}, {"dead", 0}}}},
                  {{"name", "m"},
                   {"k", 2},
                   {"policy", "jsq"},
                   {"tau", 0},
                   {"epoch", 0},
                   {"width", 0},
                   {"workers", {{"registered", 2}, {"active", 2}, {"draining", 0}, {"dead", 0}}},
                   {"shiny_new_field", "yes"}}})},
    {"counters", {{"routed", 1234}, {"errors", 5}}},
    {"replication", {{"peers", 2}}}};

const json workers_result = {{{"model", "m"},
                              {"worker", 0},
                              {"endpoint", "tcp://10.0.0.1:5600"},
                              {"state", "active"},
                              {"load", 3},
                              {"capacity", 64},
                              {"last_report_ms_ago", 120},
                              {"routed", 1000},
                              {"finished", 997}},
                             {{"model", "m"},
                              {"worker", 1},
                              {"endpoint", "tcp://10.0.0.2:5600"},
                              {"state", "draining"},
                              {"load", 12},
                              {"capacity", 64},
                              {"last_report_ms_ago", 80},
                              {"routed", 2000},
                              {"finished", 1988}}};

// A node that knows every command: canned results, and the arguments echoed where useful.
std::optional<admin_reply> canned(const admin_request& r) {
  if (r.command == "status") return ok_reply(status_result);
  if (r.command == "workers") return ok_reply(workers_result);
  if (r.command == "centroids.import") return ok_reply({{"epoch", 13}});
  if (r.command == "centroids.show")  // sample_centroids()'s model, geometry and K
    return ok_reply({{"model", "m"}, {"epoch", 12}, {"k", 2}, {"geometry", {2, 4, 2}}});
  if (r.command == "policy")
    return ok_reply(
        {{"policy", r.args.value("policy", "eldr")}, {"tau", r.args.value("tau", 0.1)}});
  if (r.command == "drain" || r.command == "undrain")
    return error_reply_of(wire_error_code::unknown_model, "no pool for model x");
  return error_reply_of(wire_error_code::unknown_type, "unknown command " + r.command);
}

// A small valid centroid set: 2 workers over a 2-layer, 4-expert model, unit rows.
centroid_file sample_centroids() {
  centroid_file f;
  f.model_name = "m";
  f.spec = *signature_spec::make({2, 4, 2}, signature_transform::count, {0, 1}, {});
  f.epoch = 7;
  f.workers = 2;
  f.centroids.assign(2 * f.spec.width(), 0.0f);
  f.centroids[0] = 1.0f;
  f.centroids[f.spec.width() + 3] = 0.6f;
  f.centroids[f.spec.width() + 4] = 0.8f;
  f.provenance.tool = "eldrctl_test";
  return f;
}

testing::process_result ctl(const fake_admin_node& node, const std::string& args) {
  return testing::run_command(eldrctl + " --node " + node.endpoint() + " --timeout-ms 5000 " +
                              args);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line))
    out.push_back(line);
  return out;
}

// The line that starts with `prefix` (after indentation), or "".
std::string line_starting(const std::string& out, const std::string& prefix) {
  for (const std::string& l : lines_of(out)) {
    const size_t at = l.find_first_not_of(' ');
    if (at != std::string::npos && l.compare(at, prefix.size(), prefix) == 0) return l;
  }
  return "";
}

struct Eldrctl : ::testing::Test {
  testing::temp_dir dir{"eldrctl"};
  void SetUp() override {
    ASSERT_FALSE(dir.path().empty());
    // The test runs the program; building this test alone does not build it.
    ASSERT_TRUE(std::filesystem::exists(eldrctl)) << eldrctl << " is missing: build target eldrctl";
  }
};

TEST_F(Eldrctl, StatusPrintsAlignedTables) {
  fake_admin_node node(canned);
  const auto r = ctl(node, "status");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(node.commands(), std::vector<std::string>{"status"});
  EXPECT_EQ(node.requests()[0].args, json::object());

  EXPECT_NE(r.output.find("node eldr-test  version 0.1.0  roles router,cache  uptime 1h2m5s"),
            std::string::npos)
      << r.output;
  EXPECT_NE(line_starting(r.output, "route").find("tcp://127.0.0.1:5700"), std::string::npos);
  EXPECT_NE(line_starting(r.output, "metrics").find("http://127.0.0.1:9464/metrics"),
            std::string::npos);
  // One row per model, columns aligned with the header: the figures an operator scans first.
  const std::string header = line_starting(r.output, "MODEL");
  const std::string row1 = line_starting(r.output, "qwen3-30b-a3b");
  const std::string row2 = line_starting(r.output, "m ");
  ASSERT_FALSE(header.empty() || row1.empty() || row2.empty()) << r.output;
  EXPECT_EQ(header.find("POLICY"), row1.find("eldr")) << r.output;
  EXPECT_EQ(header.find("POLICY"), row2.find("jsq")) << r.output;
  // Numbers are right-aligned: the last digit sits under the header's last letter.
  EXPECT_EQ(header.find("EPOCH") + 4, row1.find("12") + 1) << r.output;
  EXPECT_NE(row1.find("7/8"), std::string::npos) << r.output;  // active / registered
  EXPECT_NE(header.find("STATE"), std::string::npos) << r.output;
  EXPECT_NE(row2.find(" ok"), std::string::npos) << r.output;
  // The default view fits 100 columns; fields this build does not know wait for --wide.
  for (const std::string& line : lines_of(r.output))
    EXPECT_LE(line.size(), 100u) << line;
  EXPECT_EQ(r.output.find("SHINY_NEW_FIELD"), std::string::npos) << r.output;
  EXPECT_NE(line_starting(r.output, "routed").find("1234"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("replication"), std::string::npos) << r.output;
  // --wide: every column, including the ones this build does not know.
  const auto wide = ctl(node, "status --wide");
  ASSERT_EQ(wide.exit_code, 0) << wide.output;
  const std::string wide_header = line_starting(wide.output, "MODEL");
  EXPECT_NE(wide_header.find("SHINY_NEW_FIELD"), std::string::npos) << wide.output;
  EXPECT_NE(wide_header.find("DRAINING"), std::string::npos) << wide.output;
  EXPECT_NE(line_starting(wide.output, "m ").find("yes"), std::string::npos) << wide.output;
}

// What the default view says about a model an operator must look at.
TEST_F(Eldrctl, StatusNamesWhatIsWrongWithAModel) {
  json degraded = status_result;
  degraded["models"][0]["routing_with"] = "jsq";  // eldr wanted, no set of K: load only
  degraded["models"][0]["workers"]["dead"] = 2;
  degraded["models"][1]["workers"]["active"] = 0;
  degraded["signature_cache"] = json::array(
      {{{"model", "m"}, {"blocks", 10}, {"store", {{"degraded", true}, {"reason", "disk full"}}}}});
  fake_admin_node node([&](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command == "status") return ok_reply(degraded);
    return canned(r);
  });
  const auto r = ctl(node, "status");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(line_starting(r.output, "qwen3-30b-a3b").find("routing by jsq, 2 dead"),
            std::string::npos)
      << r.output;
  EXPECT_NE(line_starting(r.output, "m ").find("no active worker, store degraded"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("degraded: disk full"), std::string::npos) << r.output;
}

TEST_F(Eldrctl, JsonPrintsTheRawResult) {
  fake_admin_node node(canned);
  for (const char* args : {"--json status", "status --json"}) {
    const auto r = ctl(node, args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(json::parse(r.output, nullptr, false), status_result) << r.output;
  }
}

TEST_F(Eldrctl, WorkersTableAndModelFilter) {
  fake_admin_node node(canned);
  auto r = ctl(node, "workers --model m");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(node.requests().size(), 1u);
  EXPECT_EQ(node.requests()[0].args, json({{"model", "m"}}));
  const std::string header = line_starting(r.output, "MODEL");
  ASSERT_FALSE(header.empty()) << r.output;
  for (const char* h :
       {"WORKER", "ENDPOINT", "STATE", "LOAD", "CAPACITY", "LAST_REPORT_MS", "ROUTED", "FINISHED"})
    EXPECT_NE(header.find(h), std::string::npos) << h << "\n" << r.output;
  EXPECT_EQ(lines_of(r.output).size(), 3u) << r.output;  // header + 2 workers
  EXPECT_NE(r.output.find("tcp://10.0.0.2:5600"), std::string::npos);
  EXPECT_EQ(header.find("STATE"), lines_of(r.output)[2].find("draining")) << r.output;

  EXPECT_EQ(header.find("AUTHORITY"), std::string::npos) << r.output;
  EXPECT_EQ(header.find("ESTIMATED"), std::string::npos) << r.output;

  r = ctl(node, "workers");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(node.requests().at(1).args, json::object());  // no filter: no "model" key
}

// With load authorities the rows name each worker's authority and the part of its load that is
// the peer estimate, and the table shows both, ESTIMATED beside LOAD.
TEST_F(Eldrctl, WorkersTableNamesEachWorkersLoadAuthorityWhenTheRowsHaveOne) {
  fake_admin_node node([](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command != "workers") return canned(r);
    json rows = workers_result;
    rows[0]["authority"] = "node-a";
    rows[1]["authority"] = "node-b";
    rows[0]["load_estimated"] = 0;
    rows[1]["load_estimated"] = 7654;
    return ok_reply(rows);
  });
  const auto r = ctl(node, "workers");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string header = line_starting(r.output, "MODEL");
  ASSERT_NE(header.find("AUTHORITY"), std::string::npos) << r.output;
  EXPECT_EQ(header.find("AUTHORITY"), lines_of(r.output)[2].find("node-b")) << r.output;
  const size_t estimated = header.find("ESTIMATED");
  ASSERT_NE(estimated, std::string::npos) << r.output;
  // Numbers are right-aligned under their heading.
  EXPECT_EQ(estimated + std::string("ESTIMATED").size(), lines_of(r.output)[2].find("7654") + 4)
      << r.output;
  EXPECT_LT(header.find("LOAD"), estimated) << r.output;
  EXPECT_LT(estimated, header.find("CAPACITY")) << r.output;
}

TEST_F(Eldrctl, NodeErrorExitsOneWithCodeNameAndMessage) {
  fake_admin_node node([](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command == "refit")  // a code newer than this build: still the node's refusal
      return error_reply_of(static_cast<wire_error_code>(42), "not in this century");
    return canned(r);
  });
  auto r = ctl(node, "drain x 3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("unknown_model"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no pool for model x"), std::string::npos) << r.output;
  ASSERT_EQ(node.requests().size(), 1u);
  EXPECT_EQ(node.requests()[0].command, "drain");
  EXPECT_EQ(node.requests()[0].args, json({{"model", "x"}, {"worker", 3}}));

  r = ctl(node, "refit x");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not in this century"), std::string::npos) << r.output;
}

TEST_F(Eldrctl, TransportFailuresExitThree) {
  // A node that takes the request and never answers.
  fake_admin_node silent([](const admin_request&) { return std::nullopt; });
  auto r =
      testing::run_command(eldrctl + " --node " + silent.endpoint() + " --timeout-ms 200 status");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(silent.commands(), std::vector<std::string>{"status"});

  // Nothing listens: take a free port from a fresh ROUTER and close it again.
  std::string dead;
  {
    zmq::context_t ctx;
    zmq::socket_t s(ctx, zmq::socket_type::router);
    s.set(zmq::sockopt::linger, 0);
    s.bind("tcp://127.0.0.1:*");
    dead = s.get(zmq::sockopt::last_endpoint);
  }
  r = testing::run_command(eldrctl + " --node " + dead + " --timeout-ms 200 workers");
  EXPECT_EQ(r.exit_code, 3) << r.output;
}

TEST_F(Eldrctl, UsageErrorsExitTwo) {
  fake_admin_node node(canned);
  for (const char* args : {"", "drain m", "drain m notanumber", "bogus", "centroids",
                           "centroids export m", "policy m --tau -1"}) {
    const auto r = ctl(node, args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  }
  EXPECT_EQ(ctl(node, "--help").exit_code, 0);
  // An endpoint ZeroMQ cannot parse is a usage error, not a transport failure.
  EXPECT_EQ(testing::run_command(eldrctl + " --node nonsense status").exit_code, 2);
  EXPECT_TRUE(node.requests().empty());
}

// The mistakes a new operator makes first each get an answer that says what to do (exit 2, and
// nothing is sent to the node).
TEST_F(Eldrctl, UsageMistakesSayWhatToDo) {
  fake_admin_node node(canned);
  auto typo = ctl(node, "stauts");
  EXPECT_EQ(typo.exit_code, 2) << typo.output;
  EXPECT_NE(typo.output.find("did you mean \"status\"?"), std::string::npos) << typo.output;
  auto list = ctl(node, "centroids list m");
  EXPECT_EQ(list.exit_code, 2) << list.output;
  EXPECT_NE(list.output.find("unknown command \"centroids list\""), std::string::npos)
      << list.output;
  EXPECT_NE(list.output.find("show, export, import, swap, rollback"), std::string::npos)
      << list.output;
  auto rolback = ctl(node, "centroids rolback m");
  EXPECT_NE(rolback.output.find("did you mean \"centroids rollback\"?"), std::string::npos)
      << rolback.output;
  // host:port without tcp://
  const std::string bare = node.endpoint().substr(std::string("tcp://").size());
  auto no_scheme = testing::run_command(eldrctl + " --node " + bare + " status");
  EXPECT_EQ(no_scheme.exit_code, 2) << no_scheme.output;
  EXPECT_NE(no_scheme.output.find("did you mean tcp://" + bare + "?"), std::string::npos)
      << no_scheme.output;
  EXPECT_TRUE(node.requests().empty());
  // keygen into a directory that does not exist: named, nothing written.
  auto keygen = testing::run_command(eldrctl + " keygen " + dir.sub("missing/node-1"));
  EXPECT_EQ(keygen.exit_code, 2) << keygen.output;
  EXPECT_NE(keygen.output.find("directory " + dir.sub("missing") + " does not exist"),
            std::string::npos)
      << keygen.output;
  EXPECT_FALSE(std::filesystem::exists(dir.sub("missing")));
  // No answer at all: the two usual causes are named.
  fake_admin_node silent([](const admin_request&) { return std::nullopt; });
  auto quiet =
      testing::run_command(eldrctl + " --node " + silent.endpoint() + " --timeout-ms 200 status");
  EXPECT_EQ(quiet.exit_code, 3) << quiet.output;
  EXPECT_NE(quiet.output.find("--curve-server-key"), std::string::npos) << quiet.output;
}

// Against a real node: its route and worker endpoints are recognised and the admin one named;
// swapping to an epoch that is not stored lists the stored ones; 'domain' is refused with the
// policies the node serves, and never listed as valid.
TEST_F(Eldrctl, ARealNodeSaysWhichEndpointAndWhichEpochsAndPolicies) {
  ASSERT_TRUE(std::filesystem::exists(testing::node_binary()))
      << testing::node_binary() << " is missing: build target eldr-node";
  testing::node_process node(dir.sub("node.toml"),
                             testing::node_toml(dir.sub("data"), "[[models]]\nname = \"m\"\n"));
  ASSERT_TRUE(node.ok()) << "the node did not start";
  for (const auto& [endpoint, name] : {std::pair{node.route(), std::string("route")},
                                       std::pair{node.worker(), std::string("worker")}}) {
    auto r = testing::run_command(eldrctl + " --node " + endpoint + " --timeout-ms 5000 status");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("that is the node's " + name + " endpoint; eldrctl needs its admin"),
              std::string::npos)
        << r.output;
  }
  const std::string admin = eldrctl + " --node " + node.admin() + " --timeout-ms 5000 ";
  auto swap = testing::run_command(admin + "centroids swap m 9");
  EXPECT_EQ(swap.exit_code, 1) << swap.output;
  EXPECT_NE(swap.output.find("epoch 9 is not stored; stored epochs: none"), std::string::npos)
      << swap.output;
  EXPECT_EQ(swap.output.find("system_error"), std::string::npos) << swap.output;
  auto domain = testing::run_command(admin + "policy m --set domain");
  EXPECT_EQ(domain.exit_code, 1) << domain.output;
  EXPECT_NE(domain.output.find("runs only in eldr-sim"), std::string::npos) << domain.output;
  auto foo = testing::run_command(admin + "policy m --set foo");
  EXPECT_EQ(foo.exit_code, 1) << foo.output;
  EXPECT_NE(foo.output.find("the node serves: rr, random, jsq"), std::string::npos) << foo.output;
  EXPECT_EQ(foo.output.find("domain"), std::string::npos) << foo.output;
}

TEST_F(Eldrctl, InvalidCentroidFileIsRefusedLocally) {
  fake_admin_node node(canned);
  // Not a centroid file at all, and a well-formed one whose centroid is not unit norm.
  const std::vector<uint8_t> junk = {0x93, 0x01, 0x02, 0x03};
  ASSERT_TRUE(write_file_atomic(dir.sub("junk.centroids"), junk).ok());
  centroid_file bad = sample_centroids();
  bad.centroids[0] = 2.0f;
  ASSERT_TRUE(write_file_atomic(dir.sub("bad.centroids"), encode_centroid_file(bad)).ok());

  auto r = ctl(node, "centroids import m " + dir.sub("junk.centroids"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("refusing"), std::string::npos) << r.output;
  r = ctl(node, "centroids import m " + dir.sub("bad.centroids"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("norm"), std::string::npos) << r.output;  // the reason
  r = ctl(node, "centroids import m " + dir.sub("missing.centroids"));
  EXPECT_NE(r.exit_code, 0) << r.output;

  // Had eldrctl sent an import, it would have waited for the answer, which the fake node gives
  // only after recording the request: so the node's record is complete once eldrctl exited.
  r = ctl(node, "status");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(node.commands(), std::vector<std::string>{"status"});
}

TEST_F(Eldrctl, ValidCentroidFileTravelsByteForByte) {
  fake_admin_node node(canned);
  const std::string path = dir.sub("set.centroids");
  ASSERT_TRUE(write_centroid_file(sample_centroids(), path).ok());
  auto bytes = read_file(path);
  ASSERT_TRUE(bytes.ok());

  const auto r = ctl(node, "centroids import m " + path);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(line_starting(r.output, "epoch").find("13"), std::string::npos) << r.output;
  // The current set is asked for first (model, geometry and K are compared before sending).
  ASSERT_EQ(node.commands(), (std::vector<std::string>{"centroids.show", "centroids.import"}));
  const admin_request req = node.requests()[1];
  EXPECT_FALSE(req.args.contains("force")) << req.args.dump();
  EXPECT_EQ(req.command, "centroids.import");
  EXPECT_EQ(req.args.value("model", ""), "m");
  ASSERT_TRUE(req.args.contains("file") && req.args["file"].is_binary()) << req.args.dump();
  EXPECT_EQ(static_cast<const std::vector<uint8_t>&>(req.args["file"].get_binary()), *bytes);
}

// Issue 12: importing another model's set only printed a note. It is refused before anything is
// sent (exit 2, as a locally refused file), unless --force, which the node gets as an argument.
TEST_F(Eldrctl, ASetOfAnotherModelOrGeometryIsRefusedUnlessForced) {
  fake_admin_node node(canned);
  centroid_file other = sample_centroids();
  other.model_name = "synthetic, Qwen3-30B-A3B shape";
  const std::string path = dir.sub("other.centroids");
  ASSERT_TRUE(write_centroid_file(other, path).ok());
  auto r = ctl(node, "centroids import m " + path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("fitted for model \"synthetic, Qwen3-30B-A3B shape\", not \"m\" "
                          "(eldr-fit --model m)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  EXPECT_EQ(node.commands(), std::vector<std::string>{"centroids.show"});

  r = ctl(node, "centroids import m " + path + " --force");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning"), std::string::npos) << r.output;
  ASSERT_EQ(node.requests().size(), 3u);
  EXPECT_EQ(node.requests()[2].command, "centroids.import");
  EXPECT_EQ(node.requests()[2].args.value("force", false), true) << node.requests()[2].args.dump();

  // Right name, another geometry than the node's current set (canned: 2 layers, 4 experts, k 2).
  centroid_file wide = sample_centroids();
  wide.spec = *signature_spec::make({2, 8, 2}, signature_transform::count, {0, 1}, {});
  wide.centroids.assign(2 * wide.spec.width(), 0.0f);
  wide.centroids[0] = 1.0f;
  wide.centroids[wide.spec.width() + 9] = 1.0f;
  const std::string wide_path = dir.sub("wide.centroids");
  ASSERT_TRUE(write_centroid_file(wide, wide_path).ok());
  r = ctl(node, "centroids import m " + wide_path);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("geometry L=2 E=8 k=2 differs"), std::string::npos) << r.output;
  EXPECT_EQ(node.commands().back(), "centroids.show");

  // The node's own refusal (another client, or a check only the node can make) exits 1.
  fake_admin_node refusing([](const admin_request& q) -> std::optional<admin_reply> {
    if (q.command == "centroids.import")
      return error_reply_of(wire_error_code::malformed, "centroid set refused for model 'm'");
    return canned(q);
  });
  const std::string good = dir.sub("good.centroids");
  ASSERT_TRUE(write_centroid_file(sample_centroids(), good).ok());
  r = ctl(refusing, "centroids import m " + good);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("centroid set refused"), std::string::npos) << r.output;
}

// Issue 12: a rejected refit answered accepted false and eldrctl exited 0.
TEST_F(Eldrctl, ARejectedRefitExitsOneWithItsReason) {
  std::atomic<bool> accept{false};
  fake_admin_node node([&](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command == "refit")
      return accept.load()
                 ? ok_reply({{"accepted", true}, {"epoch", 6}})
                 : ok_reply({{"accepted", false},
                             {"epoch", 5},
                             {"reason", "distinct-expert score not better: candidate 9"}});
    return canned(r);
  });
  auto r = ctl(node, "refit m");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("refit: rejected: distinct-expert score not better"), std::string::npos)
      << r.output;
  r = ctl(node, "--json refit m");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  accept = true;
  r = ctl(node, "refit m");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(Eldrctl, PolicyResetSendsResetAndRefusesAPolicyBesideIt) {
  fake_admin_node node(canned);
  auto r = ctl(node, "policy m --reset");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(node.requests().size(), 1u);
  EXPECT_EQ(node.requests()[0].args, json({{"model", "m"}, {"reset", true}}));
  r = ctl(node, "policy m --reset --set jsq");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(node.requests().size(), 1u);
}

TEST_F(Eldrctl, ExportWritesTheNodesFile) {
  const std::vector<uint8_t> file = encode_centroid_file(sample_centroids());
  fake_admin_node node([&](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command == "centroids.export") return ok_reply(json::binary(file));
    return canned(r);
  });
  const std::string out = dir.sub("out.centroids");
  auto r = ctl(node, "centroids export m --epoch 7 -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(node.requests().at(0).args, json({{"model", "m"}, {"epoch", 7}}));
  auto written = read_file(out);
  ASSERT_TRUE(written.ok()) << written.error().to_string();
  EXPECT_EQ(*written, file);
  EXPECT_NE(r.output.find("epoch 7"), std::string::npos) << r.output;

  // Without --epoch, no epoch key: the node exports its current set.
  r = ctl(node, "centroids export m -o " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(node.requests().at(1).args, json({{"model", "m"}}));
}

TEST_F(Eldrctl, EveryCommandSendsItsArguments) {
  fake_admin_node node([](const admin_request& r) -> std::optional<admin_reply> {
    if (r.command == "explain")
      return ok_reply({{"request", "req-9"},
                       {"worker", 3},
                       {"policy", "eldr"},
                       {"band", {{3, 0.8}, {1, 0.75}}}});
    if (r.command == "drain" || r.command == "undrain") return ok_reply({{"state", "draining"}});
    if (r.command == "policy" || r.command == "refit" || r.command == "centroids.show" ||
        r.command == "centroids.swap" || r.command == "centroids.rollback")
      return ok_reply({{"epoch", 5}});
    return canned(r);
  });
  const std::vector<std::pair<std::string, std::pair<std::string, json>>> cases = {
      {"drain m 1", {"drain", {{"model", "m"}, {"worker", 1}}}},
      {"undrain m 1", {"undrain", {{"model", "m"}, {"worker", 1}}}},
      {"centroids show m", {"centroids.show", {{"model", "m"}}}},
      {"centroids swap m 5", {"centroids.swap", {{"model", "m"}, {"epoch", 5}}}},
      {"centroids rollback m", {"centroids.rollback", {{"model", "m"}}}},
      {"refit m", {"refit", {{"model", "m"}}}},
      {"explain m req-9", {"explain", {{"model", "m"}, {"request", "req-9"}}}},
      {"policy m", {"policy", {{"model", "m"}}}},
      {"policy m --set jsq --tau 0.25",
       {"policy", {{"model", "m"}, {"policy", "jsq"}, {"tau", 0.25}}}},
      {"policy m --widen-single false", {"policy", {{"model", "m"}, {"widen_single", false}}}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto r = ctl(node, cases[i].first);
    ASSERT_EQ(r.exit_code, 0) << cases[i].first << "\n" << r.output;
    const auto reqs = node.requests();
    ASSERT_EQ(reqs.size(), i + 1);
    EXPECT_EQ(reqs[i].command, cases[i].second.first) << cases[i].first;
    EXPECT_EQ(reqs[i].args, cases[i].second.second) << cases[i].first;
    if (cases[i].second.first == "explain") {
      // The band [[worker, score], ...] is shown as a table with named columns.
      EXPECT_NE(line_starting(r.output, "WORKER").find("SCORE"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("0.75"), std::string::npos) << r.output;
    }
  }
  EXPECT_TRUE(node.errors().empty());
}

// ---------------------------------------------------------------- keygen (no node involved),
// then the pair in use: a real eldr-node whose [security] curve_secret_key_file is the key.

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.pop_back();
  return s;
}

// The one key of a secret key file as keygen wrote it (comment lines allowed), or "".
std::string secret_key_of(const std::string& path) {
  auto lines = parse_curve_key_lines(file_text(path), path);
  if (!lines.ok() || lines->size() != 1) return "";
  return (*lines)[0].key;
}

TEST_F(Eldrctl, KeygenWritesASecretKeyReadableOnlyByItsOwnerAndItsPublicKey) {
  if (!curve_available()) GTEST_SKIP() << "libzmq was built without CURVE";
  const std::string prefix = dir.sub("node-1");
  auto r = testing::run_command(eldrctl + " keygen " + prefix);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  namespace fs = std::filesystem;
  ASSERT_TRUE(fs::exists(prefix + ".key")) << r.output;
  ASSERT_TRUE(fs::exists(prefix + ".pub")) << r.output;
  EXPECT_EQ(fs::status(prefix + ".key").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  const std::string secret = secret_key_of(prefix + ".key");
  ASSERT_EQ(secret.size(), curve_key_z85_chars) << file_text(prefix + ".key");
  const std::string pub = trimmed(file_text(prefix + ".pub"));
  ASSERT_TRUE(decode_curve_key(pub).ok()) << pub;
  auto derived = curve_public_key(secret);
  ASSERT_TRUE(derived.ok()) << derived.error().to_string();
  EXPECT_EQ(*derived, pub) << "PREFIX.pub is not the public key of PREFIX.key";
  EXPECT_NE(r.output.find(pub), std::string::npos) << "the public key is printed: " << r.output;
  // A second pair is a different one.
  auto other = testing::run_command(eldrctl + " keygen " + dir.sub("node-2"));
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(secret_key_of(dir.sub("node-2.key")), secret);
}

TEST_F(Eldrctl, KeygenNeverOverwritesAnExistingKey) {
  if (!curve_available()) GTEST_SKIP() << "libzmq was built without CURVE";
  const std::string prefix = dir.sub("node-1");
  ASSERT_EQ(testing::run_command(eldrctl + " keygen " + prefix).exit_code, 0);
  const std::string key = file_text(prefix + ".key"), pub = file_text(prefix + ".pub");
  auto again = testing::run_command(eldrctl + " keygen " + prefix);
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_EQ(file_text(prefix + ".key"), key);
  EXPECT_EQ(file_text(prefix + ".pub"), pub);
  // Any existing secret key file, whatever it holds, is left alone.
  std::ofstream(dir.sub("mine.key")) << "not a key, but mine\n";
  auto over = testing::run_command(eldrctl + " keygen " + dir.sub("mine"));
  EXPECT_EQ(over.exit_code, 2) << over.output;
  EXPECT_EQ(file_text(dir.sub("mine.key")), "not a key, but mine\n");
}

TEST_F(Eldrctl, ANodeWithAKeygenKeyAnswersOnlyClientsThatKnowItsPublicKey) {
  if (!curve_available()) GTEST_SKIP() << "libzmq was built without CURVE";
  ASSERT_TRUE(std::filesystem::exists(testing::node_binary()))
      << testing::node_binary() << " is missing: build target eldr-node";
  const std::string prefix = dir.sub("node-1");
  ASSERT_EQ(testing::run_command(eldrctl + " keygen " + prefix).exit_code, 0);
  const std::string pub = trimmed(file_text(prefix + ".pub"));
  testing::node_process node(
      dir.sub("node.toml"),
      testing::node_toml(dir.sub("data"), "[[models]]\nname = \"m\"\n",
                         "[security]\ncurve_secret_key_file = \"" + prefix + ".key\"\n"));
  ASSERT_TRUE(node.ok()) << "the node did not start with the keygen key";
  // Plain TCP: the CURVE server never answers; eldrctl gives up after its timeout (exit 3).
  auto plain =
      testing::run_command(eldrctl + " --node " + node.admin() + " --timeout-ms 500 status");
  EXPECT_EQ(plain.exit_code, 3) << plain.output;
  // With the node's public key (from PREFIX.pub): answered. (Z85 has shell characters such as
  // '(' and '*', never a single quote.)
  auto curve =
      testing::run_command(eldrctl + " --node " + node.admin() +
                           " --timeout-ms 5000 --curve-server-key '" + pub + "' status --json");
  ASSERT_EQ(curve.exit_code, 0) << curve.output;
  auto j = json::parse(curve.output, nullptr, false);
  ASSERT_TRUE(j.is_object()) << curve.output;
  EXPECT_EQ(j["node"].value("name", ""), "test-node") << curve.output;
  // Another key is not the node's: no answer either.
  ASSERT_EQ(testing::run_command(eldrctl + " keygen " + dir.sub("stranger")).exit_code, 0);
  auto wrong = testing::run_command(eldrctl + " --node " + node.admin() +
                                    " --timeout-ms 500 --curve-server-key '" +
                                    trimmed(file_text(dir.sub("stranger.pub"))) + "' status");
  EXPECT_EQ(wrong.exit_code, 3) << wrong.output;
}

}  // namespace
}  // namespace eldr
