// worker_protocol: see worker_protocol.hpp and docs/protocol.md, section 4.
#include "cluster/worker_protocol.hpp"

#include <cmath>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cluster/http_url.hpp"
#include "cluster/wire_fields.hpp"
#include "core/msgpack.hpp"

namespace eldr {
namespace {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;
using namespace wire;

constexpr std::string_view register_type = "worker_register";
constexpr std::string_view load_type = "load_report";
constexpr std::string_view finished_type = "finished";
constexpr std::string_view drain_type = "worker_drain";
constexpr std::string_view publisher_type = "publisher_register";
constexpr std::string_view ack_type = "worker_ack";
constexpr uint32_t max_state_bytes = 64;

// Any MessagePack number is accepted (Python writes float64, a hand-written peer may send 0 or 1).
status read_fraction(reader& r, std::string_view what, float& out) {
  double v = 0.0;
  if (status s = read_number(r, what, v); !s.ok()) return s;
  if (!(v >= 0.0 && v <= 1.0))  // also refuses NaN
    return status::invalid_argument(join(what, ": ") + std::to_string(v) + " is outside 0..1");
  out = static_cast<float>(v);
  return {};
}

// The optional correlation id: absent or nil reads as "".
status read_id(reader& r, std::string_view type, uint32_t max_bytes, std::string& out) {
  if (take_nil(r)) {
    out.clear();
    return {};
  }
  return read_string(r, field(type, "id"), max_bytes, out);
}

// Writes the common head of a worker message: envelope, optional id, model.
void write_head(msgpack::writer& w, uint32_t fields, std::string_view type, const std::string& id,
                const std::string& model) {
  write_envelope(w, fields + 1 + (id.empty() ? 0 : 1), worker_protocol_version, type);
  if (!id.empty()) {
    w.write_str("id");
    w.write_str(id);
  }
  w.write_str("model");
  w.write_str(model);
}

// Fields every worker message may share: id, model, worker. Sets known when the key was one.
struct common_fields {
  bool have_model = false;
  bool have_worker = false;
};

status read_common(std::string_view type, std::string_view key, reader& r,
                   const worker_protocol_limits& limits, std::string& id, std::string& model,
                   uint32_t* worker, common_fields& seen, bool& known) {
  known = true;
  if (key == "id") return read_id(r, type, limits.max_id_bytes, id);
  if (key == "model") {
    seen.have_model = true;
    return read_nonempty(r, field(type, "model"), limits.max_model_bytes, model);
  }
  if (worker && key == "worker") {
    seen.have_worker = true;
    return read_u32(r, field(type, "worker"), *worker);
  }
  known = false;
  return {};
}

status check_common(std::string_view type, const common_fields& seen, bool needs_worker) {
  if (!seen.have_model) return missing(type, "model");
  if (needs_worker && !seen.have_worker) return missing(type, "worker");
  return {};
}

result<worker_message> decode_register(reader& r, const envelope& env,
                                       const worker_protocol_limits& limits) {
  worker_register m;
  common_fields seen;
  bool have_endpoint = false;
  const std::string_view t = register_type;
  status s = for_each_field(r, env, [&](std::string_view key, reader& in, bool& known) -> status {
    if (status e = read_common(t, key, in, limits, m.id, m.model, &m.worker, seen, known);
        !e.ok() || known)
      return e;
    known = true;
    if (key == "endpoint") {
      have_endpoint = true;
      // Opaque to the node (NIXL host:port, tcp://, http://...: the KV transfer decides), but
      // route replies, `eldrctl workers` and logs carry it.
      return read_endpoint(in, field(t, "endpoint"), limits.max_endpoint_bytes,
                           endpoint_use::opaque, m.endpoint);
    }
    if (key == "capacity") {
      if (take_nil(in)) {
        m.capacity = 0;
        return {};
      }
      return read_u32(in, field(t, "capacity"), m.capacity);
    }
    if (key == "metrics_url") {
      if (take_nil(in)) {
        m.metrics_url.clear();
        return {};
      }
      // The node connects to it: checked whole here, so nothing behind the edge parses a URL
      // it has not seen validated.
      if (status e = read_endpoint(in, field(t, "metrics_url"), limits.max_endpoint_bytes,
                                   endpoint_use::opaque, m.metrics_url);
          !e.ok())
        return e;
      if (auto u = parse_http_url(m.metrics_url); !u.ok())
        return at(field(t, "metrics_url"), u.error());
      return {};
    }
    known = false;
    return {};
  });
  if (!s.ok()) return s;
  if (status e = check_common(t, seen, true); !e.ok()) return e;
  if (!have_endpoint) return missing(t, "endpoint");
  return worker_message(std::move(m));
}

result<worker_message> decode_load(reader& r, const envelope& env,
                                   const worker_protocol_limits& limits) {
  load_report m;
  common_fields seen;
  bool have_in_flight = false, have_seq = false;
  const std::string_view t = load_type;
  status s = for_each_field(r, env, [&](std::string_view key, reader& in, bool& known) -> status {
    if (status e = read_common(t, key, in, limits, m.id, m.model, &m.worker, seen, known);
        !e.ok() || known)
      return e;
    known = true;
    if (key == "in_flight") {
      have_in_flight = true;
      return read_u32(in, field(t, "in_flight"), m.in_flight);
    }
    if (key == "seq") {
      have_seq = true;
      return read_u64(in, field(t, "seq"), m.seq);
    }
    // Informational fields are optional and may be nil.
    if (key == "running") {
      if (take_nil(in)) return {};
      return read_u32(in, field(t, "running"), m.running);
    }
    if (key == "waiting") {
      if (take_nil(in)) return {};
      return read_u32(in, field(t, "waiting"), m.waiting);
    }
    if (key == "kv_usage") {
      if (take_nil(in)) return {};
      return read_fraction(in, field(t, "kv_usage"), m.kv_usage);
    }
    known = false;
    return {};
  });
  if (!s.ok()) return s;
  if (status e = check_common(t, seen, true); !e.ok()) return e;
  if (!have_in_flight) return missing(t, "in_flight");
  if (!have_seq) return missing(t, "seq");
  return worker_message(std::move(m));
}

result<worker_message> decode_finished(reader& r, const envelope& env,
                                       const worker_protocol_limits& limits) {
  finished_requests m;
  common_fields seen;
  bool have_requests = false;
  const std::string_view t = finished_type;
  status s = for_each_field(r, env, [&](std::string_view key, reader& in, bool& known) -> status {
    if (status e = read_common(t, key, in, limits, m.id, m.model, &m.worker, seen, known);
        !e.ok() || known)
      return e;
    known = true;
    if (key != "requests") {
      known = false;
      return {};
    }
    have_requests = true;
    item a;
    if (status e = next_of(in, kind::array, field(t, "requests"), a); !e.ok()) return e;
    if (a.length > limits.max_finished)
      return status::out_of_range(field(t, "requests: ") + std::to_string(a.length) +
                                  " ids, limit " + std::to_string(limits.max_finished));
    m.requests.clear();
    m.requests.reserve(a.length);  // <= max_finished, and <= the bytes left
    for (uint32_t i = 0; i < a.length; ++i) {
      std::string id;
      if (status e = read_nonempty(in, field(t, "requests[") + std::to_string(i) + "]",
                                   limits.max_id_bytes, id);
          !e.ok())
        return e;
      m.requests.push_back(std::move(id));
    }
    return {};
  });
  if (!s.ok()) return s;
  if (status e = check_common(t, seen, true); !e.ok()) return e;
  if (!have_requests) return missing(t, "requests");
  return worker_message(std::move(m));
}

result<worker_message> decode_drain(reader& r, const envelope& env,
                                    const worker_protocol_limits& limits) {
  worker_drain m;
  common_fields seen;
  bool have_drain = false;
  const std::string_view t = drain_type;
  status s = for_each_field(r, env, [&](std::string_view key, reader& in, bool& known) -> status {
    if (status e = read_common(t, key, in, limits, m.id, m.model, &m.worker, seen, known);
        !e.ok() || known)
      return e;
    known = key == "drain";
    if (!known) return {};
    have_drain = true;
    return read_bool(in, field(t, "drain"), m.drain);
  });
  if (!s.ok()) return s;
  if (status e = check_common(t, seen, true); !e.ok()) return e;
  if (!have_drain) return missing(t, "drain");
  return worker_message(std::move(m));
}

result<worker_message> decode_publisher(reader& r, const envelope& env,
                                        const worker_protocol_limits& limits) {
  publisher_register m;
  common_fields seen;
  bool have_endpoint = false;
  const std::string_view t = publisher_type;
  status s = for_each_field(r, env, [&](std::string_view key, reader& in, bool& known) -> status {
    if (status e = read_common(t, key, in, limits, m.id, m.model, nullptr, seen, known);
        !e.ok() || known)
      return e;
    known = true;
    if (key == "endpoint") {
      have_endpoint = true;
      // The signature cache connects a SUB socket to it.
      return read_endpoint(in, field(t, "endpoint"), limits.max_endpoint_bytes,
                           endpoint_use::zmq_connect, m.endpoint);
    }
    if (key == "replay_endpoint") {
      if (take_nil(in)) {
        m.replay_endpoint.clear();
        return {};
      }
      if (status e = read_string(in, field(t, "replay_endpoint"), limits.max_endpoint_bytes,
                                 m.replay_endpoint);
          !e.ok() || m.replay_endpoint.empty())
        return e;
      return check_endpoint(field(t, "replay_endpoint"), m.replay_endpoint,
                            endpoint_use::zmq_connect);
    }
    known = false;
    return {};
  });
  if (!s.ok()) return s;
  if (status e = check_common(t, seen, false); !e.ok()) return e;
  if (!have_endpoint) return missing(t, "endpoint");
  return worker_message(std::move(m));
}

}  // namespace

std::string_view worker_message_type(const worker_message& m) {
  switch (m.index()) {
    case 0:
      return register_type;
    case 1:
      return load_type;
    case 2:
      return finished_type;
    case 3:
      return drain_type;
    default:
      return publisher_type;
  }
}

std::string& worker_message_id(worker_message& m) {
  return std::visit([](auto& v) -> std::string& { return v.id; }, m);
}

const std::string& worker_message_id(const worker_message& m) {
  return std::visit([](const auto& v) -> const std::string& { return v.id; }, m);
}

std::vector<uint8_t> encode_worker_message(const worker_message& m) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, worker_register>) {
          const bool scraped = !v.metrics_url.empty();
          write_head(w, scraped ? 4 : 3, register_type, v.id, v.model);
          w.write_str("worker");
          w.write_uint(v.worker);
          w.write_str("endpoint");
          w.write_str(v.endpoint);
          w.write_str("capacity");
          w.write_uint(v.capacity);
          if (scraped) {
            w.write_str("metrics_url");
            w.write_str(v.metrics_url);
          }
        } else if constexpr (std::is_same_v<T, load_report>) {
          write_head(w, 6, load_type, v.id, v.model);
          w.write_str("worker");
          w.write_uint(v.worker);
          w.write_str("in_flight");
          w.write_uint(v.in_flight);
          w.write_str("running");
          w.write_uint(v.running);
          w.write_str("waiting");
          w.write_uint(v.waiting);
          w.write_str("kv_usage");
          w.write_float32(v.kv_usage);
          w.write_str("seq");
          w.write_uint(v.seq);
        } else if constexpr (std::is_same_v<T, finished_requests>) {
          write_head(w, 2, finished_type, v.id, v.model);
          w.write_str("worker");
          w.write_uint(v.worker);
          w.write_str("requests");
          w.write_array_header(static_cast<uint32_t>(v.requests.size()));
          for (const std::string& r : v.requests)
            w.write_str(r);
        } else if constexpr (std::is_same_v<T, worker_drain>) {
          write_head(w, 2, drain_type, v.id, v.model);
          w.write_str("worker");
          w.write_uint(v.worker);
          w.write_str("drain");
          w.write_bool(v.drain);
        } else {
          static_assert(std::is_same_v<T, publisher_register>);
          const bool replay = !v.replay_endpoint.empty();
          write_head(w, 1 + (replay ? 1 : 0), publisher_type, v.id, v.model);
          w.write_str("endpoint");
          w.write_str(v.endpoint);
          if (replay) {
            w.write_str("replay_endpoint");
            w.write_str(v.replay_endpoint);
          }
        }
      },
      m);
  return out;
}

std::vector<uint8_t> encode_worker_ack(const worker_ack& m) {
  std::vector<uint8_t> out;
  msgpack::writer w(out);
  write_envelope(w, 2 + (m.id.empty() ? 0 : 1), worker_protocol_version, ack_type);
  if (!m.id.empty()) {
    w.write_str("id");
    w.write_str(m.id);
  }
  w.write_str("state");
  w.write_str(m.state);
  w.write_str("epoch");
  w.write_uint(m.epoch);
  return out;
}

result<worker_message> decode_worker_message(std::span<const uint8_t> payload,
                                             const worker_protocol_limits& limits) {
  reader r(payload.data(), payload.size());
  envelope env;
  if (status s = read_envelope(payload, limits.max_payload_bytes, worker_protocol_version,
                               "worker message", r, env);
      !s.ok())
    return s;
  if (env.type == register_type) return decode_register(r, env, limits);
  if (env.type == load_type) return decode_load(r, env, limits);
  if (env.type == finished_type) return decode_finished(r, env, limits);
  if (env.type == drain_type) return decode_drain(r, env, limits);
  if (env.type == publisher_type) return decode_publisher(r, env, limits);
  return status::not_found("worker message.type: \"" + env.type + "\"");
}

result<worker_ack> decode_worker_ack(std::span<const uint8_t> payload,
                                     const worker_protocol_limits& limits) {
  worker_ack m;
  bool have_state = false;
  status s =
      decode_message(payload, limits.max_payload_bytes, worker_protocol_version, ack_type,
                     [&](std::string_view key, reader& in, bool& known) -> status {
                       known = true;
                       if (key == "id") return read_id(in, ack_type, limits.max_id_bytes, m.id);
                       if (key == "state") {
                         have_state = true;
                         return read_string(in, field(ack_type, "state"), max_state_bytes, m.state);
                       }
                       if (key == "epoch") {
                         if (take_nil(in)) {
                           m.epoch = 0;
                           return {};
                         }
                         return read_u64(in, field(ack_type, "epoch"), m.epoch);
                       }
                       known = false;
                       return {};
                     });
  if (!s.ok()) return s;
  if (!have_state) return missing(ack_type, "state");
  return m;
}

}  // namespace eldr
