// hash_ring: consistent hashing with virtual nodes, for sharding the signature cache by block_hash
// across the nodes of a cluster.
//
// Each member is placed on a 64-bit ring at vnodes_per_member points derived from its name alone;
// a key (a block_hash) is placed by a strong 64-bit mix of its value, and is owned by the members
// of the first points met walking clockwise (towards larger positions, wrapping at 2^64) from it.
// Because a member's points depend only on its own name, a membership change moves only the keys
// whose walk meets the points added or removed: adding a member moves about 1/(n+1) of the keys,
// all to it; removing one moves only keys it owned.
//
// Every position is computed by a hash fully specified in hash_ring.cpp (no std::hash, no
// platform byte order), so every process of every build that keeps that function agrees on
// ownership. Changing it reshuffles the whole cache: it is part of the cluster's wire contract.
//
// Thread safety: a hash_ring is immutable after make(); const methods may be called concurrently.
// A membership change builds a new ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

class hash_ring {
 public:
  // Largest ring make() accepts, members * vnodes_per_member points (16 bytes each).
  static constexpr std::size_t max_points = std::size_t{1} << 24;

  // A ring over `members` (names, compared byte-wise), each with vnodes_per_member points. The
  // order of `members` does not matter: the ring keeps them sorted. An empty list gives an empty
  // ring, which owns nothing.
  // Errors: a name is empty or appears twice, vnodes_per_member == 0 (invalid_argument); more
  // than max_points points (out_of_range).
  static result<hash_ring> make(std::vector<std::string> members, uint32_t vnodes_per_member);

  // The members in ascending byte-wise order. owners() and primary() return indices into this
  // list; the same member has the same index in any ring built from the same set of names.
  const std::vector<std::string>& members() const { return members_; }
  std::size_t size() const { return members_.size(); }
  bool empty() const { return members_.empty(); }
  uint32_t vnodes_per_member() const { return vnodes_per_member_; }

  // Index of `name` in members(), or nullopt when it is not a member.
  std::optional<uint32_t> index_of(std::string_view name) const;

  // The first min(r, size()) distinct members met walking clockwise from block_hash's position,
  // as indices into members(), nearest first: element 0 is the primary, the next ones the
  // replicas in the order a failover should try them. Empty when r == 0 or the ring is empty.
  std::vector<uint32_t> owners(uint64_t block_hash, std::size_t r) const;
  // owners(block_hash, 1)[0], or nullopt for an empty ring.
  std::optional<uint32_t> primary(uint64_t block_hash) const;
  // True iff `name` is a member and among owners(block_hash, r).
  bool owns(std::string_view name, uint64_t block_hash, std::size_t r) const;

 private:
  struct point {
    uint64_t position = 0;
    uint32_t member = 0;  // index into members_
  };

  hash_ring(std::vector<std::string> members, uint32_t vnodes_per_member);

  // Index into points_ of the first point at or clockwise after the key's position.
  std::size_t first_point(uint64_t block_hash) const;

  std::vector<std::string> members_;  // sorted
  uint32_t vnodes_per_member_ = 1;
  // Sorted by (position, member): ties, as unlikely as they are, break by name, so two rings that
  // share members agree on them too.
  std::vector<point> points_;
};

// True when `after` has every member of `before` and more: nodes joined, none left. Then every
// block's owners on `before` still hold its counts while the newcomers are handed theirs, so a
// router reads through `before` for a while (docs/cluster.md, "Signature cache").
bool only_joined(const hash_ring& before, const hash_ring& after);

// The members of the ring a router reads signature shards through after the ring changed from
// `before` (null: none yet) to `after`, while the blocks are handed to the nodes that joined
// (docs/cluster.md, "Signature cache"); nullopt: read `after` at once.
//  - `before` was at most `me` (this router's node) alone, and it has just started
//    (`just_started`): this node is the newcomer, and the ring before it joined is `after`
//    without it. Not just started: nullopt (alone, it missed what the others wrote meanwhile).
//  - Otherwise nodes joined, none left: `before`'s members, who hold every block.
//  - Otherwise (a member left, nothing changed, or `after` has fewer than two members): nullopt.
std::optional<std::vector<std::string>> handoff_read_members(const hash_ring* before,
                                                             const hash_ring& after,
                                                             std::string_view me,
                                                             bool just_started);

// Rendezvous (highest random weight) hashing by the ring's own fully specified hash: the score
// of `member` for the item (item_name, item_index). Of a set of members the one with the highest
// score takes the item, so every process that knows the same members picks the same one without
// a message, and removing a member moves only the items it had. Part of the wire contract as the
// ring's positions are (core/membership/authority_map.hpp picks a departed load authority's
// successor with it).
uint64_t rendezvous_score(std::string_view member, std::string_view item_name, uint64_t item_index);

}  // namespace eldr
