// route_protocol: see route_protocol.hpp and docs/protocol.md, section 3.
#include "cluster/route_protocol.hpp"

#include <utility>

#include "cluster/wire_fields.hpp"
#include "core/msgpack.hpp"

namespace eldr {
namespace {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;
using namespace wire;

constexpr std::string_view request_type = "route_request";
constexpr std::string_view reply_type = "route_reply";
constexpr std::string_view error_type = "error_reply";

// Scores and tau are written as float32; any number is accepted so hand-written peers (Python
// writes float64) need not care about the width.
status read_float(reader& r, std::string_view what, float& out) {
  double v = 0.0;
  if (status s = read_number(r, what, v); !s.ok()) return s;
  out = static_cast<float>(v);
  return {};
}

// The envelope and this message's fields (wire_fields.hpp: decode_message).
template <class F>
status decode_envelope(std::span<const uint8_t> payload, const route_protocol_limits& limits,
                       std::string_view type, F&& on_field) {
  return decode_message(payload, limits.max_payload_bytes, route_protocol_version, type, on_field);
}

status decode_band(reader& r, const route_protocol_limits& limits,
                   std::vector<route_band_member>& band) {
  item a;
  if (status s = next_of(r, kind::array, "route_reply.explain.band", a); !s.ok()) return s;
  if (a.length > limits.max_band)
    return status::out_of_range("route_reply.explain.band: " + std::to_string(a.length) +
                                " members, limit " + std::to_string(limits.max_band));
  band.clear();
  band.reserve(a.length);
  for (uint32_t i = 0; i < a.length; ++i) {
    const std::string what = "route_reply.explain.band[" + std::to_string(i) + "]";
    item m;
    if (status s = next_of(r, kind::array, what, m); !s.ok()) return s;
    if (m.length < 2) return status::invalid_argument(what + ": not [worker, score]");
    route_band_member b;
    if (status s = read_u32(r, what + ".worker", b.worker); !s.ok()) return s;
    if (status s = read_float(r, what + ".score", b.score); !s.ok()) return s;
    for (uint32_t j = 2; j < m.length; ++j)  // room for later additions
      if (status s = r.skip(); !s.ok()) return at(what, s);
    band.push_back(b);
  }
  return {};
}

status decode_warnings(reader& r, const route_protocol_limits& limits,
                       std::vector<std::string>& out) {
  out.clear();
  if (take_nil(r)) return {};
  item a;
  if (status s = next_of(r, kind::array, "route_reply.warnings", a); !s.ok()) return s;
  if (a.length > limits.max_warnings)
    return status::out_of_range("route_reply.warnings: " + std::to_string(a.length) +
                                " warnings, limit " + std::to_string(limits.max_warnings));
  out.resize(a.length);
  for (uint32_t i = 0; i < a.length; ++i)
    if (status s = read_string(r, "route_reply.warnings[" + std::to_string(i) + "]",
                               limits.max_message_bytes, out[i]);
        !s.ok())
      return s;
  return {};
}

status decode_explain(reader& r, const route_protocol_limits& limits, route_explain& out) {
  item m;
  if (status s = next_of(r, kind::map, "route_reply.explain", m); !s.ok()) return s;
  bool have_policy = false, have_tau = false, have_band = false;
  for (uint32_t i = 0; i < m.length; ++i) {
    item key;
    if (status s = next_of(r, kind::str, "route_reply.explain key", key); !s.ok()) return s;
    status s;
    if (key.str() == "policy") {
      s = read_string(r, "route_reply.explain.policy", limits.max_policy_bytes, out.policy);
      have_policy = true;
    } else if (key.str() == "tau") {
      s = read_float(r, "route_reply.explain.tau", out.tau);
      have_tau = true;
    } else if (key.str() == "band") {
      s = decode_band(r, limits, out.band);
      have_band = true;
    } else {
      s = r.skip();
    }
    if (!s.ok()) return s;
  }
  if (!have_policy) return missing(reply_type, "explain.policy");
  if (!have_tau) return missing(reply_type, "explain.tau");
  if (!have_band) return missing(reply_type, "explain.band");
  return {};
}

}  // namespace

const char* to_string(route_error_code code) {
  switch (code) {
    case route_error_code::malformed:
      return "malformed";
    case route_error_code::too_large:
      return "too_large";
    case route_error_code::unknown_type:
      return "unknown_type";
    case route_error_code::unknown_model:
      return "unknown_model";
    case route_error_code::no_eligible_worker:
      return "no_eligible_worker";
    case route_error_code::overloaded:
      return "overloaded";
    case route_error_code::internal:
      return "internal";
    case route_error_code::not_found:
      return "not_found";
  }
  return "unknown";
}

route_error_code route_error_code_for(const status& decode_error) {
  switch (decode_error.code()) {
    case status_code::out_of_range:
      return route_error_code::too_large;
    case status_code::not_found:
      return route_error_code::unknown_type;
    default:
      return route_error_code::malformed;
  }
}

std::vector<uint8_t> encode_route_request(const route_request& m) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  const uint32_t fields = 4 + (m.counts ? 1 : 0) + (m.label ? 1 : 0);
  write_envelope(w, fields, route_protocol_version, request_type);
  w.write_str("id");
  w.write_str(m.id);
  w.write_str("model");
  w.write_str(m.model);
  w.write_str("blocks");
  w.write_array_header(static_cast<uint32_t>(m.block_hashes.size()));
  for (uint64_t h : m.block_hashes)
    w.write_uint(h);
  if (m.counts) {
    w.write_str("counts");
    // The counts message is one complete MessagePack value: nesting its bytes as they are keeps
    // a single encoding of block counts (and its decoder) for both messages.
    const std::vector<uint8_t> counts = encode_counts_message(*m.counts);
    out.insert(out.end(), counts.begin(), counts.end());
  }
  if (m.label) {
    w.write_str("label");
    w.write_uint(*m.label);
  }
  w.write_str("explain");
  w.write_bool(m.explain);
  return out;
}

std::vector<uint8_t> encode_route_reply(const route_reply& m) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  write_envelope(
      w, 6 + (m.explain ? 1 : 0) + (m.fallback.empty() ? 0 : 1) + (m.warnings.empty() ? 0 : 1),
      route_protocol_version, reply_type);
  w.write_str("id");
  w.write_str(m.id);
  w.write_str("worker");
  w.write_uint(m.worker);
  w.write_str("endpoint");
  w.write_str(m.endpoint);
  w.write_str("epoch");
  w.write_uint(m.epoch);
  w.write_str("covered_blocks");
  w.write_uint(m.covered_blocks);
  w.write_str("total_blocks");
  w.write_uint(m.total_blocks);
  if (m.explain) {
    w.write_str("explain");
    w.write_map_header(3);
    w.write_str("policy");
    w.write_str(m.explain->policy);
    w.write_str("tau");
    w.write_float32(m.explain->tau);
    w.write_str("band");
    w.write_array_header(static_cast<uint32_t>(m.explain->band.size()));
    for (const route_band_member& b : m.explain->band) {
      w.write_array_header(2);
      w.write_uint(b.worker);
      w.write_float32(b.score);
    }
  }
  if (!m.fallback.empty()) {
    w.write_str("fallback");
    w.write_str(m.fallback);
  }
  if (!m.warnings.empty()) {
    w.write_str("warnings");
    w.write_array_header(static_cast<uint32_t>(m.warnings.size()));
    for (const std::string& text : m.warnings)
      w.write_str(text);
  }
  return out;
}

std::vector<uint8_t> encode_error_reply(const error_reply& m) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  write_envelope(w, 2 + (m.id ? 1 : 0), route_protocol_version, error_type);
  if (m.id) {
    w.write_str("id");
    w.write_str(*m.id);
  }
  w.write_str("code");
  w.write_uint(static_cast<uint8_t>(m.code));
  w.write_str("message");
  w.write_str(m.message);
  return out;
}

result<route_request> decode_route_request(std::span<const uint8_t> payload,
                                           const route_protocol_limits& limits,
                                           std::vector<kv_decode_issue>& issues) {
  route_request m;
  bool have_id = false, have_model = false, have_blocks = false;
  status s = decode_envelope(
      payload, limits, request_type, [&](std::string_view key, reader& r, bool& known) -> status {
        known = true;
        if (key == "id") {
          have_id = true;
          if (status e = read_string(r, "route_request.id", limits.max_id_bytes, m.id); !e.ok())
            return e;
          if (m.id.empty()) return status::invalid_argument("route_request.id: empty");
        } else if (key == "model") {
          have_model = true;
          if (status e = read_string(r, "route_request.model", limits.max_model_bytes, m.model);
              !e.ok())
            return e;
          if (m.model.empty()) return status::invalid_argument("route_request.model: empty");
        } else if (key == "blocks") {
          have_blocks = true;
          item a;
          if (status e = next_of(r, kind::array, "route_request.blocks", a); !e.ok()) return e;
          if (a.length > limits.max_blocks)
            return status::out_of_range("route_request.blocks: " + std::to_string(a.length) +
                                        " blocks, limit " + std::to_string(limits.max_blocks));
          m.block_hashes.clear();
          m.block_hashes.reserve(a.length);  // <= max_blocks, and <= the bytes left
          for (uint32_t i = 0; i < a.length; ++i) {
            uint64_t h = 0;
            if (status e = read_u64(r, "route_request.blocks[" + std::to_string(i) + "]", h);
                !e.ok())
              return e;
            m.block_hashes.push_back(h);
          }
        } else if (key == "counts") {
          if (take_nil(r)) {
            m.counts.reset();
            return {};
          }
          const size_t begin = r.offset();
          if (status e = r.skip(); !e.ok()) return at("route_request.counts", e);
          const counts_decode_limits counts_limits{limits.max_blocks};
          auto c = decode_counts_message(payload.subspan(begin, r.offset() - begin), counts_limits,
                                         issues);
          if (!c.ok()) return at("route_request.counts", c.error());
          m.counts = std::move(*c);
        } else if (key == "label") {
          if (take_nil(r)) {
            m.label.reset();
            return {};
          }
          uint32_t label = 0;
          if (status e = read_u32(r, "route_request.label", label); !e.ok()) return e;
          m.label = label;
        } else if (key == "explain") {
          item b;
          if (take_nil(r)) {
            m.explain = false;
            return {};
          }
          if (status e = next_of(r, kind::boolean, "route_request.explain", b); !e.ok()) return e;
          m.explain = b.boolean;
        } else {
          known = false;
        }
        return {};
      });
  if (!s.ok()) return s;
  if (!have_id) return missing(request_type, "id");
  if (!have_model) return missing(request_type, "model");
  if (!have_blocks) return missing(request_type, "blocks");
  return m;
}

result<route_reply> decode_route_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits) {
  route_reply m;
  bool have_id = false, have_worker = false, have_endpoint = false, have_epoch = false,
       have_covered = false, have_total = false;
  status s = decode_envelope(
      payload, limits, reply_type, [&](std::string_view key, reader& r, bool& known) -> status {
        known = true;
        if (key == "id") {
          have_id = true;
          return read_string(r, "route_reply.id", limits.max_id_bytes, m.id);
        } else if (key == "worker") {
          have_worker = true;
          return read_u32(r, "route_reply.worker", m.worker);
        } else if (key == "endpoint") {
          have_endpoint = true;
          return read_string(r, "route_reply.endpoint", limits.max_endpoint_bytes, m.endpoint);
        } else if (key == "epoch") {
          have_epoch = true;
          return read_u64(r, "route_reply.epoch", m.epoch);
        } else if (key == "covered_blocks") {
          have_covered = true;
          return read_u32(r, "route_reply.covered_blocks", m.covered_blocks);
        } else if (key == "total_blocks") {
          have_total = true;
          return read_u32(r, "route_reply.total_blocks", m.total_blocks);
        } else if (key == "explain") {
          if (take_nil(r)) {
            m.explain.reset();
            return {};
          }
          m.explain.emplace();
          return decode_explain(r, limits, *m.explain);
        } else if (key == "fallback") {
          if (take_nil(r)) {
            m.fallback.clear();
            return {};
          }
          return read_string(r, "route_reply.fallback", limits.max_policy_bytes, m.fallback);
        } else if (key == "warnings") {
          return decode_warnings(r, limits, m.warnings);
        }
        known = false;
        return {};
      });
  if (!s.ok()) return s;
  if (!have_id) return missing(reply_type, "id");
  if (!have_worker) return missing(reply_type, "worker");
  if (!have_endpoint) return missing(reply_type, "endpoint");
  if (!have_epoch) return missing(reply_type, "epoch");
  if (!have_covered) return missing(reply_type, "covered_blocks");
  if (!have_total) return missing(reply_type, "total_blocks");
  if (m.covered_blocks > m.total_blocks)
    return status::invalid_argument("route_reply.covered_blocks: exceeds total_blocks");
  return m;
}

result<error_reply> decode_error_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits) {
  error_reply m;
  bool have_code = false, have_message = false;
  status s = decode_envelope(
      payload, limits, error_type, [&](std::string_view key, reader& r, bool& known) -> status {
        known = true;
        if (key == "id") {
          if (take_nil(r)) {
            m.id.reset();
            return {};
          }
          m.id.emplace();
          return read_string(r, "error_reply.id", limits.max_id_bytes, *m.id);
        } else if (key == "code") {
          have_code = true;
          uint32_t code = 0;
          if (status e = read_u32(r, "error_reply.code", code); !e.ok()) return e;
          // Unknown values below 256 are kept, so an older client still reports what a newer node
          // sent (to_string says "unknown"); larger ones cannot be a code of this protocol.
          if (code > UINT8_MAX) return status::invalid_argument("error_reply.code: exceeds 255");
          m.code = static_cast<route_error_code>(code);
        } else if (key == "message") {
          have_message = true;
          return read_string(r, "error_reply.message", limits.max_message_bytes, m.message);
        } else {
          known = false;
        }
        return {};
      });
  if (!s.ok()) return s;
  if (!have_code) return missing(error_type, "code");
  if (!have_message) return missing(error_type, "message");
  return m;
}

}  // namespace eldr
