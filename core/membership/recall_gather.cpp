// recall_gather: see recall_gather.hpp.
#include "core/membership/recall_gather.hpp"

namespace eldr {

recall_gather::step recall_gather::on_answer(const std::optional<recalled_decision>& decision) {
  if (settled_) return step::settled;
  if (decision) {
    // Any peer's decision is the decision: a request id is decided by one router (the one the
    // client reached first); a second router that decided it too is a window this ask closes.
    settled_ = true;
    found_ = decision;
    if (pending_ > 0) --pending_;
    return step::answer;
  }
  return after_one();
}

recall_gather::step recall_gather::on_failure() {
  if (settled_) return step::settled;
  ++failures_;
  return after_one();
}

recall_gather::step recall_gather::after_one() {
  if (pending_ > 0) --pending_;
  if (pending_ > 0) return step::wait;
  settled_ = true;
  return step::decide_afresh;
}

}  // namespace eldr
