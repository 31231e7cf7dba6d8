// counts_message: round trips of versions 1 and 2, version and geometry checks, bad blocks skipped
// alone.
#include "cluster/wire/counts_message.hpp"

#include <gtest/gtest.h>

#include "core/base/msgpack.hpp"
#include "tests/support/protocol_test_cases.hpp"
#include "tests/support/random_ids.hpp"

namespace eldr {
namespace {

const model_geometry geo{2, 8, 2};

block_counts sample() {
  auto c = block_counts::from_parts(geo, 2, {0, 2, 4}, {1, 5, 6, 7}, {2, 2, 2, 2});
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

TEST(CountsMessage, RoundTrips) {
  counts_message m;
  m.geometry = geo;
  m.seq = 9;
  m.blocks.push_back({18446744073709539271ULL, std::nullopt, sample()});
  m.blocks.push_back({5, 18446744073709539271ULL, sample()});
  const auto bytes = encode_counts_message(m);
  std::vector<kv_decode_issue> issues;
  auto back = decode_counts_message(bytes, {}, issues);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(issues.empty());
  EXPECT_EQ(back->geometry, geo);
  EXPECT_EQ(*back->seq, 9u);
  ASSERT_EQ(back->blocks.size(), 2u);
  EXPECT_EQ(back->blocks[0].hash, 18446744073709539271ULL);
  EXPECT_FALSE(back->blocks[0].parent);
  EXPECT_EQ(*back->blocks[1].parent, 18446744073709539271ULL);
  EXPECT_EQ(back->blocks[1].counts.ids(), sample().ids());
  EXPECT_EQ(back->blocks[1].counts.counts(), sample().counts());
  EXPECT_EQ(back->blocks[1].counts.layer_offsets(), sample().layer_offsets());
}

TEST(CountsMessage, RefusesOtherVersionsAndBadBlocksAlone) {
  const auto geometry_2_8_2 = [](msgpack::writer& w) {
    w.write_array_header(3);
    w.write_uint(2);
    w.write_uint(8);
    w.write_uint(2);
  };
  std::vector<kv_decode_issue> issues;
  auto r = decode_counts_message(
      testing::map_payload()
          .uint("v", 3)
          .value("model", geometry_2_8_2)
          .value("blocks", [](msgpack::writer& w) { w.write_array_header(0); })
          .bytes(),
      {}, issues);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(counts_error_cause(r.error()), drop_cause::unsupported_version);

  // Block 0: expert id 9 >= E; block 1 fine.
  const auto two_blocks = [](msgpack::writer& w) {
    w.write_array_header(2);
    for (int b = 0; b < 2; ++b) {
      w.write_array_header(6);
      w.write_uint(static_cast<uint64_t>(b + 1));
      w.write_nil();
      w.write_uint(2);
      w.write_array_header(2);
      w.write_uint(2);
      w.write_uint(2);
      const std::vector<uint8_t> ids = {1, b == 0 ? uint8_t{9} : uint8_t{5}, 6, 7};
      const std::vector<uint8_t> counts = {2, 2, 2, 2};
      w.write_bin(ids);
      w.write_bin(counts);
    }
  };
  const auto out = testing::map_payload()
                       .value("blocks", two_blocks)
                       .value("model", geometry_2_8_2)
                       .uint("v", 1)
                       .bytes();
  r = decode_counts_message(out, {}, issues);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->blocks.size(), 1u);
  EXPECT_EQ(r->blocks[0].hash, 2u);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].cause, drop_cause::bad_counts);

  counts_decode_limits tight;
  tight.max_blocks = 1;
  r = decode_counts_message(out, tight, issues);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(counts_error_cause(r.error()), drop_cause::oversized);
}

// ---- version 2: models of more than 256 experts ----

// The "v" a payload carries, read with the plain MessagePack reader.
uint64_t version_of(const std::vector<uint8_t>& bytes) {
  msgpack::reader r(bytes.data(), bytes.size());
  const uint32_t pairs = *r.read_map_header();
  for (uint32_t i = 0; i < pairs; ++i) {
    if (*r.read_str() == "v") return *r.read_uint();
    EXPECT_TRUE(r.skip().ok());
  }
  return 0;
}

counts_message blocks_of(const model_geometry& g, uint32_t tokens, uint64_t seed) {
  const auto ids = testing::random_ids(g, tokens, seed);
  auto blocks = count_blocks(g, ids, 0, tokens, 16);
  EXPECT_TRUE(blocks.ok()) << blocks.error().to_string();
  counts_message m;
  m.geometry = g;
  m.seq = seed;
  for (size_t b = 0; b < blocks->size(); ++b)
    m.blocks.push_back(
        {1000 + b, b ? std::optional<uint64_t>(999 + b) : std::nullopt, (*blocks)[b]});
  return m;
}

void expect_same_blocks(const counts_message& a, const counts_message& b) {
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    EXPECT_EQ(a.blocks[i].hash, b.blocks[i].hash);
    EXPECT_EQ(a.blocks[i].parent, b.blocks[i].parent);
    EXPECT_EQ(a.blocks[i].counts.tokens(), b.blocks[i].counts.tokens());
    EXPECT_EQ(a.blocks[i].counts.ids(), b.blocks[i].counts.ids());
    EXPECT_EQ(a.blocks[i].counts.counts(), b.blocks[i].counts.counts());
    EXPECT_EQ(a.blocks[i].counts.layer_offsets(), b.blocks[i].counts.layer_offsets());
  }
}

// The top-level map is a field table: errors name "eldr-counts.<field>" and keep the code
// counts_error_cause maps to a drop cause.
TEST(CountsMessage, TableErrorsNameTheFieldAndKeepTheirCause) {
  counts_message m;
  m.geometry = geo;
  m.blocks.push_back({1, std::nullopt, sample()});
  // Re-encodes m's map with `key` replaced by `value` (dropped when value is empty).
  auto with = [&](const std::string& key, const std::vector<uint8_t>& value) {
    return testing::with_field(encode_counts_message(m), key, value);
  };
  auto expect = [](const std::vector<uint8_t>& bytes, const counts_decode_limits& limits,
                   drop_cause cause, const std::string& message) {
    std::vector<kv_decode_issue> issues;
    auto r = decode_counts_message(bytes, limits, issues);
    ASSERT_FALSE(r.ok()) << "expected: " << message;
    EXPECT_EQ(counts_error_cause(r.error()), cause) << r.error().message();
    EXPECT_EQ(r.error().message(), message);
  };
  std::vector<uint8_t> str;
  msgpack::writer(str).write_str("2,8,2");
  std::vector<uint8_t> v9;
  msgpack::writer(v9).write_uint(9);
  // Missing.
  expect(with("v", {}), {}, drop_cause::bad_batch, "eldr-counts.v: missing");
  expect(with("blocks", {}), {}, drop_cause::bad_batch, "eldr-counts.blocks: missing");
  // Wrong type, wrong value.
  expect(with("model", str), {}, drop_cause::bad_batch,
         "eldr-counts.model: expected array, found str");
  expect(with("v", v9), {}, drop_cause::unsupported_version,
         "eldr-counts.v: 9, this build reads versions 1 and 2");
  // Over the limit.
  expect(encode_counts_message(m), {.max_blocks = 0}, drop_cause::oversized,
         "eldr-counts.blocks: 1 blocks, limit 0");
}

TEST(CountsMessageWide, ModelsOfMoreThan256ExpertsRoundTripAsVersion2) {
  for (const model_geometry g : {model_geometry{4, 384, 8}, model_geometry{3, 512, 10}}) {
    const counts_message m = blocks_of(g, 40, 7);
    EXPECT_EQ(counts_message_version_for(g), counts_message_v2);
    const auto bytes = encode_counts_message(m);
    EXPECT_EQ(version_of(bytes), 2u);
    std::vector<kv_decode_issue> issues;
    auto back = decode_counts_message(bytes, {}, issues);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_TRUE(issues.empty());
    EXPECT_EQ(back->version, 2u);
    EXPECT_EQ(back->geometry, g);
    expect_same_blocks(*back, m);
  }
}

TEST(CountsMessageWide, ModelsOfAtMost256ExpertsStillEncodeAndDecodeVersion1) {
  for (const model_geometry g : {geo, model_geometry{3, 256, 8}}) {
    const counts_message m = blocks_of(g, 40, 8);
    const auto bytes = encode_counts_message(m);
    EXPECT_EQ(version_of(bytes), 1u) << g.to_string();
    std::vector<kv_decode_issue> issues;
    auto back = decode_counts_message(bytes, {}, issues);
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->version, 1u);
    expect_same_blocks(*back, m);
    // Version 2 of the same counts is read as well, to the same blocks.
    auto v2 = decode_counts_message(encode_counts_message(m, counts_message_v2), {}, issues);
    ASSERT_TRUE(v2.ok()) << v2.error().to_string();
    EXPECT_EQ(v2->version, 2u);
    expect_same_blocks(*v2, m);
    EXPECT_TRUE(issues.empty());
  }
}

// The bytes of docs/protocol.md's examples, written field by field with the plain writer.
std::vector<uint8_t> doc_example(uint64_t version, const model_geometry& g,
                                 const std::vector<uint8_t>& ids) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(3);
  w.write_str("v");
  w.write_uint(version);
  w.write_str("model");
  w.write_array_header(3);
  w.write_uint(g.layers);
  w.write_uint(g.experts);
  w.write_uint(g.top_k);
  w.write_str("blocks");
  w.write_array_header(1);
  w.write_array_header(6);
  w.write_uint(5);
  w.write_nil();
  w.write_uint(1);
  w.write_array_header(2);
  w.write_uint(2);
  w.write_uint(2);
  w.write_bin(ids);
  w.write_bin(std::vector<uint8_t>{1, 1, 1, 1});
  return out;
}

TEST(CountsMessageWide, TheProtocolDocumentsVersion2Example) {
  const model_geometry g{2, 512, 2};
  const auto bytes = doc_example(2, g, {0x03, 0x00, 0x2c, 0x01, 0x07, 0x00, 0xff, 0x01});
  std::vector<kv_decode_issue> issues;
  auto m = decode_counts_message(bytes, {}, issues);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  ASSERT_TRUE(issues.empty()) << issues[0].detail;
  ASSERT_EQ(m->blocks.size(), 1u);
  EXPECT_EQ(m->blocks[0].counts.ids(), (std::vector<expert_id>{3, 300, 7, 511}));
  // And the encoder writes exactly these bytes.
  EXPECT_EQ(encode_counts_message(*m), bytes);
}

TEST(CountsMessageWide, Version1CannotCarryMoreThan256Experts) {
  const model_geometry g{2, 512, 2};
  std::vector<kv_decode_issue> issues;
  auto m = decode_counts_message(doc_example(1, g, {3, 44, 7, 255}), {}, issues);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(counts_error_cause(m.error()), drop_cause::bad_batch);
  EXPECT_NE(m.error().message().find("version 1 holds one byte per expert id"), std::string::npos)
      << m.error().message();
}

TEST(CountsMessageWide, AVersion2BlockWithOneByteIdsIsSkippedAlone) {
  const model_geometry g{2, 512, 2};
  // 4 ids as 4 bytes (version 1's layout) in a version 2 message: the block is bad, not the batch.
  std::vector<kv_decode_issue> issues;
  auto m = decode_counts_message(doc_example(2, g, {3, 44, 7, 255}), {}, issues);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_TRUE(m->blocks.empty());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].cause, drop_cause::bad_counts);
  EXPECT_NE(issues[0].detail.find("ids of 2 byte(s)"), std::string::npos) << issues[0].detail;
  // An id >= E in two bytes is named like any other.
  issues.clear();
  m = decode_counts_message(doc_example(2, g, {3, 0, 0x2c, 0x01, 7, 0, 0x00, 0x02}), {}, issues);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_NE(issues[0].detail.find("expert id 512"), std::string::npos) << issues[0].detail;
}

// A message written block by block as counted (eldr-proxy's conversion) is the bytes of one made
// from block_counts, in both versions, with and without seq and parents; a producer's error and a
// wrong number of blocks are returned, not a message.
TEST(CountsMessage, WrittenAsCountedItIsTheSameBytes) {
  for (const model_geometry g : {model_geometry{6, 128, 8}, model_geometry{3, 384, 8}}) {
    const uint32_t tokens = 100, block_size = 16;
    const auto ids = testing::random_ids(g, tokens, 17);
    auto blocks = count_blocks(g, ids, 0, tokens, block_size);
    ASSERT_TRUE(blocks.ok());
    const auto n = static_cast<uint32_t>(blocks->size());
    for (const bool with_seq : {false, true}) {
      counts_message m;
      m.geometry = g;
      if (with_seq) m.seq = 77;
      for (uint32_t b = 0; b < n; ++b)
        m.blocks.push_back(
            {1000 + b, b % 3 == 0 ? std::nullopt : std::optional<uint64_t>(b), (*blocks)[b]});
      auto added = encode_counts_message_as_added(g, m.seq, n, 0, [&](counts_block_writer& w) {
        return for_each_block_count(g, ids, 0, tokens, block_size, 0,
                                    [&](uint32_t b, const block_counts_view& v) {
                                      w.add(m.blocks[b].hash, m.blocks[b].parent, v);
                                      return status{};
                                    });
      });
      ASSERT_TRUE(added.ok()) << added.error().to_string();
      EXPECT_EQ(*added, encode_counts_message(m)) << g.to_string() << " seq " << with_seq;
    }
    auto refused = encode_counts_message_as_added(g, std::nullopt, n, 0, [](counts_block_writer&) {
      return status::invalid_argument("the producer's reason");
    });
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().message(), "the producer's reason");
    auto short_of =
        encode_counts_message_as_added(g, std::nullopt, n + 1, 0, [&](counts_block_writer& w) {
          w.add(1, std::nullopt, (*blocks)[0].view());
          return status{};
        });
    ASSERT_FALSE(short_of.ok());
    EXPECT_EQ(short_of.error().code(), status_code::failed_precondition);
    EXPECT_NE(short_of.error().message().find("1 added"), std::string::npos);
  }
}

}  // namespace
}  // namespace eldr
