// trace: eldr-trace v1 and v2 round trips, one test per malformation with the message checked for
// the file and field it names, truncation/corruption at every byte, and atomic file writes.
#include "core/formats/trace.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

using bytes = std::vector<uint8_t>;
using field_writer = std::function<void(msgpack::writer&)>;

// ---- a valid little trace, and a document model to break it one field at a time ----

// L=2 E=8 k=2. Request "a": 2 prompt + 1 output token, no arrival; "b": 1 + 2, arrival 0.25.
trace small_trace() {
  trace t;
  t.model_name = "tiny-moe";
  t.geometry = {2, 8, 2};
  t.source = "unit test";
  trace_request a;
  a.id = "a";
  a.label = "code";
  a.prompt_tokens = 2;
  a.output_tokens = 1;
  a.experts = {0, 1, 2, 3, 4, 5, 6, 7, 1, 0, 3, 2};
  trace_request b;
  b.id = "b";
  b.label = "math";
  b.prompt_tokens = 1;
  b.output_tokens = 2;
  b.arrival_s = 0.25;
  b.experts = {7, 6, 5, 4, 3, 2, 1, 0, 0, 7, 1, 6};
  t.requests = {a, b};
  return t;
}

field_writer u(uint64_t v) {
  return [v](msgpack::writer& w) { w.write_uint(v); };
}
field_writer i64(int64_t v) {
  return [v](msgpack::writer& w) { w.write_int(v); };
}
field_writer s(std::string v) {
  return [v](msgpack::writer& w) { w.write_str(v); };
}
field_writer f64(double v) {
  return [v](msgpack::writer& w) { w.write_float64(v); };
}
field_writer bin(bytes v) {
  return [v](msgpack::writer& w) { w.write_bin(v); };
}

// Ids as the format document lays them out, written here independently of the code under test:
// version 1 one byte each, version 2 little-endian uint16.
bytes id_bytes(const std::vector<expert_id>& ids, uint64_t version) {
  bytes out;
  for (expert_id id : ids) {
    out.push_back(static_cast<uint8_t>(id & 0xff));
    if (version == 2) out.push_back(static_cast<uint8_t>(id >> 8));
  }
  return out;
}

// An ordered map whose values are written by callbacks.
struct fields {
  std::vector<std::pair<std::string, field_writer>> items;

  fields& set(const std::string& key, field_writer fw) {
    for (auto& [k, v] : items)
      if (k == key) {
        v = std::move(fw);
        return *this;
      }
    items.emplace_back(key, std::move(fw));
    return *this;
  }
  fields& erase(const std::string& key) {
    std::erase_if(items, [&](const auto& kv) { return kv.first == key; });
    return *this;
  }
  void write(msgpack::writer& w) const {
    w.write_map_header(static_cast<uint32_t>(items.size()));
    for (const auto& [k, v] : items) {
      w.write_str(k);
      v(w);
    }
  }
};

// A trace file as three editable layers; "model" and "requests" at the top are written from the
// model and requests members unless a test replaces them.
struct document {
  fields top, model;
  std::vector<fields> requests;

  // In version 1 unless the model has more than 256 experts, as the encoder chooses.
  static document from(const trace& t) { return from(t, t.geometry.experts <= 256 ? 1 : 2); }
  static document from(const trace& t, uint64_t version) {
    document d;
    d.top.set("format", s("eldr-trace")).set("version", u(version)).set("model", nullptr);
    d.top.set("source", s(t.source)).set("requests", nullptr);
    d.model.set("name", s(t.model_name))
        .set("layers", u(t.geometry.layers))
        .set("experts", u(t.geometry.experts))
        .set("top_k", u(t.geometry.top_k));
    for (const trace_request& r : t.requests) {
      fields f;
      f.set("id", s(r.id)).set("label", s(r.label));
      f.set("prompt_tokens", u(r.prompt_tokens)).set("output_tokens", u(r.output_tokens));
      if (r.arrival_s) f.set("arrival_s", f64(*r.arrival_s));
      f.set("experts", bin(id_bytes(r.experts, version)));
      d.requests.push_back(f);
    }
    return d;
  }

  bytes encode() const {
    bytes out;
    msgpack::writer w(out);
    w.write_map_header(static_cast<uint32_t>(top.items.size()));
    for (const auto& [k, v] : top.items) {
      w.write_str(k);
      if (v) {
        v(w);
      } else if (k == "model") {
        model.write(w);
      } else {
        w.write_array_header(static_cast<uint32_t>(requests.size()));
        for (const fields& r : requests)
          r.write(w);
      }
    }
    return out;
  }
};

result<trace> parse(const bytes& b) {
  return parse_trace(b.data(), b.size(), "t.eldrtrace");
}

// The parse fails as corrupt, and the message starts with the file name and contains every piece.
void expect_error(const bytes& b, const std::vector<std::string>& pieces) {
  result<trace> r = parse(b);
  ASSERT_FALSE(r.ok()) << "parsed a malformed file";
  EXPECT_EQ(r.error().code(), status_code::corrupt);
  const std::string& m = r.error().message();
  EXPECT_EQ(m.rfind("t.eldrtrace: ", 0), 0u) << m;
  for (const std::string& piece : pieces)
    EXPECT_NE(m.find(piece), std::string::npos) << "missing \"" << piece << "\" in: " << m;
}

// The top-level `key` left out of the small trace, then given each of `wrong` in turn: every file
// fails, naming the pieces listed with its value.
void expect_top_level_key_checked(
    const std::string& key,
    const std::vector<std::pair<field_writer, std::vector<std::string>>>& wrong) {
  document d = document::from(small_trace());
  d.top.erase(key);
  {
    SCOPED_TRACE(key + " missing");
    expect_error(d.encode(), {"eldr-trace." + key + ": missing"});
  }
  for (size_t i = 0; i < wrong.size(); ++i) {
    SCOPED_TRACE(key + " given wrong value " + std::to_string(i));
    d.top.set(key, wrong[i].first);
    expect_error(d.encode(), wrong[i].second);
  }
}

// ---- round trips ----

TEST(Trace, RoundTripsWithAndWithoutArrival) {
  const trace t = small_trace();
  ASSERT_TRUE(validate_trace(t).ok()) << validate_trace(t).to_string();
  const bytes b = encode_trace(t);
  result<trace> back = parse(b);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, t);
  EXPECT_FALSE(back->requests[0].arrival_s.has_value());
  ASSERT_TRUE(back->requests[1].arrival_s.has_value());
  EXPECT_EQ(*back->requests[1].arrival_s, 0.25);
  EXPECT_EQ(back->total_tokens(), 6u);
  // Deterministic bytes: encoding what was parsed reproduces the file.
  EXPECT_EQ(encode_trace(*back), b);
}

TEST(Trace, EncoderAndTestDocumentAgree) {
  // The document model used by the malformation tests starts from exactly the encoder's bytes.
  EXPECT_EQ(document::from(small_trace()).encode(), encode_trace(small_trace()));
}

TEST(Trace, TokenExpertsIndexesTokenMajor) {
  const trace t = small_trace();
  const trace_request& a = t.requests[0];
  // Token 1, layer 0 is bytes (1 * 2 + 0) * 2 = 4..5.
  const expert_id* ids = a.token_experts(t.geometry, 1, 0);
  EXPECT_EQ(ids, a.experts.data() + 4);
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 5);
  EXPECT_EQ(a.token_experts(t.geometry, 2, 1)[1], 2);
}

TEST(Trace, UnknownKeysAreIgnoredAtEveryLevel) {
  document d = document::from(small_trace());
  d.top.set("comment", [](msgpack::writer& w) {
    w.write_map_header(1);
    w.write_str("nested");
    w.write_array_header(2);
    w.write_nil();
    w.write_ext(3, bytes{1, 2, 3});
  });
  d.model.set("gate", s("softmax"));
  d.requests[0].set("gate_scores", bin(bytes(40, 9)));
  result<trace> r = parse(d.encode());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, small_trace());
}

TEST(Trace, KeyOrderDoesNotMatter) {
  document d = document::from(small_trace());
  std::reverse(d.top.items.begin(), d.top.items.end());
  std::reverse(d.model.items.begin(), d.model.items.end());
  for (fields& f : d.requests)
    std::reverse(f.items.begin(), f.items.end());
  result<trace> r = parse(d.encode());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, small_trace());
}

TEST(Trace, LabelAndSourceMayBeAbsent) {
  document d = document::from(small_trace());
  d.top.erase("source");
  d.requests[0].erase("label");
  result<trace> r = parse(d.encode());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->source, "");
  EXPECT_EQ(r->requests[0].label, "");
  EXPECT_EQ(r->requests[1].label, "math");
}

TEST(Trace, ArrivalAcceptsIntegersAndFloat32) {
  document d = document::from(small_trace());
  d.requests[0].set("arrival_s", u(3));
  d.requests[1].set("arrival_s", [](msgpack::writer& w) { w.write_float32(1.5f); });
  result<trace> r = parse(d.encode());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->requests[0].arrival_s, 3.0);
  EXPECT_EQ(r->requests[1].arrival_s, 1.5);
}

// ---- malformations, each with the field it must name ----

TEST(TraceErrors, EmptyInput) {
  expect_error({}, {"empty file"});
}

TEST(TraceErrors, TopLevelNotAMap) {
  bytes b;
  msgpack::writer w(b);
  w.write_array_header(0);
  expect_error(b, {"eldr-trace: expected map, found array"});
}

TEST(TraceErrors, FormatMissingWrongOrNotAString) {
  expect_top_level_key_checked(
      "format",
      {{s("eldr-trace-v2"), {"eldr-trace.format: \"eldr-trace-v2\"", "expected \"eldr-trace\""}},
       {u(1), {"eldr-trace.format: expected str", "found int"}}});
}

TEST(TraceErrors, VersionMissingWrongOrNotAnInteger) {
  expect_top_level_key_checked("version",
                               {{u(3), {"eldr-trace.version: 3", "this build reads 1 and 2"}},
                                {i64(-1), {"eldr-trace.version: expected int, found negative int"}},
                                {f64(1.0), {"eldr-trace.version: expected int", "float64"}}});
}

TEST(TraceErrors, ModelMissingOrNotAMap) {
  expect_top_level_key_checked("model",
                               {{s("qwen"), {"eldr-trace.model: expected map, found str"}}});
}

TEST(TraceErrors, EachModelKeyIsRequired) {
  for (const char* key : {"name", "layers", "experts", "top_k"}) {
    document d = document::from(small_trace());
    d.model.erase(key);
    expect_error(d.encode(), {"eldr-trace.model." + std::string(key) + ": missing"});
  }
}

TEST(TraceErrors, ModelFieldsWithWrongTypes) {
  document d = document::from(small_trace());
  d.model.set("name", u(3));
  expect_error(d.encode(), {"eldr-trace.model.name: expected str"});
  d = document::from(small_trace());
  d.model.set("layers", s("26"));
  expect_error(d.encode(), {"eldr-trace.model.layers: expected int, found str"});
  d.model.set("layers", i64(-2));
  expect_error(d.encode(), {"eldr-trace.model.layers: expected int, found negative int"});
  d.model.set("layers", u(1ull << 33));
  expect_error(d.encode(), {"eldr-trace.model.layers: exceeds 2^32-1"});
}

TEST(TraceErrors, GeometryBounds) {
  struct case_t {
    uint64_t layers, experts, top_k;
    std::string piece;
  };
  const case_t cases[] = {{0, 8, 2, "layers must be >= 1"},
                          {2, 0, 1, "experts must be in 1..4096, got 0"},
                          {2, 4097, 2, "experts must be in 1..4096, got 4097"},
                          {512, 4096, 2, "layers * experts must be <= 1048576"},
                          {2, 8, 0, "top_k must be in 1..experts (8), got 0"},
                          {2, 8, 9, "top_k must be in 1..experts (8), got 9"}};
  for (const case_t& c : cases) {
    document d = document::from(small_trace());
    d.model.set("layers", u(c.layers)).set("experts", u(c.experts)).set("top_k", u(c.top_k));
    expect_error(d.encode(), {"model: ", c.piece});
  }
}

TEST(TraceErrors, RequestsMissingOrNotAnArray) {
  const field_writer int_element = [](msgpack::writer& w) {
    w.write_array_header(1);
    w.write_uint(7);
  };
  expect_top_level_key_checked(
      "requests", {{s("none"), {"eldr-trace.requests: expected array, found str"}},
                   {int_element, {"eldr-trace.requests[0]: expected map, found int"}}});
}

TEST(TraceErrors, EachRequestKeyIsRequired) {
  document d = document::from(small_trace());
  d.requests[1].erase("id");
  expect_error(d.encode(), {"eldr-trace.requests[1].id: missing"});
  for (const char* key : {"prompt_tokens", "output_tokens", "experts"}) {
    d = document::from(small_trace());
    d.requests[1].erase(key);
    expect_error(d.encode(),
                 {"eldr-trace.requests[1] (id \"b\")." + std::string(key) + ": missing"});
  }
}

TEST(TraceErrors, RequestFieldsWithWrongTypes) {
  struct case_t {
    std::string key;
    field_writer value;
    std::string piece;
  };
  const case_t cases[] = {
      {"id", u(4), "eldr-trace.requests[0].id: expected str, found int"},
      {"label", u(4), "eldr-trace.requests[0] (id \"a\").label: expected str"},
      {"prompt_tokens", s("2"), "eldr-trace.requests[0] (id \"a\").prompt_tokens: expected int"},
      {"output_tokens", i64(-1),
       "eldr-trace.requests[0] (id \"a\").output_tokens: expected int, found negative int"},
      {"arrival_s", s("soon"),
       "eldr-trace.requests[0] (id \"a\").arrival_s: expected a number, found str"},
      {"experts", s("0123"), "eldr-trace.requests[0] (id \"a\").experts: expected bin, found str"},
  };
  for (const case_t& c : cases) {
    document d = document::from(small_trace());
    d.requests[0].set(c.key, c.value);
    expect_error(d.encode(), {c.piece});
  }
}

TEST(TraceErrors, FieldsOverTheirLimits) {
  document d = document::from(small_trace());
  d.requests[0].set("id", s(std::string(5000, 'x')));
  expect_error(d.encode(), {"eldr-trace.requests[0].id: 5000 bytes, limit 4096"});
  d = document::from(small_trace());
  d.model.set("name", s(std::string(4097, 'm')));
  expect_error(d.encode(), {"eldr-trace.model.name: 4097 bytes, limit 4096"});
  d = document::from(small_trace());
  d.requests[1].set("label", s("\xff"));
  expect_error(d.encode(), {"eldr-trace.requests[1] (id \"b\").label: not valid UTF-8 at byte 0"});
}

TEST(TraceErrors, PromptTokensBelowOne) {
  trace t = small_trace();
  t.requests[0].prompt_tokens = 0;
  t.requests[0].output_tokens = 3;  // keeps the experts length right: only the prompt is wrong
  expect_error(encode_trace(t), {"requests[0] (id \"a\"): prompt_tokens must be >= 1, got 0"});
}

TEST(TraceErrors, ExpertsTruncatedOrOversized) {
  trace t = small_trace();
  t.requests[1].experts.pop_back();
  expect_error(encode_trace(t),
               {"requests[1] (id \"b\"): experts has 11 ids, expected",
                "(prompt_tokens + output_tokens) * layers * top_k = (1 + 2) * 2 * 2 = 12"});
  t = small_trace();
  t.requests[1].experts.push_back(0);
  expect_error(encode_trace(t), {"requests[1] (id \"b\"): experts has 13 ids"});
}

TEST(TraceErrors, ExpertIdOutOfRangeNamesRequestTokenAndLayer) {
  trace t = small_trace();
  // Request b, token 2 (its second output token), layer 1, choice 0: byte (2 * 2 + 1) * 2.
  t.requests[1].experts[10] = 8;
  expect_error(encode_trace(t), {"requests[1] (id \"b\"): token 2 (output token 1), layer 1",
                                 "expert id 8 >= experts (8)"});
}

TEST(TraceErrors, DuplicateExpertWithinOneTokenAndLayer) {
  trace t = small_trace();
  t.requests[0].experts[3] = t.requests[0].experts[2];  // token 0, layer 1: {2, 2}
  expect_error(encode_trace(t), {"requests[0] (id \"a\"): token 0 (prompt token 0), layer 1",
                                 "expert id 2 chosen twice"});
}

TEST(TraceErrors, DuplicateRequestIds) {
  trace t = small_trace();
  t.requests[1].id = "a";
  expect_error(encode_trace(t),
               {"requests[1] (id \"a\"): duplicate id, first used by requests[0]"});
}

TEST(TraceErrors, EmptyRequestId) {
  trace t = small_trace();
  t.requests[0].id = "";
  expect_error(encode_trace(t), {"requests[0]: id is empty"});
}

TEST(TraceErrors, ArrivalMustBeFiniteAndNonNegative) {
  for (double bad :
       {-1.0, std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
    trace t = small_trace();
    t.requests[1].arrival_s = bad;
    expect_error(encode_trace(t), {"requests[1] (id \"b\"): arrival_s must be a finite number"});
  }
}

TEST(TraceErrors, DuplicateKnownKey) {
  document d = document::from(small_trace());
  d.top.items.emplace_back("version", u(1));
  expect_error(d.encode(), {"eldr-trace.version: duplicate"});
  d = document::from(small_trace());
  d.requests[0].items.emplace_back("experts", bin({}));
  expect_error(d.encode(), {"eldr-trace.requests[0] (id \"a\").experts: duplicate"});
}

TEST(TraceErrors, NonStringKey) {
  bytes b;
  msgpack::writer w(b);
  w.write_map_header(1);
  w.write_uint(1);
  w.write_uint(2);
  expect_error(b, {"eldr-trace key: expected str, found int"});
}

TEST(TraceErrors, TrailingBytes) {
  bytes b = encode_trace(small_trace());
  const size_t end = b.size();
  b.push_back(0xc0);
  b.push_back(0xc0);
  expect_error(b, {"2 trailing byte(s) after the top-level map", std::to_string(end)});
}

TEST(TraceErrors, TooDeepUnknownValue) {
  document d = document::from(small_trace());
  d.top.set("junk", [](msgpack::writer& w) {
    for (int i = 0; i < 1000; ++i)
      w.write_array_header(1);
    w.write_nil();
  });
  expect_error(d.encode(), {"eldr-trace.junk: msgpack: nesting deeper than"});
}

// ---- robustness ----

// `t` encodes to a file that parses, and every proper prefix of it fails as corrupt, naming the
// file.
void expect_every_truncation_fails(const trace& t) {
  const bytes full = encode_trace(t);
  ASSERT_TRUE(parse(full).ok());
  for (size_t cut = 0; cut < full.size(); ++cut) {
    // An exactly-sized copy, so a sanitizer build catches any read past the end.
    const bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
    result<trace> r = parse(prefix);
    ASSERT_FALSE(r.ok()) << "a " << cut << "-byte prefix parsed";
    EXPECT_EQ(r.error().code(), status_code::corrupt);
    EXPECT_EQ(r.error().message().rfind("t.eldrtrace: ", 0), 0u);
  }
}

TEST(TraceRobustness, EveryTruncationFailsCleanly) {
  expect_every_truncation_fails(small_trace());
}

TEST(TraceRobustness, EverySingleByteCorruptionIsHandled) {
  // Parsing may succeed (e.g. a changed expert id still in range) or fail; it must never crash,
  // and a success must still be a valid trace.
  const bytes full = encode_trace(small_trace());
  for (size_t at = 0; at < full.size(); ++at)
    for (uint8_t v : {0x00, 0x07, 0x7f, 0x80, 0xc1, 0xcc, 0xdb, 0xdd, 0xdf, 0xff}) {
      bytes b = full;
      b[at] = v;
      result<trace> r = parse(b);
      if (r.ok()) {
        EXPECT_TRUE(validate_trace(*r).ok());
      } else {
        EXPECT_EQ(r.error().code(), status_code::corrupt);
      }
    }
}

// ---- wide models (more than 256 experts): version 2 ----

// small_trace's shape with E experts: the same tokens, every id moved up into the wide range
// (id + E - 8), so that most ids need two bytes.
trace wide_trace(uint32_t experts) {
  trace t = small_trace();
  t.model_name = "wide-moe";
  t.geometry.experts = experts;
  for (trace_request& r : t.requests)
    for (expert_id& id : r.experts)
      id = static_cast<expert_id>(id + experts - 8);
  return t;
}

TEST(TraceWide, ModelsOfMoreThan256ExpertsRoundTripAsVersion2) {
  for (uint32_t experts : {384u, 512u}) {
    const trace t = wide_trace(experts);
    ASSERT_TRUE(validate_trace(t).ok()) << validate_trace(t).to_string();
    EXPECT_EQ(trace_version_for(t.geometry), 2u);
    const bytes b = encode_trace(t);
    // The bytes are the format document's version 2: ids little-endian, two bytes each.
    EXPECT_EQ(b, document::from(t, 2).encode()) << experts;
    result<trace> back = parse(b);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(*back, t);
    EXPECT_EQ(back->requests[1].experts[0], experts - 1);  // 7 + E - 8: above 255
  }
}

TEST(TraceWide, ModelsOfAtMost256ExpertsStillWriteVersion1) {
  EXPECT_EQ(trace_version_for(small_trace().geometry), 1u);
  const trace t = wide_trace(256);  // ids 248..255: the largest that fit a byte
  EXPECT_EQ(trace_version_for(t.geometry), 1u);
  EXPECT_EQ(encode_trace(t), document::from(t, 1).encode());
  result<trace> back = parse(encode_trace(t));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, t);
}

TEST(TraceWide, Version2OfANarrowModelIsReadToo) {
  const trace t = small_trace();
  result<trace> back = parse(document::from(t, 2).encode());
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, t);
  EXPECT_EQ(encode_trace(t, 2), document::from(t, 2).encode());
}

TEST(TraceWide, Version1CannotDeclareMoreThan256Experts) {
  document d = document::from(wide_trace(384), 1);  // ids truncated to a byte: never read
  expect_error(d.encode(), {"eldr-trace.model.experts: 384", "version 1 holds one byte per id",
                            "wider models need version 2"});
}

TEST(TraceWide, Version2ExpertsOfOddLengthAreRefused) {
  document d = document::from(wide_trace(512), 2);
  bytes odd = id_bytes(wide_trace(512).requests[0].experts, 2);
  odd.pop_back();
  d.requests[0].set("experts", bin(odd));
  expect_error(d.encode(),
               {"requests[0] (id \"a\")", "experts: 23 bytes", "not a whole number of 2-byte ids"});
}

TEST(TraceWide, WideIdsAreRangeCheckedAndDistinctPerTokenAndLayer) {
  trace t = wide_trace(384);
  t.requests[1].experts[10] = 384;  // token 2, layer 1, choice 0
  expect_error(encode_trace(t), {"requests[1] (id \"b\"): token 2 (output token 1), layer 1",
                                 "expert id 384 >= experts (384)"});
  t = wide_trace(384);
  t.requests[0].experts[3] = t.requests[0].experts[2];  // token 0, layer 1: {378, 378}
  expect_error(encode_trace(t), {"requests[0] (id \"a\"): token 0 (prompt token 0), layer 1",
                                 "expert id 378 chosen twice"});
  // The same wide ids again at the next token and layer are fine: each token-layer is its own set.
  t = wide_trace(512);
  for (size_t i = 0; i < t.requests[0].experts.size(); i += 2) {
    t.requests[0].experts[i] = 300;
    t.requests[0].experts[i + 1] = 511;
  }
  EXPECT_TRUE(validate_trace(t).ok()) << validate_trace(t).to_string();
}

TEST(TraceWide, EveryTruncationOfAVersion2FileFailsCleanly) {
  expect_every_truncation_fails(wide_trace(512));
}

// ---- validation of in-memory traces ----

TEST(ValidateTrace, ReportsInvalidArgumentWithoutAFileName) {
  trace t = small_trace();
  EXPECT_TRUE(validate_trace(t).ok());
  t.geometry.top_k = 9;
  const status s = validate_trace(t);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_NE(s.message().find("top_k"), std::string::npos);
  t = small_trace();
  t.requests[0].experts[0] = 200;
  EXPECT_NE(validate_trace(t).message().find("expert id 200 >= experts (8)"), std::string::npos);
}

TEST(ValidateTrace, AcceptsZeroOutputTokensAndEmptyTraces) {
  trace t = small_trace();
  t.requests[0].output_tokens = 0;
  t.requests[0].experts.resize(8);
  EXPECT_TRUE(validate_trace(t).ok());
  t.requests.clear();
  EXPECT_TRUE(validate_trace(t).ok());
  result<trace> r = parse(encode_trace(t));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->requests.empty());
}

// ---- files ----

class TraceFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    dir_ = std::filesystem::temp_directory_path() /
           ("eldr-trace-test-" + std::to_string(stamp) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::filesystem::path dir_;
};

TEST_F(TraceFiles, WriteThenReadRoundTripsAndLeavesNoTemporaryFile) {
  const std::string path = (dir_ / "small.eldrtrace").string();
  ASSERT_TRUE(write_trace_file(small_trace(), path).ok());
  // Overwriting replaces the file in one step.
  trace changed = small_trace();
  changed.source = "second write";
  ASSERT_TRUE(write_trace_file(changed, path).ok());
  result<trace> back = read_trace_file(path);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(*back, changed);
  EXPECT_EQ(listing(), std::vector<std::string>{"small.eldrtrace"});
}

TEST_F(TraceFiles, InvalidTraceIsNotWritten) {
  trace t = small_trace();
  t.requests[1].id = "a";
  const std::string path = (dir_ / "bad.eldrtrace").string();
  const status s = write_trace_file(t, path);
  EXPECT_EQ(s.code(), status_code::invalid_argument);
  EXPECT_TRUE(listing().empty());
}

TEST_F(TraceFiles, WriteIntoMissingFolderIsAnIoError) {
  const std::string path = (dir_ / "no" / "such" / "x.eldrtrace").string();
  const status s = write_trace_file(small_trace(), path);
  EXPECT_EQ(s.code(), status_code::io_error);
  EXPECT_NE(s.message().find(path), std::string::npos);
}

TEST_F(TraceFiles, ReadErrorsNameThePath) {
  const std::string missing = (dir_ / "missing.eldrtrace").string();
  result<trace> r = read_trace_file(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::not_found);
  EXPECT_NE(r.error().message().find(missing), std::string::npos);

  r = read_trace_file(dir_.string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::io_error);

  const std::string garbage = (dir_ / "garbage.eldrtrace").string();
  std::ofstream(garbage, std::ios::binary) << "hello";
  r = read_trace_file(garbage);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), status_code::corrupt);
  EXPECT_EQ(r.error().message().rfind(garbage + ": ", 0), 0u) << r.error().message();
}

TEST(TraceFuzzCorpus, SeedsAreValidTraces) {
  // The fuzz target starts from these; if the format changes they must be regenerated.
  const std::filesystem::path dir =
      std::filesystem::path(ELDR_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / "trace_fuzz";
  size_t seeds = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    result<trace> r = read_trace_file(e.path().string());
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    ++seeds;
  }
  EXPECT_GE(seeds, 3u);
}

}  // namespace
}  // namespace eldr
