// Fuzz target: the worker protocol's decoders on arbitrary bytes never crash or over-allocate;
// whatever they accept stays within the limits and survives a re-encode unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <variant>
#include <vector>

#include "cluster/wire/wire_fields.hpp"
#include "cluster/wire/worker_protocol.hpp"
#include "core/base/utf8.hpp"

namespace {

// Field-by-field equality of two messages of the same alternative.
bool same(const eldr::worker_message& a, const eldr::worker_message& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        const T& y = std::get<T>(b);
        if (x.id != y.id || x.model != y.model) return false;
        if constexpr (std::is_same_v<T, eldr::worker_register>)
          return x.worker == y.worker && x.endpoint == y.endpoint && x.capacity == y.capacity;
        else if constexpr (std::is_same_v<T, eldr::load_report>)
          return x.worker == y.worker && x.in_flight == y.in_flight && x.running == y.running &&
                 x.waiting == y.waiting && x.kv_usage == y.kv_usage && x.seq == y.seq;
        else if constexpr (std::is_same_v<T, eldr::finished_requests>)
          return x.worker == y.worker && x.requests == y.requests;
        else if constexpr (std::is_same_v<T, eldr::worker_drain>)
          return x.worker == y.worker && x.drain == y.drain;
        else
          return x.endpoint == y.endpoint && x.replay_endpoint == y.replay_endpoint;
      },
      a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  eldr::worker_protocol_limits limits;
  limits.max_finished = 16;  // small limits, so the fuzzer reaches them
  limits.max_id_bytes = 16;
  limits.max_model_bytes = 16;
  limits.max_endpoint_bytes = 32;
  const std::span<const uint8_t> in(data, size);

  if (const auto m = eldr::decode_worker_message(in, limits); m.ok()) {
    if (eldr::worker_message_id(*m).size() > limits.max_id_bytes) std::abort();
    // Accepted strings are UTF-8, accepted endpoints pass the endpoint rules (docs/protocol.md).
    if (!eldr::valid_utf8(eldr::worker_message_id(*m))) std::abort();
    std::visit(
        [](const auto& x) {
          if (!eldr::valid_utf8(x.model)) std::abort();
        },
        *m);
    using eldr::wire::endpoint_use;
    if (const auto* w = std::get_if<eldr::worker_register>(&*m))
      if (!eldr::wire::check_endpoint("e", w->endpoint, endpoint_use::opaque).ok()) std::abort();
    if (const auto* p = std::get_if<eldr::publisher_register>(&*m)) {
      if (!eldr::wire::check_endpoint("e", p->endpoint, endpoint_use::zmq_connect).ok())
        std::abort();
      if (!p->replay_endpoint.empty() &&
          !eldr::wire::check_endpoint("e", p->replay_endpoint, endpoint_use::zmq_connect).ok())
        std::abort();
    }
    if (const auto* f = std::get_if<eldr::finished_requests>(&*m)) {
      if (f->requests.size() > limits.max_finished) std::abort();
      for (const auto& r : f->requests)
        if (r.empty() || r.size() > limits.max_id_bytes || !eldr::valid_utf8(r)) std::abort();
    }
    if (const auto* l = std::get_if<eldr::load_report>(&*m))
      if (!(l->kv_usage >= 0.0f && l->kv_usage <= 1.0f)) std::abort();
    const auto back = eldr::decode_worker_message(eldr::encode_worker_message(*m), limits);
    if (!back.ok() || !same(*back, *m)) std::abort();
  } else if (m.error().message().empty()) {
    std::abort();  // every error names its field
  }

  if (const auto a = eldr::decode_worker_ack(in, limits); a.ok()) {
    if (a->id.size() > limits.max_id_bytes) std::abort();
    const auto back = eldr::decode_worker_ack(eldr::encode_worker_ack(*a), limits);
    if (!back.ok() || !(*back == *a)) std::abort();
  }
  return 0;
}
