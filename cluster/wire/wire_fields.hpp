// wire_fields: what the route, worker and admin protocols' codecs share beyond core's field
// readers (core/base/msgpack_fields.hpp): the envelope every message opens with ("version",
// "type") and the checks of endpoint strings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/base/msgpack.hpp"
#include "core/base/msgpack_fields.hpp"
#include "core/base/status.hpp"
#include "core/base/utf8.hpp"

namespace eldr::wire {

// The MessagePack vocabulary of every codec's readers: `using namespace wire` brings it along.
using msgpack::item;
using msgpack::kind;
using msgpack::reader;

// core's field readers (core/base/msgpack_fields.hpp), under the names the codecs use.
using table::at;
using table::element;
using table::field;
using table::join;
using table::missing;
using table::next_of;
using table::read_array;
using table::read_bool;
using table::read_nonempty;
using table::read_number;
using table::read_string;
using table::read_u32;
using table::read_u64;
using table::take_nil;

// What a string naming an endpoint may be. Every endpoint is 1..max bytes of printable ASCII
// without whitespace, quotes ("'`) or backslashes: it is logged, shown in tables and written into
// metrics labels, and no endpoint form needs them. zmq_connect endpoints are also ones the node
// itself connects a ZeroMQ socket to, so only tcp:// and ipc:// (never inproc://, which would
// reach sockets inside the node).
enum class endpoint_use { opaque, zmq_connect };
// Checks s; the error (invalid_argument) names `what` and the first offending byte.
status check_endpoint(std::string_view what, std::string_view s, endpoint_use use);

// A non-empty endpoint (read_nonempty, then check_endpoint).
status read_endpoint(msgpack::reader& r, std::string_view what, uint32_t max_bytes,
                     endpoint_use use, std::string& out);
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
