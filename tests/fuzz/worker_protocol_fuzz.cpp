// Fuzz target: the worker protocol's decoders on arbitrary bytes never crash or over-allocate;
// whatever they accept stays within the limits and survives a re-encode unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <variant>
#include <vector>

#include "cluster/worker_protocol.hpp"

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
    if (const auto* f = std::get_if<eldr::finished_requests>(&*m)) {
      if (f->requests.size() > limits.max_finished) std::abort();
      for (const auto& r : f->requests)
        if (r.empty() || r.size() > limits.max_id_bytes) std::abort();
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
