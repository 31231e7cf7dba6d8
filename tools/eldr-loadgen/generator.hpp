// generator: the timed phase of one policy's run, on the caller's thread. It admits each request
// at its arrival (model time), sends its KV events and then its route request, both prepared
// ahead, when its prefill hands off (at most --max-outstanding unanswered), reads and stamps the
// replies, gives up on requests unanswered after --route-timeout-ms, and hands every decision on:
// to the decode loop, or, with --route-only, finishes it at once through its own worker client
// (which also reports an empty load for every worker each --report-ms, as a node drops workers
// that stay silent).
//
// Waiting. The thread that sends also receives (a ZeroMQ socket belongs to one thread), so it
// must never be busy when a reply arrives: preparation runs elsewhere (prepare_pipeline), and
// while requests are outstanding the thread sleeps in route_socket::wait, ppoll(2) on the route
// socket's ZMQ_FD with a nanosecond timeout up to the next send, so it wakes the moment a reply
// arrives and is on time for the next send (zmq_poll's millisecond timeout would make sends up to
// 1 ms late, and spinning through the last millisecond was measured to cost the node CPU on a
// 2-core machine: p99 of both the node and the client doubled). A dedicated receive thread would
// need the sends handed across threads (an inproc hop and a context switch per request) on cores
// the node needs. With nothing outstanding it sleeps until the next arrival or hand-off.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <vector>

#include "cluster/zmq/client.hpp"
#include "core/base/status.hpp"
#include "tools/eldr-loadgen/decode_loop.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/prepare_pipeline.hpp"
#include "tools/eldr-loadgen/route_book.hpp"
#include "tools/eldr-loadgen/route_socket.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

class generator {
 public:
  // Everything it plays through must outlive it. decode: the decode loop's queue (nullptr with
  // --route-only); finisher: the route-only worker client (nullptr otherwise). Its counts go to
  // res (sent, replied, errors and their kinds, decisions per worker, worker messages, stalls).
  generator(session& s, prepare_pipeline& prep, route_socket& route, route_book& book,
            const run_clock& clock, handoff_queue* decode, worker_client* finisher,
            policy_result& res);

  // Plays until every request is answered or given up on, or `stop`; a failed preparation ends
  // it with its status.
  status run(const std::atomic<bool>& stop);

 private:
  struct pending_route {
    double handoff;
    uint32_t request;
    bool operator>(const pending_route& o) const {
      return handoff != o.handoff ? handoff > o.handoff : request > o.request;
    }
  };

  void on_reply(const route_outcome& out, wall_clock::time_point now);
  void flush_finished();

  session& s_;
  const loadgen_options& o_;
  prepare_pipeline& prep_;
  route_socket& route_;
  route_book& book_;
  const run_clock& clock_;
  handoff_queue* decode_;
  worker_client* finisher_;
  policy_result& res_;
  std::priority_queue<pending_route, std::vector<pending_route>, std::greater<>> pending_;
  std::vector<std::vector<std::string>> to_finish_;  // route-only: decided ids per worker
  wall_clock::time_point next_finish_flush_, next_report_;
};

}  // namespace eldr::loadgen
