// load_exchange: how routers of a cluster share decode load without sending each other every
// decision (docs/cluster.md, "Scaling out"; issue 14), with cluster.load_sharing = "authority".
//
// Every decode worker has one *authority* (the node its worker connection reaches), which alone
// applies the worker's own messages: its load reports and its finished events. Routers do not send
// decisions; each router keeps a decision_ledger per model -- a cumulative count of its decisions
// per worker, which only grows -- and every interval sends each authority its totals for that
// authority's workers, numbered by a per-(router, authority) sequence. Because the totals are
// cumulative, a lost or reordered message costs nothing once a later one arrives. Only the totals
// that changed since the newest delta the authority has applied travel (delta_outbox), so an
// interval costs a router what it routed, not its W workers.
//
// The authority (load_authority) keeps, per worker, a base -- the worker's in_flight at its last
// report -- and, per router, the total it had seen when that base was taken (its anchor):
//
//   in_flight(w) = max(0, base(w) + sum_r (total_r(w) - anchor_r(w)) - finished since the report)
//
// and publishes one load_vector per interval: every worker's in_flight and liveness, and for each
// router the last sequence it included. A router's load for a worker is the published value plus
// its own decisions the vector does not include yet (load_overlay): exact for its own decisions
// at once, for its peers' within one interval.
//
// A router that restarts starts its totals again from 0 under a new incarnation: the authority
// folds the old incarnation's contribution into the base (those requests are still running) and
// anchors the new one at 0. A router the authority first hears of after a worker's report (an
// authority that took over) is anchored at its first totals for that worker; before any report,
// at 0. Drift from lost finished events or a router that died is corrected by
// the worker's next report, as in a single node's load_view.
//
// An authority that restarts (faster than the membership notices) publishes under a new
// incarnation: each router takes its vectors at once and sends it every total again
// (load_overlay::on_vector, delta_outbox::resend_all), marked `resync`, so that it anchors the
// router at them, as after a report.
//
// Nothing here does I/O or reads a clock (times are passed in). Thread safety: none; one owner.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// A router's cumulative decisions per worker of one model, and which workers it routed to since
// the owner last asked (what the next deltas must carry).
class decision_ledger {
 public:
  explicit decision_ledger(uint32_t workers = 0) : totals_(workers, 0), routed_flag_(workers, 0) {}
  // Grows (never shrinks: a total, once sent, must stay the same worker's).
  void resize(uint32_t workers);
  // Error: worker out of range.
  status on_route(uint32_t worker);
  uint64_t total(uint32_t worker) const { return worker < totals_.size() ? totals_[worker] : 0; }
  std::span<const uint64_t> totals() const { return totals_; }
  // The workers routed to since the last call, each once, in the order first routed to.
  std::vector<uint32_t> take_routed();

 private:
  std::vector<uint64_t> totals_;
  std::vector<uint8_t> routed_flag_;  // 1: in routed_
  std::vector<uint32_t> routed_;
};

// What a router sends an authority every interval.
struct load_delta {
  std::string router;        // the router's node name
  uint64_t incarnation = 0;  // changes when the router restarts (its totals start again at 0)
  uint64_t seq = 0;          // per (router, authority), increasing from 1
  // (worker, cumulative total) for the authority's workers this router has routed to.
  std::vector<std::pair<uint32_t, uint64_t>> totals;
  // Sent to an authority that restarted: these totals count decisions made before it started,
  // which its workers' reports count (or will), so it anchors this router at them -- before a
  // worker's first report too -- rather than counting every decision this router ever made.
  bool resync = false;
};

struct load_vector_entry {
  uint32_t worker = 0;
  uint32_t in_flight = 0;
  bool alive = false;  // reported within the authority's report timeout
  // The authority's claim on the worker (authority_map.hpp's encode_claim); the owner fills it in.
  uint64_t claim = 0;
  // Whether the authority anchors a router it has no delta from at that router's first total
  // for the worker (the worker reported, or was adopted: those decisions are its base's), or
  // counts every decision from 0 (no report yet). A router composing a vector that includes none
  // of its deltas yet needs to know which (load_overlay).
  bool anchors = false;
};

// A router's newest delta an authority has applied, and which incarnation of the router sent it
// (a restarted router numbers its deltas from 1 again: an old incarnation's seq says nothing of
// the new one's deltas).
struct included_delta {
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  friend bool operator==(const included_delta&, const included_delta&) = default;
};

// What an authority publishes every interval.
struct load_vector {
  std::string authority;
  // The authority's process: a restarted authority numbers its vectors from 1 again and has
  // applied none of a router's deltas. The owner fills it in (its router's incarnation).
  uint64_t incarnation = 0;
  uint64_t seq = 0;  // increasing per authority incarnation
  std::vector<load_vector_entry> workers;
  // For each router: the last load_delta the vector includes.
  std::map<std::string, included_delta> included;
};

struct load_authority_counters {
  uint64_t deltas = 0;          // load_delta messages applied
  uint64_t deltas_stale = 0;    // not newer than the last applied from that router: ignored
  uint64_t incarnations = 0;    // router restarts seen (old contribution folded into the base)
  uint64_t reports = 0;         // load reports applied
  uint64_t reports_stale = 0;   // a report seq not newer than the last: a heartbeat only
  uint64_t finished = 0;        // finished requests counted
  uint64_t unknown_worker = 0;  // messages naming a worker this authority does not hold
};

// The authority's side, for the workers of one model it is the authority of.
class load_authority {
 public:
  // report_timeout_ms: a worker without a report for longer is not alive (0: never times out).
  load_authority(std::string name, int64_t report_timeout_ms);

  // Adds a worker slot (idempotent); its base is 0 until its first report.
  void add_worker(uint32_t worker, int64_t now_ms);
  // Takes a worker over from an authority that left (idempotent): its base is `in_flight`, the
  // departed authority's last published load, until the worker's next report or scrape, and every
  // router is anchored at the first total it sends for the worker, since the departed
  // authority's load already counts what they routed before (what they routed between that
  // vector and their first delta here is missed until the next report).
  void adopt_worker(uint32_t worker, uint32_t in_flight, int64_t now_ms);
  bool holds(uint32_t worker) const { return workers_.count(worker) != 0; }
  void remove_worker(uint32_t worker);

  void on_delta(const load_delta& d);
  // A worker's own load report: in_flight is authoritative; seq orders reports (a stale one is
  // still a heartbeat).
  void on_report(uint32_t worker, uint32_t in_flight, uint64_t seq, int64_t now_ms);
  // n of the worker's requests finished (the owner deduplicates ids before calling).
  void on_finished(uint32_t worker, uint32_t n);

  uint32_t in_flight(uint32_t worker) const;
  load_vector publish(int64_t now_ms);
  const load_authority_counters& counters() const { return counters_; }

 private:
  struct router_view {
    uint64_t incarnation = 0;
    uint64_t seq = 0;
    std::map<uint32_t, uint64_t> totals;  // by worker, the newest cumulative totals
  };
  struct worker_view {
    int64_t base = 0;                        // in_flight at the last report (+ folded totals)
    std::map<std::string, uint64_t> anchor;  // per router: its total when the base was taken
    // sum over routers of max(0, total - anchor), kept as deltas arrive, so that in_flight and
    // publish cost O(1) per worker, not O(routers).
    uint64_t routed = 0;
    uint64_t finished_since = 0;  // finished since the base was taken
    uint64_t report_seq = 0;
    bool reported = false;
    bool adopted = false;  // adopt_worker: a router is anchored at its first total
    int64_t last_heard_ms = 0;
  };
  // What `router` adds to w's load now: max(0, its total - its anchor).
  uint64_t contribution(const worker_view& wv, uint32_t worker, const std::string& router,
                        const router_view& view) const;
  // routed, from the routers' totals and the anchors (after the anchors changed).
  void recount(uint32_t worker, worker_view& wv) const;

  std::string name_;
  int64_t report_timeout_ms_;
  uint64_t seq_ = 0;
  std::map<std::string, router_view> routers_;
  std::map<uint32_t, worker_view> workers_;
  load_authority_counters counters_;
};

// What a router owes the authorities, interval by interval. A worker is *pending* at its authority
// from the interval the router routes to it until the authority's vector includes a delta that
// carried its new total; every delta carries the current totals of all its authority's pending
// workers. So a delta that is lost, or overtaken by a later one (the authority then includes the
// later seq and ignores the earlier), costs nothing: the later one carried the same workers again.
// An interval costs O(workers routed to or pending, log A), not O(W); resend_all, for when
// workers change authority, is O(W log A).
//
// `authority_of(worker)` gives a pointer to the name of the worker's authority, or nullptr when it
// is not known (such a worker is not sent; the owner calls resend_all when it becomes known).
class delta_outbox {
 public:
  // The deltas of this interval: the workers routed to since the last one (decision_ledger::
  // take_routed) join their authority's pending ones, and every authority with a pending worker
  // gets one delta, with the next seq of that authority, ascending by worker. The owner fills in
  // router and incarnation.
  template <class AuthorityOf>
  std::map<std::string, load_delta> interval(const decision_ledger& ledger,
                                             std::span<const uint32_t> routed,
                                             AuthorityOf&& authority_of);
  // Every worker with a total above 0 is pending again, at its current authority, and at no other
  // (workers changed authority: a takeover, a yield, a registration; an authority left).
  template <class AuthorityOf>
  void resend_all(const decision_ledger& ledger, AuthorityOf&& authority_of);
  // The authority's newest vector includes this router's delta `seq`: every worker whose current
  // total that delta carried is no longer pending there; and a resync is over once the vector
  // includes a delta that carried it.
  void acknowledged(const std::string& authority, uint64_t seq);
  // The authority restarted: its deltas are marked load_delta::resync until it includes one (the
  // owner also calls resend_all, so the first marked delta carries every total it is owed).
  void resync(const std::string& authority);
  // Pending workers, over all authorities.
  size_t pending() const;

 private:
  struct stream {
    uint64_t seq = 0;  // the last delta's
    // worker -> the seq of the first delta that carried its current total (0: not sent yet);
    // every later delta carried it too, so an included seq at or above it means applied.
    std::map<uint32_t, uint64_t> pending;
    bool resync = false;
    uint64_t resync_first = 0;  // the first delta marked resync (0: none sent yet)
  };
  std::map<std::string, stream> streams_;
};

template <class AuthorityOf>
std::map<std::string, load_delta> delta_outbox::interval(const decision_ledger& ledger,
                                                         std::span<const uint32_t> routed,
                                                         AuthorityOf&& authority_of) {
  for (const uint32_t w : routed)
    if (const std::string* a = std::invoke(authority_of, w)) streams_[*a].pending[w] = 0;
  std::map<std::string, load_delta> out;
  for (auto& [a, s] : streams_) {
    if (s.pending.empty()) continue;
    load_delta& d = out[a];
    d.seq = ++s.seq;
    d.resync = s.resync;
    if (s.resync && s.resync_first == 0) s.resync_first = d.seq;
    d.totals.reserve(s.pending.size());
    for (auto& [w, first] : s.pending) {
      d.totals.emplace_back(w, ledger.total(w));
      if (first == 0) first = d.seq;
    }
  }
  return out;
}

template <class AuthorityOf>
void delta_outbox::resend_all(const decision_ledger& ledger, AuthorityOf&& authority_of) {
  for (auto& [a, s] : streams_)
    s.pending.clear();
  const auto totals = ledger.totals();
  for (uint32_t w = 0; w < totals.size(); ++w)
    if (totals[w] > 0)
      if (const std::string* a = std::invoke(authority_of, w)) streams_[*a].pending[w] = 0;
}

// The decisions of its peers that a router's view of a worker lacks, estimated from its own: the
// view lacks every router's decisions since the shared load last included them, and with
// `routers` routers sharing the traffic evenly each of the others made about as many as this one
// in that time -- to the same workers, since they decided on the same views. Without it, R routers
// each add only their own decisions to a worker that looks light and send it up to R times what
// one router would before the next vector corrects them (herding; docs/cluster.md, "Peer
// estimate"). `own`: this router's decisions the shared load does not include yet; `routers`: R,
// the routers seen deciding (router_activity.hpp), this one included. The router
// (load_overlay::compose*, actors/router/route_decision.cpp) and the simulator (core/sim) both
// call this.
inline uint64_t peer_estimate(uint64_t own, uint32_t routers) {
  return routers > 1 ? own * (routers - 1) : 0;
}

// One worker's load as a vector and the router's own decisions make it (load_overlay).
struct composed_load {
  uint32_t worker = 0;
  uint32_t in_flight = 0;
  bool alive = false;
  uint32_t estimated = 0;  // of in_flight, peers' decisions estimated (peer_estimate)
};

class router_activity;

// A router's view of the load: the newest vector of each authority, plus its own decisions the
// vectors do not include yet.
//
// Cost: what a router keeps and does per authority is proportional to that authority's workers,
// never to all workers -- with A authorities and W workers, one interval (A sends, A vectors) is
// O(W), not O(A x W) (bench/load_exchange_bench.cpp; docs/scaling.md).
class load_overlay {
 public:
  // The (worker, cumulative total) pairs of the delta `seq` this router sent `authority` (the
  // owner calls this as it sends; the delta's own totals, only the workers that changed:
  // delta_outbox). Kept for the last `history` sends per authority until a vector includes them.
  void sent(const std::string& authority, uint64_t seq,
            std::vector<std::pair<uint32_t, uint64_t>> totals);
  enum class vector_outcome {
    stale,    // not newer than the newest applied from that authority: ignored
    applied,  // the authority's newest
    // The first of a restarted authority (a new incarnation), taken whatever its seq: it has
    // applied none of this router's earlier deltas, so the owner must send it every total again
    // (delta_outbox::resend_all). A late vector of an incarnation it replaced is stale.
    restarted,
  };
  // An authority's vector. `self` and `incarnation` name this router: the vector includes its
  // deltas only as that incarnation's. With `activity`, a vector not stale also tells it which
  // routers decided since the authority's last vector (router_activity::on_vector), at now_ms.
  vector_outcome on_vector(const load_vector& v, const std::string& self, uint64_t incarnation,
                           router_activity* activity = nullptr, int64_t now_ms = 0);
  // This router's newest delta seq the authority's newest vector includes (0: none, or unknown).
  uint64_t included(const std::string& authority) const;
  // The load of every worker the vectors cover, with this router's decisions since the included
  // delta added from `ledger`, and with routers > 1 its peers' estimated from them
  // (peer_estimate). Indexed by worker: out[w] is set and covered[w] is 1 (alive) or 2 (not alive)
  // for every covered worker inside both spans; the others are left as they are (the owner's own
  // view applies).
  void compose(const decision_ledger& ledger, std::span<uint32_t> out, std::span<uint8_t> covered,
               uint32_t routers = 1) const;
  // The same for the workers of one authority's vector only (what changes when that vector
  // arrives), one entry per worker of the vector, in its order; empty for an unknown authority.
  std::vector<composed_load> compose_vector(const std::string& authority,
                                            const decision_ledger& ledger,
                                            uint32_t routers = 1) const;
  // The newest vector's entry for `worker` from `authority`, when it has one.
  std::optional<load_vector_entry> entry(const std::string& authority, uint32_t worker) const;
  // Drops an authority's vector and sends (it left the cluster; its workers' new authorities
  // publish theirs).
  void forget(const std::string& authority) { authorities_.erase(authority); }

  static constexpr size_t history = 64;

 private:
  using totals_at_send = std::vector<std::pair<uint32_t, uint64_t>>;  // ascending by worker
  struct authority_view {
    load_vector vector;
    uint64_t included = 0;  // this router's (this incarnation's) delta seq the vector includes
    // Not included yet: (seq, the delta's totals), oldest first.
    std::deque<std::pair<uint64_t, totals_at_send>> sent;
    // Per worker, the newest total the included deltas carried: what the authority has applied.
    std::unordered_map<uint32_t, uint64_t> applied;
    // Incarnations this authority has had before its current one, newest last (at most
    // retired_kept): a late vector of one of them is stale, not another restart.
    std::vector<uint64_t> retired;
  };
  static constexpr size_t retired_kept = 4;
  // Calls f(worker, in_flight, alive, estimated) for every worker of a's vector.
  template <class F>
  static void compose_one(const authority_view& a, std::span<const uint64_t> totals,
                          uint32_t routers, F&& f);
  std::map<std::string, authority_view> authorities_;
};

}  // namespace eldr
