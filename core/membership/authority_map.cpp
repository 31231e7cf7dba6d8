// authority_map: see authority_map.hpp.
#include "core/membership/authority_map.hpp"

#include <algorithm>
#include <tuple>

#include "core/membership/hash_ring.hpp"

namespace eldr {

bool claim_beats(const authority_claim& a, const authority_claim& b, std::string_view model,
                 uint32_t worker) {
  const auto key = [&](const authority_claim& c) {
    return std::make_tuple(c.generation, c.registered, rendezvous_score(c.node, model, worker),
                           std::string_view(c.node));
  };
  return key(a) > key(b);
}

uint64_t encode_claim(const authority_claim& c) {
  return c.generation * 2 + (c.registered ? 1 : 0);
}

authority_claim decode_claim(std::string node, uint64_t encoded) {
  return {std::move(node), encoded / 2, (encoded & 1) != 0};
}

std::optional<std::string> successor_authority(const std::vector<std::string>& routers,
                                               std::string_view model, uint32_t worker) {
  const std::string* best = nullptr;
  uint64_t best_score = 0;
  for (const auto& r : routers) {
    const uint64_t s = rendezvous_score(r, model, worker);
    if (best == nullptr || s > best_score || (s == best_score && r > *best)) {
      best = &r;
      best_score = s;
    }
  }
  if (best == nullptr) return std::nullopt;
  return *best;
}

authority_map::authority_map(std::string self, std::string model)
    : self_(std::move(self)), model_(std::move(model)) {}

const authority_claim& authority_map::on_registered(uint32_t worker) {
  auto [it, added] = claims_.try_emplace(worker);
  authority_claim& c = it->second;
  if (added || c.node != self_) ++nodes_version_;
  c = authority_claim{self_, c.generation + 1, true};
  return c;
}

authority_map::verdict authority_map::on_claim(uint32_t worker, const authority_claim& theirs) {
  auto it = claims_.find(worker);
  if (it == claims_.end()) {
    claims_.emplace(worker, theirs);
    ++nodes_version_;
    return verdict::follow;
  }
  authority_claim& known = it->second;
  if (known.node == theirs.node) {
    // The same authority; its claim only grows (an older vector may arrive late).
    if (claim_beats(theirs, known, model_, worker)) known = theirs;
    return verdict::follow;
  }
  if (!claim_beats(theirs, known, model_, worker))
    return known.node == self_ ? verdict::keep_mine : verdict::ignore;
  const bool was_mine = known.node == self_;
  known = theirs;
  ++nodes_version_;
  return was_mine ? verdict::yield : verdict::follow;
}

std::vector<authority_map::succession> authority_map::on_members(
    const std::vector<std::string>& peers) {
  std::vector<std::string> live = peers;
  if (std::find(live.begin(), live.end(), self_) == live.end()) live.push_back(self_);
  std::sort(live.begin(), live.end());
  std::vector<succession> moved;
  for (auto& [worker, c] : claims_) {
    if (std::binary_search(live.begin(), live.end(), c.node)) continue;
    // live holds self_, so there is a successor.
    std::string to = *successor_authority(live, model_, worker);
    moved.push_back({worker, c.node, to});
    c.node = std::move(to);
    c.registered = false;
  }
  if (!moved.empty()) ++nodes_version_;
  return moved;
}

const authority_claim* authority_map::claim(uint32_t worker) const {
  auto it = claims_.find(worker);
  return it == claims_.end() ? nullptr : &it->second;
}

bool authority_map::mine(uint32_t worker) const {
  const auto* c = claim(worker);
  return c != nullptr && c->node == self_;
}

void authority_map::erase(uint32_t worker) {
  if (claims_.erase(worker) != 0) ++nodes_version_;
}

}  // namespace eldr
