// field_table: eldr's MessagePack maps as data. Each message or file map is one table of fields
// (name, type, rules: required, nil allowed, non-empty, left out when empty; limit), and one
// walker over the table encodes the map, decodes it and names its errors, with msgpack_fields'
// readers. A field's rules are so written once, and every format reports its errors alike
// ("load_report.in_flight: missing", "eldr-centroids.transform: expected str, found int").
// The protocols add their envelope on top (cluster/wire/wire_table.hpp); files read a table's map
// as their top-level value.
//
// A table is built once (a const object at namespace scope of the codec's .cpp): it renders each
// field's "type.name" then, so that decoding builds no strings unless it fails.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "core/base/msgpack.hpp"
#include "core/base/msgpack_fields.hpp"
#include "core/base/status.hpp"

namespace eldr::table {

// A field's rules, combined with |; 0 is an optional field that may not be nil.
enum field_rule : unsigned {
  required = 1,    // absence is an error: "type.name: missing"
  nil_ok = 2,      // nil reads as absent and resets the member to M's default for it
  nonempty = 4,    // a string (an endpoint, each string of an array) may not be ""
  omit_empty = 8,  // the encoder leaves an empty string or array out
  once = 16,       // a second occurrence is an error, "type.name: duplicate" (files; peers' maps
                   // keep the last)
};

// What a decoder hands every field: the peer's limits, the whole payload (a message nested in it
// is decoded from its own bytes) and what the message's own fields report into (route_request:
// the issues of its counts; std::monostate elsewhere).
template <class L, class X>
struct decode_context {
  const L& limits;
  std::span<const uint8_t> payload;
  X& extra;
};

// One row of a message table. The factories of `fields` fill it; `custom` takes the functions of
// a field no factory covers.
template <class M, class L, class X = std::monostate>
struct field_spec {
  using context = decode_context<L, X>;
  // Reads the field's value into m; `what` is "type.name", for errors.
  using read_fn = status (*)(msgpack::reader&, const field_spec&, const context&,
                             std::string_view what, M&);

  std::string_view name{};
  unsigned rules = 0;
  uint32_t L::*limit = nullptr;       // a string's bytes, an array's items ...
  uint32_t fixed_limit = 0;           // ... when not one of L's
  uint32_t L::*item_limit = nullptr;  // the bytes of each string of an array
  std::string_view unit{};            // what an array holds, named when it is over its limit
  read_fn read = nullptr;
  void (*write)(std::vector<uint8_t>& out, const M&) = nullptr;  // appends the value
  bool (*present)(const M&) = nullptr;  // whether the encoder writes the field (null: always)
  void (*reset)(M&) = nullptr;          // on nil (nil_ok)
  status (*check)(std::string_view what, const M&) = nullptr;  // after a successful read

  uint32_t limit_in(const L& l) const { return limit ? l.*limit : fixed_limit; }
  uint32_t item_limit_in(const L& l) const { return item_limit ? l.*item_limit : 0; }
  // The same field, written only when `when` says so (admin_reply: result when ok).
  constexpr field_spec written_when(bool (*when)(const M&)) const {
    field_spec f = *this;
    f.present = when;
    return f;
  }
  // The same field with a limit its reader applies (a custom array's items, named `unit`).
  constexpr field_spec limited(uint32_t L::*l, std::string_view u) const {
    field_spec f = *this;
    f.limit = l;
    f.unit = u;
    return f;
  }
  // The same field with a check of the value read (a URL that must parse).
  constexpr field_spec checked(status (*c)(std::string_view, const M&)) const {
    field_spec f = *this;
    f.check = c;
    return f;
  }
};

namespace detail {

template <class T>
inline constexpr bool is_optional = false;
template <class T>
inline constexpr bool is_optional<std::optional<T>> = true;

// The member P of m as a field writes into it: a std::optional member is engaged first.
template <auto P, class M>
auto& target(M& m) {
  auto& v = m.*P;
  if constexpr (is_optional<std::remove_reference_t<decltype(v)>>)
    return v.emplace();
  else
    return v;
}

template <auto P, class M>
const auto& value(const M& m) {
  const auto& v = m.*P;
  if constexpr (is_optional<std::remove_cvref_t<decltype(v)>>)
    return *v;
  else
    return v;
}

}  // namespace detail

// The field factories of message M, decoded under limits L. P is the member the field reads and
// writes; a std::optional member is written when engaged and engaged when read.
template <class M, class L, class X = std::monostate>
struct fields {
  using spec = field_spec<M, L, X>;
  using context = decode_context<L, X>;

  template <auto P>
  static constexpr spec u32(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          return read_u32(r, what, detail::target<P>(m));
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_uint(detail::value<P>(m));
        });
  }

  template <auto P>
  static constexpr spec u64(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          return read_u64(r, what, detail::target<P>(m));
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_uint(detail::value<P>(m));
        });
  }

  template <auto P>
  static constexpr spec boolean(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          return read_bool(r, what, detail::target<P>(m));
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_bool(detail::value<P>(m));
        });
  }

  // Written as float32; any number is read (Python writes float64, a hand-written peer may send an
  // integer).
  template <auto P>
  static constexpr spec f32(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          double v = 0.0;
          if (status s = read_number(r, what, v); !s.ok()) return s;
          detail::target<P>(m) = static_cast<float>(v);
          return status{};
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_float32(detail::value<P>(m));
        });
  }

  // Written as float64; any number is read.
  template <auto P>
  static constexpr spec f64(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          return read_number(r, what, detail::target<P>(m));
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_float64(detail::value<P>(m));
        });
  }

  // An enum of one byte, sent as an unsigned integer. Values the enum does not name are kept (a
  // newer peer's codes); above 255 they cannot be one.
  template <auto P>
  static constexpr spec enum8(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context&, std::string_view what, M& m) {
          uint32_t v = 0;
          if (status s = read_u32(r, what, v); !s.ok()) return s;
          if (v > UINT8_MAX) return status::invalid_argument(join(what, ": exceeds 255"));
          using E = std::remove_cvref_t<decltype(detail::target<P>(m))>;
          detail::target<P>(m) = static_cast<E>(v);
          return status{};
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_uint(static_cast<uint8_t>(detail::value<P>(m)));
        });
  }

  // A UTF-8 string of at most `limit` bytes (wire_fields: read_string).
  template <auto P>
  static constexpr spec str(std::string_view name, uint32_t L::*limit, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules, .limit = limit},
        [](msgpack::reader& r, const spec& f, const context& c, std::string_view what, M& m) {
          auto& out = detail::target<P>(m);
          if (f.rules & nonempty) return read_nonempty(r, what, f.limit_in(c.limits), out);
          return read_string(r, what, f.limit_in(c.limits), out);
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer(out).write_str(detail::value<P>(m));
        });
  }

  // As above, under a fixed limit rather than one of L's.
  template <auto P>
  static constexpr spec str(std::string_view name, uint32_t max_bytes, unsigned rules = 0) {
    spec f = str<P>(name, static_cast<uint32_t L::*>(nullptr), rules);
    f.fixed_limit = max_bytes;
    return f;
  }

  // An array of at most `limit` unsigned integers ("blocks"). Elements are named only when one
  // fails: this is the route path's longest field.
  template <auto P>
  static constexpr spec u64s(std::string_view name, uint32_t L::*limit, std::string_view unit,
                             unsigned rules = 0) {
    return uints<P>(name, limit, unit, rules);
  }
  // The same of 32-bit integers (a layer mask).
  template <auto P>
  static constexpr spec u32s(std::string_view name, uint32_t L::*limit, std::string_view unit,
                             unsigned rules = 0) {
    return uints<P>(name, limit, unit, rules);
  }

  // An array of at most `limit` strings of at most `item_limit` bytes each (nonempty: each).
  template <auto P>
  static constexpr spec strs(std::string_view name, uint32_t L::*limit, std::string_view unit,
                             uint32_t L::*item_limit, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules, .limit = limit, .item_limit = item_limit, .unit = unit},
        [](msgpack::reader& r, const spec& f, const context& c, std::string_view what, M& m) {
          msgpack::item a;
          if (status s = read_array(r, what, f.limit_in(c.limits), f.unit, a); !s.ok()) return s;
          auto& out = detail::target<P>(m);
          out.clear();
          out.resize(a.length);  // <= the limit, and <= the bytes left
          const uint32_t max_bytes = f.item_limit_in(c.limits);
          for (uint32_t i = 0; i < a.length; ++i) {
            const status s = f.rules & nonempty
                                 ? read_nonempty(r, element(what, i), max_bytes, out[i])
                                 : read_string(r, element(what, i), max_bytes, out[i]);
            if (!s.ok()) return s;
          }
          return status{};
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer w(out);
          const auto& v = detail::value<P>(m);
          w.write_array_header(static_cast<uint32_t>(v.size()));
          for (const auto& x : v)
            w.write_str(x);
        });
  }

  // A nested map read and written by table T (a message_table of P's type under the same L and
  // X, with static storage: T names its fields in errors, "eldr-trace.model.layers").
  template <auto P, const auto& T>
  static constexpr spec map(std::string_view name, unsigned rules = 0) {
    return member<P>(
        {.name = name, .rules = rules},
        [](msgpack::reader& r, const spec&, const context& c, std::string_view what, M& m) {
          msgpack::item it;
          if (status s = next_of(r, msgpack::kind::map, what, it); !s.ok()) return s;
          return T.read_map(r, it.length, c, detail::target<P>(m));
        },
        [](std::vector<uint8_t>& out, const M& m) { T.write_map(out, detail::value<P>(m)); });
  }

  // A field no factory covers: its reader and writer; written always (unless written_when says
  // otherwise), left as it is on nil unless `reset` says otherwise.
  static constexpr spec custom(std::string_view name, unsigned rules, typename spec::read_fn read,
                               void (*write)(std::vector<uint8_t>&, const M&),
                               void (*reset)(M&) = nullptr) {
    return {.name = name,
            .rules = rules,
            .read = read,
            .write = write,
            .reset = reset ? reset : +[](M&) {}};
  }

 protected:
  // Completes f for member P: written when engaged (std::optional) or, with omit_empty, when not
  // empty; reset on nil to the default M declares for it.
  template <auto P>
  static constexpr spec member(spec f, typename spec::read_fn read,
                               void (*write)(std::vector<uint8_t>&, const M&)) {
    using T = std::remove_cvref_t<decltype(std::declval<M&>().*P)>;
    f.read = read;
    f.write = write;
    if constexpr (detail::is_optional<T>)
      f.present = [](const M& m) { return (m.*P).has_value(); };
    else if constexpr (requires(const T& t) { t.empty(); }) {
      if (f.rules & omit_empty) f.present = [](const M& m) { return !(m.*P).empty(); };
    }
    f.reset = [](M& m) { m.*P = M{}.*P; };
    return f;
  }

 private:
  // u64s and u32s: the vector's element type says which.
  template <auto P>
  static constexpr spec uints(std::string_view name, uint32_t L::*limit, std::string_view unit,
                              unsigned rules) {
    return member<P>(
        {.name = name, .rules = rules, .limit = limit, .unit = unit},
        [](msgpack::reader& r, const spec& f, const context& c, std::string_view what, M& m) {
          msgpack::item a;
          if (status s = read_array(r, what, f.limit_in(c.limits), f.unit, a); !s.ok()) return s;
          auto& out = detail::target<P>(m);
          using T = typename std::remove_cvref_t<decltype(out)>::value_type;
          out.clear();
          out.reserve(a.length);  // <= the limit, and <= the bytes left
          for (uint32_t i = 0; i < a.length; ++i) {
            const size_t at = r.offset();
            msgpack::item it;
            if (r.next(it).ok() && it.type == msgpack::kind::positive_int &&
                it.uint_value <= std::numeric_limits<T>::max()) {
              out.push_back(static_cast<T>(it.uint_value));
              continue;
            }
            r.seek(at);
            T unused = 0;
            if constexpr (std::is_same_v<T, uint32_t>)
              return read_u32(r, element(what, i), unused);  // fails, naming the element
            else
              return read_u64(r, element(what, i), unused);
          }
          return status{};
        },
        [](std::vector<uint8_t>& out, const M& m) {
          msgpack::writer w(out);
          const auto& v = detail::value<P>(m);
          w.write_array_header(static_cast<uint32_t>(v.size()));
          for (uint64_t x : v)
            w.write_uint(x);
        });
  }
};

// The fields of one message, in wire order (the encoder writes them so; "missing" errors are
// reported in it). At most 64 fields.
template <class M, class L, class X = std::monostate>
class message_table {
 public:
  using spec = field_spec<M, L, X>;
  using context = decode_context<L, X>;

  // A rule over the whole message, checked once its fields are read: `seen` has bit(name) set for
  // each field read (nil is absent).
  using message_rule = status (*)(const M&, uint64_t seen);

  // `type` is the message's wire type ("load_report"), or the path of a nested map
  // ("route_reply.explain"): errors name fields under it.
  message_table(std::string_view type, std::initializer_list<spec> fields,
                message_rule rule = nullptr)
      : type_(type), fields_(fields), key_what_(join(type, " key")), rule_(rule) {
    for (const spec& f : fields_) {
      whats_.push_back(field(type, f.name));
      keys_.emplace_back();
      msgpack::writer(keys_.back()).write_str(f.name);
    }
  }

  std::string_view type() const { return type_; }

  // The fields present in m: bit i for the i-th.
  uint64_t present(const M& m) const {
    uint64_t set = 0;
    for (size_t i = 0; i < fields_.size(); ++i)
      if (!fields_[i].present || fields_[i].present(m)) set |= uint64_t{1} << i;
    return set;
  }
  uint32_t count(const M& m) const { return static_cast<uint32_t>(std::popcount(present(m))); }

  // Key and value of each field in `set` (present(m)).
  void write_fields(std::vector<uint8_t>& out, const M& m, uint64_t set) const {
    for (size_t i = 0; i < fields_.size(); ++i) {
      if (!(set & (uint64_t{1} << i))) continue;
      out.insert(out.end(), keys_[i].begin(), keys_[i].end());
      fields_[i].write(out, m);
    }
  }

  // A map nested in a message, or a file's top-level map.
  void write_map(std::vector<uint8_t>& out, const M& m) const {
    const uint64_t set = present(m);
    msgpack::writer(out).write_map_header(static_cast<uint32_t>(std::popcount(set)));
    write_fields(out, m, set);
  }

  // A map at the cursor, named by the table's type when it is not one (a file's top level).
  status read(msgpack::reader& r, const context& c, M& m) const {
    msgpack::item map;
    if (status s = next_of(r, msgpack::kind::map, type_, map); !s.ok()) return s;
    return read_map(r, map.length, c, m);
  }

  // A nested map of `pairs` pairs whose header was read: its keys are checked here (the
  // envelope's first pass saw only the message's own keys).
  status read_map(msgpack::reader& r, uint32_t pairs, const context& c, M& m) const {
    walk at;
    for (uint32_t i = 0; i < pairs; ++i) {
      msgpack::item key;
      if (status s = next_of(r, msgpack::kind::str, key_what_, key); !s.ok()) return s;
      bool known = false;
      if (status s = read_field(key.str(), r, c, m, at, known); !s.ok()) return s;
      if (!known)
        if (status s = r.skip(); !s.ok()) return table::at(field(type_, key.str()), s);
    }
    return finish(m, at.seen);
  }

  // The bit of field `name` in the `seen` a message rule is given (0 when the table has no such
  // field).
  uint64_t bit(std::string_view name) const {
    for (size_t i = 0; i < fields_.size(); ++i)
      if (fields_[i].name == name) return uint64_t{1} << i;
    return 0;
  }

 protected:
  // Where a walk over one message's fields stands.
  struct walk {
    uint64_t seen = 0;  // bit i: the i-th field was read
    size_t next = 0;    // where the search for the next key starts: peers (our encoder first)
                        // send the fields in table order, so it is usually the one
  };

  status read_field(std::string_view key, msgpack::reader& r, const context& c, M& m, walk& at,
                    bool& known) const {
    const size_t n = fields_.size();
    for (size_t k = 0; k < n; ++k) {
      const size_t i = at.next + k < n ? at.next + k : at.next + k - n;
      const spec& f = fields_[i];
      if (f.name != key) continue;
      known = true;
      at.next = i + 1;
      if ((f.rules & nil_ok) && take_nil(r)) {
        f.reset(m);
        return {};
      }
      if ((f.rules & once) && (at.seen & (uint64_t{1} << i)))
        return status::invalid_argument(whats_[i] + ": duplicate");
      at.seen |= uint64_t{1} << i;
      if (status s = f.read(r, f, c, whats_[i], m); !s.ok()) return s;
      return f.check ? f.check(whats_[i], m) : status{};
    }
    known = false;
    return {};
  }

  // After the last field: the required ones absent, then the message's rule.
  status finish(const M& m, uint64_t seen) const {
    for (size_t i = 0; i < fields_.size(); ++i)
      if ((fields_[i].rules & required) && !(seen & (uint64_t{1} << i)))
        return status::invalid_argument(whats_[i] + ": missing");
    return rule_ ? rule_(m, seen) : status{};
  }

 private:
  std::string_view type_;
  std::vector<spec> fields_;
  std::vector<std::string> whats_;          // "type.name" of each field
  std::vector<std::vector<uint8_t>> keys_;  // each field's key, encoded
  std::string key_what_;                    // "type key"
  message_rule rule_;
};

}  // namespace eldr::table
