// expert_ids: the byte encodings of expert ids shared by eldr-trace and the counts message.
//
// In memory an id is always an expert_id (16 bits). On the wire and in files a model of at most
// 256 experts keeps the original one-byte encoding (eldr-trace v1, eldr-counts v1), so that
// existing files and peers stay valid; a wider model's ids are little-endian uint16 (eldr-trace
// v2, eldr-counts v2). The width is a property of the format version, never guessed from data.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/geometry.hpp"

namespace eldr {

// Bytes per id in a format of this width: 1 (narrow formats) or 2 (wide formats).
inline constexpr uint32_t narrow_id_bytes = 1;
inline constexpr uint32_t wide_id_bytes = 2;

// The width writers use for a geometry: one byte when every id fits (E <= narrow_experts).
inline uint32_t id_bytes_for(const model_geometry& g) {
  return g.narrow_ids() ? narrow_id_bytes : wide_id_bytes;
}

// Appends ids to out, one byte each (id_bytes 1: the caller guarantees every id < 256) or
// little-endian uint16 (id_bytes 2).
void append_expert_ids(std::span<const expert_id> ids, uint32_t id_bytes,
                       std::vector<uint8_t>& out);

// Replaces out with the ids encoded in bytes at id_bytes per id. False (out unspecified) when
// bytes.size() is not a multiple of id_bytes. Ids are not range-checked here: the caller checks
// them against its geometry, as it must for any id from outside.
bool read_expert_ids(std::span<const uint8_t> bytes, uint32_t id_bytes,
                     std::vector<expert_id>& out);

}  // namespace eldr
