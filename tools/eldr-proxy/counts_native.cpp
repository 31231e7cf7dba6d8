// counts_native: eldr-proxy's compiled routed-experts-to-counts conversion (issue 13, "Speed";
// BENCHMARKS.md, "Routed experts to counts"), loaded with ctypes by eldr_proxy_native.py.
//
// The same bytes as eldr_client.counts_message with a TopkIds packed by msgpack, made by core's
// count_blocks and cluster's encode_counts_message: no second implementation of either. The C ABI
// below is the whole contract; everything else in the library is hidden (-fvisibility=hidden).
//
//   uint32_t eldr_counts_abi_version(void)
//       ELDR_COUNTS_ABI: bumped on any change of the functions below.
//   int eldr_counts_message(layers, experts, top_k, block_size, ids, id_bytes, tokens, hashes,
//                           parents, has_parent, n_blocks, has_seq, seq, handle, out, out_len,
//                           error, error_len)
//       ids: tokens x layers x top_k expert ids, C order, id_bytes (1: uint8, 2: uint16 in host
//       order) each, of the MoE layers only. The tokens make ceil(tokens / block_size) blocks;
//       hashes and parents (read where has_parent is nonzero) hold one uint64 per block. seq is
//       written when has_seq is nonzero. On success returns 0 and sets *out to *out_len bytes
//       (the MessagePack counts message) owned by *handle, valid until the caller passes the
//       handle to eldr_counts_free. Otherwise returns 1 (the input is refused: geometry, sizes,
//       an id >= experts, a count over the block's tokens (ids repeated in top-k rows), more
//       than 4096 blocks) or 2 (out of memory), leaves *handle and *out null and writes a
//       NUL-terminated message into error (truncated to error_len bytes). Never throws, never
//       aborts on input. Thread-safe: no state.
//   void eldr_counts_free(void* handle)     a null handle is ignored
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

#define ELDR_COUNTS_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr uint32_t abi_version = 2;
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
  const size_t count = size_t(q.tokens) * g.layers * g.top_k;
  std::vector<eldr::expert_id> ids(count);
  if (q.id_bytes == 2) {
    std::memcpy(ids.data(), q.ids, count * sizeof(eldr::expert_id));
  } else {
    const auto* narrow = static_cast<const uint8_t*>(q.ids);
    for (size_t i = 0; i < count; ++i)
      ids[i] = narrow[i];
  }
  auto blocks = eldr::count_blocks(g, ids, 0, uint32_t(q.tokens), q.block_size);
  if (!blocks.ok()) return blocks.error();
  eldr::counts_message m;
  m.geometry = g;
  if (q.has_seq) m.seq = q.seq;
  m.blocks.resize(blocks->size());
  for (size_t b = 0; b < blocks->size(); ++b) {
    eldr::counts_block& out = m.blocks[b];
    out.hash = q.hashes[b];
    if (q.has_parent[b] != 0) out.parent = q.parents[b];
    out.counts = std::move((*blocks)[b]);  // count_blocks refused repeated ids in a top-k row
  }
  return eldr::encode_counts_message(m);
}

}  // namespace

ELDR_COUNTS_EXPORT uint32_t eldr_counts_abi_version(void) {
  return abi_version;
}

ELDR_COUNTS_EXPORT int eldr_counts_message(uint32_t layers, uint32_t experts, uint32_t top_k,
                                           uint32_t block_size, const void* ids, uint32_t id_bytes,
                                           uint64_t tokens, const uint64_t* hashes,
                                           const uint64_t* parents, const uint8_t* has_parent,
                                           uint64_t n_blocks, int has_seq, uint64_t seq,
                                           void** handle, const uint8_t** out, size_t* out_len,
                                           char* error, size_t error_len) {
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

ELDR_COUNTS_EXPORT void eldr_counts_free(void* handle) {
  delete static_cast<std::vector<uint8_t>*>(handle);
}
