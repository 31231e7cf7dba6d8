// recall_gather: a marked retry's question to the other routers (docs/cluster.md, "Retries: ask,
// don't broadcast").
//
// A client that timed out at one router resends the request, with the same id and marked
// (route_request.retry), to the next. With cluster.load_sharing = "authority" no router hears of
// another's decisions, and with shared decisions they hear of them one load_sync_ms late; either
// way the router the resend reaches may not know the id. It then asks every peer, in parallel and
// bounded by timeouts.recall_ms, whether it decided that id. The first decision that comes back
// is the answer: the client gets the worker it was first sent to, and the load is not counted
// twice. When every peer has answered without one (or failed to answer), the router decides
// afresh. Unmarked requests are never asked about: the ask costs only resends.
//
// This class keeps one ask's tally. Nothing here reads a clock or does I/O. Thread safety: none;
// one owner (the router actor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace eldr {

// A decision a peer remembered for the request id.
struct recalled_decision {
  uint32_t worker = 0;
  uint64_t epoch = 0;
};

class recall_gather {
 public:
  // What the asking router does after one peer's outcome.
  enum class step {
    wait,           // answers are still due, none with a decision yet
    answer,         // the first decision arrived: answer the client with it (found())
    decide_afresh,  // every peer answered or failed, none with a decision
    settled,        // an outcome after the ask was settled: nothing to do
  };

  // `peers` > 0: the number of routers asked.
  explicit recall_gather(size_t peers) : pending_(peers) {}

  // One peer's answer: its decision for the id, or none.
  step on_answer(const std::optional<recalled_decision>& decision);
  // One peer did not answer (timed out, gone, or refused the question).
  step on_failure();

  const std::optional<recalled_decision>& found() const { return found_; }
  size_t failures() const { return failures_; }
  bool settled() const { return settled_; }

 private:
  step after_one();

  size_t pending_;
  size_t failures_ = 0;
  bool settled_ = false;
  std::optional<recalled_decision> found_;
};

}  // namespace eldr
