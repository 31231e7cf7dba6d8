// cluster_actor: see cluster_actor.hpp.
#include "actors/cluster/cluster_actor.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/http/metrics_http.hpp"
#include "cluster/security/hmac.hpp"
#include "core/base/file_io.hpp"
#include "core/membership/leadership.hpp"

namespace eldr {

// --- cluster_protocol.hpp's non-template parts ---

void register_cluster_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<member_info>("eldr::member_info");
  cfg.add_message_type<join_challenge>("eldr::join_challenge");
  cfg.add_message_type<join_welcome>("eldr::join_welcome");
  cfg.add_message_type<shared_decision>("eldr::shared_decision");
  cfg.add_message_type<worker_row>("eldr::worker_row");
  cfg.add_message_type<pool_snapshot>("eldr::pool_snapshot");
  cfg.add_message_type<sample_reply>("eldr::sample_reply");
  cfg.add_message_type<shard_sign_request>("eldr::shard_sign_request");
  cfg.add_message_type<shard_sign_reply>("eldr::shard_sign_reply");
  cfg.add_message_type<handoff_block>("eldr::handoff_block");
  cfg.add_message_type<load_delta_msg>("eldr::load_delta_msg");
  cfg.add_message_type<load_vector_msg>("eldr::load_vector_msg");
  // Raw bytes (encoded worker messages and centroid files).
  cfg.add_message_type<std::vector<uint8_t>>("std::vector<uint8_t>");
}

void cluster_trust::add(const caf::node_id& n) {
  std::unique_lock lock(mu_);
  nodes_.insert(n);
}
void cluster_trust::remove(const caf::node_id& n) {
  std::unique_lock lock(mu_);
  nodes_.erase(n);
}
bool cluster_trust::contains(const caf::node_id& n) const {
  std::shared_lock lock(mu_);
  return nodes_.count(n) > 0;
}

bool trusted_sender(caf::local_actor* self, const cluster_trust* trust) {
  const auto& sender = self->current_sender();
  if (!sender) return false;
  if (sender->node() == self->node()) return true;
  return trust != nullptr && trust->contains(sender->node());
}

bool local_sender(caf::local_actor* self) {
  const auto& sender = self->current_sender();
  return sender && sender->node() == self->node();
}

bool accept_member_list(caf::local_actor* self, node_metrics& metrics, uint64_t* dropped) {
  if (local_sender(self)) return true;
  metrics.cluster_event("untrusted");
  if (dropped != nullptr) ++*dropped;
  return false;
}

result<vote_record> read_vote_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return vote_record{};
  auto bytes = read_file(path, 4096);
  if (!bytes.ok()) return bytes.error();
  const std::string text(bytes->begin(), bytes->end());
  // "eldr-vote 1 <term> <candidate>\n"
  std::istringstream in(text);
  std::string magic, candidate;
  uint32_t version = 0;
  uint64_t term = 0;
  if (!(in >> magic >> version >> term >> candidate) || magic != "eldr-vote" || version != 1 ||
      term == 0)
    return status::corrupt(path + ": not an eldr vote record (\"eldr-vote 1 TERM NAME\"); it " +
                           "keeps this node from voting twice in one refit-leadership term, so " +
                           "it is not ignored: restore it, or delete it only while the node is " +
                           "out of the cluster for longer than an election");
  return vote_record{term, candidate};
}

status write_vote_file(const std::string& path, const vote_record& v) {
  std::error_code ec;
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  const std::string text = "eldr-vote 1 " + std::to_string(v.term) + " " + v.candidate + "\n";
  return write_file_atomic(
      path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

result<std::string> read_cluster_secret(const std::string& path) {
  auto bytes = read_file(path, 1u << 16);
  if (!bytes.ok())
    return status(bytes.error().code(), "cluster.secret_file: " + bytes.error().message());
  std::string secret(bytes->begin(), bytes->end());
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r'))
    secret.pop_back();
  if (secret.size() < 16)
    return status::invalid_argument("cluster.secret_file: " + path + " holds " +
                                    std::to_string(secret.size()) +
                                    " bytes; the secret must be at least 16 bytes");
  return secret;
}

namespace {

constexpr size_t max_pending_challenges = 1024;

// 16 bytes from OpenSSL's CSPRNG, hex; "" (logged) when the generator fails, which refuses the
// handshake: a predictable nonce would let a recorded proof be replayed.
std::string random_nonce() {
  auto bytes = random_bytes(16);
  if (!bytes.ok()) {
    spdlog::error("cluster: no nonce for the join handshake: {}", bytes.error().message());
    return {};
  }
  return to_hex(*bytes);
}

// The proofs of the handshake: each side MACs both nonces and its own name under the secret,
// with a different label, so one side's proof can never be replayed as the other's.
std::string proof(const std::string& secret, std::string_view label, const std::string& first,
                  const std::string& second, const std::string& name) {
  std::string message(label);
  for (const auto* part : {&first, &second, &name}) {
    message += '\0';
    message += *part;
  }
  return to_hex(hmac_sha256(secret, message));
}

bool same_proof(const std::string& a, const std::string& b) {
  const auto bytes = [](const std::string& s) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  };
  return equal_constant_time(bytes(a), bytes(b));
}

struct peer {
  member_info info;
  caf::node_id node;
  bool alive = false;
  int64_t since_ms = 0;
};

struct challenge {
  std::string joiner;
  std::string joiner_nonce;
  int64_t created_ms = 0;
};

struct cluster_state {
  node_context_ptr ctx;
  std::string secret;
  caf::io::middleman_actor mm;
  member_info self;
  std::vector<caf::actor> watchers;
  std::vector<std::string> seeds;
  std::map<std::string, peer> peers;            // by name
  std::map<std::string, challenge> challenges;  // gate side, by gate nonce
  std::set<std::string> dialling;               // addresses with a handshake under way
  uint64_t joins = 0, downs = 0, refused = 0, dial_failures = 0, untrusted = 0, collisions = 0;
  uint64_t redials = 0;                   // rounds of redial() (every reconnect_ms)
  uint64_t hellos_answered = 0;           // gate side: challenges issued (a handshake begun here)
  uint64_t refused_protocol = 0;          // handshakes of either side with another protocol
  std::set<std::string> protocol_logged;  // addresses whose protocol refusal was logged as error
  vote_box votes;
  std::string vote_file;
  uint64_t votes_granted = 0, votes_refused = 0;
};

using cluster_actor_t = caf::stateful_actor<cluster_state>;

std::vector<member_info> live_members(const cluster_state& st) {
  std::vector<member_info> out;
  for (const auto& [name, p] : st.peers)
    if (p.alive) out.push_back(p.info);
  return out;
}

// Every member this node has known, alive or not, itself included: the cluster size a majority
// is counted against (refit leadership).
// The seed list counts too: a node that has not reached its seeds yet must not think itself a
// majority of one (it would lead refits alone and publish epochs the others never agreed to).
uint32_t known_members(const cluster_state& st) {
  std::set<std::string> addresses(st.seeds.begin(), st.seeds.end());
  addresses.insert(st.self.address);
  return static_cast<uint32_t>(std::max(st.peers.size() + 1, addresses.size()));
}

void tell_watchers(cluster_actor_t* self) {
  auto members = live_members(self->state);
  self->state.ctx->metrics->cluster_members(static_cast<uint32_t>(members.size() + 1));
  // /readyz: membership is formed once this node sees a majority of the members it knows (the
  // condition refit leadership needs, core/membership/leadership.hpp).
  if (const auto& board = self->state.ctx->readiness) {
    const uint32_t known = known_members(self->state);
    const auto seen = static_cast<uint32_t>(members.size() + 1);
    board->set_cluster(2 * seen > known, "sees " + std::to_string(seen) + " of " +
                                             std::to_string(known) +
                                             " known members; a majority is needed");
  }
  for (const auto& w : self->state.watchers)
    self->send(w, members_atom::value, members, known_members(self->state));
}

// Records a peer that proved the secret. Returns false when the name belongs to another live
// node (two nodes configured with one name).
bool admit(cluster_actor_t* self, const member_info& info, const caf::node_id& node) {
  auto& st = self->state;
  if (info.name == st.self.name) return false;
  auto it = st.peers.find(info.name);
  if (it != st.peers.end() && it->second.alive) {
    if (it->second.info.incarnation == info.incarnation) return true;  // both dialled: no change
    if (it->second.node != node) {
      // A restart we have not noticed yet (its old connection still looks alive) has a higher
      // incarnation; anything else is a second node with the same name.
      if (info.incarnation < it->second.info.incarnation) return false;
      st.ctx->trust->remove(it->second.node);
    }
  }
  peer& p = st.peers[info.name];
  p.info = info;
  p.node = node;
  p.alive = true;
  p.since_ms = st.ctx->now_ms();
  st.ctx->trust->add(node);
  self->monitor(info.cluster);
  ++st.joins;
  st.ctx->metrics->cluster_event("join");
  spdlog::info("cluster: {} ({}) joined with roles [{}]", info.name, info.address,
               fmt::join(info.roles, ", "));
  tell_watchers(self);
  return true;
}

void mark_down(cluster_actor_t* self, const caf::actor_addr& who, const caf::error& why) {
  auto& st = self->state;
  for (auto& [name, p] : st.peers) {
    if (!p.alive || p.info.cluster.address() != who) continue;
    p.alive = false;
    p.since_ms = st.ctx->now_ms();
    st.ctx->trust->remove(p.node);
    ++st.downs;
    st.ctx->metrics->cluster_event("down");
    spdlog::warn("cluster: {} ({}) is gone: {}", name, p.info.address, self->system().render(why));
    tell_watchers(self);
    return;
  }
}

// A handshake with a node of another cluster protocol (cluster_protocol.hpp), either side: counted
// every time, logged as an error once per address (seeds are dialled again every reconnect_ms).
void protocol_refused(cluster_actor_t* self, const std::string& who, const std::string& why) {
  auto& st = self->state;
  ++st.refused_protocol;
  st.ctx->metrics->cluster_event("protocol");
  if (st.protocol_logged.size() < 1024 && st.protocol_logged.insert(who).second)
    spdlog::error(
        "cluster: {} speaks another cluster protocol than this node's {} ({}); nodes of different "
        "protocols do not form one cluster: run one eldr build across it (docs/cluster.md, "
        "\"Upgrades\")",
        who, cluster_protocol_version, why);
  else
    spdlog::debug("cluster: {} speaks another cluster protocol: {}", who, why);
}

// Runs the joiner's side of the handshake against the gate published at `address`.
void dial(cluster_actor_t* self, const std::string& address) {
  auto& st = self->state;
  if (address == st.self.address || st.dialling.count(address)) return;
  auto hp = parse_host_port(address);
  if (!hp.ok()) return;
  st.dialling.insert(address);
  auto done = [self, address] { self->state.dialling.erase(address); };
  auto fail = [self, address, done](const std::string& why) {
    ++self->state.dial_failures;
    spdlog::debug("cluster: joining through {} failed: {}", address, why);
    done();
  };
  // Each step of the dial (connect, hello, join) waits timeouts.dial_ms.
  const auto dial_timeout = std::chrono::milliseconds(st.ctx->config.timeouts.dial_ms);
  self->request(st.mm, dial_timeout, caf::connect_atom::value, hp->host, hp->port)
      .then(
          [=](const caf::node_id& nid, caf::strong_actor_ptr& gate_ptr,
              const std::set<std::string>&) {
            auto& s = self->state;
            if (!gate_ptr) return fail("nothing is published there");
            if (gate_ptr == self->ctrl()) return done();  // a seed that is this node
            if (nid == self->node()) {
              // Our own node id at another address: two processes hash to one CAF node id
              // (containers sharing MACs and PIDs). Neither could route to the other.
              ++s.collisions;
              spdlog::error(
                  "cluster: the node at {} has this node's CAF node id; CAF 0.17 derives it from "
                  "the MAC addresses, /etc/fstab's root UUID and the PID -- give each container "
                  "its own /etc/fstab UUID (deploy/docker/entrypoint.sh does)",
                  address);
              return done();
            }
            auto gate = caf::actor_cast<caf::actor>(gate_ptr);
            const std::string nonce = random_nonce();
            if (nonce.empty()) return done();
            self->request(gate, dial_timeout, hello_atom::value, s.self.name, nonce,
                          cluster_protocol_version)
                .then(
                    [=](const join_challenge& c) {
                      auto& s2 = self->state;
                      const auto expected = proof(s2.secret, "gate", nonce, c.gate_nonce, c.gate);
                      if (!same_proof(expected, c.gate_proof)) {
                        ++s2.refused;
                        spdlog::warn("cluster: {} does not know the cluster secret; not joining",
                                     address);
                        return done();
                      }
                      // The gate proved the secret: trust its node now, because its first
                      // messages (pool snapshots, leader terms) may overtake its welcome.
                      s2.ctx->trust->add(nid);
                      const auto mine = proof(s2.secret, "join", c.gate_nonce, nonce, s2.self.name);
                      self->request(gate, dial_timeout, join_atom::value, c.gate_nonce, mine,
                                    s2.self)
                          .then(
                              [=](const join_welcome& w) {
                                done();
                                if (!admit(self, w.gate, nid)) {
                                  self->state.ctx->trust->remove(nid);
                                  spdlog::error(
                                      "cluster: {} at {} has this node's name or is "
                                      "an older incarnation of a live member",
                                      w.gate.name, address);
                                  return;
                                }
                                for (const auto& m : w.members)
                                  if (m.name != self->state.self.name &&
                                      !(self->state.peers.count(m.name) &&
                                        self->state.peers[m.name].alive))
                                    dial(self, m.address);
                              },
                              [=](const caf::error& e) {
                                // Refused: no trust for a node that is not a member.
                                if (!self->state.peers.count(c.gate) ||
                                    !self->state.peers[c.gate].alive)
                                  self->state.ctx->trust->remove(nid);
                                fail(self->system().render(e));
                              });
                    },
                    [=](const caf::error& e) {
                      // A gate of another protocol: ours refuses with incompatible_versions, a
                      // build before versioned hellos has no handler for this one.
                      if (e == caf::sec::incompatible_versions || e == caf::sec::unexpected_message)
                        protocol_refused(self, address, self->system().render(e));
                      fail(self->system().render(e));
                    });
          },
          [=](const caf::error& e) { fail(self->system().render(e)); });
}

void redial(cluster_actor_t* self) {
  auto& st = self->state;
  ++st.redials;
  // A seed that is a live peer's address is not dialled again: the handshake (three requests,
  // two proofs) would change nothing (admit: "both dialled"), and every node of a healthy
  // cluster paid it for every seed twice a second. A restarted seed dials its own seeds.
  std::set<std::string> live;
  for (const auto& [name, p] : st.peers)
    if (p.alive) live.insert(p.info.address);
  for (const auto& s : st.seeds)
    if (!live.count(s)) dial(self, s);
  for (const auto& [name, p] : st.peers)
    if (!p.alive) dial(self, p.info.address);
  // Forget challenges nobody answered (a stranger, or a joiner that died mid-handshake).
  const int64_t now = st.ctx->now_ms();
  for (auto it = st.challenges.begin(); it != st.challenges.end();)
    it = now - it->second.created_ms > st.ctx->config.timeouts.challenge_ttl_ms
             ? st.challenges.erase(it)
             : std::next(it);
  self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.cluster.reconnect_ms),
                     dial_atom::value);
}

nlohmann::json status_json(const cluster_state& st) {
  nlohmann::json members = nlohmann::json::array();
  const int64_t now = st.ctx->now_ms();
  members.push_back({{"name", st.self.name},
                     {"address", st.self.address},
                     {"roles", st.self.roles},
                     {"alive", true},
                     {"self", true}});
  for (const auto& [name, p] : st.peers)
    members.push_back({{"name", name},
                       {"address", p.info.address},
                       {"roles", p.info.roles},
                       {"alive", p.alive},
                       {"self", false},
                       {"since_ms_ago", now - p.since_ms}});
  return {{"name", st.self.name},
          {"address", st.self.address},
          {"members", members},
          {"joins", st.joins},
          {"downs", st.downs},
          {"refused", st.refused},
          {"protocol", cluster_protocol_version},
          {"refused_protocol", st.refused_protocol},
          {"untrusted_messages", st.untrusted},
          {"dial_failures", st.dial_failures},
          {"redials", st.redials},
          {"hellos_answered", st.hellos_answered},
          {"node_id_collisions", st.collisions},
          {"vote",
           {{"term", st.votes.voted_term()},
            {"for", st.votes.voted_for()},
            {"granted", st.votes_granted},
            {"refused", st.votes_refused}}}};
}

caf::behavior cluster_behavior(cluster_actor_t* self, node_context_ptr ctx, cluster_setup setup) {
  auto& st = self->state;
  std::shared_ptr<const std::string> address = setup.address;
  st.ctx = ctx;
  st.secret = std::move(setup.secret);
  st.mm = std::move(setup.mm);
  st.self = std::move(setup.self);
  st.self.cluster = caf::actor_cast<caf::actor>(self);
  st.watchers = std::move(setup.watchers);
  st.votes = vote_box(setup.voted_term, setup.voted_for);
  st.vote_file = setup.vote_file;
  st.seeds = ctx->config.cluster.seeds;
  self->set_down_handler([self](caf::down_msg& m) { mark_down(self, m.source, m.reason); });
  self->set_default_handler(
      [self](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
        spdlog::warn("cluster: unexpected message {} from {}", caf::to_string(x.content()),
                     self->current_sender() ? caf::to_string(self->current_sender()->node()) : "?");
        return caf::sec::unexpected_message;
      });
  self->set_exit_handler([self](caf::exit_msg& m) {
    // Leaving on purpose: tell the peers, so they stop routing to us now rather than after a
    // connection timeout.
    for (const auto& [name, p] : self->state.peers)
      if (p.alive) self->send(p.info.cluster, leave_atom::value, self->state.self.name);
    self->quit(m.reason);
  });
  return {
      // The first dial_atom comes from the node once the gate is published and *address holds
      // what peers dial; later ones are our own timer. Anything else is ignored: a message
      // from the network could be anonymous, and must not multiply the timers.
      [=](dial_atom) {
        auto& s = self->state;
        if (s.self.address.empty()) {
          if (!address || address->empty()) return;
          s.self.address = *address;
          // The watchers hear the (empty) membership once now: a node alone, whose seeds are
          // itself or unreachable, still evaluates refit leadership (a cluster of one leads).
          tell_watchers(self);
          return redial(self);
        }
        if (self->current_sender() == self->ctrl()) redial(self);
      },
      // Gate side, step 1: anyone may ask; the answer proves we know the secret. Only a joiner of
      // this node's cluster protocol is answered.
      [=](hello_atom, const std::string& joiner, const std::string& joiner_nonce,
          uint32_t protocol) -> caf::result<join_challenge> {
        auto& s = self->state;
        if (joiner.size() > 256 || joiner_nonce.size() > 128) return caf::sec::invalid_argument;
        if (protocol != cluster_protocol_version) {
          const std::string why = "it speaks cluster protocol " + std::to_string(protocol) +
                                  ", this node " + std::to_string(cluster_protocol_version);
          protocol_refused(self, "a joiner named '" + joiner + "'", why);
          return caf::make_error(caf::sec::incompatible_versions, why);
        }
        if (s.challenges.size() >= max_pending_challenges) return caf::sec::request_timeout;
        join_challenge c;
        c.gate = s.self.name;
        c.gate_nonce = random_nonce();
        if (c.gate_nonce.empty()) return caf::sec::runtime_error;
        c.gate_proof = proof(s.secret, "gate", joiner_nonce, c.gate_nonce, s.self.name);
        s.challenges[c.gate_nonce] = challenge{joiner, joiner_nonce, s.ctx->now_ms()};
        ++s.hellos_answered;
        return c;
      },
      // A hello without a protocol: a build from before versioned hellos (2026-12-05).
      [=](hello_atom, const std::string& joiner,
          const std::string&) -> caf::result<join_challenge> {
        const std::string why = "it sent no cluster protocol (an eldr build before 2026-12-05)";
        protocol_refused(self, "a joiner named '" + joiner.substr(0, 256) + "'", why);
        return caf::make_error(caf::sec::incompatible_versions, why);
      },
      // Gate side, step 2: the joiner's proof, then its handles.
      [=](join_atom, const std::string& gate_nonce, const std::string& joiner_proof,
          const member_info& joiner) -> caf::result<join_welcome> {
        auto& s = self->state;
        auto it = s.challenges.find(gate_nonce);
        const auto& sender = self->current_sender();
        if (it == s.challenges.end() || !sender || it->second.joiner != joiner.name ||
            !same_proof(proof(s.secret, "join", gate_nonce, it->second.joiner_nonce, joiner.name),
                        joiner_proof)) {
          if (it != s.challenges.end()) s.challenges.erase(it);
          ++s.refused;
          s.ctx->metrics->cluster_event("refused");
          spdlog::warn("cluster: refused a join as '{}': wrong or replayed proof", joiner.name);
          return caf::make_error(caf::sec::remote_linking_failed, "cluster secret mismatch");
        }
        s.challenges.erase(it);
        if (!admit(self, joiner, sender->node())) {
          ++s.refused;
          return caf::make_error(caf::sec::remote_linking_failed,
                                 "name '" + joiner.name + "' is in use by a live member");
        }
        return join_welcome{s.self, live_members(s)};
      },
      [=](leave_atom, const std::string& name) {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) return void(++s.untrusted);
        auto it = s.peers.find(name);
        if (it == s.peers.end() || !it->second.alive) return;
        mark_down(self, it->second.info.cluster.address(),
                  caf::make_error(caf::exit_reason::user_shutdown));
      },
      // A refit-leadership candidate (any member, this node's own refit actor included) asks
      // for this node's vote. A granted vote is on disk before it is answered. The answer also
      // carries the newest term this node has voted in, so that a refused candidate (a node
      // back from a restart, say) campaigns above it next time instead of climbing term by term.
      [=](vote_atom, const std::string& candidate, uint64_t term) -> caf::result<bool, uint64_t> {
        auto& s = self->state;
        if (!trusted_sender(self, s.ctx->trust.get())) {
          ++s.untrusted;
          return caf::sec::request_receiver_down;
        }
        const vote_box before = s.votes;
        bool yes = candidate.size() <= 256 && s.votes.request(candidate, term);
        if (yes && !s.vote_file.empty() && s.votes.voted_term() != before.voted_term()) {
          if (auto w = write_vote_file(s.vote_file, {term, candidate}); !w.ok()) {
            spdlog::error("cluster: cannot record a vote, refusing it: {}", w.to_string());
            s.votes = before;
            yes = false;
          }
        }
        ++(yes ? s.votes_granted : s.votes_refused);
        spdlog::debug("cluster: vote for {} in term {}: {}", candidate, term, yes ? "yes" : "no");
        return caf::result<bool, uint64_t>(yes, s.votes.voted_term());
      },
      // The admin's part of `status`: membership as JSON text. This actor is published, so
      // anyone who reaches the port can ask: only this node's own actors get an answer.
      [=](admin_atom) -> caf::result<std::string> {
        if (!local_sender(self)) {
          ++self->state.untrusted;
          return caf::sec::request_receiver_down;
        }
        return status_json(self->state).dump();
      },
  };
}

}  // namespace

caf::actor spawn_cluster(caf::actor_system& sys, node_context_ptr ctx, cluster_setup setup) {
  return sys.spawn(cluster_behavior, std::move(ctx), std::move(setup));
}

}  // namespace eldr
