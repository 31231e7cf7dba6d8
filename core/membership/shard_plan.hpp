// shard_plan: how a router gathers one request's signature from the signature-cache shards
// (docs/cluster.md) -- which owner of each block sums it, and how partial sums kept over
// different sets of layers add up.
//
// A block may be summed by any of its owners (each holds a copy of its counts). The router wants
// the cheapest set of messages: its own node's shard costs no network round trip, so every block
// this node owns is summed here; the other blocks go to as few distinct nodes as possible, since
// a decision waits for the slowest of them and every extra node is one more request and reply.
// Choosing a minimum set of nodes is set cover; the greedy choice (the node that covers most of
// the blocks still open, again and again) is within a log factor of it and exact in the common
// cases (R = 2 of 3 nodes: every block not owned here has the same two owners).
//
// Pure and deterministic: the same inputs give the same plan in every process.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <vector>

namespace eldr {

// chosen[i] when every owner of block i is excluded: nobody can sum it.
inline constexpr uint32_t no_signer = std::numeric_limits<uint32_t>::max();

// For each block, the owner that sums it. `owners[i]` lists block i's owners (member indices,
// e.g. hash_ring::owners, nearest first); `local` is this node's member index when it holds a
// live shard; `excluded` lists members not to ask (they failed for these blocks already).
//
// Rules: a block whose owners include `local` (not excluded) is summed locally. The others are
// covered greedily: the candidate owning the most open blocks takes all of them; ties go to the
// candidate that is the nearest (primary) owner of more of them, then to the smaller index. A
// block whose owners are all excluded gets no_signer.
std::vector<uint32_t> choose_signers(const std::vector<std::vector<uint32_t>>& owners,
                                     std::optional<uint32_t> local,
                                     const std::vector<uint32_t>& excluded);

// Layer-major partial sums: a sum over `layers` (ascending) holds |layers| * experts counts, row
// i for layer layers[i]. Adds the rows of `from` whose layer is also in `to_layers` into `to`;
// layers of `to_layers` that `from` lacks (a store that does not keep them) are left alone.
// Returns false, adding nothing, when a span's size does not match its layers.
bool add_common_layers(const std::vector<uint32_t>& from_layers, std::span<const uint32_t> from,
                       const std::vector<uint32_t>& to_layers, uint32_t experts,
                       std::span<uint32_t> to);

// The layers of `wanted` that `kept` also has (both ascending): what a shard keeping `kept` can
// answer for a router whose spec sums `wanted`.
std::vector<uint32_t> common_layers(const std::vector<uint32_t>& kept,
                                    const std::vector<uint32_t>& wanted);

// Partial sums on the wire (actors/cluster/cluster_protocol.hpp's shard_sign_reply): little-endian
// values of `value_bytes` bytes each -- 2 when every value fits in 16 bits, else 4 -- packed in a
// byte vector, because CAF 0.17 serializes a std::vector<uint8_t> with one copy but any other
// vector value by value (measured on this project's machine: 3,968 uint32 values, one reply over
// 31 layers of 128 experts, took ~70 us to serialize and ~70 us to deserialize; as bytes ~5 us
// and ~1 us). Part of the cluster's wire contract.
//
// Packs `values` into `out` (replacing its contents); returns the value size chosen.
uint8_t pack_sums(std::span<const uint32_t> values, std::vector<uint8_t>& out);
// Unpacks into `out` (resized to the number of values). False, `out` unspecified: value_bytes is
// not 2 or 4, or bytes.size() is not a multiple of it.
bool unpack_sums(std::span<const uint8_t> bytes, uint8_t value_bytes, std::vector<uint32_t>& out);

}  // namespace eldr
