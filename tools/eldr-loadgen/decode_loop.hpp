// decode_loop: the live side of the decode emulation. The generator hands each decided request
// over through a handoff_queue; decode_loop, on its own thread, feeds them to the decode_emulator
// against the wall clock and tells the node what the emulated workers do (load reports every
// --report-ms, finished requests as they finish) on its own worker socket. It sleeps on the
// queue's condition variable until the next decode event, report or hand-off.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cluster/zmq/client.hpp"
#include "tools/eldr-loadgen/decode_emulator.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// A decided request handed to the decode loop.
struct handoff {
  uint32_t request;
  uint32_t worker;
  double t;  // model time of decode arrival (reply + KV transfer)
};

struct handoff_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<handoff> items;
  bool producer_done = false;
};

// Drains pipelined worker acks without waiting; counts error replies.
void drain_acks(worker_client& c, uint64_t& errors);

// What the decode loop sent to the node: messages, and sends or acks that failed.
struct decode_stats {
  uint64_t messages = 0, errors = 0;
};

// Runs until the producer is done and every request finished, `stop`, or --drain seconds after
// the producer is done; requests are named run_id + "-" + index in finished messages. Sends a
// last load report before it returns.
void decode_loop(session& s, decode_emulator& emu, handoff_queue& q, const run_clock& clock,
                 const std::atomic<bool>& stop, const std::string& run_id, decode_stats& out);

}  // namespace eldr::loadgen
