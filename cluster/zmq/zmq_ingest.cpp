// zmq_ingest: see zmq_ingest.hpp.
#include "cluster/zmq/zmq_ingest.hpp"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <chrono>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace eldr {
namespace {

constexpr uint64_t end_of_replay = ~uint64_t{0};

std::span<const uint8_t> bytes(const zmq::message_t& m) {
  return {static_cast<const uint8_t*>(m.data()), m.size()};
}

}  // namespace

class zmq_ingest::impl {
 public:
  impl(signature_cache& cache, zmq_ingest_options o, clock_fn clock)
      : opt(std::move(o)), logic(cache, opt.limits, std::move(clock)) {}

  zmq_ingest_options opt;
  zmq::context_t ctx{1};
  std::vector<zmq::socket_t> kv_subs, counts_subs;
  std::vector<std::unique_ptr<zmq::socket_t>> dealers;  // per kv publisher; null = no replay
  ingest logic;
  std::vector<zmq::message_t> parts;
  std::vector<std::span<const uint8_t>> frames;

  zmq::socket_t make_sub(const std::string& endpoint) {
    zmq::socket_t s(ctx, zmq::socket_type::sub);
    s.set(zmq::sockopt::rcvhwm, 100000);
    s.set(zmq::sockopt::maxmsgsize, opt.max_message_bytes);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::subscribe, "");
    s.connect(endpoint);
    return s;
  }

  std::unique_ptr<zmq::socket_t> make_dealer(const std::string& endpoint) {
    auto s = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
    s->set(zmq::sockopt::maxmsgsize, opt.max_message_bytes);
    s->set(zmq::sockopt::linger, 0);
    s->connect(endpoint);
    return s;
  }

  // Asks publisher p's replay socket for every batch from `start` and delivers them in order.
  // Accepts both reply shapes: [empty, seq, payload] and [empty, topic, seq, payload].
  bool replay(size_t p, uint64_t start,
              const std::function<void(uint64_t, std::span<const uint8_t>)>& deliver) {
    auto& dealer = dealers[p];
    if (!dealer) return false;
    uint8_t seq8[8];
    for (int i = 0; i < 8; ++i)
      seq8[i] = static_cast<uint8_t>(start >> (56 - 8 * i));
    try {
      dealer->send(zmq::message_t(), zmq::send_flags::sndmore);
      dealer->send(zmq::buffer(seq8, 8), zmq::send_flags::none);
      std::vector<zmq::message_t> reply;
      for (;;) {
        zmq::pollitem_t item{dealer->handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(opt.replay_timeout_ms)) == 0) {
          // A late answer must not be read as the answer to the next request: start afresh.
          dealer = make_dealer(opt.replay_endpoints[p]);
          return false;
        }
        reply.clear();
        if (!zmq::recv_multipart(*dealer, std::back_inserter(reply))) return false;
        if (reply.size() != 3 && reply.size() != 4) return false;
        const auto seq = decode_sequence(bytes(reply[reply.size() - 2]));
        if (!seq) return false;
        if (*seq == end_of_replay) return true;
        deliver(*seq, bytes(reply.back()));
      }
    } catch (const zmq::error_t& e) {
      spdlog::warn("replay from {}: {}", opt.replay_endpoints[p], e.what());
      dealer = make_dealer(opt.replay_endpoints[p]);
      return false;
    }
  }

  // Drains one socket without blocking, up to `budget` messages.
  size_t drain(zmq::socket_t& s, size_t budget, bool kv, uint32_t index) {
    size_t n = 0;
    while (n < budget) {
      parts.clear();
      const auto got = zmq::recv_multipart(s, std::back_inserter(parts), zmq::recv_flags::dontwait);
      if (!got) break;
      frames.clear();
      for (const auto& m : parts)
        frames.push_back(bytes(m));
      if (kv)
        logic.on_kv_message(index, frames);
      else
        logic.on_counts_message(index, frames);
      ++n;
    }
    return n;
  }
};

zmq_ingest::zmq_ingest(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
zmq_ingest::~zmq_ingest() = default;

result<std::unique_ptr<zmq_ingest>> zmq_ingest::create(signature_cache& cache,
                                                       zmq_ingest_options options, clock_fn clock) {
  if (options.replay_endpoints.size() > options.kv_endpoints.size())
    return status::invalid_argument("more replay endpoints than kv endpoints");
  options.replay_endpoints.resize(options.kv_endpoints.size());
  auto p = std::make_unique<impl>(cache, std::move(options), std::move(clock));
  impl* raw = p.get();
  try {
    for (size_t i = 0; i < raw->opt.kv_endpoints.size(); ++i) {
      const std::string& ep = raw->opt.kv_endpoints[i];
      raw->kv_subs.push_back(raw->make_sub(ep));
      replay_fn replay;
      if (!raw->opt.replay_endpoints[i].empty()) {
        raw->dealers.push_back(raw->make_dealer(raw->opt.replay_endpoints[i]));
        replay = [raw, i](uint64_t start, const auto& deliver) {
          return raw->replay(i, start, deliver);
        };
      } else {
        raw->dealers.push_back(nullptr);
      }
      raw->logic.add_kv_publisher(ep, std::move(replay));
    }
    for (const std::string& ep : raw->opt.counts_endpoints) {
      raw->counts_subs.push_back(raw->make_sub(ep));
      raw->logic.add_counts_publisher(ep);
    }
  } catch (const zmq::error_t& e) {
    return status::invalid_argument(std::string("zeromq: ") + e.what());
  }
  return std::unique_ptr<zmq_ingest>(new zmq_ingest(std::move(p)));
}

result<size_t> zmq_ingest::poll_once(int timeout_ms) {
  impl& m = *impl_;
  std::vector<zmq::pollitem_t> items;
  for (auto& s : m.kv_subs)
    items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  for (auto& s : m.counts_subs)
    items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  size_t handled = 0;
  try {
    if (zmq::poll(items, std::chrono::milliseconds(timeout_ms)) > 0) {
      // Round-robin over sockets until all are empty or the budget is spent, so one busy
      // publisher cannot starve the others; each socket's own order is kept.
      for (bool more = true; more && handled < m.opt.max_messages_per_commit;) {
        more = false;
        for (size_t i = 0; i < m.kv_subs.size(); ++i) {
          const size_t n = m.drain(m.kv_subs[i], 64, true, static_cast<uint32_t>(i));
          handled += n;
          more |= n > 0;
        }
        for (size_t i = 0; i < m.counts_subs.size(); ++i) {
          const size_t n = m.drain(m.counts_subs[i], 64, false, static_cast<uint32_t>(i));
          handled += n;
          more |= n > 0;
        }
      }
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) return status::io_error(std::string("zeromq: ") + e.what());
  }
  if (status s = m.logic.commit(); !s.ok()) return s;
  return handled;
}

const ingest& zmq_ingest::logic() const {
  return impl_->logic;
}

}  // namespace eldr
