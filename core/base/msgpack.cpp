// msgpack: decoding with a bounds check before every read, and smallest-form encoding.
#include "core/base/msgpack.hpp"

#include <bit>
#include <cassert>
#include <limits>
#include <optional>
#include <string>

namespace eldr::msgpack {

const char* to_string(kind k) {
  switch (k) {
    case kind::nil:
      return "nil";
    case kind::boolean:
      return "bool";
    case kind::positive_int:
      return "int";
    case kind::negative_int:
      return "negative int";
    case kind::float32:
      return "float32";
    case kind::float64:
      return "float64";
    case kind::str:
      return "str";
    case kind::bin:
      return "bin";
    case kind::array:
      return "array";
    case kind::map:
      return "map";
    case kind::ext:
      return "ext";
  }
  return "unknown";
}

namespace {

uint64_t load_be(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v = (v << 8) | p[i];
  return v;
}

status truncated(size_t pos, const char* what, size_t need, size_t have) {
  return status::corrupt("msgpack: truncated " + std::string(what) + " at byte " +
                         std::to_string(pos) + ": needs " + std::to_string(need) + " byte(s), " +
                         std::to_string(have) + " left");
}

// How the bytes after a type tag are laid out.
enum class shape : uint8_t {
  immediate,  // the tag is the whole value (fixint, nil, bool)
  scalar,     // a fixed-width number follows
  payload,    // str/bin: a length (or a fix length in the tag), then that many bytes
  array,      // a count (or a fix count in the tag); the elements follow as separate values
  map,
  ext,  // a length (or fixext size), a type byte, then the payload
};

struct format_info {
  shape layout;
  kind type;
  int width;              // bytes of length/value after the tag
  uint32_t fixed_length;  // length carried by the tag itself (fix* forms)
  const char* name;
};

// The wire format of one tag; nullopt for 0xc1, which the specification reserves ("never used").
std::optional<format_info> format_of(uint8_t tag) {
  if (tag <= 0x7f) return format_info{shape::immediate, kind::positive_int, 0, 0, "fixint"};
  if (tag >= 0xe0) return format_info{shape::immediate, kind::negative_int, 0, 0, "fixint"};
  if (tag <= 0x8f) return format_info{shape::map, kind::map, 0, tag & 0x0fu, "fixmap"};
  if (tag <= 0x9f) return format_info{shape::array, kind::array, 0, tag & 0x0fu, "fixarray"};
  if (tag <= 0xbf) return format_info{shape::payload, kind::str, 0, tag & 0x1fu, "fixstr"};
  switch (tag) {
    case 0xc0:
      return format_info{shape::immediate, kind::nil, 0, 0, "nil"};
    case 0xc2:
      return format_info{shape::immediate, kind::boolean, 0, 0, "false"};
    case 0xc3:
      return format_info{shape::immediate, kind::boolean, 0, 0, "true"};
    case 0xc4:
      return format_info{shape::payload, kind::bin, 1, 0, "bin8"};
    case 0xc5:
      return format_info{shape::payload, kind::bin, 2, 0, "bin16"};
    case 0xc6:
      return format_info{shape::payload, kind::bin, 4, 0, "bin32"};
    case 0xc7:
      return format_info{shape::ext, kind::ext, 1, 0, "ext8"};
    case 0xc8:
      return format_info{shape::ext, kind::ext, 2, 0, "ext16"};
    case 0xc9:
      return format_info{shape::ext, kind::ext, 4, 0, "ext32"};
    case 0xca:
      return format_info{shape::scalar, kind::float32, 4, 0, "float32"};
    case 0xcb:
      return format_info{shape::scalar, kind::float64, 8, 0, "float64"};
    case 0xcc:
      return format_info{shape::scalar, kind::positive_int, 1, 0, "uint8"};
    case 0xcd:
      return format_info{shape::scalar, kind::positive_int, 2, 0, "uint16"};
    case 0xce:
      return format_info{shape::scalar, kind::positive_int, 4, 0, "uint32"};
    case 0xcf:
      return format_info{shape::scalar, kind::positive_int, 8, 0, "uint64"};
    case 0xd0:
      return format_info{shape::scalar, kind::negative_int, 1, 0, "int8"};
    case 0xd1:
      return format_info{shape::scalar, kind::negative_int, 2, 0, "int16"};
    case 0xd2:
      return format_info{shape::scalar, kind::negative_int, 4, 0, "int32"};
    case 0xd3:
      return format_info{shape::scalar, kind::negative_int, 8, 0, "int64"};
    case 0xd4:
      return format_info{shape::ext, kind::ext, 0, 1, "fixext1"};
    case 0xd5:
      return format_info{shape::ext, kind::ext, 0, 2, "fixext2"};
    case 0xd6:
      return format_info{shape::ext, kind::ext, 0, 4, "fixext4"};
    case 0xd7:
      return format_info{shape::ext, kind::ext, 0, 8, "fixext8"};
    case 0xd8:
      return format_info{shape::ext, kind::ext, 0, 16, "fixext16"};
    case 0xd9:
      return format_info{shape::payload, kind::str, 1, 0, "str8"};
    case 0xda:
      return format_info{shape::payload, kind::str, 2, 0, "str16"};
    case 0xdb:
      return format_info{shape::payload, kind::str, 4, 0, "str32"};
    case 0xdc:
      return format_info{shape::array, kind::array, 2, 0, "array16"};
    case 0xdd:
      return format_info{shape::array, kind::array, 4, 0, "array32"};
    case 0xde:
      return format_info{shape::map, kind::map, 2, 0, "map16"};
    case 0xdf:
      return format_info{shape::map, kind::map, 4, 0, "map32"};
    default:
      return std::nullopt;
  }
}

}  // namespace

status reader::decode(size_t pos, item& out, size_t& end) const {
  if (pos >= size_)
    return status::corrupt("msgpack: unexpected end of input at byte " + std::to_string(pos));
  const uint8_t tag = data_[pos];
  const std::optional<format_info> f = format_of(tag);
  if (!f) return status::corrupt("msgpack: invalid type byte 0xc1 at byte " + std::to_string(pos));
  out = item{};
  out.type = f->type;

  const uint8_t* p = data_ + pos + 1;
  const size_t left = size_ - pos - 1;  // bytes after the tag
  if (left < static_cast<size_t>(f->width)) return truncated(pos, f->name, 1 + f->width, left + 1);
  const uint64_t header = load_be(p, f->width);
  size_t used = static_cast<size_t>(f->width);  // bytes consumed after the tag so far

  switch (f->layout) {
    case shape::immediate:
      if (f->type == kind::positive_int) out.uint_value = tag;
      if (f->type == kind::negative_int) out.int_value = static_cast<int8_t>(tag);
      if (f->type == kind::boolean) out.boolean = tag == 0xc3;
      break;
    case shape::scalar:
      if (f->type == kind::float32) {
        out.float_value = std::bit_cast<float>(static_cast<uint32_t>(header));
      } else if (f->type == kind::float64) {
        out.float_value = std::bit_cast<double>(header);
      } else if (f->type == kind::positive_int) {
        out.uint_value = header;
      } else {
        // Sign-extend the two's-complement value of the given width.
        const int shift = 64 - 8 * f->width;
        const int64_t v = static_cast<int64_t>(header << shift) >> shift;
        if (v >= 0) {  // a non-canonical signed encoding of a non-negative value
          out.type = kind::positive_int;
          out.uint_value = static_cast<uint64_t>(v);
        } else {
          out.int_value = v;
        }
      }
      break;
    case shape::array:
    case shape::map: {
      const uint64_t count = f->width == 0 ? f->fixed_length : header;
      // Every value takes at least one byte: a count the input cannot hold is corrupt, and
      // rejecting it here keeps callers that reserve by the count from huge allocations.
      const uint64_t min_bytes = f->layout == shape::array ? count : 2 * count;
      if (min_bytes > left - used)
        return status::corrupt("msgpack: " + std::string(f->name) + " at byte " +
                               std::to_string(pos) + " declares " + std::to_string(count) +
                               (f->layout == shape::array ? " elements" : " pairs") + " but only " +
                               std::to_string(left - used) + " byte(s) remain");
      out.length = static_cast<uint32_t>(count);
      break;
    }
    case shape::payload:
    case shape::ext: {
      const uint64_t length = f->width == 0 ? f->fixed_length : header;
      if (f->layout == shape::ext) {  // one type byte precedes the payload
        if (left - used < 1) return truncated(pos, f->name, 2 + used, left + 1);
        out.ext_type = static_cast<int8_t>(p[used]);
        used += 1;
      }
      if (length > left - used)
        return status::corrupt("msgpack: " + std::string(f->name) + " at byte " +
                               std::to_string(pos) + " declares " + std::to_string(length) +
                               " byte(s) but only " + std::to_string(left - used) + " remain");
      out.length = static_cast<uint32_t>(length);
      out.data = p + used;
      used += static_cast<size_t>(length);
      break;
    }
  }
  end = pos + 1 + used;
  return {};
}

status reader::next(item& out) {
  size_t end = 0;
  status s = decode(pos_, out, end);
  if (s.ok()) pos_ = end;
  return s;
}

status reader::peek(item& out) const {
  size_t end = 0;
  return decode(pos_, out, end);
}

status reader::skip() {
  // open[i] = values still to read in the i-th enclosing container. Iterative on purpose: a
  // recursive skip would let a 64 KB input of nested fixarrays overflow the stack.
  std::vector<uint64_t> open;
  uint64_t left = 1;
  size_t pos = pos_;
  item it;
  for (;;) {
    while (left == 0) {
      if (open.empty()) {
        pos_ = pos;
        return {};
      }
      left = open.back();
      open.pop_back();
    }
    size_t end = 0;
    if (status s = decode(pos, it, end); !s.ok()) return s;
    pos = end;
    --left;
    if (it.type == kind::array || it.type == kind::map) {
      if (open.size() + 1 > max_depth_)
        return status::corrupt("msgpack: nesting deeper than " + std::to_string(max_depth_) +
                               " containers at byte " + std::to_string(pos));
      open.push_back(left);
      left = it.type == kind::array ? uint64_t{it.length} : 2 * uint64_t{it.length};
    }
  }
}

template <class T>
result<T> reader::typed(kind want, T (*get)(const item&)) {
  item it;
  if (status s = peek(it); !s.ok()) return s;
  if (it.type != want)
    return status::corrupt("msgpack: expected " + std::string(to_string(want)) + " at byte " +
                           std::to_string(pos_) + ", found " + to_string(it.type));
  size_t end = 0;
  (void)decode(pos_, it, end);  // cannot fail: peek() just decoded the same bytes
  pos_ = end;
  return get(it);
}

result<uint64_t> reader::read_uint() {
  return typed<uint64_t>(kind::positive_int, [](const item& i) { return i.uint_value; });
}

result<int64_t> reader::read_int() {
  item it;
  if (status s = peek(it); !s.ok()) return s;
  if (it.type == kind::negative_int) {
    (void)next(it);
    return it.int_value;
  }
  if (it.type != kind::positive_int)
    return status::corrupt("msgpack: expected an integer at byte " + std::to_string(pos_) +
                           ", found " + to_string(it.type));
  if (it.uint_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return status::corrupt("msgpack: integer " + std::to_string(it.uint_value) + " at byte " +
                           std::to_string(pos_) + " does not fit a signed 64-bit integer");
  (void)next(it);
  return static_cast<int64_t>(it.uint_value);
}

result<double> reader::read_number() {
  item it;
  if (status s = peek(it); !s.ok()) return s;
  double v = 0.0;
  if (it.is_float()) {
    v = it.float_value;
  } else if (it.type == kind::positive_int) {
    v = static_cast<double>(it.uint_value);
  } else if (it.type == kind::negative_int) {
    v = static_cast<double>(it.int_value);
  } else {
    return status::corrupt("msgpack: expected a number at byte " + std::to_string(pos_) +
                           ", found " + to_string(it.type));
  }
  (void)next(it);
  return v;
}

result<bool> reader::read_bool() {
  return typed<bool>(kind::boolean, [](const item& i) { return i.boolean; });
}

status reader::read_nil() {
  result<bool> r = typed<bool>(kind::nil, [](const item&) { return true; });
  return r.ok() ? status{} : r.error();
}

result<std::string_view> reader::read_str() {
  return typed<std::string_view>(kind::str, [](const item& i) { return i.str(); });
}

result<std::span<const uint8_t>> reader::read_bin() {
  return typed<std::span<const uint8_t>>(kind::bin, [](const item& i) { return i.bytes(); });
}

result<uint32_t> reader::read_array_header() {
  return typed<uint32_t>(kind::array, [](const item& i) { return i.length; });
}

result<uint32_t> reader::read_map_header() {
  return typed<uint32_t>(kind::map, [](const item& i) { return i.length; });
}

void reader::seek(size_t off) {
  assert(off <= size_);
  pos_ = off;
}

// ---- writer ----

void writer::put_be(uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i)
    put(static_cast<uint8_t>(v >> (8 * i)));
}

void writer::put_bytes(const uint8_t* p, size_t n) {
  if (n > 0) out_->insert(out_->end(), p, p + n);
}

void writer::write_nil() {
  put(0xc0);
}

void writer::write_bool(bool v) {
  put(v ? 0xc3 : 0xc2);
}

void writer::write_uint(uint64_t v) {
  if (v <= 0x7f) {
    put(static_cast<uint8_t>(v));
  } else if (v <= 0xff) {
    put(0xcc);
    put_be(v, 1);
  } else if (v <= 0xffff) {
    put(0xcd);
    put_be(v, 2);
  } else if (v <= 0xffffffffu) {
    put(0xce);
    put_be(v, 4);
  } else {
    put(0xcf);
    put_be(v, 8);
  }
}

void writer::write_int(int64_t v) {
  if (v >= 0) return write_uint(static_cast<uint64_t>(v));
  const uint64_t bits = static_cast<uint64_t>(v);
  if (v >= -32) {
    put(static_cast<uint8_t>(bits));  // negative fixint: 111xxxxx
  } else if (v >= std::numeric_limits<int8_t>::min()) {
    put(0xd0);
    put_be(bits, 1);
  } else if (v >= std::numeric_limits<int16_t>::min()) {
    put(0xd1);
    put_be(bits, 2);
  } else if (v >= std::numeric_limits<int32_t>::min()) {
    put(0xd2);
    put_be(bits, 4);
  } else {
    put(0xd3);
    put_be(bits, 8);
  }
}

void writer::write_float32(float v) {
  put(0xca);
  put_be(std::bit_cast<uint32_t>(v), 4);
}

void writer::write_float64(double v) {
  put(0xcb);
  put_be(std::bit_cast<uint64_t>(v), 8);
}

void writer::write_str(std::string_view v) {
  const size_t n = v.size();
  if (n > 0xffffffffu) {
    ok_ = false;
    return;
  }
  if (n <= 31) {
    put(static_cast<uint8_t>(0xa0 | n));
  } else if (n <= 0xff) {
    put(0xd9);
    put_be(n, 1);
  } else if (n <= 0xffff) {
    put(0xda);
    put_be(n, 2);
  } else {
    put(0xdb);
    put_be(n, 4);
  }
  put_bytes(reinterpret_cast<const uint8_t*>(v.data()), n);
}

void writer::write_bin_header(size_t n) {
  if (n > 0xffffffffu) {
    ok_ = false;
    return;
  }
  if (n <= 0xff) {
    put(0xc4);
    put_be(n, 1);
  } else if (n <= 0xffff) {
    put(0xc5);
    put_be(n, 2);
  } else {
    put(0xc6);
    put_be(n, 4);
  }
}

void writer::write_bin(std::span<const uint8_t> v) {
  const size_t n = v.size();
  if (n > 0xffffffffu) {
    ok_ = false;
    return;
  }
  write_bin_header(n);
  put_bytes(v.data(), n);
}

void writer::write_array_header(uint32_t count) {
  if (count <= 15) {
    put(static_cast<uint8_t>(0x90 | count));
  } else if (count <= 0xffff) {
    put(0xdc);
    put_be(count, 2);
  } else {
    put(0xdd);
    put_be(count, 4);
  }
}

void writer::write_map_header(uint32_t pairs) {
  if (pairs <= 15) {
    put(static_cast<uint8_t>(0x80 | pairs));
  } else if (pairs <= 0xffff) {
    put(0xde);
    put_be(pairs, 2);
  } else {
    put(0xdf);
    put_be(pairs, 4);
  }
}

void writer::write_ext(int8_t type, std::span<const uint8_t> payload) {
  const size_t n = payload.size();
  if (n > 0xffffffffu) {
    ok_ = false;
    return;
  }
  switch (n) {
    case 1:
      put(0xd4);
      break;
    case 2:
      put(0xd5);
      break;
    case 4:
      put(0xd6);
      break;
    case 8:
      put(0xd7);
      break;
    case 16:
      put(0xd8);
      break;
    default:
      if (n <= 0xff) {
        put(0xc7);
        put_be(n, 1);
      } else if (n <= 0xffff) {
        put(0xc8);
        put_be(n, 2);
      } else {
        put(0xc9);
        put_be(n, 4);
      }
  }
  put(static_cast<uint8_t>(type));
  put_bytes(payload.data(), n);
}

}  // namespace eldr::msgpack
