// admin_protocol: see admin_protocol.hpp and docs/protocol.md, section 5.
//
// Argument and result values are converted between MessagePack and nlohmann::json here, with core's
// bounds-checked reader, rather than with nlohmann's from_msgpack: the conversion is bounded in
// depth (its recursion is at most max_depth deep), in values (max_values) and in bytes (the
// payload limit), checks UTF-8, and cannot throw.
#include "cluster/wire/admin_protocol.hpp"

#include <algorithm>
#include <exception>
#include <string_view>
#include <utility>

#include "cluster/wire/wire_fields.hpp"
#include "cluster/wire/wire_table.hpp"
#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

using namespace wire;
using nlohmann::json;

constexpr std::string_view request_type = "admin_request";
constexpr std::string_view reply_type = "admin_reply";

// Where a value sits in args / result, rendered only for an error message: a chain of frames on
// the stack of the recursive conversion ("admin_request.args.model", "...layers[3]").
struct path {
  const path* parent = nullptr;
  std::string_view root;  // set on the outermost frame only
  std::string_view key;   // a map member ...
  int64_t index = -1;     // ... or an array element

  std::string str() const {
    std::string s = parent ? parent->str() : std::string(root);
    if (index >= 0)
      s += "[" + std::to_string(index) + "]";
    else if (parent)
      s += "." + std::string(key);
    return s;
  }
};

// Converts the next MessagePack value into out. depth counts the containers this value sits in;
// values counts every value converted so far, against the limit.
status to_json(reader& r, const admin_protocol_limits& limits, const path& where, uint32_t depth,
               uint64_t& values, json& out) {
  if (++values > limits.max_values)
    return status::out_of_range(where.str() + ": more than " + std::to_string(limits.max_values) +
                                " values");
  item it;
  if (status s = r.next(it); !s.ok()) return at(where.str(), s);
  switch (it.type) {
    case kind::nil:
      out = nullptr;
      return {};
    case kind::boolean:
      out = it.boolean;
      return {};
    case kind::positive_int:
      out = it.uint_value;
      return {};
    case kind::negative_int:
      out = it.int_value;
      return {};
    case kind::float32:
    case kind::float64:
      out = it.float_value;
      return {};
    case kind::str:
      if (!valid_utf8(it.str())) return status::invalid_argument(where.str() + ": invalid UTF-8");
      out = std::string(it.str());
      return {};
    case kind::bin:
      out = json::binary(json::binary_t::container_type(it.bytes().begin(), it.bytes().end()));
      return {};
    case kind::ext:
      // The ext type's bit pattern as the subtype, as nlohmann's own MessagePack codec does.
      out = json::binary(json::binary_t::container_type(it.bytes().begin(), it.bytes().end()),
                         static_cast<uint8_t>(it.ext_type));
      return {};
    case kind::array:
    case kind::map:
      break;
  }
  if (depth + 1 > limits.max_depth)
    return status::out_of_range(where.str() + ": nested deeper than " +
                                std::to_string(limits.max_depth));
  // Every element (every map value) is at least one value: refuse before reserving.
  const uint64_t elements = it.length;
  if (elements > limits.max_values - std::min<uint64_t>(values, limits.max_values))
    return status::out_of_range(where.str() + ": " + std::to_string(elements) +
                                " elements exceed the limit of " +
                                std::to_string(limits.max_values) + " values");
  if (it.type == kind::array) {
    out = json::array();
    auto& a = out.get_ref<json::array_t&>();
    a.reserve(it.length);  // <= the bytes left, and within max_values
    for (uint32_t i = 0; i < it.length; ++i) {
      const path child{&where, {}, {}, static_cast<int64_t>(i)};
      a.emplace_back();
      if (status s = to_json(r, limits, child, depth + 1, values, a.back()); !s.ok()) return s;
    }
    return {};
  }
  out = json::object();
  auto& o = out.get_ref<json::object_t&>();
  for (uint32_t i = 0; i < it.length; ++i) {
    item key;
    if (status s = next_of(r, kind::str, where.str() + " key", key); !s.ok()) return s;
    if (!valid_utf8(key.str()))
      return status::invalid_argument(where.str() + " key: invalid UTF-8");
    const path child{&where, {}, key.str(), -1};
    json v;
    if (status s = to_json(r, limits, child, depth + 1, values, v); !s.ok()) return s;
    o[std::string(key.str())] = std::move(v);  // a repeated key: the last one wins
  }
  return {};
}

// Reads one value that must be a map (args).
status to_json_map(reader& r, const admin_protocol_limits& limits, std::string_view what,
                   json& out) {
  item it;
  if (status s = r.peek(it); !s.ok()) return at(what, s);
  if (it.type != kind::map)
    return status::invalid_argument(join(what, ": expected map, found ") +
                                    msgpack::to_string(it.type));
  const path root{nullptr, what, {}, -1};
  uint64_t values = 0;
  return to_json(r, limits, root, 0, values, out);
}

status to_json_value(reader& r, const admin_protocol_limits& limits, std::string_view what,
                     json& out) {
  const path root{nullptr, what, {}, -1};
  uint64_t values = 0;
  return to_json(r, limits, root, 0, values, out);
}

void write_json(msgpack::writer& w, const json& j) {
  switch (j.type()) {
    case json::value_t::null:
    case json::value_t::discarded:
      w.write_nil();
      return;
    case json::value_t::boolean:
      w.write_bool(j.get<bool>());
      return;
    case json::value_t::number_integer:
      w.write_int(j.get<int64_t>());
      return;
    case json::value_t::number_unsigned:
      w.write_uint(j.get<uint64_t>());
      return;
    case json::value_t::number_float:
      w.write_float64(j.get<double>());
      return;
    case json::value_t::string:
      w.write_str(j.get_ref<const std::string&>());
      return;
    case json::value_t::binary: {
      const auto& b = j.get_binary();
      if (b.has_subtype())
        w.write_ext(static_cast<int8_t>(static_cast<uint8_t>(b.subtype())), b);
      else
        w.write_bin(b);
      return;
    }
    case json::value_t::array:
      w.write_array_header(static_cast<uint32_t>(j.size()));
      for (const json& e : j)
        write_json(w, e);
      return;
    case json::value_t::object:
      w.write_map_header(static_cast<uint32_t>(j.size()));
      for (const auto& [k, v] : j.items()) {
        w.write_str(k);
        write_json(w, v);
      }
      return;
  }
  w.write_nil();
}

using L = admin_protocol_limits;
using request_fields = wire::fields<admin_request, L>;
using reply_fields = wire::fields<admin_reply, L>;

const message_table<admin_request, L> request_table{
    request_type,
    {
        request_fields::str<&admin_request::id>("id", &L::max_id_bytes, nil_ok | omit_empty),
        request_fields::str<&admin_request::command>("command", &L::max_command_bytes,
                                                     required | nonempty),
        // Always an object: nil reads as {}, and a null args is written as an empty map.
        request_fields::custom(
            "args", nil_ok,
            [](reader& r, const request_fields::spec&, const request_fields::context& c,
               std::string_view what,
               admin_request& m) { return to_json_map(r, c.limits, what, m.args); },
            [](std::vector<uint8_t>& out, const admin_request& m) {
              msgpack::writer w(out);
              if (m.args.is_null())
                w.write_map_header(0);
              else
                write_json(w, m.args);
            },
            [](admin_request& m) { m.args = json::object(); }),
    }};

// result when ok; code and error when not.
const message_table<admin_reply, L> reply_table{
    reply_type,
    {
        reply_fields::str<&admin_reply::id>("id", &L::max_id_bytes, nil_ok | omit_empty),
        reply_fields::boolean<&admin_reply::ok>("ok", required),
        reply_fields::custom(
            "result", 0,
            [](reader& r, const reply_fields::spec&, const reply_fields::context& c,
               std::string_view what,
               admin_reply& m) { return to_json_value(r, c.limits, what, m.result); },
            [](std::vector<uint8_t>& out, const admin_reply& m) {
              msgpack::writer w(out);
              write_json(w, m.result);
            })
            .written_when([](const admin_reply& m) { return m.ok; }),
        reply_fields::enum8<&admin_reply::code>("code", nil_ok)
            .written_when([](const admin_reply& m) { return !m.ok; }),
        reply_fields::str<&admin_reply::error>("error", &L::max_error_bytes, nil_ok)
            .written_when([](const admin_reply& m) { return !m.ok; }),
    },
    // A failure must say which (a nil code is none).
    [](const admin_reply& m, uint64_t seen) {
      if (!m.ok && !(seen & reply_table.bit("code"))) return missing(reply_type, "code");
      return status{};
    }};

}  // namespace

std::vector<uint8_t> encode_admin_request(const admin_request& m) {
  return request_table.encode(admin_protocol_version, m);
}

std::vector<uint8_t> encode_admin_reply(const admin_reply& m) {
  return reply_table.encode(admin_protocol_version, m);
}

namespace {

// The conversions above throw nothing but std::bad_alloc (json values are built only from checked
// items); the catch keeps even that inside the status contract.
template <class M>
result<M> decode_guarded(const message_table<M, L>& table, std::span<const uint8_t> payload,
                         const admin_protocol_limits& limits) {
  try {
    return table.decode(payload, limits.max_payload_bytes, admin_protocol_version, limits);
  } catch (const std::exception& e) {
    return status::out_of_range(join(table.type(), ": ") + e.what());
  }
}

}  // namespace

result<admin_request> decode_admin_request(std::span<const uint8_t> payload,
                                           const admin_protocol_limits& limits) {
  return decode_guarded(request_table, payload, limits);
}

result<admin_reply> decode_admin_reply(std::span<const uint8_t> payload,
                                       const admin_protocol_limits& limits) {
  return decode_guarded(reply_table, payload, limits);
}

namespace {

// The value as the error shows it: its JSON text, cut short (a decoded value is valid UTF-8, so
// dump cannot throw; the cut may split a character, hence the replacing dump).
std::string shown(const json& v) {
  std::string text = v.is_binary()
                         ? "a binary of " + std::to_string(v.get_binary().size()) + " bytes"
                         : v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

const json* find_arg(const json& args, std::string_view key) {
  if (!args.is_object()) return nullptr;
  auto it = args.find(key);
  if (it == args.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

result<std::optional<uint64_t>> admin_uint_arg(const json& args, std::string_view key,
                                               uint64_t max) {
  const json* v = find_arg(args, key);
  if (!v) return std::optional<uint64_t>();
  // MessagePack writes a non-negative int64 as an int too: take either integer kind.
  std::optional<uint64_t> got;
  if (v->is_number_unsigned())
    got = v->get<uint64_t>();
  else if (v->is_number_integer() && v->get<int64_t>() >= 0)
    got = static_cast<uint64_t>(v->get<int64_t>());
  if (!got || *got > max)
    return status::invalid_argument("argument '" + std::string(key) +
                                    "' must be an unsigned integer <= " + std::to_string(max) +
                                    ", got " + shown(*v));
  return got;
}

result<std::optional<std::string>> admin_string_arg(const json& args, std::string_view key) {
  const json* v = find_arg(args, key);
  if (!v) return std::optional<std::string>();
  if (!v->is_string())
    return status::invalid_argument("argument '" + std::string(key) + "' must be a string, got " +
                                    shown(*v));
  return std::optional<std::string>(v->get<std::string>());
}

}  // namespace eldr
