// The Python client (cluster/python/eldr_client.py) against the C++ codecs, byte for byte: what the
// real Python clients put on the wire is decoded by decode_route_request, decode_worker_message,
// decode_admin_request and decode_counts_message; what encode_route_reply, encode_error_reply,
// encode_worker_ack and encode_admin_reply write is served to the real Python clients, which must
// read it back. The Python side is tests/integration/py/test_eldr_client.py (its encode/decode
// modes hold the values checked here); its own self-contained suite runs here too, so that it is
// covered by the integration label.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "cluster/wire/admin_protocol.hpp"
#include "cluster/wire/counts_message.hpp"
#include "cluster/wire/route_protocol.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/file_io.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr {
namespace {

using json = nlohmann::json;

const std::string python = "/usr/bin/python3";
const std::string script =
    std::string(ELDR_SOURCE_DIR) + "/tests/integration/py/test_eldr_client.py";
constexpr uint64_t big = 18446744073709539271ULL;  // above INT64_MAX

std::vector<uint8_t> load(const testing::temp_dir& dir, const std::string& name) {
  auto bytes = read_file(dir.sub(name + ".msgpack"));
  EXPECT_TRUE(bytes.ok()) << name << ": " << bytes.error().to_string();
  return bytes.ok() ? *bytes : std::vector<uint8_t>{};
}

void save(const testing::temp_dir& dir, const std::string& name, const std::vector<uint8_t>& b) {
  ASSERT_TRUE(write_file_atomic(dir.sub(name + ".msgpack"), b).ok()) << name;
}

template <class T>
const T& as(const worker_message& m) {
  static const T none{};
  const T* p = std::get_if<T>(&m);
  EXPECT_NE(p, nullptr) << "worker message of another type (index " << m.index() << ")";
  return p ? *p : none;
}

struct PythonClientCodec : ::testing::Test {
  testing::temp_dir dir{"eldr-pyclient"};
  void SetUp() override { ASSERT_FALSE(dir.path().empty()); }
};

TEST_F(PythonClientCodec, PythonSuitePasses) {
  const auto r = testing::run_command(python + " " + script);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tests passed"), std::string::npos) << r.output;
}

TEST_F(PythonClientCodec, CppDecodesWhatPythonSends) {
  const auto r = testing::run_command(python + " " + script + " encode " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;

  {
    std::vector<kv_decode_issue> issues;
    auto m = decode_route_request(load(dir, "route_request"), route_protocol_limits{}, issues);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_TRUE(issues.empty());
    EXPECT_EQ(m->id, "req-1");
    EXPECT_EQ(m->model, "qwen3-30b-a3b");
    // Given as 1, a negative int64 and a 32-byte bytes hash: all normalised to uint64.
    EXPECT_EQ(m->block_hashes, (std::vector<uint64_t>{1, big, 7}));
    EXPECT_EQ(m->label, std::optional<uint32_t>(2));
    EXPECT_TRUE(m->explain);
    ASSERT_TRUE(m->counts.has_value());
    EXPECT_EQ(m->counts->geometry, (model_geometry{2, 8, 2}));
    EXPECT_EQ(m->counts->seq, std::optional<uint64_t>(7));
    ASSERT_EQ(m->counts->blocks.size(), 1u);
    const counts_block& b = m->counts->blocks[0];
    EXPECT_EQ(b.hash, 7u);
    EXPECT_EQ(b.parent, std::optional<uint64_t>(1));
    EXPECT_EQ(b.counts.tokens(), 2u);
    EXPECT_EQ(std::vector<uint8_t>(b.counts.ids().begin(), b.counts.ids().end()),
              (std::vector<uint8_t>{1, 5, 6, 7}));
    EXPECT_EQ(std::vector<uint8_t>(b.counts.counts().begin(), b.counts.counts().end()),
              (std::vector<uint8_t>{2, 2, 2, 2}));
  }
  {
    std::vector<kv_decode_issue> issues;
    auto m = decode_route_request(load(dir, "route_request_min"), route_protocol_limits{}, issues);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_EQ(m->id, "req-2");
    EXPECT_EQ(m->model, "m");
    EXPECT_TRUE(m->block_hashes.empty());
    EXPECT_FALSE(m->counts.has_value());
    EXPECT_FALSE(m->label.has_value());
    EXPECT_FALSE(m->explain);
  }
  {
    // The counts message on its own is byte-identical to the C++ encoder's.
    const std::vector<uint8_t> bytes = load(dir, "counts");
    std::vector<kv_decode_issue> issues;
    auto m = decode_counts_message(bytes, counts_decode_limits{}, issues);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_TRUE(issues.empty());
    EXPECT_EQ(encode_counts_message(*m), bytes);
  }
  {
    // A 512-expert model's counts: version 2, two-byte ids, byte-identical both ways.
    const std::vector<uint8_t> bytes = load(dir, "counts_wide");
    std::vector<kv_decode_issue> issues;
    auto m = decode_counts_message(bytes, counts_decode_limits{}, issues);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_TRUE(issues.empty());
    EXPECT_EQ(m->version, counts_message_v2);
    EXPECT_EQ(m->geometry, (model_geometry{2, 512, 2}));
    ASSERT_EQ(m->blocks.size(), 1u);
    EXPECT_EQ(m->blocks[0].counts.ids(), (std::vector<expert_id>{3, 300, 7, 511}));
    EXPECT_EQ(encode_counts_message(*m), bytes);
  }

  const worker_protocol_limits wl;
  auto worker = [&](const std::string& name) {
    auto m = decode_worker_message(load(dir, name), wl);
    EXPECT_TRUE(m.ok()) << name << ": " << m.error().to_string();
    return m.ok() ? *m : worker_message{};
  };
  {
    const auto m = as<worker_register>(worker("worker_register"));
    EXPECT_EQ(m.id.rfind("py-", 0), 0u) << m.id;  // the client's correlation id
    EXPECT_EQ(m.model, "m");
    EXPECT_EQ(m.worker, 3u);
    EXPECT_EQ(m.endpoint, "tcp://10.0.0.3:5600");
    EXPECT_EQ(m.capacity, 64u);
  }
  {
    const auto m = as<load_report>(worker("load_report"));
    EXPECT_FALSE(m.id.empty());
    EXPECT_EQ(m.model, "m");
    EXPECT_EQ(m.worker, 3u);
    EXPECT_EQ(m.in_flight, 5u);
    EXPECT_EQ(m.running, 4u);
    EXPECT_EQ(m.waiting, 1u);
    EXPECT_EQ(m.kv_usage, 0.25f);  // exact in both widths
    EXPECT_EQ(m.seq, 42u);
  }
  {
    const auto m = as<finished_requests>(worker("finished"));
    EXPECT_EQ(m.worker, 3u);
    EXPECT_EQ(m.requests, (std::vector<std::string>{"a", "b", "c"}));
  }
  {
    const auto m = as<worker_drain>(worker("worker_drain"));
    EXPECT_EQ(m.worker, 3u);
    EXPECT_FALSE(m.drain);  // the Python side sent drain=False: the default must not win
  }
  {
    const auto m = as<publisher_register>(worker("publisher_register"));
    EXPECT_EQ(m.model, "m");
    EXPECT_EQ(m.endpoint, "tcp://10.0.0.3:5557");
    EXPECT_EQ(m.replay_endpoint, "tcp://10.0.0.3:5558");
  }

  const admin_protocol_limits al;
  {
    auto m = decode_admin_request(load(dir, "admin_status"), al);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_FALSE(m->id.empty());
    EXPECT_EQ(m->command, "status");
    EXPECT_EQ(m->args, json::object());
  }
  {
    auto m = decode_admin_request(load(dir, "admin_import"), al);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    EXPECT_EQ(m->command, "centroids.import");
    EXPECT_EQ(m->args.value("model", ""), "m");
    ASSERT_TRUE(m->args.contains("file") && m->args["file"].is_binary());
    std::vector<uint8_t> all(256);
    for (size_t i = 0; i < all.size(); ++i)
      all[i] = static_cast<uint8_t>(i);
    EXPECT_EQ(static_cast<const std::vector<uint8_t>&>(m->args["file"].get_binary()), all);
  }
}

TEST_F(PythonClientCodec, PythonReadsWhatCppSends) {
  route_reply rr;
  rr.id = "req-1";
  rr.worker = 3;
  rr.endpoint = "tcp://10.0.0.3:5600";
  rr.epoch = big;  // a full uint64
  rr.covered_blocks = 2;
  rr.total_blocks = 3;
  rr.explain = route_explain{"eldr", 0.1f, {{3, 0.8f}, {1, 0.75f}}};
  save(dir, "route_reply", encode_route_reply(rr));
  rr.explain.reset();
  save(dir, "route_reply_plain", encode_route_reply(rr));
  route_reply warned = rr;
  warned.fallback = "counts_geometry";
  warned.warnings = {
      "counts_geometry: counts are L=2 E=16 k=2, the model is L=2 E=8 k=2; "
      "routed by load"};
  save(dir, "route_reply_warned", encode_route_reply(warned));
  save(dir, "error_reply",
       encode_error_reply({std::string("req-1"), wire_error_code::overloaded, "busy"}));
  save(dir, "error_reply_noid",
       encode_error_reply(
           {std::nullopt, wire_error_code::malformed, "route_request: expected map"}));
  save(dir, "error_reply_future",
       encode_error_reply({std::string("req-1"), static_cast<wire_error_code>(42), "new"}));
  save(dir, "worker_ack", encode_worker_ack({"w-1", "draining", 12}));
  admin_reply ok;
  ok.id = "a-1";
  ok.ok = true;
  ok.result = {{"node", {{"name", "n0"}, {"roles", {"router", "cache"}}}},
               {"tau", 0.5},
               {"neg", -3},
               {"blob", json::binary({1, 2, 3})}};
  save(dir, "admin_reply_ok", encode_admin_reply(ok));
  std::vector<uint8_t> all(256);
  for (size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<uint8_t>(i);
  ok.result = json::binary(all);
  save(dir, "admin_reply_bin", encode_admin_reply(ok));
  admin_reply err;
  err.id = "a-1";
  err.ok = false;
  err.code = wire_error_code::unknown_model;
  err.error = "no pool for model x";
  save(dir, "admin_reply_err", encode_admin_reply(err));

  const auto r = testing::run_command(python + " " + script + " decode " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The script prints one JSON line; take the last line in case Python warned on stderr first.
  std::string line, last;
  std::istringstream in(r.output);
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  const json out = json::parse(last, nullptr, false);
  ASSERT_TRUE(out.is_object()) << r.output;
  for (const auto& [name, kind] :
       std::vector<std::pair<std::string, std::string>>{{"route_reply", "ok"},
                                                        {"route_reply_plain", "ok"},
                                                        {"route_reply_warned", "ok"},
                                                        {"error_reply", "error"},
                                                        {"error_reply_noid", "error"},
                                                        {"error_reply_future", "error"},
                                                        {"worker_ack", "ok"},
                                                        {"admin_reply_ok", "ok"},
                                                        {"admin_reply_bin", "ok"},
                                                        {"admin_reply_err", "error"}})
    ASSERT_TRUE(out.contains(name) && out[name].contains(kind)) << name << ": " << r.output;
  // Copies below, so that a missing field reads as null and fails a comparison.

  json reply = out["route_reply"]["ok"];
  EXPECT_EQ(reply["id"], "req-1");
  EXPECT_EQ(reply["worker"], 3);
  EXPECT_EQ(reply["endpoint"], "tcp://10.0.0.3:5600");
  EXPECT_EQ(reply["epoch"].get<uint64_t>(), big);
  EXPECT_EQ(reply["covered_blocks"], 2);
  EXPECT_EQ(reply["total_blocks"], 3);
  EXPECT_EQ(reply["explain"]["policy"], "eldr");
  EXPECT_NEAR(reply["explain"]["tau"].get<double>(), 0.1, 1e-6);
  ASSERT_EQ(reply["explain"]["band"].size(), 2u);
  EXPECT_EQ(reply["explain"]["band"][1][0], 1);
  EXPECT_NEAR(reply["explain"]["band"][1][1].get<double>(), 0.75, 1e-6);
  EXPECT_FALSE(out["route_reply_plain"]["ok"].contains("explain"));
  // Every route reply has fallback and warnings, empty when the node sent none.
  EXPECT_EQ(out["route_reply_plain"]["ok"]["fallback"], "");
  EXPECT_EQ(out["route_reply_plain"]["ok"]["warnings"], json::array());
  EXPECT_EQ(out["route_reply_warned"]["ok"]["fallback"], "counts_geometry");
  EXPECT_EQ(out["route_reply_warned"]["ok"]["warnings"],
            json::array({"counts_geometry: counts are L=2 E=16 k=2, the model is L=2 E=8 k=2; "
                         "routed by load"}));

  json busy = out["error_reply"]["error"];
  EXPECT_EQ(busy["code"], 6);
  EXPECT_EQ(busy["name"], "overloaded");
  EXPECT_EQ(busy["message"], "busy");
  EXPECT_EQ(busy["id"], "req-1");
  json noid = out["error_reply_noid"]["error"];
  EXPECT_EQ(noid["code"], 1);
  EXPECT_EQ(noid["name"], "malformed");
  EXPECT_TRUE(noid["id"].is_null());
  json future = out["error_reply_future"]["error"];
  EXPECT_EQ(future["code"], 42);
  EXPECT_EQ(future["name"], "internal");  // an unknown code is treated as internal

  json ack = out["worker_ack"]["ok"];
  EXPECT_EQ(ack["id"], "w-1");
  EXPECT_EQ(ack["state"], "draining");
  EXPECT_EQ(ack["epoch"], 12);

  json res = out["admin_reply_ok"]["ok"];
  EXPECT_EQ(res["node"]["name"], "n0");
  EXPECT_EQ(res["node"]["roles"], json({"router", "cache"}));
  EXPECT_EQ(res["tau"], 0.5);
  EXPECT_EQ(res["neg"], -3);
  EXPECT_EQ(res["blob"]["hex"], "010203");
  std::string hex;
  for (int i = 0; i < 256; ++i) {
    static const char digits[] = "0123456789abcdef";
    hex += digits[i >> 4];
    hex += digits[i & 15];
  }
  EXPECT_EQ(out["admin_reply_bin"]["ok"].value("hex", ""), hex);
  json refused = out["admin_reply_err"]["error"];
  EXPECT_EQ(refused["code"], 4);
  EXPECT_EQ(refused["name"], "unknown_model");
  EXPECT_EQ(refused["message"], "no pool for model x");
}

}  // namespace
}  // namespace eldr
