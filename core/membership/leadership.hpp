// leadership: which node runs refits, and the fence that keeps a deposed leader's centroids out.
//
// One node of the cluster at a time computes new centroids (a refit) and publishes them with an
// increasing epoch. The rule, evaluated by every node from its own view of the membership: the
// leader is the alive refit-role member with the smallest name, provided the evaluating node sees
// a strict majority of the cluster's known members (all roles, itself included). A node in a
// minority partition therefore never leads, and at most one side of a split has a majority.
//
// Views can still disagree briefly (a node that has not yet noticed a death, asymmetric loss), so
// leadership is fenced rather than trusted: each leadership stint takes a term greater than any
// term the node has seen, every publish carries (term, epoch), and a router's epoch_fence rejects
// publishes from a term older than the newest it has seen. A deposed leader that keeps publishing
// is therefore ignored as soon as a router has heard of its successor's term.
//
// Each term has at most one leader: a node that the rule names first campaigns for a new term
// and leads only once a strict majority of the known members granted it their vote for that term
// (vote_box: one vote per member per term, kept across restarts by the owner). Two nodes that
// each see a majority with themselves as the smallest refit member (asymmetric partitions) can
// still both believe they lead for a while, but never in the same term, and the epochs they
// publish are numbered inside their own terms' ranges (next_epoch): an epoch number names one
// centroid set everywhere in the cluster. Announcements resolve who leads; a leader that sees a
// higher term steps down.
//
// Nothing here does I/O or reads a clock; the owners (a node's refit actor for leadership, its
// cluster actor for the vote_box and its file) feed views, votes and observed terms in and
// broadcast what comes out. Thread safety: none; one owner each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eldr {

// A member as the local failure detector currently sees it.
struct member_view {
  std::string name;
  bool refit_role = false;  // the member may run refits (and so may lead)
};

// Epoch numbers carry the term they were published in: a leader of term T > 0 numbers its
// centroid sets T * epochs_per_term + 1, + 2, ... (epoch 3000002 is the second set of term 3), so
// leaders of different terms never hand out the same number, and every epoch of a newer term is
// above every epoch of an older one. Term 0 (a node outside any cluster) counts 1, 2, 3, ...
inline constexpr uint64_t epochs_per_term = 1'000'000;

// The term an epoch number was published in (0 for the epochs of a node outside a cluster).
inline uint64_t term_of_epoch(uint64_t epoch) {
  return epoch / epochs_per_term;
}

// The epoch a publish in `term` takes when `installed` is the newest epoch this node has used or
// stored: installed + 1, or the term's first epoch when that is higher. nullopt when the term
// cannot number it -- its range is used up, or `installed` already belongs to a newer term (so
// this node's term is over and it must not publish).
std::optional<uint64_t> next_epoch(uint64_t installed, uint64_t term);

// One member's vote: granted to at most one candidate per term. The owner persists
// (voted_term, voted_for) before answering a granted request and restores it at start, so that a
// restarted member cannot vote twice in one term.
class vote_box {
 public:
  explicit vote_box(uint64_t voted_term = 0, std::string voted_for = {})
      : voted_term_(voted_term), voted_for_(std::move(voted_for)) {}

  // `candidate` asks for this member's vote in `term`. Granted when the term is above every term
  // voted in so far, or is the term last voted in and names the same candidate (a retried
  // request); then recorded.
  bool request(std::string_view candidate, uint64_t term);

  uint64_t voted_term() const { return voted_term_; }
  const std::string& voted_for() const { return voted_for_; }

 private:
  uint64_t voted_term_ = 0;
  std::string voted_for_;
};

// The outcome of leadership::evaluate.
struct leader_decision {
  // This node sees a strict majority of the known members (itself included).
  bool has_quorum = false;
  // This node leads (runs refits and publishes under `term`).
  bool self_leads = false;
  // The rule names this node and it does not lead yet: it campaigns for `term` (new, above every
  // term seen) and must ask every member for its vote, then report with campaign_result.
  bool campaign = false;
  // Who should lead as this node sees it: itself or the smallest visible refit-role member. ""
  // without quorum or when no refit-role member is visible.
  std::string leader;
  // self_leads: this node's term; campaign: the term campaigned for. Otherwise the highest term
  // seen, the least a legitimate leader's publishes can carry.
  uint64_t term = 0;
};

// A leader and its term, as this node knows them.
struct leader_info {
  std::string name;
  uint64_t term = 0;
};

// The leadership state of one node (`self`).
class leadership {
 public:
  // self: this node's name (non-empty, as the other members know it). self_refit_role: whether
  // this node may lead; its role comes from here, never from the views passed to evaluate.
  leadership(std::string self, bool self_refit_role);

  const std::string& self() const { return self_; }
  bool self_refit_role() const { return self_refit_role_; }
  // The highest term seen: in announcements, publishes, or taken by this node. Never decreases.
  uint64_t highest_term_seen() const { return highest_term_; }
  bool is_leader() const { return leading_; }
  // The term this node campaigns for; 0 when it does not campaign.
  uint64_t campaign_term() const { return campaigning_ ? campaign_term_ : 0; }
  // This node's term while it leads; 0 when it does not.
  uint64_t term() const { return leading_ ? term_ : 0; }
  // The current leader: this node while it leads, otherwise the last leader announced at the
  // highest term seen (observe_leader) that was visible at the last evaluate. nullopt when none is
  // known.
  const std::optional<leader_info>& leader() const { return leader_; }

  // A term seen anywhere (a heartbeat, a publish, a router's rejection). A term above this node's
  // own leadership term means someone has since taken over: this node steps down (returns true).
  bool observe_term(uint64_t term);
  // Another node announced that it leads under `term`. Observes the term as above, and records
  // the announcer as the current leader unless the announcement is stale (term below the highest
  // seen). An announcement under this node's own term (two leaders of one term: impossible with
  // votes unless a member lost its vote record) is resolved by name: this node steps down iff the
  // announcer's name is smaller. Announcements naming this node only observe the term: this node
  // leads only through evaluate and campaign_result. Returns true when this node stepped down.
  bool observe_leader(std::string_view name, uint64_t term);

  // Applies the rule to the current view. visible_alive: the members this node currently believes
  // alive (duplicates and entries naming this node are ignored; this node always counts as
  // visible). known_members: the size of the cluster's configured membership, all roles, this node
  // included; if fewer than the visible members, the visible count is used (they evidently exist).
  // When the rule names this node and it neither leads nor campaigns, it starts a campaign for
  // term = highest_term_seen + 1 (decision.campaign); while it leads, re-evaluating keeps its term.
  // Losing quorum, or a smaller-named refit member becoming visible, steps down or ends the
  // campaign.
  leader_decision evaluate(const std::vector<member_view>& visible_alive,
                           std::size_t known_members);

  // The votes of the campaign for `term`: `granted` members (this node included, if its own
  // vote_box granted) of `known_members`. Returns true when this node now leads under `term`: the
  // campaign is still on (no higher term seen, the rule still names this node) and the grants
  // are a strict majority. Either way the campaign is over; a failed one is retried, under a new
  // term, by a later evaluate.
  bool campaign_result(uint64_t term, std::size_t granted, std::size_t known_members);

  // Stops leading now (e.g. the refit store became unavailable). The next evaluate that finds
  // this node the rightful leader takes over again under a new term, so an owner that wants to
  // stay out must stop evaluating or run without the refit role.
  void step_down();

 private:
  std::string self_;
  bool self_refit_role_ = false;
  uint64_t highest_term_ = 0;
  bool leading_ = false;
  uint64_t term_ = 0;  // valid while leading_
  bool campaigning_ = false;
  uint64_t campaign_term_ = 0;  // valid while campaigning_
  std::optional<leader_info> leader_;
};

// The outcome of epoch_fence::offer.
enum class fence_result : uint8_t {
  accepted,    // newer epoch from a current term: install it
  stale_term,  // from a term older than the newest seen: a deposed leader, ignore
  old_epoch,   // current term but an epoch not newer than the installed one: ignore
  duplicate,   // exactly the installed (term, epoch) again, e.g. a retried publish: ignore
};

// "accepted", "stale_term", "old_epoch", "duplicate".
std::string_view to_string(fence_result r);

// What a router keeps to decide whether a published centroid set may replace the one it serves.
// Epochs number centroid sets across the whole cluster and only grow; a new leader continues from
// the installed epoch (it must learn it, e.g. from the store, and publish above it).
class epoch_fence {
 public:
  // Nothing installed: the first publish with any epoch is accepted.
  epoch_fence() = default;
  // Resumes from an installed (term, epoch), e.g. the centroid set persisted before a restart.
  epoch_fence(uint64_t term, uint64_t epoch);

  // A leader published `epoch` under `term`. In order: term below the highest term seen ->
  // stale_term; the installed (term, epoch) again -> duplicate; epoch not above the installed
  // epoch -> old_epoch; otherwise accepted and installed. Any offer whose term is not stale raises
  // the highest term seen, even when its epoch is refused, so that the new leader's first (even
  // refused) publish already fences the old one.
  fence_result offer(uint64_t term, uint64_t epoch);
  // A term learnt elsewhere (a leadership announcement): fences older leaders before the new one
  // has published anything.
  void observe_term(uint64_t term);

  uint64_t highest_term() const { return highest_term_; }
  bool has_epoch() const { return has_epoch_; }
  // The installed publish; (0, 0) while has_epoch() is false.
  uint64_t term() const { return term_; }
  uint64_t epoch() const { return epoch_; }

 private:
  uint64_t highest_term_ = 0;
  bool has_epoch_ = false;
  uint64_t term_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace eldr
