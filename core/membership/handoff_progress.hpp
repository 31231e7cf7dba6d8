// handoff_progress: which signature-cache nodes a router still waits for before it stops reading
// the ring before a join (docs/cluster.md, "Signature cache"). After nodes join, every node of the
// ring before hands the newcomers their blocks; each says when it has (every batch acknowledged
// by its receiver, so stored). The router reads through the ring before until all of them have
// said so for the ring it now has -- or until cluster.handoff_grace_ms, the upper bound, passes.
//
// A node may finish before the router starts waiting (the router learns the ring later than the
// cache): the finished hand-offs of the last few rings are kept and count when the wait starts.
// Rings are named by their sorted member names, so the same ring can come back (a node leaves and
// rejoins): when the router's ring changes, what was kept for a ring it has had, or for one that
// does not hold the new ring, is dropped, so an old hand-off for a ring never ends the wait for
// its next instance; what was kept for a bigger ring it has not had yet stays (a newcomer meeting
// the others one by one may hear a sender finish for the whole ring first). Nothing here does I/O
// or reads a clock.
#pragma once

#include <cstddef>
#include <deque>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace eldr {

class handoff_progress {
 public:
  // Rings whose finished hand-offs are kept for a wait that has not started yet.
  static constexpr size_t rings_kept = 8;

  // `sender` finished handing its blocks for the ring of `ring` members. Returns true when this
  // completes the wait under way (nobody left to wait for).
  bool on_done(const std::string& sender, std::vector<std::string> ring);
  // The router reads through the ring of `before` while the ring becomes `ring`: it waits for every
  // member of `before` that has not finished for `ring` yet. Returns true when nobody is left
  // (all finished already).
  bool start(const std::vector<std::string>& before, std::vector<std::string> ring);
  // No wait any more (the bridge ended or was dropped).
  void stop();
  // The router's ring is now `ring`: hand-offs kept for rings it has had, or that do not hold
  // `ring`, are dropped.
  void on_ring(std::vector<std::string> ring);

  bool waiting() const { return active_; }
  // The senders still waited for (empty when not waiting).
  const std::set<std::string>& pending() const { return pending_; }

 private:
  std::set<std::string>& done_for(const std::vector<std::string>& ring);

  std::deque<std::pair<std::vector<std::string>, std::set<std::string>>> done_;
  bool active_ = false;
  std::vector<std::string> target_;
  std::set<std::string> pending_;
  std::vector<std::string> ring_;              // the router's ring (sorted)
  std::deque<std::vector<std::string>> left_;  // rings it had before, the last rings_kept
};

}  // namespace eldr
