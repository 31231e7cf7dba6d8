// node_config: a full file parses to exactly the struct it describes, absent keys keep the
// header's defaults, the shipped example parses, and every kind of mistake (unknown key, wrong
// type, out of the type's range, out of the allowed range, duplicates, bad endpoints, TOML syntax)
// is refused with a message naming the file and the key.
#include "cluster/config/node_config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/formats/centroid_file.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

const std::string origin = "eldr.toml";

// The error message for `text`, or "" (and a test failure) when it parses.
std::string error_of(const std::string& text) {
  auto c = parse_node_config(text, origin);
  EXPECT_FALSE(c.ok()) << "parsed:\n" << text;
  if (c.ok()) return "";
  EXPECT_EQ(c.error().code(), status_code::invalid_argument);
  return c.error().message();
}

// A valid file with one model, with `extra` appended to the [[models]] table.
std::string one_model(const std::string& extra = "") {
  return "[[models]]\nname = \"m\"\n" + extra;
}

TEST(NodeConfig, FullFileParsesToTheExpectedStruct) {
  const std::string text = R"(
[node]
name = "edge-1"
roles = ["router", "load-monitor"]
data_dir = "/var/lib/eldr"

[endpoints]
route = "tcp://0.0.0.0:6700"
worker = "ipc:///run/eldr/worker"
admin = "inproc://admin"
metrics = "[::1]:0"

[limits]
max_message_bytes = 1024
max_blocks = 8
max_pending = 3
max_tracked_requests = 4294967295

[runtime]
threads = 64
log_level = "debug"
log_format = "json"
explain_history = 0

[signature_cache]
memory_bytes = 9007199254740993
max_blocks = 5
sync_wal = true
commit_interval_ms = 5

[cluster]
listen = "0.0.0.0:7700"
advertise = "10.0.0.5:7700"
seeds = ["10.0.0.4:7700", "[fe80::2]:7700"]
secret_file = "/etc/eldr/secret"
heartbeat_ms = 100
connection_timeout_ms = 101
reconnect_ms = 10
replication = 3
vnodes = 4096
load_sync_ms = 1
decision_ttl_ms = 5
max_decisions = 7
tls_certificate = "/etc/eldr/node.pem"
tls_key = "/etc/eldr/node.key"
tls_ca_file = "/etc/eldr/ca.pem"

[security]
curve_secret_key_file = "/etc/eldr/curve.key"
curve_authorized_keys_file = "/etc/eldr/clients.keys"

[[models]]
name = "qwen"
workers = 16
max_workers = 32
centroids = "/c/qwen.centroids"
policy = "p2c"
tau = 0.25
widen_single = false
seed = 9223372036854775807
worker_timeout_ms = 0
refit_interval_s = 60
sample_size = 100
sample_horizon = 5000
min_sample = 100
max_balance_ratio = 1
score_tolerance = 0.5
refit_batch_size = 1
kv_endpoints = ["tcp://10.0.0.1:5557", "ipc:///tmp/kv"]
counts_endpoints = ["tcp://[fe80::1]:5560"]

[[models]]
name = "second"
)";
  auto parsed = parse_node_config(text, origin);
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  const node_config& c = *parsed;
  EXPECT_EQ(c.name, "edge-1");
  EXPECT_EQ(c.roles, (std::vector<std::string>{"router", "load-monitor"}));
  EXPECT_EQ(c.data_dir, "/var/lib/eldr");
  EXPECT_EQ(c.route_endpoint, "tcp://0.0.0.0:6700");
  EXPECT_EQ(c.worker_endpoint, "ipc:///run/eldr/worker");
  EXPECT_EQ(c.admin_endpoint, "inproc://admin");
  EXPECT_EQ(c.metrics_address, "[::1]:0");
  EXPECT_EQ(c.max_message_bytes, 1024u);
  EXPECT_EQ(c.max_blocks, 8u);
  EXPECT_EQ(c.max_pending, 3u);
  EXPECT_EQ(c.max_tracked_requests, 4294967295u);
  EXPECT_EQ(c.threads, 64u);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.log_format, "json");
  EXPECT_TRUE(c.clustered());
  EXPECT_TRUE(c.has_role("router"));
  EXPECT_FALSE(c.has_role("refit"));
  EXPECT_EQ(c.cluster.listen, "0.0.0.0:7700");
  EXPECT_EQ(c.cluster.advertise, "10.0.0.5:7700");
  EXPECT_EQ(c.cluster.seeds, (std::vector<std::string>{"10.0.0.4:7700", "[fe80::2]:7700"}));
  EXPECT_EQ(c.cluster.secret_file, "/etc/eldr/secret");
  EXPECT_EQ(c.cluster.heartbeat_ms, 100u);
  EXPECT_EQ(c.cluster.connection_timeout_ms, 101u);
  EXPECT_EQ(c.cluster.reconnect_ms, 10u);
  EXPECT_EQ(c.cluster.replication, 3u);
  EXPECT_EQ(c.cluster.vnodes, 4096u);
  EXPECT_EQ(c.cluster.load_sync_ms, 1u);
  EXPECT_EQ(c.cluster.decision_ttl_ms, 5u);
  EXPECT_EQ(c.cluster.max_decisions, 7u);
  EXPECT_EQ(c.cluster.tls_certificate, "/etc/eldr/node.pem");
  EXPECT_EQ(c.cluster.tls_key, "/etc/eldr/node.key");
  EXPECT_EQ(c.cluster.tls_ca_file, "/etc/eldr/ca.pem");
  EXPECT_EQ(c.security.curve_secret_key_file, "/etc/eldr/curve.key");
  EXPECT_EQ(c.security.curve_authorized_keys_file, "/etc/eldr/clients.keys");
  EXPECT_EQ(c.explain_history, 0u);
  EXPECT_EQ(c.cache_memory_bytes, 9007199254740993ull);  // not representable as a double
  EXPECT_EQ(c.cache_max_blocks, 5u);
  EXPECT_TRUE(c.sync_wal);
  EXPECT_EQ(c.commit_interval_ms, 5u);

  ASSERT_EQ(c.models.size(), 2u);
  const model_config& m = c.models[0];
  EXPECT_EQ(m.name, "qwen");
  EXPECT_EQ(m.workers, 16u);
  EXPECT_EQ(m.max_workers, 32u);
  EXPECT_EQ(m.centroids, "/c/qwen.centroids");
  EXPECT_EQ(m.policy, "p2c");
  EXPECT_EQ(m.tau, 0.25f);
  EXPECT_FALSE(m.widen_single);
  EXPECT_EQ(m.seed, 9223372036854775807ull);
  EXPECT_EQ(m.worker_timeout_ms, 0);
  EXPECT_EQ(m.refit_interval_s, 60u);
  EXPECT_EQ(m.sample_size, 100u);
  EXPECT_EQ(m.sample_horizon, 5000u);
  EXPECT_EQ(m.min_sample, 100u);
  EXPECT_EQ(m.max_balance_ratio, 1.0);  // an integer where a float is expected is accepted
  EXPECT_EQ(m.score_tolerance, 0.5);
  EXPECT_EQ(m.refit_batch_size, 1u);
  EXPECT_EQ(m.kv_endpoints, (std::vector<std::string>{"tcp://10.0.0.1:5557", "ipc:///tmp/kv"}));
  EXPECT_EQ(m.counts_endpoints, (std::vector<std::string>{"tcp://[fe80::1]:5560"}));

  // The second model names only itself: everything else is model_config's default.
  model_config expected;
  expected.name = "second";
  const model_config& d = c.models[1];
  EXPECT_EQ(d.name, expected.name);
  EXPECT_EQ(d.workers, expected.workers);
  EXPECT_EQ(d.max_workers, expected.max_workers);
  EXPECT_EQ(d.centroids, expected.centroids);
  EXPECT_EQ(d.policy, expected.policy);
  EXPECT_EQ(d.tau, expected.tau);
  EXPECT_EQ(d.widen_single, expected.widen_single);
  EXPECT_EQ(d.seed, expected.seed);
  EXPECT_EQ(d.worker_timeout_ms, expected.worker_timeout_ms);
  EXPECT_EQ(d.sample_size, expected.sample_size);
  EXPECT_EQ(d.sample_horizon, 0u);  // automatic
  EXPECT_EQ(d.min_sample, expected.min_sample);
  EXPECT_TRUE(d.kv_endpoints.empty());
}

TEST(NodeConfig, AbsentTablesKeepTheHeaderDefaults) {
  auto parsed = parse_node_config(one_model(), origin);
  ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
  const node_config defaults;
  EXPECT_EQ(parsed->name, defaults.name);
  EXPECT_EQ(parsed->roles, defaults.roles);
  EXPECT_EQ(parsed->data_dir, defaults.data_dir);
  EXPECT_EQ(parsed->route_endpoint, defaults.route_endpoint);
  EXPECT_EQ(parsed->metrics_address, defaults.metrics_address);
  EXPECT_EQ(parsed->max_message_bytes, defaults.max_message_bytes);
  EXPECT_EQ(parsed->threads, defaults.threads);
  EXPECT_EQ(parsed->log_level, defaults.log_level);
  EXPECT_EQ(parsed->cache_memory_bytes, defaults.cache_memory_bytes);
  EXPECT_EQ(parsed->commit_interval_ms, defaults.commit_interval_ms);
  ASSERT_EQ(parsed->models.size(), 1u);
  EXPECT_EQ(parsed->models[0].name, "m");
}

TEST(NodeConfig, EmbeddedDefaultIsValid) {
  const node_config c = default_node_config();
  EXPECT_TRUE(validate_node_config(c).ok()) << validate_node_config(c).to_string();
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].name, "default");
  // The default for models with centroids is the adaptive band (issue 15); eldr stays selectable.
  EXPECT_EQ(c.models[0].policy, "eldr-adaptive");
  EXPECT_EQ(c.roles.size(), 4u);
}

TEST(NodeConfig, ShippedExampleParses) {
  const std::string path = std::string(ELDR_SOURCE_DIR) + "/deploy/eldr-node.example.toml";
  auto c = load_node_config(path);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].name, "qwen3-30b-a3b");
  EXPECT_EQ(c->models[0].kv_endpoints.size(), 2u);
  EXPECT_EQ(c->models[1].name, "deepseek-v2-lite");
  EXPECT_EQ(c->models[1].policy, "p2c");
  EXPECT_EQ(c->metrics_address, "127.0.0.1:9700");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// docs/configuration.md reproduces the example in its first ```toml block: the same text, so the
// documentation cannot show a file the parser refuses.
TEST(NodeConfig, DocumentedExampleIsTheShippedExample) {
  const std::string doc = read_text(std::string(ELDR_SOURCE_DIR) + "/docs/configuration.md");
  const std::string fence = "```toml\n";
  const size_t begin = doc.find(fence);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc.find("```", begin + fence.size());
  ASSERT_NE(end, std::string::npos);
  const std::string block = doc.substr(begin + fence.size(), end - begin - fence.size());
  EXPECT_TRUE(parse_node_config(block, "docs/configuration.md").ok());
  EXPECT_EQ(block, read_text(std::string(ELDR_SOURCE_DIR) + "/deploy/eldr-node.example.toml"));
}

TEST(NodeConfig, MissingFileNamesThePath) {
  auto c = load_node_config("/nonexistent/eldr.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("/nonexistent/eldr.toml"), std::string::npos)
      << c.error().to_string();
}

TEST(NodeConfig, UnknownKeysAndTablesAreNamed) {
  EXPECT_EQ(error_of(one_model("tua = 0.2\n")),
            "eldr.toml: models[0].tua: unknown key (did you mean models[0].tau?)");
  EXPECT_EQ(error_of("[nodes]\nname = \"x\"\n" + one_model()),
            "eldr.toml: nodes: unknown table (did you mean node?)");
  EXPECT_EQ(error_of("[runtime]\nthread = 4\n" + one_model()),
            "eldr.toml: runtime.thread: unknown key (did you mean runtime.threads?)");
  // Far from every known key: the valid ones are listed instead.
  EXPECT_EQ(error_of("[endpoints]\nzzzzzz = 1\n" + one_model()),
            "eldr.toml: endpoints.zzzzzz: unknown key; valid: route, worker, admin, metrics");
  EXPECT_EQ(error_of("verbose = true\n" + one_model()),
            "eldr.toml: verbose: unknown key; valid: node, endpoints, limits, runtime, "
            "signature_cache, cluster, security, timeouts, models");
  // Dotted keys and sub-tables are keys too.
  EXPECT_EQ(error_of("[limits.extra]\nx = 1\n" + one_model()),
            "eldr.toml: limits.extra: unknown table; valid: max_message_bytes, max_blocks, "
            "max_pending, max_tracked_requests, max_queued_reply_bytes");
}

TEST(NodeConfig, WrongTypesNameTheKeyAndTheExpectedType) {
  EXPECT_EQ(error_of("[runtime]\nthreads = \"2\"\n" + one_model()),
            "eldr.toml: runtime.threads: expected an integer, got a string");
  EXPECT_EQ(error_of("[runtime]\nthreads = 2.0\n" + one_model()),
            "eldr.toml: runtime.threads: expected an integer, got a float");
  EXPECT_EQ(error_of("[node]\nroles = \"router\"\n" + one_model()),
            "eldr.toml: node.roles: expected an array of strings, got a string");
  EXPECT_EQ(error_of("[node]\nroles = [\"router\", 1]\n" + one_model()),
            "eldr.toml: node.roles[1]: expected a string, got an integer");
  EXPECT_EQ(error_of("[signature_cache]\nsync_wal = 1\n" + one_model()),
            "eldr.toml: signature_cache.sync_wal: expected a boolean (true or false), got an "
            "integer");
  EXPECT_EQ(error_of(one_model("tau = \"0.1\"\n")),
            "eldr.toml: models[0].tau: expected a number, got a string");
  EXPECT_EQ(error_of(one_model("centroids = 1979-05-27\n")),
            "eldr.toml: models[0].centroids: expected a string, got a date");
  EXPECT_EQ(error_of("node = 5\n" + one_model()),
            "eldr.toml: node: expected a table, got an integer");
  EXPECT_EQ(error_of("[models]\nname = \"m\"\n"),
            "eldr.toml: models: expected an array of tables ([[models]]), got a table");
  EXPECT_EQ(error_of("models = [1]\n"), "eldr.toml: models[0]: expected a table, got an integer");
  EXPECT_EQ(error_of("[[models]]\nname = \"a\\u0000b\"\n"),
            "eldr.toml: models[0].name: must not contain a NUL character");
}

TEST(NodeConfig, IntegersOutsideTheFieldTypeAreRefusedNotWrapped) {
  EXPECT_EQ(error_of("[runtime]\nthreads = -1\n" + one_model()),
            "eldr.toml: runtime.threads: out of range for an unsigned 32-bit integer "
            "(0..4294967295), got -1");
  EXPECT_EQ(error_of("[limits]\nmax_blocks = 4294967296\n" + one_model()),
            "eldr.toml: limits.max_blocks: out of range for an unsigned 32-bit integer "
            "(0..4294967295), got 4294967296");
  EXPECT_EQ(error_of("[signature_cache]\nmemory_bytes = -1\n" + one_model()),
            "eldr.toml: signature_cache.memory_bytes: out of range for an unsigned 64-bit "
            "integer (0..18446744073709551615), got -1");
  EXPECT_EQ(error_of(one_model("seed = -5\n")),
            "eldr.toml: models[0].seed: out of range for an unsigned 64-bit integer "
            "(0..18446744073709551615), got -5");
  EXPECT_EQ(error_of(one_model("tau = 1e39\n")),
            "eldr.toml: models[0].tau: out of range for a 32-bit float, got 1e+39");
  // Beyond int64 is already a TOML error.
  EXPECT_NE(error_of("[limits]\nmax_blocks = 99999999999999999999\n" + one_model())
                .find("eldr.toml: line 2"),
            std::string::npos);
}

TEST(NodeConfig, ValuesOutOfTheirAllowedRangeAreNamed) {
  EXPECT_EQ(error_of("[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\ntau = -0.5\n"),
            "eldr.toml: models[1].tau: must be finite and >= 0, got -0.5");
  EXPECT_EQ(error_of(one_model("tau = nan\n")),
            "eldr.toml: models[0].tau: must be finite and >= 0, got nan");
  EXPECT_EQ(error_of(one_model("tau = inf\n")),
            "eldr.toml: models[0].tau: must be finite and >= 0, got inf");
  EXPECT_EQ(error_of("[runtime]\nthreads = 0\n" + one_model()),
            "eldr.toml: runtime.threads: must be in 1..64, got 0");
  EXPECT_EQ(error_of("[runtime]\nthreads = 65\n" + one_model()),
            "eldr.toml: runtime.threads: must be in 1..64, got 65");
  EXPECT_EQ(error_of("[runtime]\nlog_level = \"verbose\"\n" + one_model()),
            "eldr.toml: runtime.log_level: unknown level \"verbose\"; valid: trace, debug, info, "
            "warn, error, off");
  EXPECT_EQ(error_of("[runtime]\nlog_format = \"xml\"\n" + one_model()),
            "eldr.toml: runtime.log_format: unknown format \"xml\"; valid: text, json");
  EXPECT_EQ(error_of("[limits]\nmax_message_bytes = 1023\n" + one_model()),
            "eldr.toml: limits.max_message_bytes: must be >= 1024, got 1023");
  EXPECT_EQ(error_of("[limits]\nmax_blocks = 0\n" + one_model()),
            "eldr.toml: limits.max_blocks: must be >= 1, got 0");
  EXPECT_EQ(error_of("[signature_cache]\nmax_blocks = 0\n" + one_model()),
            "eldr.toml: signature_cache.max_blocks: must be >= 1, got 0");
  EXPECT_EQ(error_of(one_model("policy = \"domain\"\n")),
            "eldr.toml: models[0].policy: \"domain\" needs calibration domain labels, which a "
            "node does not have; use eldr");
  EXPECT_EQ(error_of(one_model("policy = \"jsqq\"\n")),
            "eldr.toml: models[0].policy: unknown policy \"jsqq\"; valid: rr, random, jsq, p2c, "
            "eldr, eldr-adaptive");
  for (const char* kept : {"eldr", "eldr-adaptive"}) {  // the paper's rule stays selectable
    auto c = parse_node_config(one_model(std::string("policy = \"") + kept + "\"\n"), origin);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ(c->models[0].policy, kept);
  }
  EXPECT_EQ(error_of(one_model("worker_timeout_ms = -1\n")),
            "eldr.toml: models[0].worker_timeout_ms: must be >= 0, got -1");
  EXPECT_EQ(error_of(one_model("sample_size = 0\nmin_sample = 0\n")),
            "eldr.toml: models[0].sample_size: must be >= 1, got 0");
  EXPECT_EQ(error_of(one_model("sample_size = 10\nmin_sample = 11\n")),
            "eldr.toml: models[0].min_sample: 11 exceeds sample_size (10)");
  EXPECT_EQ(error_of(one_model("sample_size = 10\nmin_sample = 1\nsample_horizon = 9\n")),
            "eldr.toml: models[0].sample_horizon: must be 0 (automatic: 8 x sample_size) or >= "
            "sample_size (10), got 9");
  EXPECT_EQ(error_of(one_model("sample_horizon = -1\n"))
                .rfind("eldr.toml: models[0].sample_horizon: out of range for ", 0),
            0u);
  EXPECT_EQ(error_of(one_model("max_balance_ratio = 0.5\n")),
            "eldr.toml: models[0].max_balance_ratio: must be finite and >= 1, got 0.5");
  EXPECT_EQ(error_of(one_model("score_tolerance = -1\n")),
            "eldr.toml: models[0].score_tolerance: must be finite and >= 0, got -1");
  EXPECT_EQ(error_of(one_model("refit_batch_size = 0\n")),
            "eldr.toml: models[0].refit_batch_size: must be >= 1, got 0");
  EXPECT_EQ(error_of(one_model("workers = 9\nmax_workers = 8\n")),
            "eldr.toml: models[0].workers: 9 exceeds max_workers (8)");
  EXPECT_EQ(error_of("[node]\nroles = [\"router\", \"rooter\"]\n" + one_model()),
            "eldr.toml: node.roles[1]: unknown role \"rooter\"; valid: router, signature-cache, "
            "load-monitor, refit");
  EXPECT_EQ(error_of("[node]\nroles = [\"refit\", \"refit\"]\n" + one_model()),
            "eldr.toml: node.roles[1]: duplicate role \"refit\"");
  EXPECT_EQ(error_of("[node]\nroles = []\n" + one_model()).substr(0, 49),
            "eldr.toml: node.roles: at least one role is requi");
  EXPECT_EQ(error_of("[node]\nname = \"\"\n" + one_model()),
            "eldr.toml: node.name: must be non-empty");
}

TEST(NodeConfig, ModelNamesAreNonEmptyBoundedAndUnique) {
  EXPECT_EQ(error_of("[[models]]\nname = \"a\"\n[[models]]\nname = \"b\"\n[[models]]\nname = "
                     "\"a\"\n"),
            "eldr.toml: models[2].name: duplicate model name \"a\" (also models[0])");
  EXPECT_EQ(error_of("[[models]]\nworkers = 4\n"), "eldr.toml: models[0].name: must be non-empty");
  EXPECT_EQ(error_of("[[models]]\nname = \"" + std::string(257, 'x') + "\"\n"),
            "eldr.toml: models[0].name: longer than 256 bytes");
  EXPECT_TRUE(
      parse_node_config("[[models]]\nname = \"" + std::string(256, 'x') + "\"\n", origin).ok());
  EXPECT_EQ(error_of("[[models]]\nname = \"a\\tb\"\n"),
            "eldr.toml: models[0].name: must not contain control characters");
}

TEST(NodeConfig, AtLeastOneModelIsRequired) {
  const std::string expected = "eldr.toml: models: at least one [[models]] table is required";
  EXPECT_EQ(error_of(""), expected);
  EXPECT_EQ(error_of("[node]\nname = \"x\"\n"), expected);
  EXPECT_EQ(error_of("models = []\n"), expected);
}

TEST(NodeConfig, EndpointsAreChecked) {
  EXPECT_EQ(error_of("[endpoints]\nroute = \"http://127.0.0.1:5700\"\n" + one_model()),
            "eldr.toml: endpoints.route: \"http://127.0.0.1:5700\" must start with tcp://, "
            "ipc:// or inproc://");
  EXPECT_EQ(error_of("[endpoints]\nworker = \"tcp://127.0.0.1\"\n" + one_model()),
            "eldr.toml: endpoints.worker: \"tcp://127.0.0.1\" must be tcp://host:port");
  EXPECT_EQ(error_of("[endpoints]\nadmin = \"tcp://127.0.0.1:70000\"\n" + one_model()),
            "eldr.toml: endpoints.admin: \"tcp://127.0.0.1:70000\" port must be a number in "
            "0..65535 or *");
  EXPECT_EQ(error_of("[endpoints]\nadmin = \"ipc://\"\n" + one_model()),
            "eldr.toml: endpoints.admin: \"ipc://\" has no path or name after the scheme");
  EXPECT_EQ(error_of("[endpoints]\nadmin = \"tcp://127.0.0.1:5700\"\n" + one_model()),
            "eldr.toml: endpoints.admin: \"tcp://127.0.0.1:5700\" is also endpoints.route");
  // Free ports may repeat: each bind gets its own.
  EXPECT_TRUE(parse_node_config("[endpoints]\nroute = \"tcp://127.0.0.1:0\"\nworker = "
                                "\"tcp://127.0.0.1:0\"\nadmin = \"tcp://127.0.0.1:*\"\n" +
                                    one_model(),
                                origin)
                  .ok());
  // Connect endpoints need a real port.
  EXPECT_EQ(error_of(one_model("kv_endpoints = [\"tcp://10.0.0.1:5557\", \"tcp://10.0.0.2:*\"]\n")),
            "eldr.toml: models[0].kv_endpoints[1]: \"tcp://10.0.0.2:*\" port must be a number in "
            "1..65535");
  EXPECT_EQ(error_of(one_model("counts_endpoints = [\"10.0.0.1:5560\"]\n")),
            "eldr.toml: models[0].counts_endpoints[0]: \"10.0.0.1:5560\" must start with tcp://, "
            "ipc:// or inproc://");

  EXPECT_TRUE(parse_node_config("[endpoints]\nmetrics = \"\"\n" + one_model(), origin).ok());
  EXPECT_TRUE(
      parse_node_config("[endpoints]\nmetrics = \"localhost:0\"\n" + one_model(), origin).ok());
  const std::string no_port = error_of("[endpoints]\nmetrics = \"localhost\"\n" + one_model());
  EXPECT_EQ(no_port.rfind("eldr.toml: endpoints.metrics: \"localhost\": no port", 0), 0u)
      << no_port;
  const std::string big_port =
      error_of("[endpoints]\nmetrics = \"127.0.0.1:65536\"\n" + one_model());
  EXPECT_NE(big_port.find("port must be a number in 0..65535"), std::string::npos) << big_port;
  const std::string scheme =
      error_of("[endpoints]\nmetrics = \"tcp://127.0.0.1:9700\"\n" + one_model());
  EXPECT_EQ(scheme.rfind("eldr.toml: endpoints.metrics: ", 0), 0u) << scheme;
}

TEST(NodeConfig, SyntaxErrorsCarryLineAndColumn) {
  const std::string e = error_of("[node]\nname = \"x\"\nroles = [\"router\"\n" + one_model());
  EXPECT_EQ(e.rfind("eldr.toml: line ", 0), 0u) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;

  // Malformed table headers that made toml++ 3.3.0 abort (debug) or assume the impossible
  // (clang release) are ordinary syntax errors here.
  for (const char* header : {"[=a]", "[[=a]]", "[[[1]]]", "[[[]]", "[ =a]"}) {
    const std::string e2 = error_of(one_model() + header + "\n");
    EXPECT_EQ(e2.rfind("eldr.toml: line 3, column ", 0), 0u) << header << ": " << e2;
  }

  const std::string e3 = error_of("[node]\nname = \"x\"\nname = \"y\"\n" + one_model());
  EXPECT_EQ(e3.rfind("eldr.toml: line 3, column 8: TOML syntax error: ", 0), 0u) << e3;
}

TEST(NodeConfig, ValidateCatchesConfigsBuiltInCode) {
  node_config c = default_node_config();
  c.models.push_back(c.models[0]);
  EXPECT_EQ(validate_node_config(c).message(),
            "models[1].name: duplicate model name \"default\" (also models[0])");
  c = default_node_config();
  c.models[0].tau = -1.0f;
  EXPECT_EQ(validate_node_config(c).message(), "models[0].tau: must be finite and >= 0, got -1");
  c = default_node_config();
  c.models.clear();
  EXPECT_FALSE(validate_node_config(c).ok());
}

// The actors' waits (issue 17: they were literals): defaults as they were, every key read, and a
// value out of range, an unknown key or a wrong type is refused by the key's name.
TEST(NodeConfig, TimeoutsAreReadAndValidatedByName) {
  const timeouts_config defaults;
  EXPECT_EQ(defaults.shard_sign_ms, 100u);
  EXPECT_EQ(defaults.leader_wait_ms, 5000u);
  EXPECT_EQ(defaults.vote_ms, 1000u);
  EXPECT_EQ(defaults.recall_ms, 50u);

  auto c = parse_node_config(
      "[timeouts]\nshard_sign_ms = 250\nsubscribe_ms = 2\nadmin_query_ms = 3\ndial_ms = 4\n"
      "challenge_ttl_ms = 5\nleader_wait_ms = 6\nleader_retry_ms = 7\nset_change_ms = 8\n"
      "peer_sample_ms = 9\nvote_ms = 10\nleadership_tick_ms = 600000\nrecall_ms = 11\n" +
          one_model(),
      origin);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const timeouts_config& t = c->timeouts;
  EXPECT_EQ(t.shard_sign_ms, 250u);
  EXPECT_EQ(t.subscribe_ms, 2u);
  EXPECT_EQ(t.admin_query_ms, 3u);
  EXPECT_EQ(t.dial_ms, 4u);
  EXPECT_EQ(t.challenge_ttl_ms, 5u);
  EXPECT_EQ(t.leader_wait_ms, 6u);
  EXPECT_EQ(t.leader_retry_ms, 7u);
  EXPECT_EQ(t.set_change_ms, 8u);
  EXPECT_EQ(t.peer_sample_ms, 9u);
  EXPECT_EQ(t.vote_ms, 10u);
  EXPECT_EQ(t.leadership_tick_ms, 600000u);
  EXPECT_EQ(t.recall_ms, 11u);

  EXPECT_EQ(error_of("[timeouts]\nshard_sign_ms = 0\n" + one_model()),
            "eldr.toml: timeouts.shard_sign_ms: must be in 1..600000, got 0");
  EXPECT_EQ(error_of("[timeouts]\nvote_ms = 600001\n" + one_model()),
            "eldr.toml: timeouts.vote_ms: must be in 1..600000, got 600001");
  EXPECT_EQ(error_of("[timeouts]\nleader_wait_ms = -1\n" + one_model()),
            "eldr.toml: timeouts.leader_wait_ms: out of range for an unsigned 32-bit integer "
            "(0..4294967295), got -1");
  EXPECT_EQ(error_of("[timeouts]\ndial_ms = \"5s\"\n" + one_model()),
            "eldr.toml: timeouts.dial_ms: expected an integer, got a string");
  EXPECT_EQ(error_of("[timeouts]\nvote_msx = 5\n" + one_model()),
            "eldr.toml: timeouts.vote_msx: unknown key (did you mean timeouts.vote_ms?)");

  node_config built = default_node_config();
  built.timeouts.set_change_ms = 0;
  EXPECT_EQ(validate_node_config(built).message(),
            "timeouts.set_change_ms: must be in 1..600000, got 0");
}

TEST(NodeConfig, ClusterKeysAreValidatedByName) {
  const std::string base = "[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\n";
  EXPECT_TRUE(parse_node_config(base + one_model(), origin).ok());
  EXPECT_EQ(error_of("[node]\nroles = [\"router\"]\n" + one_model()),
            "eldr.toml: node.roles: a standalone node (cluster.listen = \"\") needs all of "
            "router, signature-cache, load-monitor, refit; set cluster.listen to run a subset in "
            "a cluster");
  EXPECT_EQ(error_of("[cluster]\nseeds = [\"a:1\"]\n" + one_model()),
            "eldr.toml: cluster.seeds: needs cluster.listen (this node must be reachable by the "
            "nodes it joins)");
  EXPECT_EQ(error_of("[cluster]\nlisten = \"127.0.0.1:0\"\n" + one_model()),
            "eldr.toml: cluster.secret_file: required when cluster.listen is set (nodes prove "
            "they know it before they may join)");
  EXPECT_EQ(error_of(base + "seeds = [\"10.0.0.1:0\"]\n" + one_model()),
            "eldr.toml: cluster.seeds[0]: \"10.0.0.1:0\" needs a port in 1..65535");
  EXPECT_EQ(error_of("[cluster]\nlisten = \"0.0.0.0:7700\"\nsecret_file = \"s\"\n" + one_model()),
            "eldr.toml: cluster.advertise: required when cluster.listen binds a wildcard address "
            "(\"0.0.0.0:7700\"): peers need a host to dial");
  EXPECT_EQ(error_of(base + "heartbeat_ms = 500\nconnection_timeout_ms = 500\n" + one_model()),
            "eldr.toml: cluster.connection_timeout_ms: must exceed cluster.heartbeat_ms (500), "
            "got 500");
  EXPECT_EQ(error_of(base + "replication = 0\n" + one_model()),
            "eldr.toml: cluster.replication: must be >= 1, got 0");
  EXPECT_EQ(error_of(base + "vnodes = 5000\n" + one_model()),
            "eldr.toml: cluster.vnodes: must be in 1..4096, got 5000");
  EXPECT_EQ(error_of(base + "tls_key = \"k\"\n" + one_model()),
            "eldr.toml: cluster.tls_certificate: cluster.tls_certificate and cluster.tls_key go "
            "together");
  EXPECT_EQ(error_of(base + "tls_ca_file = \"ca\"\n" + one_model()),
            "eldr.toml: cluster.tls_ca_file: needs cluster.tls_certificate and cluster.tls_key "
            "(peers verify this node's certificate too)");
  EXPECT_EQ(error_of(base + "secert_file = \"x\"\n" + one_model()),
            "eldr.toml: cluster.secert_file: unknown key (did you mean cluster.secret_file?)");
  EXPECT_EQ(error_of("[security]\ncurve_authorized_keys_file = \"k\"\n" + one_model()),
            "eldr.toml: security.curve_authorized_keys_file: needs "
            "security.curve_secret_key_file (CURVE is off without it)");
}

// Issue 12 defect 13: commit_interval_ms = 0 was accepted and an idle node burnt 43% of a core.
TEST(NodeConfig, IntervalKeysHaveAMinimumNamedInTheError) {
  EXPECT_EQ(error_of("[signature_cache]\ncommit_interval_ms = 0\n" + one_model()),
            "eldr.toml: signature_cache.commit_interval_ms: must be >= 5, got 0");
  EXPECT_EQ(error_of("[signature_cache]\ncommit_interval_ms = 4\n" + one_model()),
            "eldr.toml: signature_cache.commit_interval_ms: must be >= 5, got 4");
  EXPECT_TRUE(
      parse_node_config("[signature_cache]\ncommit_interval_ms = 5\n" + one_model(), origin).ok());
  EXPECT_EQ(error_of(one_model("worker_timeout_ms = 99\n")),
            "eldr.toml: models[0].worker_timeout_ms: must be 0 (never) or >= 100, got 99");
  EXPECT_TRUE(parse_node_config(one_model("worker_timeout_ms = 0\n"), origin).ok());
  EXPECT_TRUE(parse_node_config(one_model("worker_timeout_ms = 100\n"), origin).ok());
  EXPECT_EQ(error_of("[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\n"
                     "load_sync_ms = 0\n" +
                     one_model()),
            "eldr.toml: cluster.load_sync_ms: must be >= 1, got 0");
  EXPECT_EQ(
      error_of("[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\n"
               "load_sharing = \"gossip\"\n" +
               one_model()),
      "eldr.toml: cluster.load_sharing: unknown mode \"gossip\"; valid: decisions, authority");
  auto authority = parse_node_config(
      "[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\nload_sharing = \"authority\"\n" +
          one_model(),
      origin);
  ASSERT_TRUE(authority.ok()) << authority.error().to_string();
  EXPECT_EQ(authority->cluster.load_sharing, "authority");
}

// Load authorities are the default (their cost per router does not grow with the cluster's total
// rate; BENCHMARKS.md "Fan-in"), and a worker's authority is the router of the node it talks to:
// a clustered load monitor without the router role is refused at start-up, saying both ways out.
TEST(NodeConfig, LoadAuthoritiesAreTheDefaultAndNeedARouterBesideEveryLoadMonitor) {
  const std::string cluster = "[cluster]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\n";
  auto plain = parse_node_config(cluster + one_model(), origin);
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  EXPECT_EQ(plain->cluster.load_sharing, "authority");
  const std::string monitor_only = "[node]\nroles = [\"load-monitor\", \"signature-cache\"]\n";
  EXPECT_EQ(error_of(monitor_only + cluster + one_model()),
            "eldr.toml: cluster.load_sharing: \"authority\" (the default) needs the router role on "
            "every load-monitor node (node.roles): the node a decode worker talks to is that "
            "worker's load authority; add \"router\" to node.roles or set cluster.load_sharing = "
            "\"decisions\"");
  auto decisions = parse_node_config(
      monitor_only + cluster + "load_sharing = \"decisions\"\n" + one_model(), origin);
  ASSERT_TRUE(decisions.ok()) << decisions.error().to_string();
  EXPECT_EQ(decisions->cluster.load_sharing, "decisions");
}

TEST(NodeConfig, ScrapeIntervalIsBoundedByTheWorkerTimeout) {
  auto c = parse_node_config(one_model(), origin);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->models[0].scrape_interval_ms, 0u);   // automatic
  EXPECT_EQ(c->models[0].scrape_interval(), 200u);  // worker_timeout_ms 3000
  auto fast = parse_node_config(one_model("worker_timeout_ms = 100\n"), origin);
  ASSERT_TRUE(fast.ok());
  EXPECT_EQ(fast->models[0].scrape_interval(), 50u);
  auto never =
      parse_node_config(one_model("worker_timeout_ms = 0\nscrape_interval_ms = 5000\n"), origin);
  ASSERT_TRUE(never.ok()) << never.error().to_string();
  EXPECT_EQ(never->models[0].scrape_interval(), 5000u);
  auto set =
      parse_node_config(one_model("worker_timeout_ms = 1000\nscrape_interval_ms = 500\n"), origin);
  ASSERT_TRUE(set.ok()) << set.error().to_string();
  EXPECT_EQ(set->models[0].scrape_interval(), 500u);
  EXPECT_EQ(error_of(one_model("scrape_interval_ms = 9\n")),
            "eldr.toml: models[0].scrape_interval_ms: must be 0 (automatic) or >= 10, got 9");
  EXPECT_EQ(error_of(one_model("worker_timeout_ms = 1000\nscrape_interval_ms = 501\n")),
            "eldr.toml: models[0].scrape_interval_ms: must be <= worker_timeout_ms / 2 (500), "
            "got 501");
  EXPECT_EQ(error_of(one_model("scrape_interval_ms = -1\n")).find("models[0].scrape_interval_ms"),
            std::string("eldr.toml: ").size());
}

TEST(NodeConfig, KvEventsBindIsABindEndpoint) {
  auto c = parse_node_config(one_model("kv_events.bind = \"tcp://*:5557\"\n"), origin);
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->models[0].kv_bind, "tcp://*:5557");
  auto table =
      parse_node_config(one_model("[models.kv_events]\nbind = \"tcp://127.0.0.1:0\"\n"), origin);
  ASSERT_TRUE(table.ok()) << table.error().to_string();
  EXPECT_EQ(table->models[0].kv_bind, "tcp://127.0.0.1:0");
  EXPECT_EQ(parse_node_config(one_model(), origin)->models[0].kv_bind, "");
  EXPECT_NE(
      error_of(one_model("kv_events.bind = \"udp://*:1\"\n")).find("models[0].kv_events.bind"),
      std::string::npos);
  EXPECT_NE(
      error_of(one_model("kv_events.bnd = \"tcp://*:1\"\n"))
          .find("models[0].kv_events.bnd: unknown key (did you mean models[0].kv_events.bind?)"),
      std::string::npos);
  EXPECT_NE(error_of(one_model("kv_events = 1\n")).find("models[0].kv_events"), std::string::npos);
}

// check_node_files: what --check-config and start-up find wrong in the files a config names.
class NodeFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    c_ = default_node_config();
    c_.data_dir = dir_.sub("data");
  }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_.sub(name)) << text;
  }
  void write_centroids(const std::string& name, uint32_t k) {
    centroid_file f;
    f.model_name = "m";
    f.spec = *signature_spec::make(model_geometry{2, 8, 2}, signature_transform::count, {}, {});
    f.workers = k;
    f.centroids.assign(k * f.spec.width(), 0.25f);
    f.epoch = 1;
    ASSERT_TRUE(write_centroid_file(f, dir_.sub(name)).ok());
  }
  std::string error() {
    auto s = check_node_files(c_);
    EXPECT_FALSE(s.ok());
    return s.message();
  }
  void clustered() {
    c_.cluster.listen = "127.0.0.1:0";
    c_.cluster.secret_file = dir_.sub("secret");
  }

  testing::temp_dir dir_{"eldr-node-files"};
  node_config c_;
};

TEST_F(NodeFilesTest, ValidFilesPass) {
  EXPECT_TRUE(check_node_files(c_).ok());  // data_dir does not exist yet: start-up creates it
  std::filesystem::create_directory(c_.data_dir);
  EXPECT_TRUE(check_node_files(c_).ok());
  clustered();
  write("secret", "0123456789abcdef\n");
  write_centroids("m.centroids", 4);
  c_.models[0].centroids = dir_.sub("m.centroids");
  c_.models[0].workers = 4;
  EXPECT_TRUE(check_node_files(c_).ok()) << check_node_files(c_).message();
  c_.models[0].workers = 0;  // K from the file
  EXPECT_TRUE(check_node_files(c_).ok());
}

TEST_F(NodeFilesTest, DataDirThatIsAFileOrCannotBeCreatedIsRefused) {
  write("data", "x");
  EXPECT_EQ(error(), "node.data_dir: \"" + c_.data_dir + "\" exists and is not a directory");
  c_.data_dir = dir_.sub("data/below");
  EXPECT_EQ(error(), "node.data_dir: \"" + c_.data_dir + "\" cannot be created: \"" +
                         dir_.sub("data") + "\" is not a directory");
}

TEST_F(NodeFilesTest, MissingShortOrDirectorySecretIsRefused) {
  clustered();
  EXPECT_EQ(error(), "cluster.secret_file: \"" + dir_.sub("secret") + "\": no such file");
  write("secret", "short\n");
  EXPECT_EQ(error(), "cluster.secret_file: \"" + dir_.sub("secret") +
                         "\" holds 5 bytes; the secret must be at least 16 bytes");
  std::filesystem::remove(dir_.sub("secret"));
  std::filesystem::create_directory(dir_.sub("secret"));
  EXPECT_EQ(error(),
            "cluster.secret_file: \"" + dir_.sub("secret") + "\" is a directory, not a file");
}

TEST_F(NodeFilesTest, CurveKeyPathThatIsADirectoryIsSaidToBeOne) {
  std::filesystem::create_directory(dir_.sub("keys"));
  c_.security.curve_secret_key_file = dir_.sub("keys");
  EXPECT_EQ(error(), "security.curve_secret_key_file: \"" + dir_.sub("keys") +
                         "\" is a directory, not a file");
  c_.security.curve_secret_key_file = dir_.sub("none");
  EXPECT_EQ(error(), "security.curve_secret_key_file: \"" + dir_.sub("none") + "\": no such file");
}

TEST_F(NodeFilesTest, MissingOrUnparsableCentroidFileIsRefused) {
  c_.models[0].centroids = dir_.sub("m.centroids");
  EXPECT_EQ(error(), "models[0].centroids: \"" + dir_.sub("m.centroids") + "\": no such file");
  write("m.centroids", "not a centroid file");
  EXPECT_EQ(error().rfind("models[0].centroids: ", 0), 0u);
}

// The silent fallback: workers = 4 with a file of K = 8 started and routed by load only.
TEST_F(NodeFilesTest, CentroidFileOfAnotherKThanWorkersIsRefusedNamingBothKeys) {
  write_centroids("m.centroids", 8);
  c_.models[0].centroids = dir_.sub("m.centroids");
  c_.models[0].workers = 4;
  const std::string e = error();
  EXPECT_NE(e.find("models[0].workers = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("models[0].centroids"), std::string::npos) << e;
  EXPECT_NE(e.find("K = 8"), std::string::npos) << e;
  c_.models[0].workers = 0;
  c_.models[0].max_workers = 6;
  EXPECT_NE(error().find("more than models[0].max_workers = 6"), std::string::npos);
}

}  // namespace
}  // namespace eldr
