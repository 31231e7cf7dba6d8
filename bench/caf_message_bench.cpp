// caf_message_bench: what one message between two nodes costs in CPU, both ends together: the
// cluster's messages (docs/scaling.md counts them per node and second) travel as CAF messages
// over the middleman, serialised with the project's inspect() functions. Two actor systems in
// this process, each configured as a clustered node's (sharing scheduler, 2 threads, the
// cluster's message types), one publishing a counting actor on 127.0.0.1 port 0, the other
// connected to it; each iteration sends a burst of messages one-way and waits until the receiver
// counted them all.
//
// - load_delta: a router's totals to an authority (load_delta_msg) of E (worker, total) pairs.
// - load_vector: an authority's vector (load_vector_msg) of E workers, naming R = E routers.
//
// Process CPU time (every thread of both systems: the senders' serialisation, both middlemen's
// network threads, the receiver's deserialisation and its actor), per message: the Time column
// divided by the burst (the items_per_second counter is messages per CPU-second). Smoke mode:
// E = 1, a burst of 16.
#include <benchmark/benchmark.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/cluster/cluster_protocol.hpp"
#include "bench/bench_support.hpp"

namespace {

using eldr::load_delta_atom;
using eldr::load_delta_msg;
using eldr::load_vector_atom;
using eldr::load_vector_msg;

// What the receiver has counted, and a wait for a number of messages.
struct counter {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t received = 0;

  void add() {
    std::lock_guard<std::mutex> lock(mu);
    ++received;
    cv.notify_all();
  }
  void wait_for(uint64_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return received >= n; });
  }
};

caf::behavior receiver(caf::event_based_actor*, counter* c) {
  return {
      [=](load_delta_atom, const load_delta_msg&) { c->add(); },
      [=](load_vector_atom, const load_vector_msg&) { c->add(); },
  };
}

struct node_config : caf::actor_system_config {
  node_config() {
    load<caf::io::middleman>();
    set("scheduler.max-threads", size_t{2});
    set("scheduler.policy", caf::atom("sharing"));
    set("logger.verbosity", caf::atom("quiet"));
    set("middleman.enable-automatic-connections", false);
    eldr::register_cluster_types(*this);
  }
};

// Two connected nodes, made once for the whole program (publish and remote_actor block).
// Members are destroyed in reverse: a (the connecting node) first, then b, then the counter its
// receiver used; each configuration outlives its system.
struct pair_of_nodes {
  counter count;
  node_config cfg_b;
  caf::actor_system b{cfg_b};
  node_config cfg_a;
  caf::actor_system a{cfg_a};
  caf::actor local;   // in b
  caf::actor remote;  // a's handle of it

  pair_of_nodes() {
    local = b.spawn(receiver, &count);
    auto port = b.middleman().publish(local, 0, "127.0.0.1");
    if (!port) throw std::runtime_error("publish: " + b.render(port.error()));
    auto r = a.middleman().remote_actor("127.0.0.1", *port);
    if (!r) throw std::runtime_error("remote_actor: " + a.render(r.error()));
    remote = *r;
  }
  ~pair_of_nodes() {
    caf::anon_send_exit(local, caf::exit_reason::user_shutdown);
    remote = nullptr;
  }
};

// Made on first use, torn down by main() before static destruction (CAF's threads must be gone
// by then).
std::unique_ptr<pair_of_nodes> the_nodes;

pair_of_nodes& nodes() {
  if (!the_nodes) the_nodes = std::make_unique<pair_of_nodes>();
  return *the_nodes;
}

load_delta_msg delta_of(uint32_t entries) {
  load_delta_msg m{"qwen", "n7", 1, 1, {}, {}, false};
  for (uint32_t i = 0; i < entries; ++i) {
    m.workers.push_back(i * 100 + 7);
    m.totals.push_back(1000 + i);
  }
  return m;
}

load_vector_msg vector_of(uint32_t entries) {
  load_vector_msg m{"qwen", "n7", 1, 1, {}, {}, {}, {}, {}, {}, {}, {}};
  for (uint32_t i = 0; i < entries; ++i) {
    m.workers.push_back(i * 100 + 7);
    m.in_flight.push_back(i % 13);
    m.alive.push_back(1);
    m.anchors.push_back(1);
    m.claim.push_back(3);
    m.routers.push_back(std::string(1, 'n').append(std::to_string(i + 1)));
    m.router_incarnations.push_back(0x9e3779b97f4a7c15ULL + i);
    m.included.push_back(5000 + i);
  }
  return m;
}

int64_t burst() {
  return eldr::bench::smoke() ? 16 : 1000;
}

template <class Atom, class Msg>
void send_bursts(benchmark::State& state, const Msg& msg) {
  auto& p = nodes();
  const int64_t n = burst();
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(p.count.mu);
    target = p.count.received;
  }
  for (auto _ : state) {
    for (int64_t i = 0; i < n; ++i)
      caf::anon_send(p.remote, Atom::value, msg);
    target += static_cast<uint64_t>(n);
    p.count.wait_for(target);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["burst"] = static_cast<double>(n);
}

void entries(benchmark::internal::Benchmark* b) {
  if (eldr::bench::smoke()) {
    b->Arg(1);
    return;
  }
  for (int64_t e : {1, 10, 100})
    b->Arg(e);
}

void load_delta(benchmark::State& state) {
  send_bursts<load_delta_atom>(state, delta_of(static_cast<uint32_t>(state.range(0))));
}
BENCHMARK(load_delta)->Apply(entries)->ArgName("E")->MeasureProcessCPUTime();

void load_vector(benchmark::State& state) {
  send_bursts<load_vector_atom>(state, vector_of(static_cast<uint32_t>(state.range(0))));
}
BENCHMARK(load_vector)->Apply(entries)->ArgName("E")->MeasureProcessCPUTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  the_nodes.reset();
  benchmark::Shutdown();
  return 0;
}
