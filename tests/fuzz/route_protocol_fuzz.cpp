// Fuzz target: the route protocol's three decoders on arbitrary bytes never crash or over-allocate;
// whatever they accept stays within the limits and survives a re-encode unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cluster/wire/route_protocol.hpp"
#include "core/base/utf8.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  eldr::route_protocol_limits limits;
  limits.max_blocks = 64;  // small limits, so the fuzzer reaches them
  limits.max_band = 16;
  limits.max_id_bytes = 32;
  const std::span<const uint8_t> in(data, size);

  std::vector<eldr::kv_decode_issue> issues;
  if (const auto m = eldr::decode_route_request(in, limits, issues); m.ok()) {
    if (m->block_hashes.size() > limits.max_blocks || m->id.empty() || m->model.empty() ||
        !eldr::valid_utf8(m->id) || !eldr::valid_utf8(m->model) ||
        (m->counts && m->counts->blocks.size() > limits.max_blocks))
      std::abort();
    std::vector<eldr::kv_decode_issue> issues2;
    const auto back = eldr::decode_route_request(eldr::encode_route_request(*m), limits, issues2);
    if (!back.ok() || !issues2.empty() || back->id != m->id || back->model != m->model ||
        back->block_hashes != m->block_hashes || back->label != m->label ||
        back->cached_blocks != m->cached_blocks || back->explain != m->explain ||
        back->counts.has_value() != m->counts.has_value() ||
        (m->counts && back->counts->blocks.size() != m->counts->blocks.size()))
      std::abort();
  }

  if (const auto r = eldr::decode_route_reply(in, limits); r.ok()) {
    if (r->covered_blocks > r->total_blocks ||
        (r->explain && r->explain->band.size() > limits.max_band))
      std::abort();
    const auto back = eldr::decode_route_reply(eldr::encode_route_reply(*r), limits);
    // Compared field by field: a NaN score is a legal float32 and never equals itself.
    if (!back.ok() || back->id != r->id || back->worker != r->worker ||
        back->endpoint != r->endpoint || back->epoch != r->epoch ||
        back->covered_blocks != r->covered_blocks || back->total_blocks != r->total_blocks ||
        back->explain.has_value() != r->explain.has_value() ||
        (r->explain && back->explain->band.size() != r->explain->band.size()))
      std::abort();
  }

  if (const auto e = eldr::decode_error_reply(in, limits); e.ok()) {
    const auto back = eldr::decode_error_reply(eldr::encode_error_reply(*e), limits);
    if (!back.ok() || !(*back == *e)) std::abort();
  }
  return 0;
}
