// hash_ring: member and key positions, and the clockwise walk that finds a key's owners.
#include "core/membership/hash_ring.hpp"

#include <algorithm>
#include <cassert>
#include <utility>

namespace eldr {
namespace {

constexpr uint64_t golden_gamma = 0x9e3779b97f4a7c15ull;  // 2^64 / phi, splitmix64's increment
// Arbitrary odd constant that keeps a member's name hash away from the key stream (a name whose
// hash happened to equal a block_hash would otherwise start the same splitmix64 sequence).
constexpr uint64_t name_seed = 0x6a09e667f3bcc909ull;

// splitmix64's finaliser (Steele, Lea, Flood 2014): a bijection on 64-bit values with full
// avalanche, so neighbouring inputs (block hashes 0, 1, 2, ...; vnode indices) land at
// independent-looking positions.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A 64-bit hash of a member name: 8-byte little-endian words (assembled byte by byte, so the host's
// byte order does not matter) chained through mix64, then the length, so "a" and "a\0" differ.
uint64_t name_hash(std::string_view name) {
  uint64_t h = name_seed;
  std::size_t i = 0;
  while (i < name.size()) {
    uint64_t word = 0;
    for (std::size_t b = 0; b < 8 && i < name.size(); ++b, ++i)
      word |= uint64_t{static_cast<unsigned char>(name[i])} << (8 * b);
    h = mix64(h ^ word) + golden_gamma;
  }
  return mix64(h ^ (uint64_t{name.size()} * golden_gamma));
}

// Point v of a member: the v-th output of a splitmix64 stream seeded with the name's hash.
uint64_t vnode_position(uint64_t name_hash_value, uint32_t vnode) {
  return mix64(name_hash_value + (uint64_t{vnode} + 1) * golden_gamma);
}

// A key's position: the first output of a splitmix64 stream seeded with the block_hash, so that
// small or clustered block hashes still spread over the whole ring.
uint64_t key_position(uint64_t block_hash) {
  return mix64(block_hash + golden_gamma);
}

}  // namespace

result<hash_ring> hash_ring::make(std::vector<std::string> members, uint32_t vnodes_per_member) {
  if (vnodes_per_member == 0)
    return status::invalid_argument("hash_ring: vnodes_per_member must be >= 1");
  if (members.size() > max_points / vnodes_per_member)
    return status::out_of_range("hash_ring: " + std::to_string(members.size()) + " members x " +
                                std::to_string(vnodes_per_member) + " vnodes exceeds " +
                                std::to_string(max_points) + " points");
  std::sort(members.begin(), members.end());
  for (std::size_t i = 0; i < members.size(); ++i) {
    if (members[i].empty()) return status::invalid_argument("hash_ring: empty member name");
    if (i > 0 && members[i] == members[i - 1])
      return status::invalid_argument("hash_ring: member '" + members[i] + "' appears twice");
  }
  return hash_ring(std::move(members), vnodes_per_member);
}

hash_ring::hash_ring(std::vector<std::string> members, uint32_t vnodes_per_member)
    : members_(std::move(members)), vnodes_per_member_(vnodes_per_member) {
  points_.reserve(members_.size() * vnodes_per_member_);
  for (uint32_t m = 0; m < members_.size(); ++m) {
    const uint64_t h = name_hash(members_[m]);
    for (uint32_t v = 0; v < vnodes_per_member_; ++v)
      points_.push_back({vnode_position(h, v), m});
  }
  std::sort(points_.begin(), points_.end(), [](const point& a, const point& b) {
    return a.position != b.position ? a.position < b.position : a.member < b.member;
  });
}

std::optional<uint32_t> hash_ring::index_of(std::string_view name) const {
  const auto it = std::lower_bound(members_.begin(), members_.end(), name);
  if (it == members_.end() || *it != name) return std::nullopt;
  return static_cast<uint32_t>(it - members_.begin());
}

std::size_t hash_ring::first_point(uint64_t block_hash) const {
  assert(!points_.empty());
  const uint64_t key = key_position(block_hash);
  const auto it = std::lower_bound(points_.begin(), points_.end(), key,
                                   [](const point& p, uint64_t k) { return p.position < k; });
  // Past the largest point the walk wraps to the smallest.
  return it == points_.end() ? 0 : static_cast<std::size_t>(it - points_.begin());
}

std::vector<uint32_t> hash_ring::owners(uint64_t block_hash, std::size_t r) const {
  std::vector<uint32_t> out;
  if (r == 0 || points_.empty()) return out;
  const std::size_t want = std::min(r, members_.size());
  out.reserve(want);
  const std::size_t start = first_point(block_hash);
  // At most one full turn: every member has a point, so a full turn finds all of them. The
  // linear duplicate check is cheap for the small replica counts a cache uses.
  for (std::size_t step = 0; step < points_.size() && out.size() < want; ++step) {
    const uint32_t m = points_[(start + step) % points_.size()].member;
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  }
  return out;
}

std::optional<uint32_t> hash_ring::primary(uint64_t block_hash) const {
  if (points_.empty()) return std::nullopt;
  return points_[first_point(block_hash)].member;
}

bool hash_ring::owns(std::string_view name, uint64_t block_hash, std::size_t r) const {
  const std::optional<uint32_t> m = index_of(name);
  if (!m) return false;
  const std::vector<uint32_t> o = owners(block_hash, r);
  return std::find(o.begin(), o.end(), *m) != o.end();
}

std::optional<std::vector<std::string>> handoff_read_members(const hash_ring* before,
                                                             const hash_ring& after,
                                                             std::string_view me,
                                                             bool just_started) {
  if (after.size() < 2) return std::nullopt;
  const bool was_alone =
      before == nullptr || before->empty() || (before->size() == 1 && before->members()[0] == me);
  if (was_alone) {
    // A node that has served alone a while and meets others is not the newcomer: alone, it
    // missed what they wrote meanwhile (a healed partition), which the new ring's owners have.
    if (!just_started || !after.index_of(me)) return std::nullopt;
    std::vector<std::string> others;
    for (const auto& n : after.members())
      if (n != me) others.push_back(n);
    return others;
  }
  if (before != nullptr && !before->empty() && only_joined(*before, after))
    return before->members();
  return std::nullopt;
}

uint64_t rendezvous_score(std::string_view member, std::string_view item_name,
                          uint64_t item_index) {
  // The item's key, then one mix with the member's hash: member names and items hash apart
  // (name_seed), and neighbouring indices land far apart (mix64).
  const uint64_t item = mix64(name_hash(item_name) + (item_index + 1) * golden_gamma);
  return mix64(name_hash(member) ^ item);
}

bool only_joined(const hash_ring& before, const hash_ring& after) {
  const auto& b = before.members();
  const auto& a = after.members();
  return a.size() > b.size() && std::includes(a.begin(), a.end(), b.begin(), b.end());
}

}  // namespace eldr
