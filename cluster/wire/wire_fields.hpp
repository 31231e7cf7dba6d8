// wire_fields: the field readers and writers every eldr message codec shares (route, worker and
// admin protocols): read a typed field, name it in errors, keep the error's code. One copy, so
// the three protocols report errors alike ("route_request.blocks[3]: expected int, found str").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/base/msgpack.hpp"
#include "core/base/status.hpp"
#include "core/base/utf8.hpp"

namespace eldr::wire {

// The MessagePack vocabulary of every codec's readers: `using namespace wire` brings it along.
using msgpack::item;
using msgpack::kind;
using msgpack::reader;

std::string join(std::string_view a, std::string_view b);
// "type.name", how errors name a field of a message.
std::string field(std::string_view type, std::string_view name);
// Prefixes a status with the field it is about, keeping its code: a truncation stays corrupt, a
// limit stays out_of_range, so wire_error_for_decode still sees the original cause.
status at(std::string_view what, const status& s);
// "type.name: missing" (invalid_argument).
status missing(std::string_view type, std::string_view name);

// What a string naming an endpoint may be. Every endpoint is 1..max bytes of printable ASCII
// without whitespace, quotes ("'`) or backslashes: it is logged, shown in tables and written into
// metrics labels, and no endpoint form needs them. zmq_connect endpoints are also ones the node
// itself connects a ZeroMQ socket to, so only tcp:// and ipc:// (never inproc://, which would
// reach sockets inside the node).
enum class endpoint_use { opaque, zmq_connect };
// Checks s; the error (invalid_argument) names `what` and the first offending byte.
status check_endpoint(std::string_view what, std::string_view s, endpoint_use use);

// Reads the next value and requires its kind. Wrong kinds are invalid_argument (the bytes are
// fine MessagePack, the message is wrong), so a client learns which field it got wrong.
status next_of(msgpack::reader& r, msgpack::kind want, std::string_view what, msgpack::item& it);
// A string of at most max_bytes (out_of_range beyond) that is valid UTF-8 (invalid_argument):
// every string a peer sends is checked here, so a decoded message can always be logged, echoed
// and dumped as JSON.
status read_string(msgpack::reader& r, std::string_view what, uint32_t max_bytes, std::string& out);
status read_nonempty(msgpack::reader& r, std::string_view what, uint32_t max_bytes,
                     std::string& out);
// A non-empty endpoint (read_nonempty, then check_endpoint).
status read_endpoint(msgpack::reader& r, std::string_view what, uint32_t max_bytes,
                     endpoint_use use, std::string& out);
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

// The envelope every message starts with: a map of `fields` + 2 entries, "version" and "type".
void write_envelope(msgpack::writer& w, uint32_t fields, uint32_t version, std::string_view type);

// The envelope every message shares: a map holding "version" and "type" plus the message's own
// fields. read_envelope makes a first pass over the whole map: it checks the payload size, the
// structure, the version, and reads the type -- so a message of another type or version is named
// as such even when its fields come first and would not decode. `what` names the message in its
// errors. `r` must read `payload`.
struct envelope {
  std::string type;
  size_t fields_at = 0;  // reader offset of the first key
  uint32_t pairs = 0;
};
status read_envelope(std::span<const uint8_t> payload, uint32_t max_payload_bytes, uint32_t version,
                     std::string_view what, msgpack::reader& r, envelope& env);

// Second pass: hands every field but version and type to on_field(key, reader, known) in wire
// order; a field it does not know (known = false) is skipped. The structure was checked by
// read_envelope, so only field contents can fail here.
template <class F>
status for_each_field(msgpack::reader& r, const envelope& env, F&& on_field) {
  r.seek(env.fields_at);
  for (uint32_t i = 0; i < env.pairs; ++i) {
    const std::string_view key = *r.read_str();
    bool known = false;
    if (key != "version" && key != "type") {
      if (status s = on_field(key, r, known); !s.ok()) return s;
    }
    if (!known) (void)r.skip();
  }
  return {};
}

// Both passes for a message that must be of `type` (another type: not_found, which
// wire_error_for_decode answers as unknown_type).
template <class F>
status decode_message(std::span<const uint8_t> payload, uint32_t max_payload_bytes,
                      uint32_t version, std::string_view type, F&& on_field) {
  msgpack::reader r(payload.data(), payload.size());
  envelope env;
  if (status s = read_envelope(payload, max_payload_bytes, version, type, r, env); !s.ok())
    return s;
  if (env.type != type) return status::not_found(field(type, "type: \"") + env.type + "\"");
  return for_each_field(r, env, on_field);
}

}  // namespace eldr::wire
