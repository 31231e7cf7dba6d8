// session: the helpers, the prompt plans and the KV-event publishers (session.hpp).
#include "tools/eldr-loadgen/session.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <sys/resource.h>

#include "core/base/parallel.hpp"
#include "tools/eldr-loadgen/prefill_emulator.hpp"

namespace eldr::loadgen {

void say(const loadgen_options& o, const std::string& m) {
  if (!o.quiet) std::fprintf(stderr, "eldr-loadgen: %s\n", m.c_str());
}

std::string fmt(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

double process_cpu_s() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

int ms_until(wall_clock::time_point t, int cap) {
  const auto d = std::chrono::duration<double, std::milli>(t - wall_clock::now()).count();
  if (d <= 0.0) return 0;
  return static_cast<int>(std::min<double>(cap, std::ceil(d)));
}

std::string reachable(const std::string& endpoint, const std::string& admin) {
  auto host_of = [](const std::string& e) -> std::pair<std::size_t, std::size_t> {
    const std::size_t a = e.find("://");
    if (a == std::string::npos) return {std::string::npos, 0};
    const std::size_t b = e.rfind(':');
    if (b == std::string::npos || b <= a + 3) return {std::string::npos, 0};
    return {a + 3, b - (a + 3)};
  };
  const auto [start, len] = host_of(endpoint);
  if (start == std::string::npos) return endpoint;
  const std::string host = endpoint.substr(start, len);
  if (host != "*" && host != "0.0.0.0" && host != "[::]" && host != "::") return endpoint;
  const auto [astart, alen] = host_of(admin);
  if (astart == std::string::npos) return endpoint;
  return endpoint.substr(0, start) + admin.substr(astart, alen) + endpoint.substr(start + len);
}

result<std::shared_ptr<const prompt_plan>> make_plan(const workload& w, const sim_request& r,
                                                     uint32_t block_size, bool with_counts,
                                                     std::vector<expert_id>& ids) {
  auto p = std::make_shared<prompt_plan>();
  prompt_tokens(r.source, r.prompt_tokens, p->tokens);
  p->hashes = block_hashes(p->tokens, block_size);
  if (with_counts && r.prompt_tokens > 0) {
    w.source->prompt_experts(r.source, ids);
    auto c = count_blocks(w.geometry(), ids, 0, r.prompt_tokens, block_size);
    if (!c.ok()) return c.error();
    p->counts = std::move(c).value();
  }
  return std::shared_ptr<const prompt_plan>(std::move(p));
}

std::vector<uint8_t> publisher::encode_events(const std::vector<kv_event>& events) {
  if (events.empty()) return {};
  kv_batch b;
  b.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  b.data_parallel_rank = 0;
  b.events = events;
  return encode_kv_batch(b);
}

void publisher::publish_encoded(const std::vector<uint8_t>& payload) {
  if (payload.empty()) return;
  const auto seq8 = encode_sequence(seq++);
  // PUB/XPUB sends never block: without a subscriber, or above the HWM, frames are dropped,
  // as vLLM's would be.
  (void)socket.send(zmq::const_buffer("", 0), zmq::send_flags::sndmore);
  (void)socket.send(zmq::buffer(seq8), zmq::send_flags::sndmore);
  (void)socket.send(zmq::buffer(payload), zmq::send_flags::none);
  // Subscription notices pile up in an XPUB: read them.
  zmq::message_t m;
  while (socket.recv(m, zmq::recv_flags::dontwait)) {
  }
}

bool publisher::wait_subscriber(int timeout_ms) {
  const auto deadline = wall_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    const int left = ms_until(deadline, timeout_ms);
    if (zmq::poll(&item, 1, std::chrono::milliseconds(left)) <= 0) return false;
    zmq::message_t m;
    if (socket.recv(m, zmq::recv_flags::dontwait) && m.size() >= 1 &&
        static_cast<const uint8_t*>(m.data())[0] == 1)
      return true;
  }
}

status prepare_plans(session& s) {
  const loadgen_options& o = *s.o;
  const workload& w = *s.w;
  std::vector<uint32_t> firsts;  // the first request of each distinct source, in arrival order
  std::unordered_map<uint64_t, bool> seen;
  for (uint32_t i = 0; i < w.requests.size() && firsts.size() < max_plans; ++i)
    if (seen.emplace(w.requests[i].source, true).second) firsts.push_back(i);
  std::vector<std::shared_ptr<const prompt_plan>> made(firsts.size());
  std::vector<status> errors(firsts.size());
  parallel_slices(o.workload.threads, firsts.size(), [&](std::size_t begin, std::size_t end) {
    std::vector<expert_id> ids;
    for (std::size_t j = begin; j < end; ++j) {
      auto p = make_plan(w, w.requests[firsts[j]], o.block_size, o.send_counts, ids);
      if (p.ok()) {
        made[j] = std::move(p).value();
      } else {
        errors[j] = p.error();
      }
    }
  });
  for (std::size_t j = 0; j < firsts.size(); ++j) {
    if (!errors[j].ok()) return errors[j];
    s.plans.emplace(w.requests[firsts[j]].source, std::move(made[j]));
  }
  return {};
}

}  // namespace eldr::loadgen
