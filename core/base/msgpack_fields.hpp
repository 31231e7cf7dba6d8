// msgpack_fields: the typed readers every eldr MessagePack codec shares (the route, worker and
// admin protocols, the counts message, the trace and centroid files): read a typed field, name it
// in errors, keep the error's code. One copy, so every format reports errors alike
// ("route_request.blocks[3]: expected int, found str", "eldr-centroids.epoch: missing").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/base/msgpack.hpp"
#include "core/base/status.hpp"

namespace eldr::table {

std::string join(std::string_view a, std::string_view b);
// "type.name", how errors name a field of a message or file.
std::string field(std::string_view type, std::string_view name);
// Prefixes a status with the field it is about, keeping its code: a truncation stays corrupt, a
// limit stays out_of_range, so a caller mapping codes (wire_error_for_decode, counts_error_cause)
// still sees the original cause.
status at(std::string_view what, const status& s);
// "type.name: missing" (invalid_argument).
status missing(std::string_view type, std::string_view name);

// Reads the next value and requires its kind. Wrong kinds are invalid_argument (the bytes are
// fine MessagePack, the message is wrong), so a peer learns which field it got wrong.
status next_of(msgpack::reader& r, msgpack::kind want, std::string_view what, msgpack::item& it);
// A string of at most max_bytes (out_of_range beyond) that is valid UTF-8 (invalid_argument):
// every string read is checked here, so a decoded message can always be logged, echoed and dumped
// as JSON.
status read_string(msgpack::reader& r, std::string_view what, uint32_t max_bytes, std::string& out);
status read_nonempty(msgpack::reader& r, std::string_view what, uint32_t max_bytes,
                     std::string& out);
status read_u64(msgpack::reader& r, std::string_view what, uint64_t& out);
status read_u32(msgpack::reader& r, std::string_view what, uint32_t& out);
status read_bool(msgpack::reader& r, std::string_view what, bool& out);
// Any MessagePack number (Python writes float64, a hand-written peer may send an integer).
status read_number(msgpack::reader& r, std::string_view what, double& out);
// An array header of at most max_items elements (out_of_range beyond: "what: 5000 blocks, limit
// 4096", `unit` naming what the array holds). Reserving by a.length is then safe.
status read_array(msgpack::reader& r, std::string_view what, uint32_t max_items,
                  std::string_view unit, msgpack::item& a);
// "what[i]", how errors name an element of an array field; built only when an element fails.
std::string element(std::string_view what, uint32_t i);
// True when the next value is nil, which is then consumed: optional fields may be sent as nil.
bool take_nil(msgpack::reader& r);
// "byte 3 (0x0a)", how errors point at one byte of a string.
std::string byte_at(std::string_view s, size_t i);

}  // namespace eldr::table
