// authority_map: which node is each decode worker's load authority, as one router knows it, and
// who takes a worker over when its authority leaves the cluster (cluster.load_sharing =
// "authority"; docs/cluster.md, "When an authority leaves").
//
// A worker's authority is the node whose load monitor applies its own load (its reports, its
// scrapes) and publishes it to the other routers (load_exchange.hpp). A node *claims* a worker:
//  - by registration: the worker (or eldr-proxy for a vLLM instance) registered at this node;
//  - by succession: the authority left the live members, and this node is the survivor with the
//    highest rendezvous score for (model, worker) (hash_ring.hpp) among the live routers. Every
//    router that sees the same members computes the same successor without a message, and a
//    departed node's workers spread over the survivors.
//
// Claims are ordered, so two nodes that both claim a worker (a partition healed, two proxies
// registered it at two nodes, a registration after a succession) settle on one without a
// round of messages: a claim carries a *generation*; a registration claims one above every
// generation this node has seen for the worker, a succession keeps the departed claim's. The
// higher generation wins, then a registration over a succession (a node that only *thinks* the
// authority left -- a one-sided partition -- does not take the worker from it), then the higher
// rendezvous score, then the greater name. A node that sees a vector with a claim that beats its
// own gives the worker up (yield); a router follows the best claim it has seen, so deltas go
// where the winner is.
//
// Nothing here does I/O; one owner; O(log W) per call except on_members (O(W)).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace eldr {

struct authority_claim {
  std::string node;
  uint64_t generation = 0;
  bool registered = false;  // by registration, not by succession
};

// A claim's generation and kind as one number for the load vector (generation * 2 + registered);
// decode_claim is its inverse (the node's name travels beside it).
uint64_t encode_claim(const authority_claim& c);
authority_claim decode_claim(std::string node, uint64_t encoded);

// Whether claim `a` beats claim `b` for worker `worker` of `model` (the order above). A claim never
// beats itself.
bool claim_beats(const authority_claim& a, const authority_claim& b, std::string_view model,
                 uint32_t worker);

// The router that takes over `worker` of `model` from a departed authority: the highest
// rendezvous score among `routers` (ties by the greater name). nullopt when `routers` is empty.
std::optional<std::string> successor_authority(const std::vector<std::string>& routers,
                                               std::string_view model, uint32_t worker);

class authority_map {
 public:
  authority_map() = default;
  // self: this router's node name; model: the model the workers belong to.
  authority_map(std::string self, std::string model);

  // This node registered the worker: it claims it at one generation above any it has seen.
  // Returns the claim.
  const authority_claim& on_registered(uint32_t worker);

  // What a vector's claim means to this node.
  enum class verdict : uint8_t {
    follow,     // the claim is (now) the worker's authority here
    keep_mine,  // this node's own claim beats it: the other node will yield
    ignore,     // another node's claim beats it: that one is followed
    yield,      // it beats this node's own claim: give the worker up
  };
  // A vector from `claim.node` lists the worker with this claim.
  verdict on_claim(uint32_t worker, const authority_claim& claim);

  // A worker handed to another node than its authority by on_members.
  struct succession {
    uint32_t worker = 0;
    std::string from;  // the departed authority
    std::string to;    // its successor (this node's name when it takes the worker over)
  };
  // The live routers are now `peers` (the other members with a router; this node is always
  // live): every worker whose authority is not among them goes to its successor, at the same
  // generation, as a succession. Returns those moves, ascending by worker.
  std::vector<succession> on_members(const std::vector<std::string>& peers);

  // The worker's authority and its claim, when known.
  const authority_claim* claim(uint32_t worker) const;
  bool mine(uint32_t worker) const;
  // Forgets the worker (its slot was removed from the pool).
  void erase(uint32_t worker);
  // Every known worker's claim, by worker.
  const std::map<uint32_t, authority_claim>& claims() const { return claims_; }
  // Changes whenever a worker gets an authority node, another one, or none: the router's deltas
  // then go to new places (delta_outbox::resend_all).
  uint64_t nodes_version() const { return nodes_version_; }

 private:
  std::string self_;
  std::string model_;
  std::map<uint32_t, authority_claim> claims_;
  uint64_t nodes_version_ = 0;
};

}  // namespace eldr
