// centroid_history: the changes that made a model's centroid set current, newest last -- what
// `eldrctl centroids rollback` undoes.
//
// Epoch numbers say when a set was stored, not which set was in use before the current one: after
// `swap 1` from epoch 2, "the epoch below the current" is nothing, yet the operator's last change
// (2 -> 1) is what a rollback should undo. So each router keeps the sequence of installs itself:
// every install (an import, a refit, a swap, a set adopted from a peer) is recorded, and a
// rollback returns to the set the newest change replaced.
//
// A rollback is recognised by its cause and checked by content (a digest of the set without its
// epoch number), because a cluster renumbers: there the refit leader re-publishes the older set as
// a new epoch (epochs only go up, or the routers' fences would refuse it), announces it with its
// cause, and every router records it alike: a rollback to the set the newest change replaced
// removes that change, and the entry below takes the new epoch number. A swap is a change like an
// import: after `swap 1` from 2, a rollback goes back to 2.
//
// Plain data: no I/O, no clock (the owner passes times in), no thread safety (one owner).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>

#include "core/base/status.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr {

// One install that made a set current.
struct centroid_change {
  uint64_t epoch = 0;   // the epoch number the set was installed as (where the store keeps it)
  uint64_t digest = 0;  // content_digest of the set
  std::string cause;    // "import", "refit", "swap", "rollback", "peer", "start", ...
  int64_t at_ms = 0;    // the owner's clock when it was installed
};

// A 64-bit digest of a set's content: everything but its epoch number. Not cryptographic: it tells
// sets of one model apart, which a collision among a handful of stored sets could not fool in
// practice (FNV-1a over the encoded file).
uint64_t content_digest(const centroid_file& file);

class centroid_history {
 public:
  static constexpr size_t default_capacity = 32;

  explicit centroid_history(size_t capacity = default_capacity);

  // Records an install. A "rollback" whose set is the one current before the newest change undoes
  // that change instead (see the file comment; a rollback that matches nothing -- this router's
  // history diverged -- is recorded as a change); an install that repeats the newest entry (same
  // epoch and content: a restart installing what was current) changes nothing. Beyond the capacity
  // the oldest change is forgotten. Returns true when the record was an undo.
  bool record(centroid_change change);

  // The change a rollback returns to: the one before the newest. not_found (saying why) when there
  // is none.
  result<centroid_change> previous() const;

  // Oldest first; the last one is current.
  const std::deque<centroid_change>& changes() const { return changes_; }
  bool empty() const { return changes_.empty(); }

  // Text, one change per line after a header (persisted by the router, docs/node.md "Hot swap"):
  //   eldr-centroid-history 1
  //   <epoch> <digest, 16 hex digits> <at_ms> <cause>
  // parse refuses anything else, naming the line.
  std::string encode() const;
  static result<centroid_history> parse(std::string_view text, size_t capacity = default_capacity);

 private:
  size_t capacity_;
  std::deque<centroid_change> changes_;
};

}  // namespace eldr
