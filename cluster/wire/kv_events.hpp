// kv_events: decoder for vLLM's KV-cache event payloads, byte for byte as vLLM's msgspec encoder
// writes them (../shared/reference/vllm-kv-events.md).
//
// Accepted: the outer batch as an array [ts, events] or [ts, events, dp_rank] (extra trailing
// elements ignored) or as a map with those keys; each event in the tagged-array form
// ["BlockStored", field1, ...] (fewer trailing fields allowed, extra ones ignored) or the
// tagged-map form {"type": "BlockStored", ...} (unknown keys ignored); hashes as uint64, int64
// (two's complement: the same 64 bits) or bin (its last 8 bytes, big-endian).
//
// A malformed or oversized event is skipped and reported; the rest of the batch still decodes.
// Only a payload whose outer structure is broken fails as a whole. Memory is bounded by the
// payload size and by kv_decode_limits.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cluster/wire/drop_cause.hpp"
#include "core/base/status.hpp"

namespace eldr {

enum class kv_event_type : uint8_t { block_stored, block_removed, all_blocks_cleared };

struct kv_event {
  kv_event_type type = kv_event_type::block_stored;
  std::vector<uint64_t> block_hashes;  // normalised to uint64
  std::optional<uint64_t> parent_block_hash;
  std::optional<std::string> medium;
  std::optional<int64_t> group_idx;
  // Decoded only with kv_decode_limits::keep_details (routing does not need them).
  std::vector<int64_t> token_ids;
  std::optional<int64_t> block_size;
  std::optional<int64_t> lora_id;
  std::optional<std::string> lora_name;
  std::vector<uint8_t> extra_keys;  // the raw MessagePack value; empty when nil or absent
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> kv_cache_spec_sliding_window;
  std::optional<std::string> locality;
  std::vector<uint8_t> ownership;  // raw MessagePack value; empty when nil or absent
};

struct kv_batch {
  double ts = 0.0;
  std::optional<int64_t> data_parallel_rank;
  std::vector<kv_event> events;
};

// A batch is what one engine step changed: its blocks are bounded by the tokens of the step
// (vLLM's max_num_batched_tokens / block_size, 8192 / 16 = 512 by default) plus the evictions
// that made room. The bounds leave room for the largest legitimate steps and keep the work and
// memory of one message small: decoding costs about 2 ms per MiB of payload, so a payload is
// bounded in bytes too, and the node applies the hashes in slices (cluster/ingest/ingest.hpp;
// measured in BENCHMARKS.md). A batch beyond a bound is dropped whole (oversized), an event
// beyond max_hashes alone.
struct kv_decode_limits {
  uint32_t max_events = 1 << 16;               // per batch; more make the batch oversized
  uint32_t max_hashes = 1 << 14;               // per event (a 256k-token prompt in blocks of 16)
  uint32_t max_batch_hashes = 1 << 15;         // over all events of a batch; more: batch oversized
  size_t max_payload_bytes = size_t{4} << 20;  // a larger payload is dropped before decoding
  bool keep_details = false;                   // decode token ids, LoRA, spec and extra keys too
};

// One problem met while decoding; `detail` says where, for the log.
struct kv_decode_issue {
  drop_cause cause;
  std::string detail;
};

// Decodes one payload. Errors (the whole payload dropped): bad_msgpack or bad_batch, reported as
// the status message prefixed with the cause name; issues about single events go to `issues`.
result<kv_batch> decode_kv_batch(std::span<const uint8_t> payload, const kv_decode_limits& limits,
                                 std::vector<kv_decode_issue>& issues);

// The cause a failed decode_kv_batch stands for.
drop_cause kv_batch_error_cause(const status& s);

// Big-endian 8-byte sequence frame; nullopt unless exactly 8 bytes.
std::optional<uint64_t> decode_sequence(std::span<const uint8_t> frame);

}  // namespace eldr
