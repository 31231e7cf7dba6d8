// failover_budget: see failover_budget.hpp.
#include "core/membership/failover_budget.hpp"

#include <algorithm>
#include <string>

namespace eldr {

result<failover_budget> failover_budget::make(double max_tokens, double token_ratio) {
  if (!(max_tokens > 0.0))
    return status::invalid_argument("failover_budget: max_tokens must be > 0, not " +
                                    std::to_string(max_tokens));
  if (!(token_ratio > 0.0) || token_ratio > max_tokens)
    return status::invalid_argument(
        "failover_budget: token_ratio must be in (0, max_tokens], not " +
        std::to_string(token_ratio));
  return failover_budget(max_tokens, token_ratio);
}

void failover_budget::on_answer() {
  tokens_ = std::min(max_, tokens_ + ratio_);
}

bool failover_budget::on_timeout() {
  tokens_ = std::max(0.0, tokens_ - 1.0);
  if (tokens_ > max_ / 2) {
    ++allowed_;
    return true;
  }
  ++refused_;
  return false;
}

}  // namespace eldr
