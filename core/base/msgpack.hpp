// msgpack: a small, bounds-checked MessagePack reader and writer in standard C++.
//
// core/ reads and writes eldr-trace files with nothing but the standard library, so it cannot use
// msgpack-c. The reader is a pull cursor over a caller-owned buffer: str, bin and ext payloads are
// returned as views, never copied, so a 5 MB trace of a few hundred bin blobs decodes without
// allocating. Every declared length is checked against the bytes actually left before anything is
// trusted, so a hostile header cannot make the reader (or a caller that reserves by a count it
// returned) read out of bounds or allocate more than the input could hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr::msgpack {

// The decoded type of one MessagePack value. Integers are split by sign, not by wire width: a
// non-negative value is positive_int whatever encoding carried it (int8 with 5 included).
enum class kind : uint8_t {
  nil,
  boolean,
  positive_int,  // 0 .. 2^64-1, in item::uint_value
  negative_int,  // -2^63 .. -1, in item::int_value
  float32,       // widened exactly into item::float_value
  float64,
  str,  // item::data / item::length: UTF-8 is not checked
  bin,
  array,  // item::length elements follow
  map,    // item::length key/value pairs follow (2 * length values)
  ext,    // item::ext_type plus item::data / item::length
};

// "nil", "bool", "int", "negative int", "float32", "float64", "str", "bin", "array", "map", "ext".
const char* to_string(kind k);

// One decoded header or scalar. For str, bin and ext, data points into the reader's buffer and
// stays valid exactly as long as that buffer does.
struct item {
  kind type = kind::nil;
  bool boolean = false;
  uint64_t uint_value = 0;
  int64_t int_value = 0;
  double float_value = 0.0;
  uint32_t length = 0;  // str/bin/ext: payload bytes; array: elements; map: pairs
  int8_t ext_type = 0;
  const uint8_t* data = nullptr;

  bool is_integer() const { return type == kind::positive_int || type == kind::negative_int; }
  bool is_float() const { return type == kind::float32 || type == kind::float64; }
  std::string_view str() const {
    return {reinterpret_cast<const char*>(data), static_cast<size_t>(length)};
  }
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(length)}; }
};

// A forward-only cursor over one buffer holding one or more MessagePack values.
//
// Ownership: the reader borrows the buffer; the caller keeps it alive while the reader and any
// item views are used. Not thread-safe (one cursor), but cheap to copy: copies read independently.
// Errors: every call returns status_code::corrupt (with the byte offset) on malformed or truncated
// input and leaves the cursor where it was, so a caller may peek and retry another type.
class reader {
 public:
  static constexpr size_t default_max_depth = 64;

  reader(const uint8_t* data, size_t size, size_t max_depth = default_max_depth)
      : data_(data), size_(size), max_depth_(max_depth) {}

  // Decodes the next header or scalar and advances past it (past the payload for str/bin/ext, but
  // not into the elements of an array or map: those are read by the following calls). The length
  // of an array is at most remaining(), of a map at most remaining() / 2, since every value takes
  // at least one byte: reserving by it is safe.
  status next(item& out);
  // Like next() without advancing.
  status peek(item& out) const;
  // Advances past one complete value, however deeply nested. Fails (corrupt) on a nesting deeper
  // than max_depth containers; it never recurses, so the limit bounds memory, not the stack.
  status skip();

  // Typed reads: on a type mismatch they fail naming what was found and do not advance.
  result<uint64_t> read_uint();  // positive_int only
  result<int64_t> read_int();    // either sign; positive values above INT64_MAX fail
  result<double> read_number();  // float32, float64 or an integer (converted)
  result<bool> read_bool();
  status read_nil();
  result<std::string_view> read_str();  // view into the buffer
  result<std::span<const uint8_t>> read_bin();
  result<uint32_t> read_array_header();  // element count
  result<uint32_t> read_map_header();    // pair count

  size_t offset() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  bool at_end() const { return pos_ == size_; }
  // Moves the cursor to an offset previously returned by offset(). Precondition: off <= size().
  void seek(size_t off);

 private:
  // Decodes the value starting at pos into out and sets end to the first byte after its header
  // (and payload). Reads nothing outside [pos, size_).
  status decode(size_t pos, item& out, size_t& end) const;
  template <class T>
  result<T> typed(kind want, T (*get)(const item&));

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  size_t max_depth_;
};

// Appends MessagePack values to a caller-owned byte vector, always choosing the smallest encoding
// (fixint/fixstr/fixarray/fixmap first, then the 8/16/32/64-bit forms).
//
// Ownership: borrows the vector, which must outlive the writer. A str, bin or ext payload longer
// than 2^32-1 bytes cannot be represented in MessagePack: such a call writes nothing and makes
// ok() false for good, so a caller checks once at the end instead of after every call.
class writer {
 public:
  explicit writer(std::vector<uint8_t>& out) : out_(&out) {}

  void write_nil();
  void write_bool(bool v);
  void write_uint(uint64_t v);
  void write_int(int64_t v);  // non-negative values use the unsigned forms, like every encoder
  void write_float32(float v);
  void write_float64(double v);
  void write_str(std::string_view v);
  void write_bin(std::span<const uint8_t> v);
  // The header of a bin of n bytes; the caller appends exactly n bytes to the vector next (for
  // payloads encoded in place, such as expert ids). n > 2^32-1 writes nothing and clears ok().
  void write_bin_header(size_t n);
  void write_array_header(uint32_t count);
  void write_map_header(uint32_t pairs);
  void write_ext(int8_t type, std::span<const uint8_t> payload);

  bool ok() const { return ok_; }

 private:
  void put(uint8_t b) { out_->push_back(b); }
  void put_be(uint64_t v, int bytes);
  void put_bytes(const uint8_t* p, size_t n);

  std::vector<uint8_t>* out_;
  bool ok_ = true;
};

}  // namespace eldr::msgpack
