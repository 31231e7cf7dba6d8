// format_head: what eldr's file formats (eldr-trace, eldr-centroids) share as field tables: the
// limits their fields read under, the "format" and "version" pairs they open with, and the
// "model" map {name, layers, experts, top_k}. One definition, so that both files describe their
// model alike and report a damaged head alike (docs/trace-format.md, docs/centroid-file.md).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "core/base/field_table.hpp"
#include "core/base/msgpack.hpp"
#include "core/base/status.hpp"
#include "core/geometry.hpp"

namespace eldr {

// The limits of every field of eldr's files. Generous: they bound what a damaged or hostile file
// can make a reader hold, not what a real file needs.
struct file_limits {
  uint32_t max_name_bytes = 4096;         // a name, id, label, transform or provenance string
  uint32_t max_text_bytes = 1u << 24;     // free text (a trace's source)
  uint32_t max_mask_layers = max_layers;  // the entries of a layer mask
};

// What a file table's fields read into beyond their own struct: nothing for the centroid file,
// the id width of the trace's version for a trace request.
template <class X = std::monostate>
using file_context = table::decode_context<file_limits, X>;

// The "model" map.
struct format_model {
  std::string name;
  uint32_t layers = 0;
  uint32_t experts = 0;
  uint32_t top_k = 0;

  model_geometry geometry() const { return {layers, experts, top_k}; }
};

// The table of the "model" map of the file whose type is `path` ("eldr-trace.model").
template <class X = std::monostate>
table::message_table<format_model, file_limits, X> model_table(std::string_view path) {
  using F = table::fields<format_model, file_limits, X>;
  return {path,
          {
              F::template str<&format_model::name>("name", &file_limits::max_name_bytes,
                                                   table::required | table::once),
              F::template u32<&format_model::layers>("layers", table::required | table::once),
              F::template u32<&format_model::experts>("experts", table::required | table::once),
              F::template u32<&format_model::top_k>("top_k", table::required | table::once),
          }};
}

// The "format" and "version" every file opens with.
struct format_head {
  std::optional<std::string> format;
  std::optional<uint32_t> version;
};

// Reads "format" and "version" from the top-level map of a file of type `format` (its other
// fields are skipped, unread) and checks them, before anything else is read: a file of another
// type or of a version this build does not read says so, not that some field it lays out
// differently is wrong. Errors: "eldr-trace.format: \"x\", expected \"eldr-trace\"",
// "eldr-trace.version: 3, this build reads 1 and 2" (failed_precondition), "eldr-trace.format:
// missing"; otherwise as the table readers say (corrupt for bytes that are no MessagePack, invalid
// argument for a value of the wrong kind). Callers report every one as their file's corruption.
// On success `version` is the file's.
status check_format_head(std::span<const uint8_t> bytes, std::string_view format,
                         std::initializer_list<uint32_t> versions, uint32_t& version);

// The two head fields of a file table over M, which holds them as members `format` and `version`.
template <class M, class X = std::monostate>
table::field_spec<M, file_limits, X> format_field() {
  return table::fields<M, file_limits, X>::template str<&M::format>(
      "format", &file_limits::max_name_bytes, table::required | table::once);
}
template <class M, class X = std::monostate>
table::field_spec<M, file_limits, X> version_field() {
  return table::fields<M, file_limits, X>::template u32<&M::version>("version",
                                                                     table::required | table::once);
}

}  // namespace eldr
