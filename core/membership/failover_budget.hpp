// failover_budget: how often a router may ask a block's other owners after a signature-cache
// shard did not answer its part in time (docs/cluster.md, "Signature cache").
//
// A shard that times out usually still does the work: it is slow, not gone (a dead node's
// requests fail at once, and the ring drops it). Asking the next owner then doubles the shards'
// work exactly when they are short of CPU, the next ask times out too, and a saturated cluster
// collapses (measured: BENCHMARKS.md, "Shard failovers under saturation"). So timeouts may fail
// over only while they are rare, as gRPC throttles retries: the budget holds up to `max_tokens`
// tokens (full at the start); each answered part adds `token_ratio`, each timed-out part takes 1,
// and a timed-out part may be asked elsewhere only while more than half of `max_tokens` is left.
// With the defaults (10, 0.1) failovers go on while fewer than about 1 part in 11 times out.
//
// Nothing here reads a clock or does I/O. Thread safety: none; one owner (the router actor).
#pragma once

#include <cstdint>

#include "core/base/status.hpp"

namespace eldr {

class failover_budget {
 public:
  // Errors (invalid_argument): max_tokens <= 0, token_ratio <= 0 or above max_tokens.
  static result<failover_budget> make(double max_tokens = 10.0, double token_ratio = 0.1);

  // A shard answered its part (in time).
  void on_answer();
  // A shard's part timed out: true when its blocks may be asked of their other owners, false
  // when the budget is spent (the part is given up; counted in refused()).
  bool on_timeout();

  double tokens() const { return tokens_; }
  uint64_t allowed() const { return allowed_; }
  uint64_t refused() const { return refused_; }

 private:
  failover_budget(double max_tokens, double token_ratio)
      : max_(max_tokens), ratio_(token_ratio), tokens_(max_tokens) {}

  double max_;
  double ratio_;
  double tokens_;
  uint64_t allowed_ = 0, refused_ = 0;
};

}  // namespace eldr
