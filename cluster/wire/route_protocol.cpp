// route_protocol: see route_protocol.hpp and docs/protocol.md, section 3.
#include "cluster/wire/route_protocol.hpp"

#include <utility>

#include "cluster/wire/wire_fields.hpp"
#include "cluster/wire/wire_table.hpp"
#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

using namespace wire;

// The request's counts are an eldr-counts message nested as one value: its own decoder reads its
// bytes, and reports the blocks it skipped into the request's issues.
using request_fields =
    wire::fields<route_request, route_protocol_limits, std::vector<kv_decode_issue>>;
using reply_fields = wire::fields<route_reply, route_protocol_limits>;
using explain_fields = wire::fields<route_explain, route_protocol_limits>;
using error_fields = wire::fields<error_reply, route_protocol_limits>;
using L = route_protocol_limits;

status read_counts(reader& r, const request_fields::spec&, const request_fields::context& c,
                   std::string_view what, route_request& m) {
  const size_t begin = r.offset();
  if (status s = r.skip(); !s.ok()) return at(what, s);
  const counts_decode_limits counts_limits{c.limits.max_blocks};
  auto counts =
      decode_counts_message(c.payload.subspan(begin, r.offset() - begin), counts_limits, c.extra);
  if (!counts.ok()) return at(what, counts.error());
  m.counts = std::move(*counts);
  return {};
}

void write_counts(std::vector<uint8_t>& out, const route_request& m) {
  // The counts message is one complete MessagePack value: nesting its bytes as they are keeps a
  // single encoding of block counts (and its decoder) for both messages.
  const std::vector<uint8_t> counts = encode_counts_message(*m.counts);
  out.insert(out.end(), counts.begin(), counts.end());
}

const message_table<route_request, L, std::vector<kv_decode_issue>> request_table{
    "route_request",
    {
        request_fields::str<&route_request::id>("id", &L::max_id_bytes, required | nonempty),
        request_fields::str<&route_request::model>("model", &L::max_model_bytes,
                                                   required | nonempty),
        request_fields::u64s<&route_request::block_hashes>("blocks", &L::max_blocks, "blocks",
                                                           required),
        request_fields::custom("counts", nil_ok, read_counts, write_counts,
                               [](route_request& m) { m.counts.reset(); })
            .written_when([](const route_request& m) { return m.counts.has_value(); }),
        request_fields::u32<&route_request::cached_blocks>("cached_blocks", nil_ok),
        request_fields::u32<&route_request::label>("label", nil_ok),
        request_fields::boolean<&route_request::explain>("explain", nil_ok),
        request_fields::boolean<&route_request::retry>("retry", nil_ok)
            .written_when([](const route_request& m) { return m.retry; }),
    },
    [](const route_request& m, uint64_t) {
      if (m.cached_blocks && *m.cached_blocks > m.block_hashes.size())
        return status::invalid_argument(
            "route_request.cached_blocks: " + std::to_string(*m.cached_blocks) + " exceeds the " +
            std::to_string(m.block_hashes.size()) + " blocks");
      return status{};
    }};

// A band member is [worker, score]; later elements are room for additions and skipped.
status read_band(reader& r, const explain_fields::spec& f, const explain_fields::context& c,
                 std::string_view what, route_explain& m) {
  item a;
  if (status s = read_array(r, what, f.limit_in(c.limits), f.unit, a); !s.ok()) return s;
  m.band.clear();
  m.band.reserve(a.length);
  for (uint32_t i = 0; i < a.length; ++i) {
    // The usual [worker, float] is read without naming it; anything else (an integer score, more
    // elements, an error) is read again below, by a path that names what is wrong.
    const size_t start = r.offset();
    item pair, worker, score;
    if (r.next(pair).ok() && pair.type == kind::array && pair.length == 2 && r.next(worker).ok() &&
        worker.type == kind::positive_int && worker.uint_value <= UINT32_MAX &&
        r.next(score).ok() && score.is_float()) {
      m.band.push_back(
          {static_cast<uint32_t>(worker.uint_value), static_cast<float>(score.float_value)});
      continue;
    }
    r.seek(start);
    const std::string member = element(what, i);
    if (status s = next_of(r, kind::array, member, pair); !s.ok()) return s;
    if (pair.length < 2) return status::invalid_argument(member + ": not [worker, score]");
    route_band_member b;
    if (status s = read_u32(r, member + ".worker", b.worker); !s.ok()) return s;
    double value = 0.0;
    if (status s = read_number(r, member + ".score", value); !s.ok()) return s;
    b.score = static_cast<float>(value);
    for (uint32_t j = 2; j < pair.length; ++j)
      if (status s = r.skip(); !s.ok()) return at(member, s);
    m.band.push_back(b);
  }
  return {};
}

void write_band(std::vector<uint8_t>& out, const route_explain& m) {
  msgpack::writer w(out);
  w.write_array_header(static_cast<uint32_t>(m.band.size()));
  for (const route_band_member& b : m.band) {
    w.write_array_header(2);
    w.write_uint(b.worker);
    w.write_float32(b.score);
  }
}

const message_table<route_explain, L> explain_table{
    "route_reply.explain",
    {
        explain_fields::str<&route_explain::policy>("policy", &L::max_policy_bytes, required),
        explain_fields::f32<&route_explain::tau>("tau", required),
        explain_fields::custom("band", required, read_band, write_band)
            .limited(&L::max_band, "members"),
    }};

status read_explain(reader& r, const reply_fields::spec&, const reply_fields::context& c,
                    std::string_view what, route_reply& m) {
  item map;
  if (status s = next_of(r, kind::map, what, map); !s.ok()) return s;
  return explain_table.read_map(r, map.length, c, m.explain.emplace());
}

const message_table<route_reply, L> reply_table{
    "route_reply",
    {
        reply_fields::str<&route_reply::id>("id", &L::max_id_bytes, required),
        reply_fields::u32<&route_reply::worker>("worker", required),
        reply_fields::str<&route_reply::endpoint>("endpoint", &L::max_endpoint_bytes, required),
        reply_fields::u64<&route_reply::epoch>("epoch", required),
        reply_fields::u32<&route_reply::covered_blocks>("covered_blocks", required),
        reply_fields::u32<&route_reply::total_blocks>("total_blocks", required),
        reply_fields::custom(
            "explain", nil_ok, read_explain,
            [](std::vector<uint8_t>& out, const route_reply& m) {
              explain_table.write_map(out, *m.explain);
            },
            [](route_reply& m) { m.explain.reset(); })
            .written_when([](const route_reply& m) { return m.explain.has_value(); }),
        reply_fields::str<&route_reply::fallback>("fallback", &L::max_policy_bytes,
                                                  nil_ok | omit_empty),
        reply_fields::strs<&route_reply::warnings>("warnings", &L::max_warnings, "warnings",
                                                   &L::max_message_bytes, nil_ok | omit_empty),
    },
    [](const route_reply& m, uint64_t) {
      if (m.covered_blocks > m.total_blocks)
        return status::invalid_argument("route_reply.covered_blocks: exceeds total_blocks");
      return status{};
    }};

const message_table<error_reply, L> error_table{
    "error_reply",
    {
        error_fields::str<&error_reply::id>("id", &L::max_id_bytes, nil_ok),
        error_fields::enum8<&error_reply::code>("code", required),
        error_fields::str<&error_reply::message>("message", &L::max_message_bytes, required),
    }};

}  // namespace

std::vector<uint8_t> encode_route_request(const route_request& m) {
  return request_table.encode(route_protocol_version, m);
}

std::vector<uint8_t> encode_route_reply(const route_reply& m) {
  return reply_table.encode(route_protocol_version, m);
}

std::vector<uint8_t> encode_error_reply(const error_reply& m) {
  return error_table.encode(route_protocol_version, m);
}

result<route_request> decode_route_request(std::span<const uint8_t> payload,
                                           const route_protocol_limits& limits,
                                           std::vector<kv_decode_issue>& issues) {
  return request_table.decode(payload, limits.max_payload_bytes, route_protocol_version, limits,
                              issues);
}

result<route_reply> decode_route_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits) {
  return reply_table.decode(payload, limits.max_payload_bytes, route_protocol_version, limits);
}

result<error_reply> decode_error_reply(std::span<const uint8_t> payload,
                                       const route_protocol_limits& limits) {
  return error_table.decode(payload, limits.max_payload_bytes, route_protocol_version, limits);
}

}  // namespace eldr
