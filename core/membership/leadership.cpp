// leadership: the majority-and-smallest-name rule with terms, and the router's epoch fence.
#include "core/membership/leadership.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace eldr {

leadership::leadership(std::string self, bool self_refit_role)
    : self_(std::move(self)), self_refit_role_(self_refit_role) {
  assert(!self_.empty());
}

std::optional<uint64_t> next_epoch(uint64_t installed, uint64_t term) {
  if (term == 0) return installed + 1;
  if (term >= UINT64_MAX / epochs_per_term) return std::nullopt;
  const uint64_t first = term * epochs_per_term + 1;
  const uint64_t next = std::max(installed + 1, first);
  if (term_of_epoch(next) != term) return std::nullopt;
  return next;
}

bool vote_box::request(std::string_view candidate, uint64_t term) {
  if (candidate.empty() || term == 0) return false;
  if (term == voted_term_) return candidate == voted_for_;
  if (term < voted_term_) return false;
  voted_term_ = term;
  voted_for_ = std::string(candidate);
  return true;
}

bool leadership::observe_term(uint64_t term) {
  if (term <= highest_term_) return false;
  highest_term_ = term;
  // Someone campaigns or leads in a newer term: ours cannot win.
  campaigning_ = false;
  // A known leader from an older term has been superseded, whoever it was.
  if (leader_ && leader_->term < term) leader_.reset();
  if (leading_ && term_ < term) {
    leading_ = false;
    return true;
  }
  return false;
}

bool leadership::observe_leader(std::string_view name, uint64_t term) {
  bool stepped_down = observe_term(term);
  if (name.empty() || name == self_ || term < highest_term_) return stepped_down;
  if (leading_ && term == term_) {
    // Two leaders under one term: the smaller name keeps it, so both sides settle the same way.
    if (name > std::string_view(self_)) return stepped_down;
    leading_ = false;
    stepped_down = true;
  } else if (!leading_ && leader_ && term == leader_->term &&
             name > std::string_view(leader_->name)) {
    return stepped_down;  // the same rule seen from a bystander: the smaller name keeps the term
  }
  leader_ = leader_info{std::string(name), term};
  return stepped_down;
}

leader_decision leadership::evaluate(const std::vector<member_view>& visible_alive,
                                     std::size_t known_members) {
  // Distinct visible names other than self; self always counts.
  std::vector<std::string_view> seen;
  seen.reserve(visible_alive.size());
  std::string_view candidate = self_refit_role_ ? std::string_view(self_) : std::string_view();
  for (const member_view& m : visible_alive) {
    if (m.name.empty() || m.name == self_) continue;
    if (std::find(seen.begin(), seen.end(), m.name) != seen.end()) continue;
    seen.push_back(m.name);
    if (m.refit_role && (candidate.empty() || m.name < candidate)) candidate = m.name;
  }
  const std::size_t visible = seen.size() + 1;
  const std::size_t known = std::max(known_members, visible);

  leader_decision d;
  d.has_quorum = 2 * visible > known;
  if (!d.has_quorum || candidate.empty() || candidate != self_) {
    leading_ = false;
    campaigning_ = false;
  }
  // A leader this node can no longer see (or vouch for, without quorum) is not reported.
  if (leader_ && (!d.has_quorum || leader_->name == self_ ||
                  std::find(seen.begin(), seen.end(), leader_->name) == seen.end()))
    leader_.reset();
  if (!d.has_quorum) {
    d.term = highest_term_;
    return d;
  }
  d.leader = std::string(candidate);
  if (candidate == self_) {
    if (leading_) {
      leader_ = leader_info{self_, term_};
      d.self_leads = true;
      d.term = term_;
    } else if (campaigning_) {
      d.term = campaign_term_;  // the votes are still being counted
    } else {
      campaign_term_ = ++highest_term_;
      campaigning_ = true;
      d.campaign = true;
      d.term = campaign_term_;
    }
  } else {
    d.term = highest_term_;
  }
  return d;
}

bool leadership::campaign_result(uint64_t term, std::size_t granted, std::size_t known_members) {
  if (!campaigning_ || term != campaign_term_) return false;
  campaigning_ = false;
  if (term < highest_term_ || 2 * granted <= known_members) return false;
  leading_ = true;
  term_ = term;
  leader_ = leader_info{self_, term_};
  return true;
}

void leadership::step_down() {
  leading_ = false;
  campaigning_ = false;
  if (leader_ && leader_->name == self_) leader_.reset();
}

std::string_view to_string(fence_result r) {
  switch (r) {
    case fence_result::accepted:
      return "accepted";
    case fence_result::stale_term:
      return "stale_term";
    case fence_result::old_epoch:
      return "old_epoch";
    case fence_result::duplicate:
      return "duplicate";
  }
  return "unknown";
}

epoch_fence::epoch_fence(uint64_t term, uint64_t epoch)
    : highest_term_(term), has_epoch_(true), term_(term), epoch_(epoch) {}

fence_result epoch_fence::offer(uint64_t term, uint64_t epoch) {
  if (term < highest_term_) return fence_result::stale_term;
  highest_term_ = term;
  if (has_epoch_ && term == term_ && epoch == epoch_) return fence_result::duplicate;
  if (has_epoch_ && epoch <= epoch_) return fence_result::old_epoch;
  has_epoch_ = true;
  term_ = term;
  epoch_ = epoch;
  return fence_result::accepted;
}

void epoch_fence::observe_term(uint64_t term) {
  highest_term_ = std::max(highest_term_, term);
}

}  // namespace eldr
