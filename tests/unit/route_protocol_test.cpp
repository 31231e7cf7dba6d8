// route_protocol: round trips, every limit, unknown keys ignored, wrong types named, and
// truncation at every byte offset refused rather than crashing.
#include "cluster/wire/route_protocol.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

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

// A message's envelope, for hand-written payloads.
void envelope(msgpack::writer& w, uint32_t fields, std::string_view type) {
  w.write_map_header(fields + 2);
  w.write_str("version");
  w.write_uint(1);
  w.write_str("type");
  w.write_str(type);
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
  EXPECT_EQ(back->label, std::optional<uint32_t>(3));
  EXPECT_TRUE(back->explain);
}

TEST(RouteProtocol, MinimalRequestRoundTrips) {
  route_request m;
  m.id = "a";
  m.model = "m";
  auto back = decode_request(encode_route_request(m));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->block_hashes.empty());
  EXPECT_FALSE(back->counts);
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
  auto over = decode_route_reply(encode_route_reply(r), tight);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code(), status_code::out_of_range);
  EXPECT_NE(over.error().message().find("route_reply.warnings"), std::string::npos);
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
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 5, "route_request");
  w.write_str("future");
  w.write_map_header(1);  // a nested value, skipped whole
  w.write_str("x");
  w.write_array_header(2);
  w.write_uint(1);
  w.write_str("y");
  w.write_str("id");
  w.write_str("r");
  w.write_str("model");
  w.write_str("m");
  w.write_str("blocks");
  w.write_array_header(1);
  w.write_uint(9);
  w.write_str("zzz");
  w.write_nil();
  auto m = decode_request(out);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->block_hashes, std::vector<uint64_t>{9});

  // The reply's explanation ignores unknown keys and extra band-member elements too.
  out.clear();
  envelope(w, 7, "route_reply");
  for (const char* k : {"worker", "epoch", "covered_blocks", "total_blocks"}) {
    w.write_str(k);
    w.write_uint(1);
  }
  w.write_str("id");
  w.write_str("r");
  w.write_str("endpoint");
  w.write_str("e");
  w.write_str("explain");
  w.write_map_header(4);
  w.write_str("note");
  w.write_str("later");
  w.write_str("policy");
  w.write_str("jsq");
  w.write_str("tau");
  w.write_uint(0);
  w.write_str("band");
  w.write_array_header(1);
  w.write_array_header(3);
  w.write_uint(1);
  w.write_float64(0.5);
  w.write_str("extra");
  auto r = decode_route_reply(out, {});
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(r->explain);
  EXPECT_EQ(r->explain->policy, "jsq");
  EXPECT_EQ(r->explain->band, (std::vector<route_band_member>{{1, 0.5f}}));
}

// Writes a request whose field `key` holds a string, to see the wrong type named.
std::vector<uint8_t> request_with_string_at(std::string_view key) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 4, "route_request");
  for (std::string_view k : {"id", "model", "blocks", "label"}) {
    w.write_str(k);
    if (k == key)
      w.write_str("oops");
    else if (k == "blocks")
      w.write_array_header(0);
    else if (k == "label")
      w.write_uint(1);
    else
      w.write_str("x");
  }
  return out;
}

TEST(RouteProtocol, WrongTypesAreNamed) {
  for (std::string_view key : {"blocks", "label"}) {
    auto m = decode_request(request_with_string_at(key));
    ASSERT_FALSE(m.ok()) << key;
    EXPECT_EQ(m.error().code(), status_code::invalid_argument);
    EXPECT_NE(m.error().message().find("route_request." + std::string(key)), std::string::npos)
        << m.error().message();
  }

  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 3, "route_request");
  w.write_str("id");
  w.write_uint(5);
  w.write_str("model");
  w.write_str("m");
  w.write_str("blocks");
  w.write_array_header(2);
  w.write_uint(1);
  w.write_int(-1);
  auto m = decode_request(out);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("route_request.id"), std::string::npos);

  // Element errors say which element.
  out.clear();
  envelope(w, 3, "route_request");
  w.write_str("id");
  w.write_str("r");
  w.write_str("model");
  w.write_str("m");
  w.write_str("blocks");
  w.write_array_header(2);
  w.write_uint(1);
  w.write_int(-1);
  m = decode_request(out);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("route_request.blocks[1]"), std::string::npos)
      << m.error().message();

  auto r = decode_route_reply(encode_error_reply(sample_error()), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(wire_error_for_decode(r.error()), wire_error_code::unknown_type);
  EXPECT_NE(r.error().message().find("error_reply"), std::string::npos);

  std::vector<uint8_t> not_a_map;
  msgpack::writer(not_a_map).write_array_header(0);
  auto e = decode_error_reply(not_a_map, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), status_code::invalid_argument);
}

TEST(RouteProtocol, VersionTypeAndRequiredFieldsAreChecked) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(4);
  w.write_str("id");
  w.write_str("r");
  w.write_str("model");
  w.write_str("m");
  w.write_str("type");
  w.write_str("route_request");
  w.write_str("version");
  w.write_uint(2);
  auto m = decode_request(out);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), status_code::failed_precondition);

  out.clear();
  envelope(w, 2, "route_request");
  w.write_str("id");
  w.write_str("r");
  w.write_str("model");
  w.write_str("m");
  m = decode_request(out);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("route_request.blocks: missing"), std::string::npos);

  out.clear();
  w.write_map_header(1);
  w.write_str("version");
  w.write_uint(1);
  m = decode_request(out);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message().find("type: missing"), std::string::npos);

  route_reply bad = sample_reply();
  bad.covered_blocks = 4;
  auto r = decode_route_reply(encode_route_reply(bad), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("covered_blocks"), std::string::npos);

  // Trailing bytes after the message are refused.
  auto bytes = encode_error_reply(sample_error());
  bytes.push_back(0xc0);
  auto e = decode_error_reply(bytes, {});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code(), status_code::corrupt);
}

TEST(RouteProtocol, EveryLimitIsEnforced) {
  const auto request = encode_route_request(sample_request());
  const auto reply = encode_route_reply(sample_reply());
  const auto error = encode_error_reply(sample_error());
  auto expect_too_large = [](const status& s, std::string_view field) {
    EXPECT_EQ(s.code(), status_code::out_of_range) << s.to_string();
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  route_protocol_limits l;

  l = {};
  l.max_payload_bytes = static_cast<uint32_t>(request.size() - 1);
  expect_too_large(decode_request(request, l).error(), "payload");
  l = {};
  l.max_id_bytes = 4;  // "req-1" is 5
  expect_too_large(decode_request(request, l).error(), "route_request.id");
  expect_too_large(decode_route_reply(reply, l).error(), "route_reply.id");
  expect_too_large(decode_error_reply(error, l).error(), "error_reply.id");
  l = {};
  l.max_model_bytes = 3;
  expect_too_large(decode_request(request, l).error(), "route_request.model");
  l = {};
  l.max_blocks = 2;  // three hashes
  expect_too_large(decode_request(request, l).error(), "route_request.blocks");
  l = {};
  l.max_endpoint_bytes = 5;
  expect_too_large(decode_route_reply(reply, l).error(), "route_reply.endpoint");
  l = {};
  l.max_band = 1;
  expect_too_large(decode_route_reply(reply, l).error(), "route_reply.explain.band");
  l = {};
  l.max_policy_bytes = 2;
  expect_too_large(decode_route_reply(reply, l).error(), "route_reply.explain.policy");
  l = {};
  l.max_message_bytes = 3;
  expect_too_large(decode_error_reply(error, l).error(), "error_reply.message");

  // The counts travel under max_blocks too (one counted block, three hashes).
  route_request few = sample_request();
  few.block_hashes.clear();
  counts_message& c = *few.counts;
  c.blocks.push_back(c.blocks[0]);
  l = {};
  l.max_blocks = 1;
  expect_too_large(decode_request(encode_route_request(few), l).error(), "route_request.counts");
  EXPECT_EQ(wire_error_for_decode(decode_request(encode_route_request(few), l).error()),
            wire_error_code::too_large);
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
  const std::vector<std::vector<uint8_t>> all = {encode_route_request(sample_request()),
                                                 encode_route_reply(sample_reply()),
                                                 encode_error_reply(sample_error())};
  for (const auto& bytes : all) {
    for (size_t n = 0; n < bytes.size(); ++n) {
      const std::span<const uint8_t> cut(bytes.data(), n);
      EXPECT_FALSE(decode_request(cut).ok()) << n;
      EXPECT_FALSE(decode_route_reply(cut, {}).ok()) << n;
      EXPECT_FALSE(decode_error_reply(cut, {}).ok()) << n;
    }
  }
}

TEST(RouteProtocol, HostileLengthsDoNotAllocate) {
  // A request declaring 2^32-1 block hashes in a few bytes: refused by the limit, never reserved.
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  envelope(w, 3, "route_request");
  w.write_str("id");
  w.write_str("r");
  w.write_str("model");
  w.write_str("m");
  w.write_str("blocks");
  w.write_array_header(UINT32_MAX);
  route_protocol_limits l;
  l.max_blocks = UINT32_MAX;
  auto m = decode_request(out, l);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), status_code::corrupt);
}

}  // namespace
}  // namespace eldr
