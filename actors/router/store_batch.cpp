// store_batch: see store_batch.hpp.
#include "actors/router/store_batch.hpp"

namespace eldr::router {

bool store_batcher::add(const std::string& owner, const std::string& model,
                        const model_geometry& geometry,
                        std::span<const counts_block* const> blocks) {
  if (blocks.empty()) return false;
  auto& ob = by_owner_[owner];
  batch* b = nullptr;
  for (auto& x : ob.batches)
    if (x.model == model && x.counts.geometry == geometry) b = &x;
  if (!b) {
    ob.batches.push_back(batch{owner, model, {}});
    b = &ob.batches.back();
    b->counts.geometry = geometry;
  }
  for (const counts_block* c : blocks) {
    b->counts.blocks.push_back(*c);
    ob.hashes.insert(c->hash);
  }
  ob.blocks += blocks.size();
  pending_ += blocks.size();
  return ob.blocks >= max_blocks_;
}

std::vector<store_batcher::batch> store_batcher::take(const std::string& owner) {
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return {};
  pending_ -= it->second.blocks;
  auto out = std::move(it->second.batches);
  by_owner_.erase(it);
  return out;
}

bool store_batcher::holds_any(const std::string& owner, std::span<const uint64_t> blocks) const {
  auto it = by_owner_.find(owner);
  if (it == by_owner_.end()) return false;
  for (uint64_t h : blocks)
    if (it->second.hashes.count(h) != 0) return true;
  return false;
}

std::vector<store_batcher::batch> store_batcher::take_all() {
  std::vector<batch> out;
  for (auto& [owner, ob] : by_owner_)
    for (auto& b : ob.batches)
      out.push_back(std::move(b));
  by_owner_.clear();
  pending_ = 0;
  return out;
}

}  // namespace eldr::router
