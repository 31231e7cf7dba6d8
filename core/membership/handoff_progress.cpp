// handoff_progress: see handoff_progress.hpp.
#include "core/membership/handoff_progress.hpp"

#include <algorithm>

namespace eldr {

std::set<std::string>& handoff_progress::done_for(const std::vector<std::string>& ring) {
  for (auto& [r, senders] : done_)
    if (r == ring) return senders;
  if (done_.size() >= rings_kept) done_.pop_front();
  done_.emplace_back(ring, std::set<std::string>{});
  return done_.back().second;
}

bool handoff_progress::on_done(const std::string& sender, std::vector<std::string> ring) {
  std::sort(ring.begin(), ring.end());
  done_for(ring).insert(sender);
  if (!active_ || ring != target_ || !pending_.erase(sender)) return false;
  if (!pending_.empty()) return false;
  active_ = false;
  return true;
}

bool handoff_progress::start(const std::vector<std::string>& before,
                             std::vector<std::string> ring) {
  std::sort(ring.begin(), ring.end());
  const auto& done = done_for(ring);
  pending_.clear();
  for (const auto& s : before)
    if (!done.count(s)) pending_.insert(s);
  target_ = std::move(ring);
  active_ = !pending_.empty();
  return !active_;
}

void handoff_progress::on_ring(std::vector<std::string> ring) {
  std::sort(ring.begin(), ring.end());
  // Kept: the new ring's, and those of bigger rings the router has not had yet (it may be on its
  // way there: a newcomer meets the others one by one, and a sender can finish for the whole
  // ring before the newcomer's ring has grown to it).
  std::erase_if(done_, [&](const auto& entry) {
    const auto& r = entry.first;
    return r != ring && (r == ring_ || std::find(left_.begin(), left_.end(), r) != left_.end() ||
                         !std::includes(r.begin(), r.end(), ring.begin(), ring.end()));
  });
  if (!ring_.empty() && ring_ != ring) {
    left_.push_back(std::move(ring_));
    if (left_.size() > rings_kept) left_.pop_front();
  }
  ring_ = std::move(ring);
}

void handoff_progress::stop() {
  active_ = false;
  pending_.clear();
}

}  // namespace eldr
