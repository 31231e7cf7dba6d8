// kv_events: every golden vLLM payload (../shared/reference/vllm-kv-vectors, read in place)
// decodes to exactly the meaning vectors.json gives it; both event encodings, all hash forms;
// malformed events are skipped while the rest of the batch survives.
#include "cluster/wire/kv_events.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path vectors_dir() {
  if (const char* env = std::getenv("ELDR_KV_VECTORS")) return env;
  return fs::path(ELDR_SOURCE_DIR) / ".." / "shared" / "reference" / "vllm-kv-vectors";
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expected hash: a decimal string, or {"bin_hex": ...} whose last 8 bytes are the uint64.
uint64_t expected_hash(const json& j) {
  if (j.is_string()) return std::stoull(j.get<std::string>());
  const std::string hex = j.at("bin_hex").get<std::string>();
  return std::stoull(hex.substr(hex.size() - 16), nullptr, 16);
}

// Raw MessagePack (as kept for extra_keys) to JSON, for comparing with vectors.json.
json to_json(msgpack::reader& r) {
  msgpack::item it;
  EXPECT_TRUE(r.next(it).ok());
  switch (it.type) {
    case msgpack::kind::nil:
      return nullptr;
    case msgpack::kind::boolean:
      return it.boolean;
    case msgpack::kind::positive_int:
      return it.uint_value;
    case msgpack::kind::negative_int:
      return it.int_value;
    case msgpack::kind::float32:
    case msgpack::kind::float64:
      return it.float_value;
    case msgpack::kind::str:
      return std::string(it.str());
    case msgpack::kind::array: {
      json a = json::array();
      for (uint32_t i = 0; i < it.length; ++i)
        a.push_back(to_json(r));
      return a;
    }
    default:
      ADD_FAILURE() << "unexpected kind in extra_keys";
      return nullptr;
  }
}

json raw_to_json(const std::vector<uint8_t>& raw) {
  if (raw.empty()) return nullptr;
  msgpack::reader r(raw.data(), raw.size());
  return to_json(r);
}

template <class T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

const char* type_name(kv_event_type t) {
  switch (t) {
    case kv_event_type::block_stored:
      return "BlockStored";
    case kv_event_type::block_removed:
      return "BlockRemoved";
    case kv_event_type::all_blocks_cleared:
      return "AllBlocksCleared";
  }
  return "?";
}

TEST(KvEvents, EveryGoldenVectorDecodesToItsMeaning) {
  const fs::path dir = vectors_dir();
  if (!fs::exists(dir / "vectors.json"))
    GTEST_SKIP() << "golden vectors not found in " << dir << " (set ELDR_KV_VECTORS)";
  std::ifstream in(dir / "vectors.json");
  const json doc = json::parse(in);
  const json& vectors = doc.at("vectors");
  ASSERT_EQ(vectors.size(), 18u);
  kv_decode_limits limits;
  limits.keep_details = true;
  for (const json& v : vectors) {
    SCOPED_TRACE(v.at("file").get<std::string>());
    const std::vector<uint8_t> bytes = read_bytes(dir / v.at("file").get<std::string>());
    ASSERT_FALSE(bytes.empty());
    std::vector<kv_decode_issue> issues;
    auto batch = decode_kv_batch(bytes, limits, issues);
    ASSERT_TRUE(batch.ok()) << batch.error().to_string();
    EXPECT_TRUE(issues.empty());
    const json& want = v.at("expected");
    EXPECT_EQ(batch->ts, want.at("ts").get<double>());
    EXPECT_EQ(opt(batch->data_parallel_rank), want.at("data_parallel_rank"));
    ASSERT_EQ(batch->events.size(), want.at("events").size());
    for (size_t i = 0; i < batch->events.size(); ++i) {
      const kv_event& e = batch->events[i];
      const json& w = want.at("events")[i];
      EXPECT_EQ(type_name(e.type), w.at("type").get<std::string>());
      if (e.type == kv_event_type::all_blocks_cleared) {
        EXPECT_EQ(w.size(), 1u);
        continue;
      }
      std::vector<uint64_t> hashes;
      for (const json& h : w.at("block_hashes"))
        hashes.push_back(expected_hash(h));
      EXPECT_EQ(e.block_hashes, hashes);
      EXPECT_EQ(opt(e.medium), w.at("medium"));
      EXPECT_EQ(opt(e.group_idx), w.at("group_idx"));
      EXPECT_EQ(opt(e.locality), w.value("locality", json(nullptr)));
      if (e.type == kv_event_type::block_removed) continue;
      const json& parent = w.at("parent_block_hash");
      if (parent.is_null())
        EXPECT_FALSE(e.parent_block_hash);
      else
        EXPECT_EQ(e.parent_block_hash, expected_hash(parent));
      EXPECT_EQ(json(e.token_ids), w.at("token_ids"));
      EXPECT_EQ(opt(e.block_size), w.at("block_size"));
      EXPECT_EQ(opt(e.lora_id), w.at("lora_id"));
      EXPECT_EQ(opt(e.lora_name), w.at("lora_name"));
      EXPECT_EQ(raw_to_json(e.extra_keys), w.at("extra_keys"));
      EXPECT_EQ(opt(e.kv_cache_spec_kind), w.at("kv_cache_spec_kind"));
      EXPECT_EQ(opt(e.kv_cache_spec_sliding_window), w.at("kv_cache_spec_sliding_window"));
    }
  }
}

// Hand-built payloads for the shapes the golden vectors do not cover.
std::vector<uint8_t> payload(const std::function<void(msgpack::writer&)>& body) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  body(w);
  return out;
}

TEST(KvEvents, AcceptsTwoElementBatchesMapBatchesAndNegativeHashes) {
  auto two = payload([](msgpack::writer& w) {
    w.write_array_header(2);
    w.write_float64(1.5);
    w.write_array_header(1);
    w.write_array_header(2);
    w.write_str("BlockRemoved");
    w.write_array_header(1);
    w.write_int(-2);  // int64 form of 2^64 - 2
  });
  std::vector<kv_decode_issue> issues;
  auto b = decode_kv_batch(two, {}, issues);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_FALSE(b->data_parallel_rank);
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].block_hashes[0], 0xfffffffffffffffeULL);
  EXPECT_FALSE(b->events[0].medium);  // an old BlockRemoved without medium

  auto map = payload([](msgpack::writer& w) {
    w.write_map_header(4);
    w.write_str("events");
    w.write_array_header(1);
    w.write_map_header(3);
    w.write_str("type");
    w.write_str("BlockStored");
    w.write_str("block_hashes");
    w.write_array_header(2);
    w.write_uint(1);
    w.write_uint(2);
    w.write_str("future_field");
    w.write_map_header(0);
    w.write_str("ts");
    w.write_float64(2.0);
    w.write_str("data_parallel_rank");
    w.write_uint(3);
    w.write_str("unknown");
    w.write_nil();
  });
  b = decode_kv_batch(map, {}, issues);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  EXPECT_EQ(*b->data_parallel_rank, 3);
  EXPECT_EQ(b->events[0].block_hashes, (std::vector<uint64_t>{1, 2}));
  EXPECT_TRUE(issues.empty());
}

TEST(KvEvents, BadAndUnknownEventsAreSkippedTheRestKept) {
  auto p = payload([](msgpack::writer& w) {
    w.write_array_header(3);
    w.write_float64(1.0);
    w.write_array_header(5);
    w.write_array_header(2);  // unknown type
    w.write_str("BlockMoved");
    w.write_uint(1);
    w.write_array_header(2);  // wrong field type
    w.write_str("BlockStored");
    w.write_str("not a list");
    w.write_array_header(2);  // too many hashes for the limit below
    w.write_str("BlockRemoved");
    w.write_array_header(5);
    for (int i = 0; i < 5; ++i)
      w.write_uint(static_cast<uint64_t>(i));
    w.write_uint(42);  // not an event at all
    w.write_array_header(1);
    w.write_str("AllBlocksCleared");
    w.write_nil();
  });
  kv_decode_limits limits;
  limits.max_hashes = 4;
  std::vector<kv_decode_issue> issues;
  auto b = decode_kv_batch(p, limits, issues);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].type, kv_event_type::all_blocks_cleared);
  ASSERT_EQ(issues.size(), 4u);
  EXPECT_EQ(issues[0].cause, drop_cause::unknown_event_type);
  EXPECT_EQ(issues[1].cause, drop_cause::bad_event);
  EXPECT_EQ(issues[2].cause, drop_cause::oversized);
  EXPECT_EQ(issues[3].cause, drop_cause::bad_event);
}

TEST(KvEvents, BrokenOuterStructureFailsWithItsCause) {
  std::vector<kv_decode_issue> issues;
  const std::vector<uint8_t> truncated = {0x93, 0xcb, 0x00};
  auto b = decode_kv_batch(truncated, {}, issues);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(kv_batch_error_cause(b.error()), drop_cause::bad_msgpack);
  const std::vector<uint8_t> scalar = {0x05};
  b = decode_kv_batch(scalar, {}, issues);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(kv_batch_error_cause(b.error()), drop_cause::bad_batch);
  // A million hashes in one event: the declared count exceeds the bytes left, refused unread.
  auto huge = payload([](msgpack::writer& w) {
    w.write_array_header(2);
    w.write_float64(0);
    w.write_array_header(1);
    w.write_array_header(2);
    w.write_str("BlockStored");
    w.write_array_header(1'000'000);
  });
  b = decode_kv_batch(huge, {}, issues);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(kv_batch_error_cause(b.error()), drop_cause::bad_msgpack);

  EXPECT_EQ(*decode_sequence(std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1, 2}), 258u);
  EXPECT_FALSE(decode_sequence(std::vector<uint8_t>{1, 2}));
}

TEST(KvEvents, AMillionHashesInOneEventDropThatEventOnly) {
  auto p = payload([](msgpack::writer& w) {
    w.write_array_header(3);
    w.write_float64(0);
    w.write_array_header(2);
    w.write_array_header(2);
    w.write_str("BlockStored");
    w.write_array_header(1'000'000);
    for (int i = 0; i < 1'000'000; ++i)
      w.write_uint(7);
    w.write_array_header(2);
    w.write_str("BlockRemoved");
    w.write_array_header(1);
    w.write_uint(9);
    w.write_uint(0);
  });
  std::vector<kv_decode_issue> issues;
  auto b = decode_kv_batch(p, {}, issues);
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].type, kv_event_type::block_removed);
  ASSERT_EQ(issues.size(), 1u);
  EXPECT_EQ(issues[0].cause, drop_cause::oversized);
}

}  // namespace
}  // namespace eldr
