// handoff_planner: see handoff_planner.hpp.
#include "actors/sigcache/handoff_planner.hpp"

#include <algorithm>

namespace eldr::sigcache {

handoff_planner::handoff_planner(std::optional<hash_ring> base, hash_ring next, size_t replication,
                                 std::string me, std::set<std::string> receivers,
                                 std::vector<held_block> held, size_t batch_blocks)
    : base_(std::move(base)),
      next_(std::move(next)),
      replication_(replication),
      me_(std::move(me)),
      receivers_(std::move(receivers)),
      held_(std::move(held)),
      batch_blocks_(std::max<size_t>(batch_blocks, 1)) {}

std::optional<handoff_planner::batch> handoff_planner::next(size_t scan) {
  const size_t end = std::min(held_.size(), pos_ + scan);
  while (pos_ < end) {
    const held_block& b = held_[pos_++];
    std::vector<uint32_t> before;
    if (base_) before = base_->owners(b.first, replication_);
    for (uint32_t o : next_.owners(b.first, replication_)) {
      const std::string& name = next_.members()[o];
      if (name == me_ || !receivers_.count(name)) continue;
      if (base_) {
        auto old = base_->index_of(name);
        if (old && std::find(before.begin(), before.end(), *old) != before.end()) continue;
      }
      auto& f = filling_[name];
      f.push_back(b);
      if (f.size() >= batch_blocks_) {
        batch out{name, std::move(f)};
        filling_.erase(name);
        return out;
      }
    }
  }
  if (pos_ < held_.size()) return std::nullopt;
  // Every block scanned: what is left, one receiver at a time.
  for (auto it = filling_.begin(); it != filling_.end(); it = filling_.erase(it))
    if (!it->second.empty()) {
      batch out{it->first, std::move(it->second)};
      filling_.erase(it);
      return out;
    }
  return std::nullopt;
}

bool handoff_planner::done() const {
  return pos_ >= held_.size() && filling_.empty();
}

}  // namespace eldr::sigcache
