// route_book: the generator's record of every route request of one run -- when it was sent, when
// and how it was answered, or that it timed out -- and the route figures of the run's result made
// from it (round trips after the warm-up and by second, rates, decisions per worker, coverage).
//
// Used from the generator's thread alone.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cluster/zmq/client.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// The per-request record of the generator.
enum class route_fate : uint8_t { unsent, outstanding, replied, error_reply, timeout, send_error };

struct request_record {
  wall_clock::time_point sent_at{};
  wall_clock::time_point received_at{};
  uint64_t epoch = 0;  // of the reply (decisions only)
  route_fate fate = route_fate::unsent;
  bool outstanding() const { return fate == route_fate::outstanding; }
};

class route_book {
 public:
  // Requests [0, requests) are named run_id + "-" + index; decisions name workers [0, workers);
  // round trips of requests sent in the first warmup_s seconds stay out of the headline figures.
  route_book(std::string run_id, uint32_t requests, uint32_t workers, double warmup_s);

  // Request i is about to be sent now (counted in res.sent).
  void sending(uint32_t i, policy_result& res);
  // Request i's send failed (an error, not retried) or succeeded (outstanding).
  void send_failed(uint32_t i, policy_result& res);
  void sent(uint32_t i);

  // Records a reply read at `now`. Returns the request's index when the reply is a decision for
  // an outstanding request of this run (to hand on), nullopt otherwise: an error reply, a foreign
  // or unmatched id, a late reply to a request already counted as timed out.
  std::optional<uint32_t> on_reply(const route_outcome& out, wall_clock::time_point now,
                                   policy_result& res);

  // Requests without a reply timeout_ms after their send are given up on.
  void expire(wall_clock::time_point now, int timeout_ms, policy_result& res);

  uint64_t outstanding() const { return outstanding_; }
  const std::vector<request_record>& records() const { return rec_; }

  // The route figures: round-trip percentiles (after the warm-up, by second, all), route_rps,
  // coverage_mean, decision_imbalance, decision_cv, epochs.
  void summarize(policy_result& res);

 private:
  const std::string run_id_;
  const uint32_t workers_;
  const double warmup_s_;
  std::vector<request_record> rec_;
  std::deque<uint32_t> in_order_;  // sent requests, oldest first, for timeouts
  std::set<uint64_t> epochs_;
  std::vector<double> rtts_;  // after the warm-up
  std::vector<std::vector<double>> rtts_by_second_;
  double coverage_sum_ = 0;
  uint64_t decisions_ = 0, outstanding_ = 0;
  wall_clock::time_point first_send_{}, last_reply_{};
};

}  // namespace eldr::loadgen
