// msgpack_fields: see msgpack_fields.hpp.
#include "core/base/msgpack_fields.hpp"

#include "core/base/utf8.hpp"

namespace eldr::table {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;

std::string join(std::string_view a, std::string_view b) {
  std::string s(a);
  s += b;
  return s;
}

std::string field(std::string_view type, std::string_view name) {
  std::string s(type);
  s += '.';
  s += name;
  return s;
}

status at(std::string_view what, const status& s) {
  return {s.code(), join(what, ": ") + s.message()};
}

status missing(std::string_view type, std::string_view name) {
  return status::invalid_argument(field(type, name) + ": missing");
}

std::string byte_at(std::string_view s, size_t i) {
  static constexpr char hex[] = "0123456789abcdef";
  const auto c = static_cast<unsigned char>(s[i]);
  std::string out = "byte ";
  out += std::to_string(i);
  out += " (0x";
  out += hex[c >> 4];
  out += hex[c & 15];
  out += ')';
  return out;
}

status next_of(reader& r, kind want, std::string_view what, item& it) {
  if (status s = r.next(it); !s.ok()) return at(what, s);
  if (it.type != want)
    return status::invalid_argument(join(what, ": expected ") + msgpack::to_string(want) +
                                    ", found " + msgpack::to_string(it.type));
  return {};
}

status read_string(reader& r, std::string_view what, uint32_t max_bytes, std::string& out) {
  item it;
  if (status s = next_of(r, kind::str, what, it); !s.ok()) return s;
  if (it.length > max_bytes)
    return status::out_of_range(join(what, ": ") + std::to_string(it.length) + " bytes, limit " +
                                std::to_string(max_bytes));
  const std::string_view v = it.str();
  if (const size_t bad = utf8_error_at(v); bad != v.size())
    return status::invalid_argument(join(what, ": not valid UTF-8 at ") + byte_at(v, bad));
  out.assign(v);
  return {};
}

status read_nonempty(reader& r, std::string_view what, uint32_t max_bytes, std::string& out) {
  if (status s = read_string(r, what, max_bytes, out); !s.ok()) return s;
  if (out.empty()) return status::invalid_argument(join(what, ": empty"));
  return {};
}

namespace {

// A scalar of one kind, taken from the item member that holds it.
template <class T>
status read_scalar(reader& r, kind want, T item::*value, std::string_view what, T& out) {
  item it;
  if (status s = next_of(r, want, what, it); !s.ok()) return s;
  out = it.*value;
  return {};
}

}  // namespace

status read_u64(reader& r, std::string_view what, uint64_t& out) {
  return read_scalar(r, kind::positive_int, &item::uint_value, what, out);
}

status read_u32(reader& r, std::string_view what, uint32_t& out) {
  uint64_t v = 0;
  if (status s = read_u64(r, what, v); !s.ok()) return s;
  if (v > UINT32_MAX) return status::invalid_argument(join(what, ": exceeds 2^32-1"));
  out = static_cast<uint32_t>(v);
  return {};
}

status read_bool(reader& r, std::string_view what, bool& out) {
  return read_scalar(r, kind::boolean, &item::boolean, what, out);
}

status read_number(reader& r, std::string_view what, double& out) {
  item it;
  if (status s = r.next(it); !s.ok()) return at(what, s);
  if (it.is_float())
    out = it.float_value;
  else if (it.type == kind::positive_int)
    out = static_cast<double>(it.uint_value);
  else if (it.type == kind::negative_int)
    out = static_cast<double>(it.int_value);
  else
    return status::invalid_argument(join(what, ": expected a number, found ") +
                                    msgpack::to_string(it.type));
  return {};
}

status read_array(reader& r, std::string_view what, uint32_t max_items, std::string_view unit,
                  item& a) {
  if (status s = next_of(r, kind::array, what, a); !s.ok()) return s;
  if (a.length > max_items)
    return status::out_of_range(join(what, ": ") + std::to_string(a.length) + " " +
                                std::string(unit) + ", limit " + std::to_string(max_items));
  return {};
}

std::string element(std::string_view what, uint32_t i) {
  return join(what, "[") + std::to_string(i) + "]";
}

bool take_nil(reader& r) {
  item it;
  if (!r.peek(it).ok() || it.type != kind::nil) return false;
  (void)r.skip();
  return true;
}

}  // namespace eldr::table
