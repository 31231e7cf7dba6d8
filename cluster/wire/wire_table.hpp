// wire_table: the route, worker and admin protocols' message tables. The table machinery is
// core's (core/base/field_table.hpp: a field's name, type, rules and limit written once, driving
// encode, decode and error text); what this adds is the protocol's: the envelope every message
// opens with ("version" and "type", wire_fields) and the endpoint fields.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "cluster/wire/wire_fields.hpp"
#include "core/base/field_table.hpp"
#include "core/base/msgpack.hpp"
#include "core/base/status.hpp"

namespace eldr::wire {

using table::decode_context;
using table::field_rule;
using table::field_spec;
using table::nil_ok;
using table::nonempty;
using table::omit_empty;
using table::required;

// core's factories plus the endpoint fields of the protocols.
template <class M, class L, class X = std::monostate>
struct fields : table::fields<M, L, X> {
  using base = table::fields<M, L, X>;
  using spec = typename base::spec;
  using context = typename base::context;

  // A string naming an endpoint (wire_fields: check_endpoint); without nonempty, "" is none.
  template <auto P>
  static constexpr spec endpoint(std::string_view name, uint32_t L::*limit, endpoint_use use,
                                 unsigned rules = 0) {
    return base::template member<P>({.name = name, .rules = rules, .limit = limit},
                                    use == endpoint_use::zmq_connect
                                        ? &read_endpoint_as<P, endpoint_use::zmq_connect>
                                        : &read_endpoint_as<P, endpoint_use::opaque>,
                                    [](std::vector<uint8_t>& out, const M& m) {
                                      msgpack::writer(out).write_str(table::detail::value<P>(m));
                                    });
  }

 private:
  template <auto P, endpoint_use U>
  static status read_endpoint_as(msgpack::reader& r, const spec& f, const context& c,
                                 std::string_view what, M& m) {
    auto& out = table::detail::target<P>(m);
    if (f.rules & nonempty) return read_endpoint(r, what, f.limit_in(c.limits), U, out);
    if (status s = read_string(r, what, f.limit_in(c.limits), out); !s.ok() || out.empty())
      return s;
    return check_endpoint(what, out, U);
  }
};

// A message's table (core's) with the protocol's envelope: encode and decode whole messages.
template <class M, class L, class X = std::monostate>
class message_table : public table::message_table<M, L, X> {
  using base = table::message_table<M, L, X>;

 public:
  using base::base;
  using typename base::context;

  // A whole message: the envelope (version and type) and the fields.
  std::vector<uint8_t> encode(uint32_t version, const M& m) const {
    std::vector<uint8_t> out;
    out.reserve(128);  // a reply or an ack whole; longer messages grow from there
    msgpack::writer w(out);
    const uint64_t set = this->present(m);
    write_envelope(w, static_cast<uint32_t>(std::popcount(set)), version, this->type());
    this->write_fields(out, m, set);
    return out;
  }

  // The second pass over a message whose envelope read_envelope has read: every field the table
  // knows, in wire order (others are skipped), then the required ones that were absent and the
  // message's own rule.
  status read_fields(msgpack::reader& r, const envelope& env, const context& c, M& m) const {
    typename base::walk at;
    status s = for_each_field(r, env, [&](std::string_view key, msgpack::reader& in, bool& known) {
      return this->read_field(key, in, c, m, at, known);
    });
    return s.ok() ? this->finish(m, at.seen) : s;
  }

  // Both passes over a message that must be of this table's type (wire_fields: decode_message).
  result<M> decode(std::span<const uint8_t> payload, uint32_t max_payload_bytes, uint32_t version,
                   const L& limits, X& extra) const {
    M m;
    typename base::walk at;
    const context c{limits, payload, extra};
    status s = decode_message(payload, max_payload_bytes, version, this->type(),
                              [&](std::string_view key, msgpack::reader& in, bool& known) {
                                return this->read_field(key, in, c, m, at, known);
                              });
    if (!s.ok()) return s;
    if (s = this->finish(m, at.seen); !s.ok()) return s;
    return m;
  }
  result<M> decode(std::span<const uint8_t> payload, uint32_t max_payload_bytes, uint32_t version,
                   const L& limits) const requires std::is_same_v<X, std::monostate> {
    std::monostate none;
    return decode(payload, max_payload_bytes, version, limits, none);
  }
};

}  // namespace eldr::wire
