// wire_table: one table drives encode, decode and the error texts of a message. A toy message
// covers every factory and rule: exact bytes written, required fields missing, nil where it is
// and is not allowed, limits, wrong types, unknown fields skipped, nested maps, checks.
#include "cluster/wire/wire_table.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"

namespace eldr::wire {
namespace {

struct toy_limits {
  uint32_t max_payload_bytes = 1024;
  uint32_t max_name_bytes = 8;
  uint32_t max_items = 3;
};

enum class toy_color : uint8_t { red = 1, green = 2 };

struct toy {
  std::string name{};                // required, non-empty
  uint32_t count = 7;                // optional, nil resets to 7
  std::optional<uint64_t> big{};     // written when engaged
  bool flag = true;                  // optional, nil not allowed
  float ratio = 0.0f;                // f32
  toy_color color = toy_color::red;  // enum8
  std::string note{};                // omitted when empty
  std::vector<uint64_t> ids{};       // array, limit max_items
  std::vector<std::string> tags{};   // array of non-empty strings, omitted when empty
  std::string where{};               // zmq endpoint, "" = none
};

using L = toy_limits;
using F = fields<toy, L>;

const message_table<toy, L> toy_table{
    "toy",
    {
        F::str<&toy::name>("name", &L::max_name_bytes, required | nonempty),
        F::u32<&toy::count>("count", nil_ok),
        F::u64<&toy::big>("big", nil_ok),
        F::boolean<&toy::flag>("flag"),
        F::f32<&toy::ratio>("ratio"),
        F::enum8<&toy::color>("color"),
        F::str<&toy::note>("note", &L::max_name_bytes, nil_ok | omit_empty),
        F::u64s<&toy::ids>("ids", &L::max_items, "ids", required),
        F::strs<&toy::tags>("tags", &L::max_items, "tags", &L::max_name_bytes,
                            nonempty | omit_empty),
        F::endpoint<&toy::where>("where", &L::max_payload_bytes, endpoint_use::zmq_connect,
                                 nil_ok | omit_empty),
    }};

// The bytes of a toy message with the given fields (each a key and a writer of its value).
struct raw_field {
  std::string key;
  void (*value)(msgpack::writer&);
};
std::vector<uint8_t> raw(std::string_view type, const std::vector<raw_field>& fs) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(static_cast<uint32_t>(fs.size()) + 2);
  w.write_str("version");
  w.write_uint(1);
  w.write_str("type");
  w.write_str(type);
  for (const raw_field& f : fs) {
    w.write_str(f.key);
    f.value(w);
  }
  return out;
}

const raw_field name_field{"name", [](msgpack::writer& w) { w.write_str("box"); }};
const raw_field ids_field{"ids", [](msgpack::writer& w) {
                            w.write_array_header(2);
                            w.write_uint(1);
                            w.write_uint(2);
                          }};

result<toy> decode(std::span<const uint8_t> bytes, const toy_limits& limits = {}) {
  return toy_table.decode(bytes, limits.max_payload_bytes, 1, limits);
}

void expect_error(const result<toy>& r, status_code code, std::string_view text) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), code) << r.error().to_string();
  EXPECT_EQ(r.error().message(), text);
}

TEST(WireTable, EncodesTheFieldsInTableOrderLeavingOutAbsentOnes) {
  toy m;
  m.name = "box";
  m.ids = {1, 2};
  // note, big, tags and where are absent: not written.
  const std::vector<uint8_t> expected =
      raw("toy", {name_field,
                  {"count", [](msgpack::writer& w) { w.write_uint(7); }},
                  {"flag", [](msgpack::writer& w) { w.write_bool(true); }},
                  {"ratio", [](msgpack::writer& w) { w.write_float32(0.0f); }},
                  {"color", [](msgpack::writer& w) { w.write_uint(1); }},
                  ids_field});
  EXPECT_EQ(toy_table.encode(1, m), expected);
}

TEST(WireTable, EveryFieldRoundTrips) {
  toy m;
  m.name = "box";
  m.count = 3;
  m.big = 1ULL << 40;
  m.flag = false;
  m.ratio = 0.25f;
  m.color = toy_color::green;
  m.note = "hi";
  m.ids = {1, 2, UINT64_MAX};
  m.tags = {"a", "b"};
  m.where = "tcp://h:1";
  auto back = decode(toy_table.encode(1, m));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->name, "box");
  EXPECT_EQ(back->count, 3u);
  EXPECT_EQ(back->big, 1ULL << 40);
  EXPECT_FALSE(back->flag);
  EXPECT_EQ(back->ratio, 0.25f);
  EXPECT_EQ(back->color, toy_color::green);
  EXPECT_EQ(back->note, "hi");
  EXPECT_EQ(back->ids, m.ids);
  EXPECT_EQ(back->tags, m.tags);
  EXPECT_EQ(back->where, "tcp://h:1");
}

TEST(WireTable, AMissingRequiredFieldIsNamedInTableOrder) {
  expect_error(decode(raw("toy", {ids_field})), status_code::invalid_argument, "toy.name: missing");
  expect_error(decode(raw("toy", {name_field})), status_code::invalid_argument, "toy.ids: missing");
  expect_error(decode(raw("toy", {})), status_code::invalid_argument, "toy.name: missing");
}

TEST(WireTable, NilResetsAFieldThatAllowsItAndIsRefusedElsewhere) {
  const raw_field nil_count{"count", [](msgpack::writer& w) { w.write_nil(); }};
  const raw_field nil_big{"big", [](msgpack::writer& w) { w.write_nil(); }};
  auto m = decode(raw("toy", {name_field, ids_field, nil_count, nil_big}));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->count, 7u);  // the default toy declares, not 0
  EXPECT_FALSE(m->big.has_value());

  const raw_field nil_flag{"flag", [](msgpack::writer& w) { w.write_nil(); }};
  expect_error(decode(raw("toy", {name_field, ids_field, nil_flag})), status_code::invalid_argument,
               "toy.flag: expected bool, found nil");
  // A required field sent as nil is refused as a wrong type, not taken as absent.
  const raw_field nil_name{"name", [](msgpack::writer& w) { w.write_nil(); }};
  expect_error(decode(raw("toy", {nil_name, ids_field})), status_code::invalid_argument,
               "toy.name: expected str, found nil");
}

TEST(WireTable, ValuesOverTheirLimitAreOutOfRange) {
  const raw_field long_name{"name", [](msgpack::writer& w) { w.write_str("123456789"); }};
  expect_error(decode(raw("toy", {long_name, ids_field})), status_code::out_of_range,
               "toy.name: 9 bytes, limit 8");
  const raw_field many_ids{"ids", [](msgpack::writer& w) {
                             w.write_array_header(4);
                             for (int i = 0; i < 4; ++i)
                               w.write_uint(1);
                           }};
  expect_error(decode(raw("toy", {name_field, many_ids})), status_code::out_of_range,
               "toy.ids: 4 ids, limit 3");
  const raw_field long_tag{"tags", [](msgpack::writer& w) {
                             w.write_array_header(1);
                             w.write_str("123456789");
                           }};
  expect_error(decode(raw("toy", {name_field, ids_field, long_tag})), status_code::out_of_range,
               "toy.tags[0]: 9 bytes, limit 8");
  const raw_field big_color{"color", [](msgpack::writer& w) { w.write_uint(256); }};
  expect_error(decode(raw("toy", {name_field, ids_field, big_color})),
               status_code::invalid_argument, "toy.color: exceeds 255");
  const raw_field big_count{"count", [](msgpack::writer& w) { w.write_uint(1ULL << 32); }};
  expect_error(decode(raw("toy", {name_field, ids_field, big_count})),
               status_code::invalid_argument, "toy.count: exceeds 2^32-1");
}

TEST(WireTable, AWrongTypeIsNamedWithWhatWasFound) {
  const raw_field str_count{"count", [](msgpack::writer& w) { w.write_str("3"); }};
  expect_error(decode(raw("toy", {name_field, ids_field, str_count})),
               status_code::invalid_argument, "toy.count: expected int, found str");
  const raw_field bad_id{"ids", [](msgpack::writer& w) {
                           w.write_array_header(3);
                           w.write_uint(1);
                           w.write_uint(2);
                           w.write_int(-3);
                         }};
  expect_error(decode(raw("toy", {name_field, bad_id})), status_code::invalid_argument,
               "toy.ids[2]: expected int, found negative int");
  const raw_field empty_tag{"tags", [](msgpack::writer& w) {
                              w.write_array_header(2);
                              w.write_str("a");
                              w.write_str("");
                            }};
  expect_error(decode(raw("toy", {name_field, ids_field, empty_tag})),
               status_code::invalid_argument, "toy.tags[1]: empty");
  const raw_field empty_name{"name", [](msgpack::writer& w) { w.write_str(""); }};
  expect_error(decode(raw("toy", {empty_name, ids_field})), status_code::invalid_argument,
               "toy.name: empty");
  const raw_field inproc{"where", [](msgpack::writer& w) { w.write_str("inproc://x"); }};
  expect_error(decode(raw("toy", {name_field, ids_field, inproc})), status_code::invalid_argument,
               "toy.where: \"inproc://x\" is not tcp://HOST:PORT or ipc://PATH");
  // An integer where a float is written is a number all the same.
  const raw_field int_ratio{"ratio", [](msgpack::writer& w) { w.write_uint(1); }};
  auto m = decode(raw("toy", {name_field, ids_field, int_ratio}));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->ratio, 1.0f);
}

TEST(WireTable, UnknownFieldsAreSkippedAndAnotherTypeIsNotFound) {
  const raw_field unknown{"later", [](msgpack::writer& w) {
                            w.write_map_header(1);
                            w.write_str("x");
                            w.write_array_header(1);
                            w.write_nil();
                          }};
  auto m = decode(raw("toy", {unknown, name_field, ids_field}));
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->name, "box");
  expect_error(decode(raw("box", {name_field, ids_field})), status_code::not_found,
               "toy.type: \"box\"");
}

// A nested map is a table of its own, read with read_map and written with write_map.
struct inner {
  std::string policy{};
  float tau = 0.0f;
};
const message_table<inner, L> inner_table{
    "toy.inner",
    {
        fields<inner, L>::str<&inner::policy>("policy", &L::max_name_bytes, required),
        fields<inner, L>::f32<&inner::tau>("tau"),
    }};

result<inner> read_inner(const std::vector<uint8_t>& bytes) {
  msgpack::reader r(bytes.data(), bytes.size());
  msgpack::item map;
  if (status s = next_of(r, msgpack::kind::map, "toy.inner", map); !s.ok()) return s;
  inner m;
  toy_limits limits;
  std::monostate none;
  if (status s = inner_table.read_map(r, map.length, {limits, bytes, none}, m); !s.ok()) return s;
  return m;
}

TEST(WireTable, NestedMapsCheckTheirKeysAndRequiredFields) {
  std::vector<uint8_t> bytes;
  inner_table.write_map(bytes, {"eldr", 0.5f});
  auto back = read_inner(bytes);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->policy, "eldr");
  EXPECT_EQ(back->tau, 0.5f);

  auto missing_policy =
      read_inner(testing::map_payload()
                     .value("tau", [](msgpack::writer& w) { w.write_float32(1.0f); })
                     .str("unknown", "skipped")
                     .bytes());
  ASSERT_FALSE(missing_policy.ok());
  EXPECT_EQ(missing_policy.error().message(), "toy.inner.policy: missing");

  std::vector<uint8_t> int_key;
  msgpack::writer w3(int_key);
  w3.write_map_header(1);
  w3.write_uint(1);
  w3.write_str("x");
  auto bad_key = read_inner(int_key);
  ASSERT_FALSE(bad_key.ok());
  EXPECT_EQ(bad_key.error().message(), "toy.inner key: expected str, found int");
}

// checked() runs after a successful read; written_when() decides presence; the message's rule
// runs last and sees which fields were read (nil is not).
struct gated {
  bool ok = false;
  std::string detail{};
};
const message_table<gated, L> gated_table{
    "gated",
    {
        fields<gated, L>::boolean<&gated::ok>("ok", required),
        fields<gated, L>::str<&gated::detail>("detail", 8, nil_ok)
            .written_when([](const gated& m) { return !m.ok; })
            .checked([](std::string_view what, const gated& m) -> status {
              if (m.detail == "bad") return status::invalid_argument(join(what, ": is bad"));
              return {};
            }),
    },
    [](const gated& m, uint64_t seen) {
      if (!m.ok && !(seen & gated_table.bit("detail"))) return missing("gated", "detail");
      return status{};
    }};

result<gated> decode_gated(std::span<const uint8_t> bytes) {
  return gated_table.decode(bytes, 1024, 1, toy_limits{});
}

TEST(WireTable, WrittenWhenCheckedAndTheMessageRuleApply) {
  EXPECT_EQ(gated_table.count({true, "x"}), 1u);
  EXPECT_EQ(gated_table.count({false, ""}), 2u);
  auto bad = decode_gated(gated_table.encode(1, {false, "bad"}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "gated.detail: is bad");
  auto fine = decode_gated(gated_table.encode(1, {false, "fine"}));
  ASSERT_TRUE(fine.ok()) << fine.error().to_string();
  EXPECT_EQ(fine->detail, "fine");
  ASSERT_TRUE(decode_gated(gated_table.encode(1, {true, "unsent"})).ok());

  const raw_field not_ok{"ok", [](msgpack::writer& w) { w.write_bool(false); }};
  const raw_field nil_detail{"detail", [](msgpack::writer& w) { w.write_nil(); }};
  auto nil = decode_gated(raw("gated", {not_ok, nil_detail}));
  ASSERT_FALSE(nil.ok());
  EXPECT_EQ(nil.error().code(), status_code::invalid_argument);
  EXPECT_EQ(nil.error().message(), "gated.detail: missing");
  // A fixed limit, not one of the limits struct's.
  const raw_field long_detail{"detail", [](msgpack::writer& w) { w.write_str("123456789"); }};
  auto over = decode_gated(raw("gated", {not_ok, long_detail}));
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().message(), "gated.detail: 9 bytes, limit 8");
  EXPECT_EQ(gated_table.bit("ok"), 1u);
  EXPECT_EQ(gated_table.bit("no such field"), 0u);
}

}  // namespace
}  // namespace eldr::wire
