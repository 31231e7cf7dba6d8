// wire_fields: see wire_fields.hpp.
#include "cluster/wire/wire_fields.hpp"

namespace eldr::wire {

// A message type name longer than this is not one of ours.
constexpr uint32_t max_type_bytes = 64;

namespace {

using table::byte_at;

bool endpoint_char(char ch) {
  const auto c = static_cast<unsigned char>(ch);
  return c > 0x20 && c < 0x7f && c != '"' && c != '\'' && c != '`' && c != '\\';
}

}  // namespace

status check_endpoint(std::string_view what, std::string_view s, endpoint_use use) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!endpoint_char(s[i]))
      return status::invalid_argument(
          join(what, ": contains ") + byte_at(s, i) +
          "; an endpoint is printable ASCII without whitespace, quotes or backslashes");
  if (use == endpoint_use::zmq_connect) {
    const bool tcp = s.starts_with("tcp://") && s.size() > 6;
    const bool ipc = s.starts_with("ipc://") && s.size() > 6;
    if (!tcp && !ipc)
      return status::invalid_argument(join(what, ": \"") + std::string(s) +
                                      "\" is not tcp://HOST:PORT or ipc://PATH");
  }
  return {};
}

status read_endpoint(reader& r, std::string_view what, uint32_t max_bytes, endpoint_use use,
                     std::string& out) {
  if (status s = read_nonempty(r, what, max_bytes, out); !s.ok()) return s;
  return check_endpoint(what, out, use);
}

void write_envelope(msgpack::writer& w, uint32_t fields, uint32_t version, std::string_view type) {
  w.write_map_header(fields + 2);
  w.write_str("version");
  w.write_uint(version);
  w.write_str("type");
  w.write_str(type);
}

status read_envelope(std::span<const uint8_t> payload, uint32_t max_payload_bytes, uint32_t version,
                     std::string_view what, reader& r, envelope& env) {
  if (payload.size() > max_payload_bytes)
    return status::out_of_range(join(what, ": payload of ") + std::to_string(payload.size()) +
                                " bytes, limit " + std::to_string(max_payload_bytes));
  item top;
  if (status s = next_of(r, kind::map, what, top); !s.ok()) return s;
  env.fields_at = r.offset();
  env.pairs = top.length;
  bool have_version = false, have_type = false;
  const std::string key_what = join(what, " key");
  for (uint32_t i = 0; i < top.length; ++i) {
    item key;
    if (status s = next_of(r, kind::str, key_what, key); !s.ok()) return s;
    if (key.str() == "version") {
      uint32_t v = 0;
      if (status s = read_u32(r, field(what, "version"), v); !s.ok()) return s;
      if (v != version)
        return status::failed_precondition(field(what, "version: ") + std::to_string(v) +
                                           ", this build reads " + std::to_string(version));
      have_version = true;
    } else if (key.str() == "type") {
      if (status s = read_string(r, field(what, "type"), max_type_bytes, env.type); !s.ok())
        return s;
      have_type = true;
    } else if (status s = r.skip(); !s.ok()) {
      return at(field(what, key.str()), s);
    }
  }
  if (!r.at_end()) return status::corrupt(join(what, ": trailing bytes after the message"));
  if (!have_version) return status::invalid_argument(field(what, "version: missing"));
  if (!have_type) return status::invalid_argument(field(what, "type: missing"));
  return {};
}

}  // namespace eldr::wire
