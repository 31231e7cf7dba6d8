// format_head: the pairs eldr's file formats (eldr-trace, eldr-centroids) open with: "format",
// "version", and the "model" map {name, layers, experts, top_k}. One writer, so that both files
// describe their model alike (docs/trace-format.md, docs/centroid-file.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "core/base/msgpack.hpp"
#include "core/geometry.hpp"

namespace eldr {

// Writes the three pairs; the caller's map header counts them.
inline void write_format_head(msgpack::writer& w, std::string_view format, uint32_t version,
                              std::string_view model_name, const model_geometry& g) {
  w.write_str("format");
  w.write_str(format);
  w.write_str("version");
  w.write_uint(version);
  w.write_str("model");
  w.write_map_header(4);
  w.write_str("name");
  w.write_str(model_name);
  w.write_str("layers");
  w.write_uint(g.layers);
  w.write_str("experts");
  w.write_uint(g.experts);
  w.write_str("top_k");
  w.write_uint(g.top_k);
}

}  // namespace eldr
