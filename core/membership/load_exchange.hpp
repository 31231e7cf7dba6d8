// load_exchange: how routers of a cluster share decode load without sending each other every
// decision (docs/cluster.md, "Scaling out"; issue 14). Status: the plain logic, unit-tested; the
// router does not use it yet.
//
// Every decode worker has one *authority* (the node its worker connection reaches), which alone
// applies the worker's own messages: its load reports and its finished events. Routers do not send
// decisions; each router keeps a decision_ledger per model -- a cumulative count of its decisions
// per worker, which only grows -- and every interval sends each authority its totals for that
// authority's workers, numbered by a per-(router, authority) sequence. Because the totals are
// cumulative, a lost or reordered message costs nothing once a later one arrives.
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
// Nothing here does I/O or reads a clock (times are passed in). Thread safety: none; one owner.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// A router's cumulative decisions per worker of one model.
class decision_ledger {
 public:
  explicit decision_ledger(uint32_t workers = 0) : totals_(workers, 0) {}
  // Grows (never shrinks: a total, once sent, must stay the same worker's).
  void resize(uint32_t workers);
  // Error: worker out of range.
  status on_route(uint32_t worker);
  uint64_t total(uint32_t worker) const { return worker < totals_.size() ? totals_[worker] : 0; }
  std::span<const uint64_t> totals() const { return totals_; }

 private:
  std::vector<uint64_t> totals_;
};

// What a router sends an authority every interval.
struct load_delta {
  std::string router;        // the router's node name
  uint64_t incarnation = 0;  // changes when the router restarts (its totals start again at 0)
  uint64_t seq = 0;          // per (router, authority), increasing from 1
  // (worker, cumulative total) for the authority's workers this router has routed to.
  std::vector<std::pair<uint32_t, uint64_t>> totals;
};

struct load_vector_entry {
  uint32_t worker = 0;
  uint32_t in_flight = 0;
  bool alive = false;  // reported within the authority's report timeout
  // The authority's claim on the worker (authority_map.hpp's encode_claim); the owner fills it in.
  uint64_t claim = 0;
};

// What an authority publishes every interval.
struct load_vector {
  std::string authority;
  uint64_t seq = 0;  // increasing per authority
  std::vector<load_vector_entry> workers;
  // For each router: the last load_delta seq (of its current incarnation) the vector includes.
  std::map<std::string, uint64_t> included;
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
    uint64_t finished_since = 0;             // finished since the base was taken
    uint64_t report_seq = 0;
    bool reported = false;
    bool adopted = false;  // adopt_worker: a router is anchored at its first total
    int64_t last_heard_ms = 0;
  };
  std::string name_;
  int64_t report_timeout_ms_;
  uint64_t seq_ = 0;
  std::map<std::string, router_view> routers_;
  std::map<uint32_t, worker_view> workers_;
  load_authority_counters counters_;
};

// What a router owes the authorities this interval: for every worker it has routed to (a total
// above 0) whose authority it knows, its cumulative total, grouped by that authority, ascending by
// worker. The owner fills in router, incarnation and seq of the ones it sends. O(W log A).
// `authority_of` maps a worker to its authority's name, or to what `name_of` makes that name of
// (authority_map's claims and &authority_claim::node).
template <class Map, class NameOf = std::identity>
std::map<std::string, load_delta> deltas_by_authority(const decision_ledger& ledger,
                                                      const Map& authority_of,
                                                      NameOf name_of = {}) {
  std::map<std::string, load_delta> out;
  for (const auto& [w, a] : authority_of)
    if (ledger.total(w) > 0) out[std::invoke(name_of, a)].totals.emplace_back(w, ledger.total(w));
  return out;
}

// One worker's load as a vector and the router's own decisions make it (load_overlay).
struct composed_load {
  uint32_t worker = 0;
  uint32_t in_flight = 0;
  bool alive = false;
};

// A router's view of the load: the newest vector of each authority, plus its own decisions the
// vectors do not include yet.
//
// Cost: what a router keeps and does per authority is proportional to that authority's workers,
// never to all workers -- with A authorities and W workers, one interval (A sends, A vectors) is
// O(W), not O(A x W) (bench/load_exchange_bench.cpp; docs/scaling.md).
class load_overlay {
 public:
  // The (worker, cumulative total) pairs of the delta `seq` this router sent `authority` (the
  // owner calls this as it sends; the delta's own totals). Kept for the last `history` sends per
  // authority.
  void sent(const std::string& authority, uint64_t seq,
            std::vector<std::pair<uint32_t, uint64_t>> totals);
  // An authority's vector; an older one than the newest applied is ignored (returns false).
  bool on_vector(const load_vector& v, const std::string& self);
  // The load of every worker the vectors cover, with this router's decisions since the included
  // delta added from `ledger`. Indexed by worker: out[w] is set and covered[w] is 1 (alive) or 2
  // (not alive) for every covered worker inside both spans; the others are left as they are (the
  // owner's own view applies).
  void compose(const decision_ledger& ledger, std::span<uint32_t> out,
               std::span<uint8_t> covered) const;
  // The same for the workers of one authority's vector only (what changes when that vector
  // arrives), one entry per worker of the vector, in its order; empty for an unknown authority.
  std::vector<composed_load> compose_vector(const std::string& authority,
                                            const decision_ledger& ledger) const;
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
    uint64_t included = 0;  // this router's delta seq the vector includes
    std::deque<std::pair<uint64_t, totals_at_send>> sent;  // (seq, the delta's totals)
  };
  // Calls f(worker, in_flight, alive) for every worker of a's vector.
  template <class F>
  static void compose_one(const authority_view& a, std::span<const uint64_t> totals, F&& f);
  std::map<std::string, authority_view> authorities_;
};

}  // namespace eldr
