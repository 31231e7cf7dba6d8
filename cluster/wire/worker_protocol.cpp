// worker_protocol: see worker_protocol.hpp and docs/protocol.md, section 4.
#include "cluster/wire/worker_protocol.hpp"

#include <cmath>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cluster/http/http_url.hpp"
#include "cluster/wire/wire_fields.hpp"
#include "cluster/wire/wire_table.hpp"
#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

using namespace wire;
using L = worker_protocol_limits;

constexpr std::string_view register_type = "worker_register";
constexpr std::string_view load_type = "load_report";
constexpr std::string_view finished_type = "finished";
constexpr std::string_view drain_type = "worker_drain";
constexpr std::string_view publisher_type = "publisher_register";
constexpr std::string_view ack_type = "worker_ack";
constexpr uint32_t max_state_bytes = 64;

// The fields every worker message starts with: the optional correlation id (absent or nil reads
// as "") and the model.
template <class M>
wire::field_spec<M, L> id_field() {
  return wire::fields<M, L>::template str<&M::id>("id", &L::max_id_bytes, nil_ok | omit_empty);
}
template <class M>
wire::field_spec<M, L> model_field() {
  return wire::fields<M, L>::template str<&M::model>("model", &L::max_model_bytes,
                                                     required | nonempty);
}
template <class M>
wire::field_spec<M, L> worker_field() {
  return wire::fields<M, L>::template u32<&M::worker>("worker", required);
}

using register_fields = wire::fields<worker_register, L>;
const message_table<worker_register, L> register_table{
    register_type,
    {
        id_field<worker_register>(),
        model_field<worker_register>(),
        worker_field<worker_register>(),
        // Opaque to the node (NIXL host:port, tcp://, http://...: the KV transfer decides), but
        // route replies, `eldrctl workers` and logs carry it.
        register_fields::endpoint<&worker_register::endpoint>(
            "endpoint", &L::max_endpoint_bytes, endpoint_use::opaque, required | nonempty),
        register_fields::u32<&worker_register::capacity>("capacity", nil_ok),
        // The node connects to it: checked whole here, so nothing behind the edge parses a URL it
        // has not seen validated.
        register_fields::endpoint<&worker_register::metrics_url>(
            "metrics_url", &L::max_endpoint_bytes, endpoint_use::opaque,
            nil_ok | nonempty | omit_empty)
            .checked([](std::string_view what, const worker_register& m) -> status {
              if (auto u = parse_http_url(m.metrics_url); !u.ok()) return at(what, u.error());
              return {};
            }),
    }};

// Any MessagePack number is accepted (Python writes float64, a hand-written peer may send 0 or 1).
status read_fraction(reader& r, const wire::field_spec<load_report, L>&,
                     const wire::decode_context<L, std::monostate>&, std::string_view what,
                     load_report& m) {
  double v = 0.0;
  if (status s = read_number(r, what, v); !s.ok()) return s;
  if (!(v >= 0.0 && v <= 1.0))  // also refuses NaN
    return status::invalid_argument(join(what, ": ") + std::to_string(v) + " is outside 0..1");
  m.kv_usage = static_cast<float>(v);
  return {};
}

using load_fields = wire::fields<load_report, L>;
const message_table<load_report, L> load_table{
    load_type,
    {
        id_field<load_report>(),
        model_field<load_report>(),
        worker_field<load_report>(),
        load_fields::u32<&load_report::in_flight>("in_flight", required),
        // Informational fields are optional and may be nil.
        load_fields::u32<&load_report::running>("running", nil_ok),
        load_fields::u32<&load_report::waiting>("waiting", nil_ok),
        load_fields::custom(
            "kv_usage", nil_ok, read_fraction,
            [](std::vector<uint8_t>& out, const load_report& m) {
              msgpack::writer(out).write_float32(m.kv_usage);
            },
            [](load_report& m) { m.kv_usage = 0.0f; }),
        load_fields::u64<&load_report::seq>("seq", required),
    }};

const message_table<finished_requests, L> finished_table{
    finished_type,
    {
        id_field<finished_requests>(),
        model_field<finished_requests>(),
        worker_field<finished_requests>(),
        wire::fields<finished_requests, L>::strs<&finished_requests::requests>(
            "requests", &L::max_finished, "ids", &L::max_id_bytes, required | nonempty),
    }};

const message_table<worker_drain, L> drain_table{
    drain_type,
    {
        id_field<worker_drain>(),
        model_field<worker_drain>(),
        worker_field<worker_drain>(),
        wire::fields<worker_drain, L>::boolean<&worker_drain::drain>("drain", required),
    }};

// The signature cache connects a SUB socket to both endpoints.
using publisher_fields = wire::fields<publisher_register, L>;
const message_table<publisher_register, L> publisher_table{
    publisher_type,
    {
        id_field<publisher_register>(),
        model_field<publisher_register>(),
        publisher_fields::endpoint<&publisher_register::endpoint>(
            "endpoint", &L::max_endpoint_bytes, endpoint_use::zmq_connect, required | nonempty),
        publisher_fields::endpoint<&publisher_register::replay_endpoint>(
            "replay_endpoint", &L::max_endpoint_bytes, endpoint_use::zmq_connect,
            nil_ok | omit_empty),
    }};

using ack_fields = wire::fields<worker_ack, L>;
const message_table<worker_ack, L> ack_table{
    ack_type,
    {
        ack_fields::str<&worker_ack::id>("id", &L::max_id_bytes, nil_ok | omit_empty),
        ack_fields::str<&worker_ack::state>("state", max_state_bytes, required),
        ack_fields::u64<&worker_ack::epoch>("epoch", nil_ok),
    }};

const auto& table_of(const worker_register&) {
  return register_table;
}
const auto& table_of(const load_report&) {
  return load_table;
}
const auto& table_of(const finished_requests&) {
  return finished_table;
}
const auto& table_of(const worker_drain&) {
  return drain_table;
}
const auto& table_of(const publisher_register&) {
  return publisher_table;
}

// The fields of a message of type M whose envelope was read.
template <class M>
result<worker_message> decode_as(reader& r, const envelope& env, std::span<const uint8_t> payload,
                                 const worker_protocol_limits& limits) {
  M m;
  std::monostate none;
  if (status s = table_of(m).read_fields(r, env, {limits, payload, none}, m); !s.ok()) return s;
  return worker_message(std::move(m));
}

}  // namespace

std::string_view worker_message_type(const worker_message& m) {
  return std::visit([](const auto& v) { return table_of(v).type(); }, m);
}

std::string& worker_message_id(worker_message& m) {
  return std::visit([](auto& v) -> std::string& { return v.id; }, m);
}

const std::string& worker_message_id(const worker_message& m) {
  return std::visit([](const auto& v) -> const std::string& { return v.id; }, m);
}

std::vector<uint8_t> encode_worker_message(const worker_message& m) {
  return std::visit([](const auto& v) { return table_of(v).encode(worker_protocol_version, v); },
                    m);
}

std::vector<uint8_t> encode_worker_ack(const worker_ack& m) {
  return ack_table.encode(worker_protocol_version, m);
}

result<worker_message> decode_worker_message(std::span<const uint8_t> payload,
                                             const worker_protocol_limits& limits) {
  reader r(payload.data(), payload.size());
  envelope env;
  if (status s = read_envelope(payload, limits.max_payload_bytes, worker_protocol_version,
                               "worker message", r, env);
      !s.ok())
    return s;
  if (env.type == register_type) return decode_as<worker_register>(r, env, payload, limits);
  if (env.type == load_type) return decode_as<load_report>(r, env, payload, limits);
  if (env.type == finished_type) return decode_as<finished_requests>(r, env, payload, limits);
  if (env.type == drain_type) return decode_as<worker_drain>(r, env, payload, limits);
  if (env.type == publisher_type) return decode_as<publisher_register>(r, env, payload, limits);
  return status::not_found("worker message.type: \"" + env.type + "\"");
}

result<worker_ack> decode_worker_ack(std::span<const uint8_t> payload,
                                     const worker_protocol_limits& limits) {
  return ack_table.decode(payload, limits.max_payload_bytes, worker_protocol_version, limits);
}

}  // namespace eldr
