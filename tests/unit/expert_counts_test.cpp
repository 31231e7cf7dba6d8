// expert_counts: dense per-request counts and sparse per-block counts agree exactly.
#include "core/expert_counts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <span>
#include <string>

#include "core/base/random.hpp"
#include "tests/support/random_ids.hpp"

namespace eldr {
namespace {

using namespace eldr::testing;  // random_ids, prompt_counts, make_random_prompt

TEST(ExpertCounts, EveryLayerSumsToTokensTimesTopK) {
  const model_geometry g{4, 16, 3};
  const auto ids = random_ids(g, 10, 1);
  const std::vector<uint32_t> counts = prompt_counts(g, ids, 10);
  ASSERT_EQ(counts.size(), g.width());
  for (uint32_t l = 0; l < g.layers; ++l) {
    uint32_t sum = 0;
    for (uint32_t e = 0; e < g.experts; ++e)
      sum += counts[l * g.experts + e];
    EXPECT_EQ(sum, 10u * g.top_k);
  }
}

TEST(ExpertCounts, BlocksSumToTheWholePromptForEveryBlockSize) {
  const model_geometry g{5, 32, 4};
  const uint32_t tokens = 103;
  const auto [ids, whole] = make_random_prompt(g, tokens, 2);
  ASSERT_EQ(whole.size(), g.width());
  for (uint32_t bs : {1u, 7u, 16u, 64u, 255u}) {
    auto blocks = count_blocks(g, ids, 0, tokens, bs);
    ASSERT_TRUE(blocks.ok()) << blocks.error().to_string();
    EXPECT_EQ(blocks->size(), (tokens + bs - 1) / bs);
    std::vector<uint32_t> summed(g.width(), 0);
    uint32_t token_total = 0;
    for (const auto& b : *blocks) {
      b.add_to(g, summed);
      token_total += b.tokens();
    }
    EXPECT_EQ(token_total, tokens);
    EXPECT_EQ(summed, whole) << "block size " << bs;
  }
}

TEST(ExpertCounts, BlockCountsAreExactPerBlock) {
  const model_geometry g{3, 8, 2};
  const auto ids = random_ids(g, 20, 3);
  auto blocks = count_blocks(g, ids, 0, 20, 8);
  ASSERT_TRUE(blocks.ok());
  for (std::size_t b = 0; b < blocks->size(); ++b) {
    std::vector<uint32_t> expect(g.width(), 0), got(g.width(), 0);
    const auto begin = static_cast<uint32_t>(b * 8);
    ASSERT_TRUE(add_token_counts(g, ids, begin, std::min(20u, begin + 8), expect).ok());
    (*blocks)[b].add_to(g, got);
    EXPECT_EQ(got, expect);
  }
}

// Each way a layer can be wrong is refused, with a message naming it, whichever layer it is in
// (from_parts checks each layer in one pass and only then looks for the reason).
TEST(ExpertCounts, FromPartsNamesEachKindOfBadLayer) {
  const model_geometry g{3, 8, 2};
  // tokens 2, top 2: every layer's counts sum to 4.
  const std::vector<uint32_t> offsets = {0, 2, 5, 7};
  const std::vector<expert_id> ids = {1, 5, 0, 3, 7, 2, 6};
  const std::vector<uint8_t> counts = {2, 2, 2, 1, 1, 2, 2};
  ASSERT_TRUE(block_counts::from_parts(g, 2, offsets, ids, counts).ok());
  auto refused = [&](std::vector<uint32_t> o, std::vector<expert_id> i, std::vector<uint8_t> c,
                     const std::string& why) {
    auto r = block_counts::from_parts(g, 2, std::move(o), std::move(i), std::move(c));
    ASSERT_FALSE(r.ok()) << why;
    EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
  };
  for (size_t at : {size_t{1}, size_t{4}, size_t{6}}) {  // the last id of each layer
    auto i = ids;
    i[at] = 8;  // expert id out of range
    refused(offsets, i, counts, "expert");
    auto c = counts;
    c[at] = 0;
    refused(offsets, ids, c, "is not in 1..2");
    c[at] = 3;
    refused(offsets, ids, c, "is not in 1..2");
  }
  auto i = ids;
  i[3] = 0;  // layer 1: 0, 0, 7
  refused(offsets, i, counts, "not strictly increasing");
  auto c = counts;
  c[2] = 1;
  c[3] = 1;  // layer 1 sums to 3
  refused(offsets, ids, c, "sums to 3");
  refused({0, 2, 1, 7}, ids, counts, "layer offsets decrease");
}

TEST(ExpertCounts, FromPartsRoundTripsAndValidates) {
  const model_geometry g{2, 8, 2};
  const auto ids = random_ids(g, 4, 4);
  auto b = block_counts::from_tokens(g, ids, 0, 4);
  ASSERT_TRUE(b.ok());
  auto copy = block_counts::from_parts(g, b->tokens(), b->layer_offsets(), b->ids(), b->counts());
  ASSERT_TRUE(copy.ok()) << copy.error().to_string();
  EXPECT_EQ(copy->ids(), b->ids());

  auto bad_ids = b->ids();
  bad_ids[0] = 9;
  EXPECT_FALSE(block_counts::from_parts(g, 4, b->layer_offsets(), bad_ids, b->counts()).ok());
  auto bad_counts = b->counts();
  bad_counts[0] = static_cast<uint8_t>(bad_counts[0] + 1);  // layer no longer sums to tokens * k
  auto r = block_counts::from_parts(g, 4, b->layer_offsets(), b->ids(), bad_counts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("sums to"), std::string::npos);
  EXPECT_FALSE(block_counts::from_parts(g, 4, {0, 1}, b->ids(), b->counts()).ok());
  EXPECT_FALSE(block_counts::from_parts(g, 0, b->layer_offsets(), b->ids(), b->counts()).ok());
}

TEST(ExpertCounts, RejectsBadInput) {
  const model_geometry g{2, 8, 2};
  auto ids = random_ids(g, 4, 5);
  std::vector<uint32_t> counts(g.width(), 0);
  EXPECT_FALSE(add_token_counts(g, ids, 0, 5, counts).ok());  // past the end
  EXPECT_FALSE(add_token_counts(g, ids, 3, 2, counts).ok());  // reversed
  std::vector<uint32_t> short_counts(3, 0);
  EXPECT_FALSE(add_token_counts(g, ids, 0, 4, short_counts).ok());
  ids[5] = 200;
  auto r = add_token_counts(g, ids, 0, 4, counts);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("expert id 200"), std::string::npos);
  EXPECT_FALSE(count_blocks(g, ids, 0, 4, 0).ok());
  EXPECT_FALSE(count_blocks(g, ids, 0, 4, 256).ok());
}

// A token names k distinct experts per layer, so no count exceeds the block's tokens: a count that
// does is refused (the check the counts message's decoder and eldr_client make, no stricter), also
// when 256 or more picks of one expert would wrap a byte around to a plausible count (255 tokens
// x top-8 of expert 0).
TEST(ExpertCounts, FromTokensRefusesRepeatedIdsInATopKRow) {
  const model_geometry g{2, 16, 2};
  auto ids = random_ids(g, 4, 9);
  ASSERT_TRUE(block_counts::from_tokens(g, ids, 0, 4).ok());
  for (uint32_t t = 0; t < 4; ++t)  // layer 0: every token picks expert 3 twice (8 > 4 tokens)
    ids[t * 4] = ids[t * 4 + 1] = 3;
  auto r = block_counts::from_tokens(g, ids, 0, 4);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("repeated ids"), std::string::npos);
  const model_geometry wide_k{1, 16, 8};
  const std::vector<expert_id> zeros(255 * 8, 0);  // expert 0 picked 2,040 = 7 * 256 + 248 times
  EXPECT_FALSE(block_counts::from_tokens(wide_k, zeros, 0, 255).ok());
  const model_geometry many{1, 4096, 1};  // sparse: 3 of 4,096 experts, ascending
  const std::vector<expert_id> sparse = {4095, 7, 300};
  auto s = block_counts::from_tokens(many, sparse, 0, 3);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ids(), (std::vector<expert_id>{7, 300, 4095}));
  EXPECT_EQ(s->counts(), (std::vector<uint8_t>{1, 1, 1}));
}

// Models of more than 256 experts (Kimi K2: 384, Qwen3-Next: 512): ids above 255 are counted,
// stored and validated like any other.
TEST(ExpertCountsWide, DenseAndBlockCountsAgreeAt384And512Experts) {
  for (const model_geometry g : {model_geometry{6, 384, 8}, model_geometry{4, 512, 10}}) {
    ASSERT_TRUE(g.validate().ok()) << g.to_string();
    const uint32_t tokens = 70;
    const auto ids = random_ids(g, tokens, 11);
    ASSERT_TRUE(std::any_of(ids.begin(), ids.end(), [](expert_id e) { return e > 255; }));
    const std::vector<uint32_t> whole = prompt_counts(g, ids, tokens);
    ASSERT_EQ(whole.size(), g.width());
    for (uint32_t l = 0; l < g.layers; ++l)
      EXPECT_EQ(
          std::accumulate(whole.begin() + l * g.experts, whole.begin() + (l + 1) * g.experts, 0u),
          tokens * g.top_k);
    for (uint32_t bs : {1u, 16u, 255u}) {
      auto blocks = count_blocks(g, ids, 0, tokens, bs);
      ASSERT_TRUE(blocks.ok()) << blocks.error().to_string();
      std::vector<uint32_t> summed(g.width(), 0);
      for (const auto& b : *blocks) {
        b.add_to(g, summed);
        // What the wire carries is accepted back as it is.
        auto copy = block_counts::from_parts(g, b.tokens(), b.layer_offsets(), b.ids(), b.counts());
        ASSERT_TRUE(copy.ok()) << copy.error().to_string();
        EXPECT_EQ(copy->ids(), b.ids());
      }
      EXPECT_EQ(summed, whole) << g.to_string() << " block size " << bs;
    }
  }
}

TEST(ExpertCountsWide, WideIdsAreRangeCheckedAndCountsStayBelowABlocksTokens) {
  const model_geometry g{2, 512, 2};
  // 3 tokens; layer 0 picks {300, 511} three times, layer 1 {0, 256}, {0, 257}, {0, 258}.
  const std::vector<expert_id> ids = {300, 511, 0, 256, 300, 511, 0, 257, 300, 511, 0, 258};
  auto b = block_counts::from_tokens(g, ids, 0, 3);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(b->ids(), (std::vector<expert_id>{300, 511, 0, 256, 257, 258}));
  EXPECT_EQ(b->counts(), (std::vector<uint8_t>{3, 3, 3, 1, 1, 1}));
  EXPECT_EQ(b->layer_offsets(), (std::vector<uint32_t>{0, 2, 6}));

  auto bad = ids;
  bad[7] = 512;
  auto r = block_counts::from_tokens(g, bad, 0, 3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("expert id 512"), std::string::npos) << r.error().message();
  auto parts =
      block_counts::from_parts(g, 3, {0, 2, 6}, {300, 512, 0, 256, 257, 258}, {3, 3, 3, 1, 1, 1});
  ASSERT_FALSE(parts.ok());
  EXPECT_NE(parts.error().message().find("expert id 512"), std::string::npos);
  // A count above the block's tokens, and a block of 256 tokens, are refused whatever the width.
  EXPECT_FALSE(
      block_counts::from_parts(g, 3, {0, 2, 6}, {300, 511, 0, 256, 257, 258}, {4, 2, 3, 1, 1, 1})
          .ok());
  const auto many = random_ids(g, 256, 3);
  EXPECT_FALSE(block_counts::from_tokens(g, many, 0, 256).ok());
  EXPECT_TRUE(block_counts::from_tokens(g, many, 0, 255).ok());
}

// The blocks of one-byte ids (vLLM's routed experts of models of at most 256 experts, counted by
// eldr-proxy's library without widening them) equal those of the same ids widened, which equal
// the dense counts per block; ids up to 255 included.
TEST(ExpertCountsNarrow, OneByteIdsCountAsTheirWidenedCopy) {
  for (const model_geometry g :
       {model_geometry{48, 128, 8}, model_geometry{26, 64, 6}, model_geometry{5, 256, 8},
        model_geometry{3, 9, 9}, model_geometry{2, 16, 1}}) {
    const uint32_t tokens = 300;
    const auto wide = random_ids(g, tokens, 21);
    const std::vector<uint8_t> narrow(wide.begin(), wide.end());
    for (uint32_t bs : {1u, 16u, 33u, 255u}) {
      auto a = count_blocks(g, wide, 0, tokens, bs);
      auto b = count_blocks(g, std::span<const uint8_t>(narrow), 0, tokens, bs);
      ASSERT_TRUE(a.ok() && b.ok()) << g.to_string();
      ASSERT_EQ(a->size(), b->size());
      for (size_t i = 0; i < a->size(); ++i) {
        const block_counts& x = (*a)[i];
        const block_counts& y = (*b)[i];
        EXPECT_EQ(x.tokens(), y.tokens());
        EXPECT_EQ(x.layer_offsets(), y.layer_offsets());
        EXPECT_EQ(x.ids(), y.ids());
        EXPECT_EQ(x.counts(), y.counts());
        std::vector<uint32_t> dense(g.width(), 0), from_block(g.width(), 0);
        const auto begin = static_cast<uint32_t>(i * bs);
        ASSERT_TRUE(add_token_counts(g, wide, begin, std::min(tokens, begin + bs), dense).ok());
        y.add_to(g, from_block);
        EXPECT_EQ(from_block, dense) << g.to_string() << " block " << i << " of size " << bs;
        // What goes on the wire is accepted back.
        EXPECT_TRUE(
            block_counts::from_parts(g, y.tokens(), y.layer_offsets(), y.ids(), y.counts()).ok());
      }
      auto one =
          block_counts::from_tokens(g, std::span<const uint8_t>(narrow), 0, std::min(tokens, bs));
      ASSERT_TRUE(one.ok());
      EXPECT_EQ(one->ids(), (*a)[0].ids());
      EXPECT_EQ(one->counts(), (*a)[0].counts());
    }
  }
}

// Refusals of one-byte ids, and the counting after each is exact: the histogram the counting
// keeps per thread between blocks is left zeroed by a refused block too.
TEST(ExpertCountsNarrow, RefusalsLeaveTheNextCountExact) {
  const model_geometry g{4, 100, 4};
  const uint32_t tokens = 40;
  const auto wide = random_ids(g, tokens, 5);
  const std::vector<uint8_t> good(wide.begin(), wide.end());
  auto want = count_blocks(g, std::span<const uint8_t>(good), 0, tokens, 16);
  ASSERT_TRUE(want.ok());
  auto same_as_want = [&] {
    auto again = count_blocks(g, std::span<const uint8_t>(good), 0, tokens, 16);
    ASSERT_TRUE(again.ok());
    for (size_t i = 0; i < want->size(); ++i) {
      EXPECT_EQ((*again)[i].ids(), (*want)[i].ids());
      EXPECT_EQ((*again)[i].counts(), (*want)[i].counts());
    }
  };
  auto bad = good;
  bad[size_t{20} * 16 + 2 * 4 + 3] = 100;  // token 20, layer 2, rank 3: id 100 >= E
  auto r = count_blocks(g, std::span<const uint8_t>(bad), 0, tokens, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("expert id 100 at token 20, layer 2"), std::string::npos)
      << r.error().message();
  same_as_want();
  bad = good;
  bad[size_t{33} * 16 + 15] = 255;  // token 33, layer 3: the largest one-byte id
  EXPECT_FALSE(count_blocks(g, std::span<const uint8_t>(bad), 0, tokens, 16).ok());
  same_as_want();
  bad = good;
  for (uint32_t t = 16; t < 32; ++t)  // block 1, layer 3: expert 7 picked 32 times by 16 tokens
    bad[size_t{t} * 16 + 3 * 4] = bad[size_t{t} * 16 + 3 * 4 + 1] = 7;
  r = count_blocks(g, std::span<const uint8_t>(bad), 0, tokens, 16);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("repeated ids"), std::string::npos) << r.error().message();
  same_as_want();
  // 255 tokens x top-8 of expert 0: 2,040 picks, a byte wraps to 248 <= 255 tokens.
  const model_geometry k8{1, 16, 8};
  const std::vector<uint8_t> zeros(255 * 8, 0);
  EXPECT_FALSE(block_counts::from_tokens(k8, std::span<const uint8_t>(zeros), 0, 255).ok());
  same_as_want();
  EXPECT_FALSE(count_blocks(g, std::span<const uint8_t>(good), 0, tokens + 1, 16).ok());
  EXPECT_FALSE(count_blocks(g, std::span<const uint8_t>(good), 0, tokens, 256).ok());
  EXPECT_FALSE(
      count_blocks(model_geometry{0, 8, 2}, std::span<const uint8_t>(good), 0, 1, 16).ok());
}

// A token stride reads each token's ids in place from rows of a wider array (vLLM's routed
// experts with a leading dense layer): the counts of the contiguous copy.
TEST(ExpertCountsNarrow, TokenStrideReadsRowsOfAWiderArrayInPlace) {
  const model_geometry g{6, 64, 6};
  const uint32_t tokens = 50;
  const auto wide = random_ids(g, tokens, 8);
  const size_t per_token = size_t{g.layers} * g.top_k;
  const size_t stride = per_token + 2 * g.top_k;  // one dense layer before, one after
  std::vector<uint8_t> rows(stride * tokens, 0);
  std::vector<expert_id> rows16(stride * tokens, 0);
  for (uint32_t t = 0; t < tokens; ++t)
    for (size_t i = 0; i < per_token; ++i) {
      rows[t * stride + g.top_k + i] = static_cast<uint8_t>(wide[t * per_token + i]);
      rows16[t * stride + g.top_k + i] = wide[t * per_token + i];
    }
  auto want = count_blocks(g, wide, 0, tokens, 16);
  ASSERT_TRUE(want.ok());
  // The span starts at token 0's first MoE id and ends after the last token's last one.
  const size_t span_len = (tokens - 1) * stride + per_token;
  auto got = count_blocks(g, std::span<const uint8_t>(rows.data() + g.top_k, span_len), 0, tokens,
                          16, stride);
  auto got16 = count_blocks(g, std::span<const expert_id>(rows16.data() + g.top_k, span_len), 0,
                            tokens, 16, stride);
  ASSERT_TRUE(got.ok()) << got.error().to_string();
  ASSERT_TRUE(got16.ok()) << got16.error().to_string();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*got)[i].ids(), (*want)[i].ids());
    EXPECT_EQ((*got)[i].counts(), (*want)[i].counts());
    EXPECT_EQ((*got16)[i].ids(), (*want)[i].ids());
  }
  // Blocks from a token in the middle; a stride of exactly L * k is the contiguous array.
  auto middle = count_blocks(g, std::span<const uint8_t>(rows.data() + g.top_k, span_len), 16,
                             tokens, 16, stride);
  ASSERT_TRUE(middle.ok());
  EXPECT_EQ((*middle)[0].ids(), (*want)[1].ids());
  const std::vector<uint8_t> narrow(wide.begin(), wide.end());
  EXPECT_TRUE(count_blocks(g, std::span<const uint8_t>(narrow), 0, tokens, 16, per_token).ok());
  // A stride shorter than a token, or a last row past the array, is refused.
  auto r = count_blocks(g, std::span<const uint8_t>(narrow), 0, tokens, 16, per_token - 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("stride"), std::string::npos) << r.error().message();
  r = count_blocks(g, std::span<const uint8_t>(rows.data() + g.top_k, span_len - 1), 0, tokens, 16,
                   stride);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("holds 49 tokens"), std::string::npos) << r.error().message();
  EXPECT_FALSE(count_blocks(g, std::span<const uint8_t>(narrow), 0, 3, 16,
                            std::numeric_limits<size_t>::max() / 2)
                   .ok());
}

TEST(ExpertCountsWide, GeometryBoundsAreDocumented) {
  EXPECT_TRUE((model_geometry{60, 384, 8}.validate().ok()));   // Kimi K2
  EXPECT_TRUE((model_geometry{48, 512, 10}.validate().ok()));  // Qwen3-Next
  EXPECT_TRUE((model_geometry{256, 4096, 8}.validate().ok()));
  EXPECT_TRUE((model_geometry{4096, 256, 8}.validate().ok()));  // the widest model before
  EXPECT_FALSE((model_geometry{1, 4097, 8}.validate().ok()));
  const status s = model_geometry{257, 4096, 8}.validate();
  EXPECT_NE(s.message().find("layers * experts must be <= 1048576"), std::string::npos)
      << s.message();
  EXPECT_TRUE((model_geometry{2, 256, 2}.narrow_ids()));
  EXPECT_FALSE((model_geometry{2, 257, 2}.narrow_ids()));
}

// Each way of gathering a histogram row's nonzero counts that this CPU runs (SSSE3, AVX-512)
// gives what the portable one gives, and that is the row's nonzero entries: every width from
// one expert to max_experts around the 16- and 64-byte steps, empty, sparse, dense and full
// rows, counts at and over the block's tokens. The counting tests above then run the fastest.
TEST(ExpertCountsRows, EveryRowCompressorThisCpuRunsGivesTheNonzeroEntries) {
  using detail::row_compressor;
  std::vector<row_compressor> others;
  for (row_compressor c : {row_compressor::ssse3, row_compressor::avx512})
    if (detail::cpu_runs(c)) others.push_back(c);
  ::testing::Test::RecordProperty("compressors_checked", static_cast<int>(others.size()) + 1);
  rng_engine rng(41);
  uint32_t rows = 0;
  for (uint32_t width : {1u, 7u, 8u, 15u, 16u, 17u, 63u, 64u, 65u, 100u, 128u, 200u, 256u, 384u,
                         512u, 1000u, max_experts})
    for (uint32_t percent : {0u, 3u, 50u, 97u, 100u})
      for (uint32_t tokens : {1u, 16u, 255u}) {
        std::vector<uint8_t> row(width, 0);
        for (uint8_t& b : row)
          if (uniform_index(rng, 100) < percent)
            b = static_cast<uint8_t>(1 + uniform_index(rng, tokens));
        const bool over = tokens < 255 && uniform_index(rng, 4) == 0 && width > 1;
        if (over) row[uniform_index(rng, width)] = static_cast<uint8_t>(tokens + 1);
        std::vector<expert_id> ids;
        std::vector<uint8_t> counts;
        uint32_t sum = 0;
        for (uint32_t e = 0; e < width; ++e)
          if (row[e] != 0) {
            ids.push_back(static_cast<expert_id>(e));
            counts.push_back(row[e]);
            sum += row[e];
          }
        const std::string what = "width " + std::to_string(width) + ", " + std::to_string(percent) +
                                 "% nonzero, " + std::to_string(tokens) + " tokens";
        auto portable = detail::compress_row_with(row_compressor::portable, row, tokens);
        ASSERT_TRUE(portable.has_value());
        EXPECT_EQ(portable->ids, ids) << what;
        EXPECT_EQ(portable->counts, counts) << what;
        EXPECT_EQ(portable->sum, sum) << what;
        EXPECT_EQ(portable->over, over) << what;
        EXPECT_TRUE(portable->row_zeroed) << what;
        for (row_compressor c : others) {
          auto got = detail::compress_row_with(c, row, tokens);
          ASSERT_TRUE(got.has_value());
          const std::string how = what + ", compressor " + std::to_string(static_cast<int>(c));
          EXPECT_EQ(got->ids, ids) << how;
          EXPECT_EQ(got->counts, counts) << how;
          EXPECT_EQ(got->sum, sum) << how;
          EXPECT_EQ(got->over, over) << how;
          EXPECT_TRUE(got->row_zeroed) << how;
        }
        ++rows;
      }
  EXPECT_EQ(rows, 17u * 5 * 3);
}

// for_each_block_count hands over, in order, the counts count_blocks makes, for both id widths and
// a token stride; the first error (a bad id, or the callee's) ends it, and no block after it is
// counted; the counting after a refusal is exact again.
TEST(ExpertCounts, EachBlockCountIsCountBlocksBlockAndStopsAtTheFirstError) {
  const model_geometry g{5, 64, 6};
  const uint32_t tokens = 90, block_size = 16, stride = 5 * 6 + 6;  // a wider row: one more layer
  const auto packed = random_ids(g, tokens, 23);
  std::vector<expert_id> wide(size_t{tokens} * stride, 0);
  for (uint32_t t = 0; t < tokens; ++t)
    std::copy_n(packed.begin() + size_t{t} * 30, 30, wide.begin() + size_t{t} * stride);
  const std::vector<uint8_t> narrow(wide.begin(), wide.end());
  auto want = count_blocks(g, wide, 0, tokens, block_size, stride);
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(want->size(), 6u);
  auto same = [&](uint32_t i, const block_counts_view& v) {
    const block_counts& b = (*want)[i];
    EXPECT_EQ(v.tokens, b.tokens()) << i;
    EXPECT_TRUE(std::equal(v.layer_offsets.begin(), v.layer_offsets.end(),
                           b.layer_offsets().begin(), b.layer_offsets().end()))
        << i;
    EXPECT_TRUE(std::equal(v.ids.begin(), v.ids.end(), b.ids().begin(), b.ids().end())) << i;
    EXPECT_TRUE(std::equal(v.counts.begin(), v.counts.end(), b.counts().begin(), b.counts().end()))
        << i;
  };
  std::vector<uint32_t> seen;
  auto each = [&](uint32_t i, const block_counts_view& v) {
    same(i, v);
    seen.push_back(i);
    return status{};
  };
  ASSERT_TRUE(for_each_block_count(g, wide, 0, tokens, block_size, stride, each).ok());
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5}));
  seen.clear();
  ASSERT_TRUE(
      for_each_block_count(g, std::span<const uint8_t>(narrow), 0, tokens, block_size, stride, each)
          .ok());
  EXPECT_EQ(seen.size(), 6u);
  // The callee's error ends it.
  seen.clear();
  status stopped = for_each_block_count(
      g, wide, 0, tokens, block_size, stride, [&](uint32_t i, const block_counts_view& v) {
        EXPECT_TRUE(each(i, v).ok());
        return i == 2 ? status::invalid_argument("enough") : status{};
      });
  EXPECT_EQ(stopped.message(), "enough");
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  // A bad id in block 3 ends it after block 2, named; the next counting is exact.
  std::vector<expert_id> bad = wide;
  bad[size_t{50} * stride + 7] = 64;
  seen.clear();
  status refused = for_each_block_count(g, bad, 0, tokens, block_size, stride, each);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("expert id 64 at token 50"), std::string::npos)
      << refused.message();
  EXPECT_EQ(seen, (std::vector<uint32_t>{0, 1, 2}));
  seen.clear();
  ASSERT_TRUE(for_each_block_count(g, wide, 0, tokens, block_size, stride, each).ok());
  EXPECT_EQ(seen.size(), 6u);
  // count_blocks' checks come first: nothing is handed over.
  seen.clear();
  EXPECT_FALSE(for_each_block_count(g, wide, 0, tokens, 0, stride, each).ok());
  EXPECT_FALSE(for_each_block_count(g, wide, 0, tokens + 1, block_size, stride, each).ok());
  EXPECT_TRUE(seen.empty());
}

}  // namespace
}  // namespace eldr
