// route_protocol: round trips, every limit, unknown keys ignored, wrong types named, and
// truncation at every byte offset refused rather than crashing.
#include "cluster/wire/route_protocol.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"

namespace eldr {
namespace {

using testing::expect_error;
using testing::map_payload;
using testing::message;

const model_geometry geo{2, 8, 2};

block_counts sample_counts() {
  auto c = block_counts::from_parts(geo, 2, {0, 2, 4}, {1, 5, 6, 7}, {2, 2, 2, 2});
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

route_request sample_request() {
  route_request m;
  m.id = "req-1";
  m.model = "qwen3-30b-a3b";
  m.block_hashes = {1, 18446744073709539271ULL, 7};
  counts_message c;
  c.geometry = geo;
  c.blocks.push_back({7, 18446744073709539271ULL, sample_counts()});
  m.counts = std::move(c);
  m.cached_blocks = 2;
  m.label = 3;
  m.explain = true;
  return m;
}

route_reply sample_reply() {
  route_reply m;
  m.id = "req-1";
  m.worker = 4;
  m.endpoint = "tcp://10.0.0.4:5600";
  m.epoch = 1ULL << 40;
  m.covered_blocks = 2;
  m.total_blocks = 3;
  m.explain = route_explain{"eldr", 0.1f, {{4, 0.75f}, {1, 0.7f}}};
  return m;
}

error_reply sample_error() {
  return {std::string("req-9"), wire_error_code::unknown_model, "no pool serves model \"x\""};
}

result<route_request> decode_request(std::span<const uint8_t> bytes,
                                     const route_protocol_limits& limits = {}) {
  std::vector<kv_decode_issue> issues;
  return decode_route_request(bytes, limits, issues);
}

TEST(RouteProtocol, RequestRoundTrips) {
  const route_request m = sample_request();
  std::vector<kv_decode_issue> issues;
  auto back = decode_route_request(encode_route_request(m), {}, issues);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(issues.empty());
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->model, m.model);
  EXPECT_EQ(back->block_hashes, m.block_hashes);
  ASSERT_TRUE(back->counts);
  EXPECT_EQ(back->counts->geometry, geo);
  ASSERT_EQ(back->counts->blocks.size(), 1u);
  EXPECT_EQ(back->counts->blocks[0].hash, 7u);
  EXPECT_EQ(back->counts->blocks[0].counts.ids(), sample_counts().ids());
  EXPECT_EQ(back->counts->blocks[0].counts.counts(), sample_counts().counts());
  EXPECT_EQ(back->cached_blocks, std::optional<uint32_t>(2));
  EXPECT_EQ(back->label, std::optional<uint32_t>(3));
  EXPECT_TRUE(back->explain);
}

TEST(RouteProtocol, CachedBlocksAreAtMostTheBlocks) {
  route_request m = sample_request();
  m.cached_blocks = 3;  // every block: a prompt served whole from the prefix cache
  auto back = decode_request(encode_route_request(m));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->cached_blocks, std::optional<uint32_t>(3));
  m.cached_blocks = 4;
  expect_error(decode_request(encode_route_request(m)), status_code::invalid_argument,
               "route_request.cached_blocks: 4 exceeds the 3 blocks");
  // nil is absent.
  back = decode_request(message("route_request")
                            .str("id", "r")
                            .str("model", "m")
                            .value("blocks", [](msgpack::writer& w) { w.write_array_header(0); })
                            .nil("cached_blocks")
                            .bytes());
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_FALSE(back->cached_blocks);
}

// A resend marked by the client (docs/cluster.md, "Retries: ask, don't broadcast"): written only
// when set, so an unmarked request is byte for byte what a client without the field sends; absent
// or nil reads as false.
TEST(RouteProtocol, RetryIsWrittenOnlyWhenSet) {
  route_request m = sample_request();
  const std::vector<uint8_t> unmarked = encode_route_request(m);
  auto back = decode_request(unmarked);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_FALSE(back->retry);
  const std::string key = "retry";
  EXPECT_EQ(std::search(unmarked.begin(), unmarked.end(), key.begin(), key.end()), unmarked.end());

  m.retry = true;
  const std::vector<uint8_t> marked = encode_route_request(m);
  EXPECT_GT(marked.size(), unmarked.size());
  back = decode_request(marked);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->retry);

  back = decode_request(message("route_request")
                            .str("id", "r")
                            .str("model", "m")
                            .value("blocks", [](msgpack::writer& w) { w.write_array_header(0); })
                            .nil("retry")
                            .bytes());
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_FALSE(back->retry);
}

TEST(RouteProtocol, MinimalRequestRoundTrips) {
  route_request m;
  m.id = "a";
  m.model = "m";
  auto back = decode_request(encode_route_request(m));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->block_hashes.empty());
  EXPECT_FALSE(back->counts);
  EXPECT_FALSE(back->cached_blocks);
  EXPECT_FALSE(back->label);
  EXPECT_FALSE(back->explain);
}

TEST(RouteProtocol, ReplyAndErrorRoundTrip) {
  const route_reply r = sample_reply();
  auto back = decode_route_reply(encode_route_reply(r), {});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, r);

  route_reply plain = r;
  plain.explain.reset();
  auto back2 = decode_route_reply(encode_route_reply(plain), {});
  ASSERT_TRUE(back2.ok()) << back2.error().to_string();
  EXPECT_EQ(*back2, plain);

  const error_reply e = sample_error();
  auto eb = decode_error_reply(encode_error_reply(e), {});
  ASSERT_TRUE(eb.ok()) << eb.error().to_string();
  EXPECT_EQ(*eb, e);

  error_reply anonymous{std::nullopt, wire_error_code::malformed, "bad"};
  auto ab = decode_error_reply(encode_error_reply(anonymous), {});
  ASSERT_TRUE(ab.ok()) << ab.error().to_string();
  EXPECT_EQ(*ab, anonymous);
}

// A decision by load only says why, and warnings travel as a list; both are absent from the
// encoding when empty, so older clients see the reply they know.
TEST(RouteProtocol, FallbackAndWarningsRoundTripAndAreLimited) {
  route_reply r = sample_reply();
  r.fallback = "counts_geometry";
  r.warnings = {
      "counts_geometry: counts are L=2 E=16 k=2, the model is L=2 E=8 k=2; routed by load",
      "another: one"};
  auto back = decode_route_reply(encode_route_reply(r), {});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, r);

  const route_reply plain = sample_reply();
  auto plain_back = decode_route_reply(encode_route_reply(plain), {});
  ASSERT_TRUE(plain_back.ok());
  EXPECT_TRUE(plain_back->fallback.empty());
  EXPECT_TRUE(plain_back->warnings.empty());
  route_reply with = plain;
  with.fallback = "no_counts";
  EXPECT_GT(encode_route_reply(with).size(), encode_route_reply(plain).size());

  route_protocol_limits tight;
  tight.max_warnings = 1;
  expect_error(decode_route_reply(encode_route_reply(r), tight), status_code::out_of_range,
               "route_reply.warnings");
}

TEST(RouteProtocol, ErrorCodesAreNamedAndMapped) {
  EXPECT_STREQ(to_string(wire_error_code::no_eligible_worker), "no_eligible_worker");
  EXPECT_STREQ(to_string(wire_error_code::not_found), "not_found");
  EXPECT_STREQ(to_string(static_cast<wire_error_code>(200)), "unknown");
  EXPECT_EQ(wire_error_for_decode(status::out_of_range("x")), wire_error_code::too_large);
  EXPECT_EQ(wire_error_for_decode(status::not_found("x")), wire_error_code::unknown_type);
  EXPECT_EQ(wire_error_for_decode(status::corrupt("x")), wire_error_code::malformed);
  EXPECT_EQ(wire_error_for_decode(status::invalid_argument("x")), wire_error_code::malformed);
}

TEST(RouteProtocol, UnknownKeysAreIgnored) {
  const auto future = [](msgpack::writer& w) {
    w.write_map_header(1);  // a nested value, skipped whole
    w.write_str("x");
    w.write_array_header(2);
    w.write_uint(1);
    w.write_str("y");
  };
  const auto one_block = [](msgpack::writer& w) {
    w.write_array_header(1);
    w.write_uint(9);
  };
  auto m = decode_request(message("route_request")
                              .value("future", future)
                              .str("id", "r")
                              .str("model", "m")
                              .value("blocks", one_block)
                              .nil("zzz")
                              .bytes());
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->block_hashes, std::vector<uint64_t>{9});

  // The reply's explanation ignores unknown keys and extra band-member elements too.
  map_payload reply = message("route_reply");
  for (const char* k : {"worker", "epoch", "covered_blocks", "total_blocks"})
    reply.uint(k, 1);
  const auto band = [](msgpack::writer& w) {
    w.write_array_header(1);
    w.write_array_header(3);
    w.write_uint(1);
    w.write_float64(0.5);
    w.write_str("extra");
  };
  const auto explain =
      map_payload().str("note", "later").str("policy", "jsq").uint("tau", 0).value("band", band);
  reply.str("id", "r").str("endpoint", "e").map("explain", explain);
  auto r = decode_route_reply(reply.bytes(), {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(r->explain);
  EXPECT_EQ(r->explain->policy, "jsq");
  EXPECT_EQ(r->explain->band, (std::vector<route_band_member>{{1, 0.5f}}));
}

// Writes a request whose field `key` holds a string, to see the wrong type named.
std::vector<uint8_t> request_with_string_at(std::string_view key) {
  map_payload m = message("route_request");
  for (std::string_view k : {"id", "model", "blocks", "label", "cached_blocks", "retry"}) {
    if (k == key)
      m.str(k, "oops");
    else if (k == "retry")
      continue;  // optional: only the wrong type is written
    else if (k == "blocks")
      m.value(k, [](msgpack::writer& w) { w.write_array_header(0); });
    else if (k == "label" || k == "cached_blocks")
      m.uint(k, 0);
    else
      m.str(k, "x");
  }
  return m.bytes();
}

// Block hashes {1, -1}: the second is not a uint64.
void write_bad_second_hash(msgpack::writer& w) {
  w.write_array_header(2);
  w.write_uint(1);
  w.write_int(-1);
}

TEST(RouteProtocol, WrongTypesAreNamed) {
  for (std::string_view key : {"blocks", "label", "cached_blocks", "retry"}) {
    SCOPED_TRACE(key);
    expect_error(decode_request(request_with_string_at(key)), status_code::invalid_argument,
                 "route_request." + std::string(key));
  }

  auto m = decode_request(message("route_request")
                              .uint("id", 5)
                              .str("model", "m")
                              .value("blocks", write_bad_second_hash)
                              .bytes());
  expect_error(m, status_code::invalid_argument, "route_request.id");

  // Element errors say which element.
  m = decode_request(message("route_request")
                         .str("id", "r")
                         .str("model", "m")
                         .value("blocks", write_bad_second_hash)
                         .bytes());
  expect_error(m, status_code::invalid_argument, "route_request.blocks[1]");

  auto r = decode_route_reply(encode_error_reply(sample_error()), {});
  expect_error(r, status_code::not_found, "error_reply");
  EXPECT_EQ(wire_error_for_decode(r.error()), wire_error_code::unknown_type);

  std::vector<uint8_t> not_a_map;
  msgpack::writer(not_a_map).write_array_header(0);
  expect_error(decode_error_reply(not_a_map, {}), status_code::invalid_argument, "");
}

TEST(RouteProtocol, VersionTypeAndRequiredFieldsAreChecked) {
  expect_error(decode_request(map_payload()
                                  .str("id", "r")
                                  .str("model", "m")
                                  .str("type", "route_request")
                                  .uint("version", 2)
                                  .bytes()),
               status_code::failed_precondition, "version");
  expect_error(decode_request(message("route_request").str("id", "r").str("model", "m").bytes()),
               status_code::invalid_argument, "route_request.blocks: missing");
  expect_error(decode_request(map_payload().uint("version", 1).bytes()),
               status_code::invalid_argument, "type: missing");

  route_reply bad = sample_reply();
  bad.covered_blocks = 4;
  expect_error(decode_route_reply(encode_route_reply(bad), {}), status_code::invalid_argument,
               "covered_blocks");

  // Trailing bytes after the message are refused.
  auto bytes = encode_error_reply(sample_error());
  bytes.push_back(0xc0);
  expect_error(decode_error_reply(bytes, {}), status_code::corrupt, "");
}

TEST(RouteProtocol, EveryLimitIsEnforced) {
  using limits = route_protocol_limits;
  const auto request = encode_route_request(sample_request());
  const auto reply = encode_route_reply(sample_reply());
  const auto error = encode_error_reply(sample_error());
  const auto of_request = [&](const limits& l) { return decode_request(request, l).error(); };
  const auto of_reply = [&](const limits& l) { return decode_route_reply(reply, l).error(); };
  const auto of_error = [&](const limits& l) { return decode_error_reply(error, l).error(); };
  // The counts travel under max_blocks too (one counted block, three hashes).
  route_request few = sample_request();
  few.block_hashes.clear();
  counts_message& c = *few.counts;
  c.blocks.push_back(c.blocks[0]);
  const auto of_few = [bytes = encode_route_request(few)](const limits& l) {
    return decode_request(bytes, l).error();
  };
  testing::expect_limits_enforced<limits>({
      {"payload", &limits::max_payload_bytes, static_cast<uint32_t>(request.size() - 1),
       of_request},
      {"route_request.id", &limits::max_id_bytes, 4, of_request},  // "req-1" is 5
      {"route_reply.id", &limits::max_id_bytes, 4, of_reply},
      {"error_reply.id", &limits::max_id_bytes, 4, of_error},
      {"route_request.model", &limits::max_model_bytes, 3, of_request},
      {"route_request.blocks", &limits::max_blocks, 2, of_request},  // three hashes
      {"route_reply.endpoint", &limits::max_endpoint_bytes, 5, of_reply},
      {"route_reply.explain.band", &limits::max_band, 1, of_reply},
      {"route_reply.explain.policy", &limits::max_policy_bytes, 2, of_reply},
      {"error_reply.message", &limits::max_message_bytes, 3, of_error},
      {"route_request.counts", &limits::max_blocks, 1, of_few},
  });
  limits l;
  l.max_blocks = 1;
  EXPECT_EQ(wire_error_for_decode(of_few(l)), wire_error_code::too_large);
}

TEST(RouteProtocol, BadCountBlocksAreReportedNotFatal) {
  route_request m = sample_request();
  std::vector<uint8_t> bytes = encode_route_request(m);
  // Corrupt the counted block's first expert id (1 -> 9 >= E): find the ids bin 0xc4 0x04 01 05.
  const std::vector<uint8_t> ids = {0xc4, 0x04, 0x01, 0x05, 0x06, 0x07};
  auto it = std::search(bytes.begin(), bytes.end(), ids.begin(), ids.end());
  ASSERT_NE(it, bytes.end());
  it[2] = 9;
  std::vector<kv_decode_issue> issues;
  auto back = decode_route_request(bytes, {}, issues);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_TRUE(back->counts);
  EXPECT_TRUE(back->counts->blocks.empty());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].cause, drop_cause::bad_counts);
}

TEST(RouteProtocol, TruncationAtEveryOffsetIsAnError) {
  testing::expect_truncations_refused(
      {encode_route_request(sample_request()), encode_route_reply(sample_reply()),
       encode_error_reply(sample_error())},
      [](std::span<const uint8_t> b) { return decode_request(b); },
      [](std::span<const uint8_t> b) { return decode_route_reply(b, {}); },
      [](std::span<const uint8_t> b) { return decode_error_reply(b, {}); });
}

TEST(RouteProtocol, HostileLengthsDoNotAllocate) {
  // A request declaring 2^32-1 block hashes in a few bytes: refused by the limit, never reserved.
  const auto out =
      message("route_request")
          .str("id", "r")
          .str("model", "m")
          .value("blocks", [](msgpack::writer& w) { w.write_array_header(UINT32_MAX); })
          .bytes();
  route_protocol_limits l;
  l.max_blocks = UINT32_MAX;
  expect_error(decode_request(out, l), status_code::corrupt, "");
}

}  // namespace
}  // namespace eldr
