// counts_native: eldr-proxy's compiled routed-experts-to-counts conversion (issue 13, "Speed";
// BENCHMARKS.md, "Routed experts to counts"), loaded with ctypes by eldr_proxy_native.py.
//
// The same bytes as eldr_client.counts_message with a TopkIds packed by msgpack, made by core's
// counting (for_each_block_count, count_blocks' blocks as they are counted) and cluster's counts
// encoder (encode_counts_message_as_added, which encode_counts_message also writes with): no
// second implementation of either. vLLM's base64 .npy string is decoded here too
// (routed_experts_npy.hpp). The C ABI below is the whole contract; everything else in the library
// is hidden (-fvisibility=hidden).
//
//   uint32_t eldr_counts_abi_version(void)
//       ELDR_COUNTS_ABI: bumped on any change of the functions below.
//   int eldr_routed_experts_decode(text, text_len, out, out_len, dtype, shape, data_offset,
//                                  error, error_len)
//       text: text_len bytes of vLLM's routed_experts string (need not be NUL-terminated); out:
//       out_len >= text_len / 4 * 3 writable bytes. On success returns 0, the decoded .npy in
//       out, its elements C-order from out + *data_offset, *dtype (0 uint8, 1 uint16, 2 int32,
//       3 uint32, 4 int64, little-endian) and shape[0..2] (tokens, layers, top_k). Otherwise
//       returns 1 (not strict base64, not a .npy, not a 3-dimensional C-order integer array of
//       those dtypes, a negative id, out too small) or 2, with a message in error as below.
//   int eldr_counts_message(layers, experts, top_k, block_size, ids, id_bytes, tokens,
//                           token_stride, hashes, parents, has_parent, n_blocks, has_seq, seq,
//                           handle, out, out_len, error, error_len)
//       ids: expert ids of the MoE layers, id_bytes (1: uint8, 2: uint16 in host order) each;
//       token t's layers x top_k ids (C order) start at element t * token_stride (0: layers x
//       top_k, a C-order (tokens, layers, top_k) array; more: rows of a wider array, such as
//       vLLM's with its dense layers, read in place). The tokens make ceil(tokens / block_size)
//       blocks; hashes and parents (read where has_parent is nonzero) hold one uint64 per block.
//       seq is written when has_seq is nonzero. On success returns 0 and sets *out to *out_len
//       bytes (the MessagePack counts message) owned by *handle, valid until the caller passes
//       the handle to eldr_counts_free. Otherwise returns 1 (the input is refused: geometry,
//       sizes, an id >= experts, a count over the block's tokens (ids repeated in top-k rows),
//       more than 4096 blocks) or 2 (out of memory), leaves *handle and *out null and writes a
//       NUL-terminated message into error (truncated to error_len bytes).
//   int eldr_block_hashes(none_hash, token_ids, n_tokens, block_size, has_salt, salt, salt_len,
//                         partial_tag, tag_len, out, out_len, error, error_len)
//       vLLM's sha256_cbor block hashes of n_tokens int64 token ids (block_hashes_native.hpp):
//       ceil(n_tokens / block_size) digests of 32 bytes into out (out_len bytes). none_hash: 32
//       bytes; salt and partial_tag: UTF-8, not NUL-terminated; the salt is hashed when has_salt
//       is nonzero and salt_len > 0. Returns 0, 1 (refused: sizes, nulls) or 2 (OpenSSL failed,
//       out of memory) with a message in error as below.
//   void eldr_counts_free(void* handle)     a null handle is ignored
// None throws or aborts on input; all are thread-safe (no shared state).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "cluster/wire/counts_message.hpp"
#include "core/expert_counts.hpp"
#include "core/geometry.hpp"
#include "tools/eldr-proxy/block_hashes_native.hpp"
#include "tools/eldr-proxy/routed_experts_npy.hpp"

#define ELDR_COUNTS_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint32_t abi_version = 3;
constexpr int ok = 0;
constexpr int invalid = 1;
constexpr int internal = 2;
constexpr uint64_t max_message_blocks = 4096;  // eldr_client.counts_message's bound

int fail(int code, const std::string& message, char* error, size_t error_len) {
  if (error != nullptr && error_len > 0) {
    const size_t n = message.size() < error_len - 1 ? message.size() : error_len - 1;
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return code;
}

struct request {
  eldr::model_geometry geometry;
  uint32_t block_size = 0;
  const void* ids = nullptr;
  uint32_t id_bytes = 0;
  uint64_t tokens = 0;
  uint64_t token_stride = 0;  // in ids; 0: layers * top_k
  const uint64_t* hashes = nullptr;
  const uint64_t* parents = nullptr;
  const uint8_t* has_parent = nullptr;
  uint64_t n_blocks = 0;
  bool has_seq = false;
  uint64_t seq = 0;
};

// The message of a checked request, or the reason it is refused.
eldr::result<std::vector<uint8_t>> build(const request& q) {
  const eldr::model_geometry& g = q.geometry;
  if (eldr::status s = g.validate(); !s.ok()) return s;
  if (q.block_size < 1 || q.block_size > 255)
    return eldr::status::invalid_argument("block_size: a block holds 1..255 tokens, got " +
                                          std::to_string(q.block_size));
  if (q.id_bytes != 1 && q.id_bytes != 2)
    return eldr::status::invalid_argument("ids: 1 (uint8) or 2 (uint16) bytes per id, got " +
                                          std::to_string(q.id_bytes));
  const uint64_t n_blocks = (q.tokens + q.block_size - 1) / q.block_size;
  if (q.n_blocks != n_blocks)
    return eldr::status::invalid_argument(std::to_string(q.tokens) + " tokens in blocks of " +
                                          std::to_string(q.block_size) + " make " +
                                          std::to_string(n_blocks) + " blocks; got " +
                                          std::to_string(q.n_blocks) + " hashes");
  if (n_blocks > max_message_blocks)
    return eldr::status::invalid_argument("a counts message holds at most 4096 blocks, got " +
                                          std::to_string(n_blocks));
  if (q.tokens > 0 &&
      (q.ids == nullptr || q.hashes == nullptr || q.parents == nullptr || q.has_parent == nullptr))
    return eldr::status::invalid_argument("ids, hashes, parents or has_parent is null");
  if (q.tokens > UINT32_MAX)
    return eldr::status::invalid_argument(std::to_string(q.tokens) + " tokens");
  // The ids the tokens span: the last token's row ends (tokens - 1) * stride + L * k ids in.
  const uint64_t per_token = uint64_t{g.layers} * g.top_k;
  const uint64_t stride = q.token_stride == 0 ? per_token : q.token_stride;
  if (stride < per_token)
    return eldr::status::invalid_argument(
        "token_stride " + std::to_string(stride) +
        " is shorter than layers * top_k = " + std::to_string(per_token));
  uint64_t count = 0;
  if (q.tokens > 0 &&
      (__builtin_mul_overflow(q.tokens - 1, stride, &count) ||
       __builtin_add_overflow(count, per_token, &count) || count > (uint64_t{1} << 40)))
    return eldr::status::invalid_argument("the ids of " + std::to_string(q.tokens) +
                                          " tokens at a stride of " + std::to_string(stride) +
                                          " pass 2^40 ids");
  const auto tokens = static_cast<uint32_t>(q.tokens);
  // The message's size is at most: per block its header and L layer sizes, and per layer an
  // entry (an id and a count) for each expert its tokens picked.
  const uint64_t entries = std::min(
      n_blocks * g.layers * std::min<uint64_t>(g.experts, uint64_t{q.block_size} * g.top_k),
      q.tokens * per_token);
  const size_t reserve =
      64 + n_blocks * (40 + 5 * uint64_t{g.layers}) + entries * (g.narrow_ids() ? 2 : 3);
  // Each block is written into the message as soon as it is counted, from core's scratch: no
  // block_counts made and copied again. Core counts one-byte ids as they are: no widened copy.
  return eldr::encode_counts_message_as_added(
      g, q.has_seq ? std::optional<uint64_t>(q.seq) : std::nullopt, static_cast<uint32_t>(n_blocks),
      reserve, [&](eldr::counts_block_writer& message) {
        auto add = [&](uint32_t b, const eldr::block_counts_view& counts) {
          message.add(q.hashes[b],
                      q.has_parent[b] != 0 ? std::optional<uint64_t>(q.parents[b]) : std::nullopt,
                      counts);
          return eldr::status{};
        };
        return q.id_bytes == 1
                   ? eldr::for_each_block_count(
                         g, std::span(static_cast<const uint8_t*>(q.ids), count), 0, tokens,
                         q.block_size, stride, add)
                   : eldr::for_each_block_count(
                         g, std::span(static_cast<const eldr::expert_id*>(q.ids), count), 0, tokens,
                         q.block_size, stride, add);
      });
}

}  // namespace

ELDR_COUNTS_EXPORT uint32_t eldr_counts_abi_version(void) {
  return abi_version;
}

ELDR_COUNTS_EXPORT int eldr_routed_experts_decode(const char* text, size_t text_len, uint8_t* out,
                                                  size_t out_len, uint32_t* dtype, uint64_t* shape,
                                                  uint64_t* data_offset, char* error,
                                                  size_t error_len) {
  if (dtype == nullptr || shape == nullptr || data_offset == nullptr ||
      (text == nullptr && text_len > 0) || (out == nullptr && out_len > 0))
    return fail(invalid, "text, out, dtype, shape and data_offset must not be null", error,
                error_len);
  try {
    auto a = eldr::proxy::decode_routed_experts(std::string_view(text, text_len),
                                                std::span(out, out_len));
    if (!a.ok()) return fail(invalid, a.error().message(), error, error_len);
    *dtype = static_cast<uint32_t>(a->dtype);
    std::copy(a->shape, a->shape + 3, shape);
    *data_offset = a->data_offset;
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(internal, "out of memory", error, error_len);
  } catch (const std::exception& e) {
    return fail(internal, e.what(), error, error_len);
  }
}

ELDR_COUNTS_EXPORT int eldr_counts_message(uint32_t layers, uint32_t experts, uint32_t top_k,
                                           uint32_t block_size, const void* ids, uint32_t id_bytes,
                                           uint64_t tokens, uint64_t token_stride,
                                           const uint64_t* hashes, const uint64_t* parents,
                                           const uint8_t* has_parent, uint64_t n_blocks,
                                           int has_seq, uint64_t seq, void** handle,
                                           const uint8_t** out, size_t* out_len, char* error,
                                           size_t error_len) {
  if (handle == nullptr || out == nullptr || out_len == nullptr)
    return fail(invalid, "handle, out and out_len must not be null", error, error_len);
  *handle = nullptr;
  *out = nullptr;
  *out_len = 0;
  try {
    request q;
    q.geometry = {layers, experts, top_k};
    q.block_size = block_size;
    q.ids = ids;
    q.id_bytes = id_bytes;
    q.tokens = tokens;
    q.token_stride = token_stride;
    q.hashes = hashes;
    q.parents = parents;
    q.has_parent = has_parent;
    q.n_blocks = n_blocks;
    q.has_seq = has_seq != 0;
    q.seq = seq;
    auto bytes = build(q);
    if (!bytes.ok()) return fail(invalid, bytes.error().message(), error, error_len);
    // The caller reads the encoder's own buffer: no copy of a message of megabytes.
    auto* owner = new std::vector<uint8_t>(std::move(*bytes));
    *handle = owner;
    *out = owner->data();
    *out_len = owner->size();
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(internal, "out of memory", error, error_len);
  } catch (const std::exception& e) {
    return fail(internal, e.what(), error, error_len);
  }
}

ELDR_COUNTS_EXPORT int eldr_block_hashes(const uint8_t* none_hash, const int64_t* token_ids,
                                         uint64_t n_tokens, uint32_t block_size, int has_salt,
                                         const char* salt, size_t salt_len, const char* partial_tag,
                                         size_t tag_len, uint8_t* out, size_t out_len, char* error,
                                         size_t error_len) {
  if (none_hash == nullptr || (token_ids == nullptr && n_tokens > 0) ||
      (salt == nullptr && salt_len > 0) || (partial_tag == nullptr && tag_len > 0) ||
      (out == nullptr && out_len > 0))
    return fail(invalid, "none_hash, token_ids, salt, partial_tag or out is null", error,
                error_len);
  try {
    eldr::proxy::block_hash_request q;
    q.none_hash = std::span(none_hash, 32);
    q.token_ids = std::span(token_ids, n_tokens);
    q.block_size = block_size;
    q.has_salt = has_salt != 0;
    q.salt = std::string_view(salt, salt_len);
    q.partial_tag = std::string_view(partial_tag, tag_len);
    const eldr::status s = eldr::proxy::vllm_block_hashes(q, std::span(out, out_len));
    if (!s.ok())
      return fail(s.code() == eldr::status_code::invalid_argument ? invalid : internal, s.message(),
                  error, error_len);
    return ok;
  } catch (const std::bad_alloc&) {
    return fail(internal, "out of memory", error, error_len);
  } catch (const std::exception& e) {
    return fail(internal, e.what(), error, error_len);
  }
}

ELDR_COUNTS_EXPORT void eldr_counts_free(void* handle) {
  delete static_cast<std::vector<uint8_t>*>(handle);
}
