// msgpack: smallest encodings at every width boundary, decoding of every type (canonical or not),
// and errors instead of out-of-bounds reads for truncated, oversized, reserved or too-deep input.
#include "core/base/msgpack.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace eldr::msgpack {
namespace {

using bytes = std::vector<uint8_t>;

template <class F>
bytes encode(F&& f) {
  bytes out;
  writer w(out);
  f(w);
  EXPECT_TRUE(w.ok());
  return out;
}

item decode_one(const bytes& b) {
  reader r(b.data(), b.size());
  item it;
  const status s = r.next(it);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return it;
}

status decode_status(const bytes& b) {
  reader r(b.data(), b.size());
  item it;
  return r.next(it);
}

TEST(MsgpackWriter, UnsignedIntegersUseTheSmallestForm) {
  struct case_t {
    uint64_t value;
    size_t size;
    uint8_t tag;
  };
  const case_t cases[] = {{0, 1, 0x00},
                          {127, 1, 0x7f},
                          {128, 2, 0xcc},
                          {255, 2, 0xcc},
                          {256, 3, 0xcd},
                          {65535, 3, 0xcd},
                          {65536, 5, 0xce},
                          {0xffffffffull, 5, 0xce},
                          {0x100000000ull, 9, 0xcf},
                          {std::numeric_limits<uint64_t>::max(), 9, 0xcf}};
  for (const case_t& c : cases) {
    const bytes b = encode([&](writer& w) { w.write_uint(c.value); });
    ASSERT_EQ(b.size(), c.size) << c.value;
    EXPECT_EQ(b[0], c.tag) << c.value;
    const item it = decode_one(b);
    EXPECT_EQ(it.type, kind::positive_int);
    EXPECT_EQ(it.uint_value, c.value);
  }
}

TEST(MsgpackWriter, SignedIntegersUseTheSmallestForm) {
  struct case_t {
    int64_t value;
    size_t size;
    uint8_t tag;
  };
  const case_t cases[] = {{5, 1, 0x05},
                          {-1, 1, 0xff},
                          {-32, 1, 0xe0},
                          {-33, 2, 0xd0},
                          {-128, 2, 0xd0},
                          {-129, 3, 0xd1},
                          {-32768, 3, 0xd1},
                          {-32769, 5, 0xd2},
                          {std::numeric_limits<int32_t>::min(), 5, 0xd2},
                          {int64_t{std::numeric_limits<int32_t>::min()} - 1, 9, 0xd3},
                          {std::numeric_limits<int64_t>::min(), 9, 0xd3},
                          {std::numeric_limits<int64_t>::max(), 9, 0xcf}};
  for (const case_t& c : cases) {
    const bytes b = encode([&](writer& w) { w.write_int(c.value); });
    ASSERT_EQ(b.size(), c.size) << c.value;
    EXPECT_EQ(b[0], c.tag) << c.value;
    reader r(b.data(), b.size());
    result<int64_t> v = r.read_int();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, c.value);
    EXPECT_TRUE(r.at_end());
  }
}

TEST(MsgpackWriter, StringsBinsArraysAndMapsUseTheSmallestHeader) {
  struct case_t {
    size_t length;
    uint8_t str_tag, bin_tag, array_tag, map_tag;
    size_t header;  // str header size; bin/array/map checked by tag only
  };
  const case_t cases[] = {{0, 0xa0, 0xc4, 0x90, 0x80, 1},    {15, 0xaf, 0xc4, 0x9f, 0x8f, 1},
                          {16, 0xb0, 0xc4, 0xdc, 0xde, 1},   {31, 0xbf, 0xc4, 0xdc, 0xde, 1},
                          {32, 0xd9, 0xc4, 0xdc, 0xde, 2},   {255, 0xd9, 0xc4, 0xdc, 0xde, 2},
                          {256, 0xda, 0xc5, 0xdc, 0xde, 3},  {65535, 0xda, 0xc5, 0xdc, 0xde, 3},
                          {65536, 0xdb, 0xc6, 0xdd, 0xdf, 5}};
  for (const case_t& c : cases) {
    const std::string s(c.length, 'x');
    const bytes payload(c.length, 0xab);
    const bytes str = encode([&](writer& w) { w.write_str(s); });
    EXPECT_EQ(str[0], c.str_tag) << c.length;
    EXPECT_EQ(str.size(), c.header + c.length) << c.length;
    EXPECT_EQ(decode_one(str).str(), s);

    const bytes bin = encode([&](writer& w) { w.write_bin(payload); });
    EXPECT_EQ(bin[0], c.bin_tag) << c.length;
    const item b = decode_one(bin);
    EXPECT_EQ(b.type, kind::bin);
    EXPECT_EQ(bytes(b.bytes().begin(), b.bytes().end()), payload);

    // Containers are decodable only when their elements are present.
    bytes arr = encode([&](writer& w) {
      w.write_array_header(static_cast<uint32_t>(c.length));
      for (size_t i = 0; i < c.length; ++i)
        w.write_nil();
    });
    EXPECT_EQ(arr[0], c.array_tag) << c.length;
    EXPECT_EQ(decode_one(arr).length, c.length);
    bytes map = encode([&](writer& w) {
      w.write_map_header(static_cast<uint32_t>(c.length));
      for (size_t i = 0; i < 2 * c.length; ++i)
        w.write_bool(true);
    });
    EXPECT_EQ(map[0], c.map_tag) << c.length;
    EXPECT_EQ(decode_one(map).type, kind::map);
    EXPECT_EQ(decode_one(map).length, c.length);
  }
}

TEST(MsgpackWriter, FloatsRoundTripBitForBit) {
  const bytes b = encode([](writer& w) {
    w.write_float32(1.5f);
    w.write_float64(-0.1);
    w.write_float64(std::numeric_limits<double>::infinity());
  });
  ASSERT_EQ(b.size(), 5u + 9u + 9u);
  EXPECT_EQ(b[0], 0xca);
  EXPECT_EQ(b[5], 0xcb);
  reader r(b.data(), b.size());
  item it;
  ASSERT_TRUE(r.next(it).ok());
  EXPECT_EQ(it.type, kind::float32);
  EXPECT_EQ(it.float_value, 1.5);
  ASSERT_TRUE(r.next(it).ok());
  EXPECT_EQ(it.type, kind::float64);
  EXPECT_EQ(it.float_value, -0.1);
  result<double> inf = r.read_number();
  ASSERT_TRUE(inf.ok());
  EXPECT_TRUE(std::isinf(*inf));
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackWriter, ExtUsesFixextForItsSizesAndExtOtherwise) {
  const bytes one(1, 7), three(3, 7), sixteen(16, 7), big(300, 7);
  EXPECT_EQ(encode([&](writer& w) { w.write_ext(5, one); })[0], 0xd4);
  EXPECT_EQ(encode([&](writer& w) { w.write_ext(5, sixteen); })[0], 0xd8);
  EXPECT_EQ(encode([&](writer& w) { w.write_ext(5, three); })[0], 0xc7);
  EXPECT_EQ(encode([&](writer& w) { w.write_ext(5, big); })[0], 0xc8);
  const item it = decode_one(encode([&](writer& w) { w.write_ext(-3, three); }));
  EXPECT_EQ(it.type, kind::ext);
  EXPECT_EQ(it.ext_type, -3);
  EXPECT_EQ(it.length, 3u);
}

TEST(MsgpackReader, DecodesHandWrittenSpecExamples) {
  // [1, "a", true, nil, {"k": -2}, bin8 [9, 8], fixext1 type 1 payload 0x55, float32 0.5]
  const bytes b = {0x98, 0x01, 0xa1, 'a',  0xc3, 0xc0, 0x81, 0xa1, 'k',  0xfe, 0xc4,
                   0x02, 0x09, 0x08, 0xd4, 0x01, 0x55, 0xca, 0x3f, 0x00, 0x00, 0x00};
  reader r(b.data(), b.size());
  EXPECT_EQ(*r.read_array_header(), 8u);
  EXPECT_EQ(*r.read_uint(), 1u);
  EXPECT_EQ(*r.read_str(), "a");
  EXPECT_EQ(*r.read_bool(), true);
  EXPECT_TRUE(r.read_nil().ok());
  EXPECT_EQ(*r.read_map_header(), 1u);
  EXPECT_EQ(*r.read_str(), "k");
  EXPECT_EQ(*r.read_int(), -2);
  const auto bin = r.read_bin();
  ASSERT_TRUE(bin.ok());
  EXPECT_EQ(bin->size(), 2u);
  EXPECT_EQ((*bin)[0], 9);
  // The view points into the input, not a copy.
  EXPECT_EQ(bin->data(), b.data() + 12);
  item ext;
  ASSERT_TRUE(r.next(ext).ok());
  EXPECT_EQ(ext.type, kind::ext);
  EXPECT_EQ(ext.ext_type, 1);
  EXPECT_EQ(ext.data[0], 0x55);
  EXPECT_EQ(*r.read_number(), 0.5);
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackReader, NonCanonicalIntegerEncodingsDecodeBySign) {
  // int8 +5, uint64 7, int32 -70000, uint16 300
  const bytes b = {0xd0, 0x05, 0xcf, 0,    0,    0,    0,    0,    0,   0,
                   7,    0xd2, 0xff, 0xfe, 0xee, 0x90, 0xcd, 0x01, 0x2c};
  reader r(b.data(), b.size());
  item it;
  ASSERT_TRUE(r.next(it).ok());
  EXPECT_EQ(it.type, kind::positive_int);
  EXPECT_EQ(it.uint_value, 5u);
  EXPECT_EQ(*r.read_uint(), 7u);
  EXPECT_EQ(*r.read_int(), -70000);
  EXPECT_EQ(*r.read_number(), 300.0);
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackReader, TypedReadsFailWithoutAdvancing) {
  const bytes b = encode([](writer& w) {
    w.write_int(-4);
    w.write_uint(std::numeric_limits<uint64_t>::max());
  });
  reader r(b.data(), b.size());
  result<uint64_t> u = r.read_uint();
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().code(), status_code::corrupt);
  EXPECT_NE(u.error().message().find("found negative int"), std::string::npos)
      << u.error().message();
  EXPECT_EQ(r.offset(), 0u);
  EXPECT_FALSE(r.read_str().ok());
  EXPECT_FALSE(r.read_bin().ok());
  EXPECT_FALSE(r.read_map_header().ok());
  EXPECT_EQ(*r.read_int(), -4);
  result<int64_t> too_big = r.read_int();
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.error().message().find("does not fit"), std::string::npos);
  EXPECT_EQ(*r.read_uint(), std::numeric_limits<uint64_t>::max());
}

TEST(MsgpackReader, PeekDoesNotAdvance) {
  const bytes b = encode([](writer& w) { w.write_str("abc"); });
  reader r(b.data(), b.size());
  item it;
  ASSERT_TRUE(r.peek(it).ok());
  EXPECT_EQ(it.str(), "abc");
  EXPECT_EQ(r.offset(), 0u);
}

TEST(MsgpackReader, RejectsTheReservedTypeByte) {
  const status s = decode_status({0xc1});
  EXPECT_EQ(s.code(), status_code::corrupt);
  EXPECT_NE(s.message().find("0xc1"), std::string::npos);
}

TEST(MsgpackReader, EveryTruncatedHeaderIsAnError) {
  // One complete value of each multi-byte form; every strict prefix must fail cleanly.
  const std::vector<bytes> values = {
      encode([](writer& w) { w.write_uint(200); }),
      encode([](writer& w) { w.write_uint(70000); }),
      encode([](writer& w) { w.write_uint(1ull << 40); }),
      encode([](writer& w) { w.write_int(-1000); }),
      encode([](writer& w) { w.write_int(-(1ll << 40)); }),
      encode([](writer& w) { w.write_float32(1.0f); }),
      encode([](writer& w) { w.write_float64(1.0); }),
      encode([](writer& w) { w.write_str(std::string(40, 'x')); }),
      encode([](writer& w) { w.write_str(std::string(300, 'x')); }),
      encode([](writer& w) { w.write_str(std::string(70000, 'x')); }),
      encode([](writer& w) { w.write_bin(bytes(10, 1)); }),
      encode([](writer& w) { w.write_bin(bytes(300, 1)); }),
      encode([](writer& w) { w.write_bin(bytes(70000, 1)); }),
      encode([](writer& w) { w.write_ext(1, bytes(8, 1)); }),
      encode([](writer& w) { w.write_ext(1, bytes(5, 1)); }),
      encode([](writer& w) { w.write_ext(1, bytes(300, 1)); }),
      encode([](writer& w) { w.write_ext(1, bytes(70000, 1)); }),
  };
  for (const bytes& v : values) {
    ASSERT_TRUE(decode_status(v).ok());
    // Every cut inside the header, and the last ones inside the payload (the same check).
    for (size_t cut = 0; cut < v.size();
         cut = cut < 10 ? cut + 1 : std::max(cut + 1, v.size() - 2)) {
      const bytes prefix(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(cut));
      const status s = decode_status(prefix);
      EXPECT_EQ(s.code(), status_code::corrupt) << "tag " << int{v[0]} << " cut at " << cut;
    }
  }
}

TEST(MsgpackReader, DeclaredLengthsBeyondTheInputAreErrorsNotAllocations) {
  // str32 / bin32 / ext32 claiming 4 GiB, array32 / map32 claiming 4 billion entries, with only a
  // few bytes behind them.
  const std::vector<bytes> liars = {
      {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'},
      {0xc6, 0xff, 0xff, 0xff, 0xff, 1, 2},
      {0xc9, 0xff, 0xff, 0xff, 0xff, 1, 2},
      {0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2, 3},
      {0xdf, 0xff, 0xff, 0xff, 0xff, 1, 2},
      {0x92, 0x01},  // fixarray of 2, one present
      {0x81, 0x01},  // fixmap: needs 2 values
  };
  for (const bytes& b : liars) {
    const status s = decode_status(b);
    EXPECT_EQ(s.code(), status_code::corrupt) << int{b[0]};
    EXPECT_NE(s.message().find("declares"), std::string::npos) << s.message();
  }
  // The bound is exact: an array32 of 3 nils with 3 bytes behind it is fine.
  const bytes exact = {0xdd, 0, 0, 0, 3, 0xc0, 0xc0, 0xc0};
  EXPECT_EQ(decode_one(exact).length, 3u);
}

TEST(MsgpackReader, SkipCrossesNestedValuesAndLandsOnTheNext) {
  const bytes b = encode([](writer& w) {
    w.write_map_header(2);
    w.write_str("a");
    w.write_array_header(3);
    w.write_uint(1);
    w.write_map_header(0);
    w.write_bin(bytes(5, 0));
    w.write_str("b");
    w.write_ext(2, bytes(3, 0));
    w.write_str("after");
  });
  reader r(b.data(), b.size());
  ASSERT_TRUE(r.skip().ok());
  EXPECT_EQ(*r.read_str(), "after");
  EXPECT_TRUE(r.at_end());
}

TEST(MsgpackReader, SkipEnforcesTheDepthLimitWithoutRecursing) {
  auto nested = [](size_t depth) {
    bytes b(depth, 0x91);  // [[[...]]]
    b.push_back(0xc0);
    return b;
  };
  {
    const bytes ok = nested(reader::default_max_depth);
    reader r(ok.data(), ok.size());
    EXPECT_TRUE(r.skip().ok());
    EXPECT_TRUE(r.at_end());
  }
  {
    const bytes deep = nested(reader::default_max_depth + 1);
    reader r(deep.data(), deep.size());
    const status s = r.skip();
    EXPECT_EQ(s.code(), status_code::corrupt);
    EXPECT_NE(s.message().find("nesting deeper than"), std::string::npos) << s.message();
    EXPECT_EQ(r.offset(), 0u);
  }
  {
    // Far deeper than any stack would survive recursively; a custom limit lets it through.
    const bytes very_deep = nested(200000);
    reader r(very_deep.data(), very_deep.size(), 1000000);
    EXPECT_TRUE(r.skip().ok());
  }
  {
    // A skip that runs out of input inside a container fails and does not move.
    const bytes cut = {0x93, 0x01, 0x02};
    reader r(cut.data(), cut.size());
    EXPECT_FALSE(r.skip().ok());
    EXPECT_EQ(r.offset(), 0u);
  }
}

TEST(MsgpackReader, RandomBytesNeverReadOutOfBounds) {
  // Cheap in-process fuzzing; the real fuzz target covers the trace parser. Each buffer is copied
  // into an exactly-sized vector so a sanitizer build catches any overread.
  std::mt19937_64 rng(42);
  for (int round = 0; round < 20000; ++round) {
    bytes b(rng() % 24);
    for (uint8_t& x : b)
      x = static_cast<uint8_t>(rng());
    reader r(b.data(), b.size());
    for (int guard = 0; guard < 64 && !r.at_end(); ++guard) {
      const size_t before = r.offset();
      if (!r.skip().ok()) {
        EXPECT_EQ(r.offset(), before);
        break;
      }
      EXPECT_GT(r.offset(), before);
      EXPECT_LE(r.offset(), b.size());
    }
  }
}

}  // namespace
}  // namespace eldr::msgpack
