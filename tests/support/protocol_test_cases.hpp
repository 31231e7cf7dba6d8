// Helpers shared by the wire-protocol unit tests (route, worker, admin): hand-written MessagePack
// maps built field by field (to leave a field out, give one the wrong type or add unknown keys),
// the check that a decode failed with a given code and message fragment, and the two sweeps every
// protocol runs: each limit lowered below a sample message, and each sample cut at every byte.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/msgpack.hpp"
#include "core/base/status.hpp"

namespace eldr::testing {

// A MessagePack map written key by key, in the order given; the header's pair count is whatever
// was added by the time bytes() is called. The same bytes as writing the header and the pairs by
// hand.
class map_payload {
 public:
  map_payload& str(std::string_view key, std::string_view v) {
    return value(key, [&](msgpack::writer& w) { w.write_str(v); });
  }
  map_payload& uint(std::string_view key, uint64_t v) {
    return value(key, [&](msgpack::writer& w) { w.write_uint(v); });
  }
  map_payload& sint(std::string_view key, int64_t v) {
    return value(key, [&](msgpack::writer& w) { w.write_int(v); });
  }
  map_payload& f64(std::string_view key, double v) {
    return value(key, [&](msgpack::writer& w) { w.write_float64(v); });
  }
  map_payload& boolean(std::string_view key, bool v) {
    return value(key, [&](msgpack::writer& w) { w.write_bool(v); });
  }
  map_payload& nil(std::string_view key) {
    return value(key, [](msgpack::writer& w) { w.write_nil(); });
  }
  // Any other value (an array, a nested map, a hostile header), written by `write`.
  map_payload& value(std::string_view key, const std::function<void(msgpack::writer&)>& write) {
    msgpack::writer w(body_);
    w.write_str(key);
    write(w);
    ++pairs_;
    return *this;
  }

  map_payload& map(std::string_view key, const map_payload& nested) {
    msgpack::writer(body_).write_str(key);
    const std::vector<uint8_t> b = nested.bytes();
    body_.insert(body_.end(), b.begin(), b.end());
    ++pairs_;
    return *this;
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out;
    msgpack::writer(out).write_map_header(pairs_);
    out.insert(out.end(), body_.begin(), body_.end());
    return out;
  }

 private:
  uint32_t pairs_ = 0;
  std::vector<uint8_t> body_;
};

// The envelope every protocol message starts with, "version" then "type"; add the fields next.
inline map_payload message(std::string_view type, uint64_t version = 1) {
  map_payload m;
  m.uint("version", version).str("type", type);
  return m;
}

// `bytes` (a MessagePack map) with the value of `key` replaced by the encoded `value`, or the key
// dropped when `value` is empty: a valid message or file with one field made wrong.
inline std::vector<uint8_t> with_field(const std::vector<uint8_t>& bytes, std::string_view key,
                                       const std::vector<uint8_t>& value) {
  msgpack::reader r(bytes.data(), bytes.size());
  const uint32_t pairs = *r.read_map_header();
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  w.write_map_header(value.empty() ? pairs - 1 : pairs);
  for (uint32_t i = 0; i < pairs; ++i) {
    const std::string k(*r.read_str());
    const size_t begin = r.offset();
    EXPECT_TRUE(r.skip().ok());
    if (k == key && value.empty()) continue;
    w.write_str(k);
    if (k == key)
      out.insert(out.end(), value.begin(), value.end());
    else
      out.insert(out.end(), bytes.begin() + static_cast<std::ptrdiff_t>(begin),
                 bytes.begin() + static_cast<std::ptrdiff_t>(r.offset()));
  }
  return out;
}

// `s` has `code` and its message contains `fragment`.
inline void expect_error(const status& s, status_code code, std::string_view fragment) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

// The decode failed with `code` and a message containing `fragment` (a success fails both).
template <class T>
void expect_error(const result<T>& r, status_code code, std::string_view fragment) {
  ASSERT_FALSE(r.ok()) << "decoded, expected " << to_string(code) << " naming " << fragment;
  expect_error(r.error(), code, fragment);
}

// One limit lowered below what a sample message needs: `decode` (a sample under the limits) must
// fail out_of_range, its message naming `field`.
template <class Limits>
struct limit_case {
  std::string field;
  uint32_t Limits::*limit;
  uint32_t value;
  std::function<status(const Limits&)> decode;
};

// Each case from default limits with only its own limit lowered.
template <class Limits>
void expect_limits_enforced(const std::vector<limit_case<Limits>>& cases) {
  for (const limit_case<Limits>& c : cases) {
    SCOPED_TRACE("limit naming " + c.field + ", lowered to " + std::to_string(c.value));
    Limits l;
    l.*c.limit = c.value;
    expect_error(c.decode(l), status_code::out_of_range, c.field);
  }
}

// Every proper prefix of every message in `all` fails to decode with each of `decoders` (callables
// taking the bytes and returning a result).
template <class... Decoders>
void expect_truncations_refused(const std::vector<std::vector<uint8_t>>& all,
                                const Decoders&... decoders) {
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t n = 0; n < all[i].size(); ++n) {
      const std::span<const uint8_t> cut(all[i].data(), n);
      const auto refused = [&](const auto& decode) {
        EXPECT_FALSE(decode(cut).ok()) << "message " << i << " cut at " << n;
      };
      (refused(decoders), ...);
    }
  }
}

}  // namespace eldr::testing
