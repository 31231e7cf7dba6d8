// admin_protocol: requests and replies round trip with every kind of argument value (binary blobs
// included), agree with nlohmann's own MessagePack codec, and hostile input -- deep nesting, huge
// counts, bad UTF-8, non-str keys, truncation -- is refused with a named field, never a throw.
#include "cluster/wire/admin_protocol.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"

namespace eldr {
namespace {

using testing::expect_error;
using testing::map_payload;
using testing::message;

using nlohmann::json;

json sample_args() {
  json args = json::object();
  args["model"] = "qwen3-30b-a3b";
  args["epoch"] = 12;
  args["tau"] = 0.25;
  args["offset"] = -7;
  args["big"] = 18446744073709551615ULL;
  args["dry_run"] = true;
  args["none"] = nullptr;
  args["names"] = json::array({"a", "b", "\xc3\xa9t\xc3\xa9"});  // UTF-8 "ete" with accents
  args["nested"] = {{"x", json::array({1, 2, json::object()})}};
  args["file"] = json::binary({0x00, 0xff, 0x10, 0x80});
  args["ext"] = json::binary({1, 2, 3}, 5);
  return args;
}

admin_request sample_request() {
  return {"a-1", "centroids.import", sample_args()};
}

// A request whose args value is written by `write_args`.
std::vector<uint8_t> request_with_args(const std::function<void(msgpack::writer&)>& write_args) {
  return message("admin_request").str("command", "status").value("args", write_args).bytes();
}

TEST(AdminProtocol, RequestRoundTripsEveryValueKind) {
  const admin_request m = sample_request();
  auto back = decode_admin_request(encode_admin_request(m), {});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->id, "a-1");
  EXPECT_EQ(back->command, "centroids.import");
  EXPECT_EQ(back->args, m.args);
  EXPECT_TRUE(back->args["file"].is_binary());
  EXPECT_EQ(static_cast<const std::vector<uint8_t>&>(back->args["file"].get_binary()),
            (std::vector<uint8_t>{0x00, 0xff, 0x10, 0x80}));
  EXPECT_FALSE(back->args["file"].get_binary().has_subtype());
  EXPECT_EQ(back->args["ext"].get_binary().subtype(), 5u);
  EXPECT_EQ(back->args["big"].get<uint64_t>(), 18446744073709551615ULL);
  EXPECT_EQ(back->args["offset"].get<int64_t>(), -7);

  // No id and null args: the id stays empty, args reads as an empty object.
  admin_request bare{"", "status", nullptr};
  auto b = decode_admin_request(encode_admin_request(bare), {});
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(b->id, "");
  EXPECT_TRUE(b->args.is_object());
  EXPECT_TRUE(b->args.empty());
}

TEST(AdminProtocol, RepliesRoundTrip) {
  admin_reply ok;
  ok.id = "a-1";
  ok.ok = true;
  ok.result = json::binary(std::vector<uint8_t>(100000, 0xab));  // a centroid file
  auto back = decode_admin_reply(encode_admin_reply(ok), {});
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(back->ok);
  EXPECT_EQ(back->id, "a-1");
  EXPECT_EQ(back->result, ok.result);

  admin_reply nothing;
  nothing.ok = true;
  auto n = decode_admin_reply(encode_admin_reply(nothing), {});
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  EXPECT_TRUE(n->result.is_null());

  admin_reply err;
  err.id = "a-2";
  err.ok = false;
  err.code = wire_error_code::unknown_model;
  err.error = "no pool serves model \"x\"";
  auto e = decode_admin_reply(encode_admin_reply(err), {});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_FALSE(e->ok);
  EXPECT_EQ(e->code, wire_error_code::unknown_model);
  EXPECT_EQ(e->error, err.error);
  EXPECT_TRUE(e->result.is_null());
}

TEST(AdminProtocol, AgreesWithNlohmannMessagePack) {
  // Our encoding of args is read by nlohmann's from_msgpack, and nlohmann's to_msgpack by us.
  const json args = sample_args();
  const auto ours = encode_admin_request({"a", "x", args});
  msgpack::reader r(ours.data(), ours.size());
  const uint32_t pairs = *r.read_map_header();
  bool found = false;
  for (uint32_t i = 0; i < pairs; ++i) {
    const std::string key(*r.read_str());
    const size_t at = r.offset();
    ASSERT_TRUE(r.skip().ok());
    if (key == "args") {
      const std::vector<uint8_t> value(ours.begin() + at, ours.begin() + r.offset());
      EXPECT_EQ(json::from_msgpack(value), args);
      found = true;
    }
  }
  EXPECT_TRUE(found);

  const std::vector<uint8_t> theirs = json::to_msgpack(args);
  std::vector<uint8_t> out = request_with_args([](msgpack::writer&) {});
  out.insert(out.end(), theirs.begin(), theirs.end());
  auto m = decode_admin_request(out, {});
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->args, args);
}

TEST(AdminProtocol, UnknownKeysAreIgnoredAndTypesChecked) {
  const auto later = [](msgpack::writer& w) {
    w.write_array_header(1);
    w.write_map_header(0);
  };
  auto m = decode_admin_request(
      message("admin_request").value("later", later).str("command", "workers").nil("args").bytes(),
      {});
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->command, "workers");
  EXPECT_TRUE(m->args.is_object());

  // Another message type is not_found (unknown_type).
  auto r = decode_admin_reply(encode_admin_request(sample_request()), {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(wire_error_for_decode(r.error()), wire_error_code::unknown_type);
  auto q =
      decode_admin_request(encode_error_reply({std::nullopt, wire_error_code::internal, "x"}), {});
  EXPECT_EQ(q.error().code(), status_code::not_found);
}

TEST(AdminProtocol, BadRequestsAreNamed) {
  expect_error(
      decode_admin_request(message("admin_request").map("args", map_payload()).bytes(), {}),
      status_code::invalid_argument, "admin_request.command: missing");
  expect_error(decode_admin_request(message("admin_request").str("command", "").bytes(), {}),
               status_code::invalid_argument, "admin_request.command: empty");
  expect_error(decode_admin_request(
                   request_with_args([](msgpack::writer& a) { a.write_array_header(0); }), {}),
               status_code::invalid_argument, "admin_request.args: expected map");

  // A non-str key, at depth 2, is named with its path.
  auto bad_key = request_with_args([](msgpack::writer& a) {
    a.write_map_header(1);
    a.write_str("outer");
    a.write_map_header(1);
    a.write_uint(5);
    a.write_nil();
  });
  expect_error(decode_admin_request(bad_key, {}), status_code::invalid_argument,
               "admin_request.args.outer key");

  // Invalid UTF-8 in a string value, inside an array: overlong, surrogate, truncated sequence.
  for (std::string bad : {std::string("\xc0\xaf"), std::string("\xed\xa0\x80"),
                          std::string("ab\xe2\x82"), std::string("\xff")}) {
    auto bytes = request_with_args([&](msgpack::writer& a) {
      a.write_map_header(1);
      a.write_str("list");
      a.write_array_header(2);
      a.write_str("fine \xe2\x82\xac");
      a.write_str(bad);
    });
    SCOPED_TRACE(::testing::PrintToString(bad));
    expect_error(decode_admin_request(bytes, {}), status_code::invalid_argument,
                 "admin_request.args.list[1]: invalid UTF-8");
  }

  // Replies: ok is required, and a failed reply needs its code.
  expect_error(decode_admin_reply(message("admin_reply").uint("result", 1).bytes(), {}),
               status_code::invalid_argument, "admin_reply.ok: missing");
  expect_error(
      decode_admin_reply(message("admin_reply").boolean("ok", false).str("error", "x").bytes(), {}),
      status_code::invalid_argument, "admin_reply.code: missing");
  expect_error(
      decode_admin_reply(message("admin_reply").boolean("ok", false).uint("code", 300).bytes(), {}),
      status_code::invalid_argument, "admin_reply.code");

  expect_error(decode_admin_request(message("admin_request", 7).bytes(), {}),
               status_code::failed_precondition, "version");
}

// Args nested `depth` containers deep (args itself is the first).
std::vector<uint8_t> nested(uint32_t depth) {
  return request_with_args([&](msgpack::writer& a) {
    a.write_map_header(1);
    a.write_str("d");
    for (uint32_t i = 1; i < depth; ++i)
      a.write_array_header(1);
    a.write_uint(1);
  });
}

TEST(AdminProtocol, DepthAndValueCountAreBounded) {
  auto ok = decode_admin_request(nested(32), {});
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  expect_error(decode_admin_request(nested(33), {}), status_code::out_of_range,
               "nested deeper than 32");
  // Far deeper than the reader's own limit: refused without recursing.
  EXPECT_FALSE(decode_admin_request(nested(100000), {}).ok());

  admin_protocol_limits l;
  l.max_values = 10;
  auto many = request_with_args([](msgpack::writer& a) {
    a.write_map_header(1);
    a.write_str("xs");
    a.write_array_header(20);
    for (int i = 0; i < 20; ++i)
      a.write_uint(1);
  });
  expect_error(decode_admin_request(many, l), status_code::out_of_range, "values");
  l.max_values = 22;  // args, xs, 20 elements
  EXPECT_TRUE(decode_admin_request(many, l).ok());

  // A hostile element count is refused by the reader before anything is reserved.
  auto hostile = request_with_args([](msgpack::writer& a) {
    a.write_map_header(1);
    a.write_str("xs");
    a.write_array_header(UINT32_MAX);
  });
  l.max_values = UINT32_MAX;
  EXPECT_FALSE(decode_admin_request(hostile, l).ok());
}

TEST(AdminProtocol, EveryLimitIsEnforced) {
  using limits = admin_protocol_limits;
  const auto req = encode_admin_request(sample_request());
  admin_reply err;
  err.id = "a";
  err.code = wire_error_code::internal;
  err.error = "something broke";
  const auto of_request = [&](const limits& l) { return decode_admin_request(req, l).error(); };
  const auto of_reply = [bytes = encode_admin_reply(err)](const limits& l) {
    return decode_admin_reply(bytes, l).error();
  };
  testing::expect_limits_enforced<limits>({
      {"payload", &limits::max_payload_bytes, static_cast<uint32_t>(req.size() - 1), of_request},
      {"admin_request.command", &limits::max_command_bytes, 4, of_request},
      {"admin_request.id", &limits::max_id_bytes, 2, of_request},
      {"admin_reply.error", &limits::max_error_bytes, 3, of_reply},
  });
}

TEST(AdminProtocol, TruncationAndGarbageAreErrorsNotThrows) {
  admin_reply ok;
  ok.id = "r";
  ok.ok = true;
  ok.result = sample_args();
  const std::vector<std::vector<uint8_t>> all = {encode_admin_request(sample_request()),
                                                 encode_admin_reply(ok)};
  testing::expect_truncations_refused(
      all, [](std::span<const uint8_t> b) { return decode_admin_request(b, {}); },
      [](std::span<const uint8_t> b) { return decode_admin_reply(b, {}); });
  // Every single-byte corruption decodes or fails cleanly.
  std::vector<uint8_t> bytes = encode_admin_request(sample_request());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xc1}, uint8_t{0xdf}, uint8_t{0xff}}) {
      std::vector<uint8_t> b = bytes;
      b[i] = v;
      EXPECT_NO_THROW((void)decode_admin_request(b, {}));
      EXPECT_NO_THROW((void)decode_admin_reply(b, {}));
    }
  }
}

}  // namespace
}  // namespace eldr
