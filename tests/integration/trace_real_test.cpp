// trace on the two REAL recorded traces in shared/data: they parse, hold what the format document
// says they hold, and survive encode -> parse unchanged.
#include <gtest/gtest.h>

#include <cstddef>
#include <map>
#include <set>
#include <string>

#include "core/formats/trace.hpp"
#include "tests/support/test_data.hpp"

namespace eldr {
namespace {

// encode(t) parses back to t.
void expect_round_trip(const trace& t) {
  const std::vector<uint8_t> bytes = encode_trace(t);
  result<trace> back = parse_trace(bytes.data(), bytes.size(), "re-encoded");
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(*back == t);
}

TEST(TraceReal, EsftDeepseekV2LiteMatchesTheFormatDocument) {
  ELDR_REQUIRE_SHARED_DATA(path, "esft-deepseek-v2-lite.eldrtrace");
  result<trace> t = read_trace_file(path);
  ASSERT_TRUE(t.ok()) << t.error().to_string();

  EXPECT_EQ(t->geometry, (model_geometry{26, 64, 6}));
  EXPECT_EQ(t->requests.size(), 213u);
  EXPECT_EQ(t->total_tokens(), 33279u);
  std::map<std::string, size_t> labels;
  for (const trace_request& r : t->requests) {
    ++labels[r.label];
    EXPECT_FALSE(r.arrival_s.has_value()) << r.id;
  }
  const std::map<std::string, size_t> expected = {
      {"intent", 127}, {"law", 33}, {"summary", 13}, {"translation", 40}};
  EXPECT_EQ(labels, expected);
  // "the first half of each request is taken as the prompt"
  for (const trace_request& r : t->requests)
    EXPECT_EQ(r.prompt_tokens, r.total_tokens() / 2) << r.id;

  expect_round_trip(*t);
}

TEST(TraceReal, GraniteMatchesTheFormatDocument) {
  ELDR_REQUIRE_SHARED_DATA(path, "granite-3.0-1b-a400m.eldrtrace");
  result<trace> t = read_trace_file(path);
  ASSERT_TRUE(t.ok()) << t.error().to_string();

  EXPECT_EQ(t->geometry, (model_geometry{24, 32, 8}));
  ASSERT_EQ(t->requests.size(), 3u);
  std::set<std::string> labels;
  for (const trace_request& r : t->requests) {
    EXPECT_EQ(r.output_tokens, 64u) << r.id;
    EXPECT_GE(r.prompt_tokens, 1u) << r.id;
    labels.insert(r.label);
  }
  EXPECT_EQ(labels, (std::set<std::string>{"english_prose", "code", "math"}));

  expect_round_trip(*t);
}

TEST(TraceReal, RealFileTruncatedAnywhereIsAnErrorNamingTheFile) {
  ELDR_REQUIRE_SHARED_DATA(path, "granite-3.0-1b-a400m.eldrtrace");
  result<trace> t = read_trace_file(path);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  const std::vector<uint8_t> bytes = encode_trace(*t);
  // Every 97th cut, including inside request headers and expert blobs.
  for (size_t cut = 0; cut < bytes.size(); cut += 97) {
    const std::vector<uint8_t> prefix(bytes.begin(),
                                      bytes.begin() + static_cast<std::ptrdiff_t>(cut));
    result<trace> r = parse_trace(prefix.data(), prefix.size(), "granite-cut");
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.error().message().rfind("granite-cut: ", 0), 0u) << r.error().message();
  }
}

}  // namespace
}  // namespace eldr
