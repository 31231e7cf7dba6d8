// load_view: one model's decode pool as the router sees it -- which decode_worker slots are
// registered, how many requests each has in flight, and which may receive the next request
// (docs/method.md section 5: "load = the router's count of in-flight decode requests per worker").
//
// The router counts: +1 when it routes a request to a worker, -1 when that request's finished
// event arrives (once per request id). The count drifts whenever an event is lost (a worker
// crashes, a finished message is dropped), so each worker's own periodic load report overrides it:
// the report is authoritative. A worker that stops reporting for longer than the configured
// timeout is "dead" and leaves the candidate set until its next report. Liveness and load are
// kept apart: every well-formed report is a heartbeat, whatever its seq; seq only decides whether
// the report's in_flight replaces the load (docs/protocol.md section 4, load_report).
//
// Every method that depends on time takes `now_ms` (any monotonic millisecond clock the owner
// chooses); nothing here reads a clock, so tests drive time by hand.
//
// Thread safety: none. A load_view has one owner, the router's routing actor, which both routes
// and applies worker messages; the spans it hands out are valid until the next non-const call.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

// A worker slot's state as the admin "workers" listing shows it. When several apply, the first in
// this order wins: unregistered, dead, draining, full, active (a dead worker is the most urgent
// thing for an operator to see; draining is intent, full is transient).
enum class worker_state : uint8_t {
  unregistered,  // no worker has registered this index (or it unregistered): never eligible
  active,        // registered, live, not draining, below capacity: eligible
  draining,      // registered but drained: no new requests, in-flight ones finish
  dead,          // no load report for longer than report_timeout_ms: not eligible until it reports
  full,          // in-flight load has reached the registered capacity: not eligible until it drops
};

// "unregistered", "active", "draining", "dead", "full".
std::string_view to_string(worker_state s);

struct load_view_options {
  // A worker whose last report (or registration) is more than this many ms old is dead.
  // 0 = workers never time out. Must be >= 0.
  int64_t report_timeout_ms = 0;
  // Request ids remembered between on_route and on_finished. When full, the oldest is forgotten
  // (counted in tracked_evicted). Bounds memory whatever clients send. Must be >= 1.
  uint32_t max_tracked = 1u << 16;
  // A tracked id older than this is forgotten (counted in tracked_expired): its finished event was
  // lost or never comes. Must be >= 1. Forgetting does not change the load; reports correct it.
  int64_t tracked_ttl_ms = 10 * 60 * 1000;
  // Longest request id accepted (the worker protocol's max_id_bytes). Must be >= 1.
  uint32_t max_id_bytes = 256;
  // A report whose seq is at most this far behind the last applied one is a reordered or
  // repeated report: its load is ignored (counted in reports_stale). One further behind starts a
  // new sequence (a worker restarted without registering again, or a sender that reset or
  // wrapped its counter): it is applied and counted in seq_resets. Without this a single
  // report with seq = 2^64-1 would make every later load report stale for good.
  uint64_t seq_reorder_window = 64;
};

// Totals since construction, for the status command and the metrics exporter.
struct load_view_counters {
  uint64_t routed = 0;            // on_route calls applied
  uint64_t rerouted = 0;          // on_route with an id still tracked: the old route was released
  uint64_t finished = 0;          // finished events that decremented a worker
  uint64_t finished_unknown = 0;  // finished for an id not tracked (duplicate, expired, evicted,
                                  // other worker, or a worker re-registered since): no-op
  uint64_t reports = 0;           // load reports applied
  uint64_t reports_stale = 0;     // load reports whose load was ignored: seq not newer than the
                                  // last applied, within seq_reorder_window (still a heartbeat)
  uint64_t seq_resets = 0;        // load reports applied as the start of a new seq sequence
  uint64_t scrapes = 0;           // scraped loads applied (on_scrape)
  uint64_t scrapes_stale = 0;     // scrapes issued before the worker's latest registration: ignored
  uint64_t scrapes_failed = 0;    // failed scrapes noted (on_scrape_failed)
  uint64_t shared = 0;            // loads applied from a load authority's vector (on_shared)
  uint64_t estimated = 0;         // requests added as peers' estimated decisions (add_estimate)
  uint64_t tracked_evicted = 0;   // tracked ids forgotten because max_tracked was reached
  uint64_t tracked_expired = 0;   // tracked ids forgotten because older than tracked_ttl_ms
};

// One row of the admin "workers" listing.
struct worker_snapshot {
  uint32_t index = 0;
  std::string endpoint;   // "" when unregistered
  uint32_t capacity = 0;  // 0 = unbounded
  worker_state state = worker_state::unregistered;
  bool draining = false;  // drained, whatever else applies (state shows only one)
  uint32_t load = 0;      // in-flight requests as the router counts them
  // now - last report (registration counts as a report); -1 when unregistered.
  int64_t last_report_age_ms = -1;
  bool has_reported_seq = false;  // a load report has been applied since registration
  uint64_t reported_seq = 0;      // seq of the last applied report (valid if has_reported_seq)
  uint64_t routed = 0;            // requests routed to this slot since construction
  uint64_t finished = 0;          // finished events applied to this slot since construction
  // now - the last applied scrape of the worker's metrics; -1 when none since registration.
  int64_t last_scrape_age_ms = -1;
  uint64_t scrapes = 0;         // scrapes applied to this slot since construction
  uint64_t scrapes_failed = 0;  // failed scrapes of this slot since construction
};

class load_view {
 public:
  // A pool of k worker slots (indices 0..k-1; worker k owns centroid k), all unregistered.
  // Errors (invalid_argument): k == 0; report_timeout_ms < 0; max_tracked == 0;
  // tracked_ttl_ms < 1; max_id_bytes == 0.
  static result<load_view> make(uint32_t k, const load_view_options& options = {});

  load_view(load_view&&) = default;
  load_view& operator=(load_view&&) = default;
  load_view(const load_view&) = delete;  // tracked ids index into their own list nodes
  load_view& operator=(const load_view&) = delete;

  uint32_t k() const { return static_cast<uint32_t>(slots_.size()); }
  const load_view_options& options() const { return options_; }
  const load_view_counters& counters() const { return counters_; }

  // Changes the number of slots (a membership change). Surviving indices keep all their state;
  // new slots are unregistered. Requests tracked to a removed slot stay tracked until they finish,
  // expire or are evicted, and their finished events then change nothing (even if the index is
  // re-added later). Errors (invalid_argument): k == 0.
  status resize(uint32_t k);

  // A worker announces (or re-announces, after a restart) itself: endpoint, capacity (0 =
  // unbounded). The slot becomes active with load 0 and last report = now_ms; a re-registration
  // also clears drain and the seq history (a restarted worker counts from scratch), and finished
  // events for requests routed before it no longer decrement the new instance.
  // Errors (invalid_argument): worker >= k(); endpoint empty.
  status register_worker(uint32_t worker, std::string endpoint, uint32_t capacity, int64_t now_ms);
  // The slot becomes unregistered (load 0, not eligible). Its routed/finished totals are kept.
  // Errors (invalid_argument): worker >= k(). Unregistering an unregistered slot is a no-op.
  status unregister_worker(uint32_t worker);

  // Graceful drain: a drained worker receives no new requests; its in-flight ones finish and are
  // counted down as usual. undrain makes it eligible again. Errors: worker >= k()
  // (invalid_argument); the slot is unregistered (failed_precondition).
  status drain(uint32_t worker);
  status undrain(uint32_t worker);

  // The router sent request `request_id` to `worker`: load +1, and the id is remembered so that
  // its finished event decrements the same worker once. Any registered worker is accepted, even
  // one that is not eligible now (the request is really there). An id that is still tracked is
  // treated as a retry: the earlier route is released (its worker -1, counted in rerouted) so the
  // count never leaks. Also forgets tracked ids older than tracked_ttl_ms and, when max_tracked
  // are held, the oldest one.
  // Errors: worker >= k(), request_id empty or longer than max_id_bytes (invalid_argument); the
  // slot is unregistered (failed_precondition). Nothing changes on error.
  status on_route(std::string_view request_id, uint32_t worker, int64_t now_ms);

  // The request's stream ended: its worker -1 (never below 0), once per id. Returns true when a
  // tracked route was released; false (counted in finished_unknown) for an unknown, duplicate,
  // expired or evicted id, or one routed to an earlier registration of the worker.
  // The two-argument form comes from a worker's "finished" message: it applies only when the id
  // was routed to that worker (a mismatching id is left tracked and counted as unknown).
  bool on_finished(std::string_view request_id, int64_t now_ms);
  bool on_finished(uint32_t worker, std::string_view request_id, int64_t now_ms);

  // A worker's own count of its in-flight requests. Every report makes the worker live as of
  // now_ms (a heartbeat, whatever its seq). Its load is applied when seq is newer than the last
  // applied report's since registration (the first report applies whatever its seq), or more than
  // seq_reorder_window behind it (a new sequence, counted in seq_resets); a report at most
  // that far behind is counted in reports_stale and its load ignored (returns ok: a reordered
  // report is not an error). When applied: load := in_flight (authoritative; routes the worker has
  // not yet seen are briefly undercounted, which the next report corrects).
  // Errors: worker >= k() (invalid_argument); unregistered slot (failed_precondition: a worker
  // registers before it reports).
  status on_report(uint32_t worker, uint32_t in_flight, uint64_t seq, int64_t now_ms);

  // The worker's load as its engine reported it when scraped (vLLM's running + waiting, taken
  // from its /metrics; docs/vllm.md): authoritative like a report, and a heartbeat. The scrape was
  // issued at issued_ms and answered by now_ms; routes the engine cannot have seen when it
  // answered are the ones made since the scrape was issued, so the load becomes
  //   in_flight + (requests routed to this worker at or after issued_ms and still tracked),
  // which may count a request the engine already held twice for one scrape interval, never
  // forgets one. Seq is untouched (reports and scrapes may be mixed). A scrape issued before the
  // worker's latest registration belongs to an earlier instance: ignored (counted in
  // scrapes_stale; returns ok). Errors as on_report.
  status on_scrape(uint32_t worker, uint32_t in_flight, int64_t issued_ms, int64_t now_ms);
  // The worker's load as the cluster's load authority for it published it
  // (core/membership/load_exchange.hpp, cluster.load_sharing = "authority"), this router's own
  // decisions since included: load := in_flight. A heartbeat when the authority hears the worker
  // (alive), else liveness is left to time out. Seq is untouched. Counted in shared. Errors as
  // on_report.
  // `estimated` of in_flight are peers' decisions the router estimated (load_overlay's peer
  // estimate), not counted.
  status on_shared(uint32_t worker, uint32_t in_flight, bool alive, int64_t now_ms,
                   uint32_t estimated = 0);
  // n requests the router estimates its peers sent the worker since the last shared load
  // (core/membership/load_exchange.hpp, peer_estimate): load += n (saturating), no id tracked,
  // no heartbeat; the next shared load, report or scrape replaces it with a count. An estimate
  // steers the choice among workers but never makes a worker full: the capacity is checked
  // against the load without it, so a guess cannot refuse a request. Counted in estimated.
  // Errors as on_report.
  status add_estimate(uint32_t worker, uint32_t n);
  // The part of load()[worker] that is estimated (0 for an index out of range).
  uint32_t estimated(uint32_t worker) const {
    return worker < slots_.size() ? slots_[worker].estimated : 0;
  }
  // A scrape of the worker failed (unreachable, timeout, bad body): counted only. Liveness is not
  // touched, so a worker whose scrapes keep failing goes dead report_timeout_ms after its last
  // heartbeat, as a silent reporting worker does. Errors: worker >= k() (invalid_argument).
  status on_scrape_failed(uint32_t worker);

  // Forgets tracked ids older than tracked_ttl_ms at now_ms. Called by on_route/on_finished; the
  // owner may also call it from a timer so that memory shrinks while no request arrives.
  void expire_tracked(int64_t now_ms);
  // Ids currently tracked (<= max_tracked).
  std::size_t tracked() const { return by_id_.size(); }

  // In-flight load per slot, K entries (0 for unregistered slots), for route_input::load.
  // Allocation-free; valid until the next non-const call.
  std::span<const uint32_t> load() const { return load_; }
  // Eligibility per slot at now_ms, K entries (1 = may receive a request), for
  // route_input::eligible: registered, not draining, reported within report_timeout_ms of now_ms
  // (an age of exactly the timeout is still live), and below capacity. Recomputed only when state
  // changed or a liveness deadline passed since the last call; allocation-free.
  std::span<const uint8_t> eligible(int64_t now_ms);
  // Number of nonzero entries of eligible(now_ms).
  uint32_t eligible_count(int64_t now_ms);

  // For readiness (a node is ready when some worker may receive a request): the workers that are
  // registered, live at now_ms and not draining (capacity is ignored: a full worker frees up by
  // itself), and until when at least one of them stays live without another report
  // (INT64_MAX when reports never time out; 0 when there is none). O(K).
  struct routable_summary {
    uint32_t workers = 0;
    int64_t live_until_ms = 0;
  };
  routable_summary routable(int64_t now_ms) const;

  // The state of one slot at now_ms. Precondition: worker < k() (asserted).
  worker_state state(uint32_t worker, int64_t now_ms) const;
  // Errors (invalid_argument): worker >= k().
  result<worker_snapshot> snapshot(uint32_t worker, int64_t now_ms) const;
  // Every slot, in index order.
  std::vector<worker_snapshot> snapshot_all(int64_t now_ms) const;

 private:
  struct slot {
    bool registered = false;
    bool draining = false;
    std::string endpoint;
    uint32_t capacity = 0;
    int64_t last_report_ms = 0;
    int64_t registered_ms = 0;
    int64_t last_scrape_ms = 0;
    bool has_scrape = false;
    uint64_t scrapes = 0;
    uint64_t scrapes_failed = 0;
    bool has_seq = false;
    uint64_t seq = 0;
    uint64_t routed = 0;
    uint64_t finished = 0;
    // Changes at every (un)registration and when the slot is (re)created, so a finished event
    // decrements only the instance the request was routed to.
    uint64_t generation = 0;
    // The part of the load that is peers' estimated decisions (add_estimate, on_shared's
    // `estimated`): counted for the choice, not against the capacity.
    uint32_t estimated = 0;
  };
  struct tracked_route {
    std::string id;
    uint32_t worker = 0;
    uint64_t generation = 0;
    int64_t routed_ms = 0;
  };
  using route_list = std::list<tracked_route>;

  load_view(uint32_t k, const load_view_options& options);

  bool live(const slot& s, int64_t now_ms) const;
  // A registration or its end starts the worker afresh: not draining, no report sequence, no
  // load, and a new generation, so that requests routed before it no longer count against it.
  slot& restart(uint32_t worker, bool registered);
  void release(route_list::iterator it);  // -1 on its worker if still the same instance
  void forget(route_list::iterator it);   // drops the id without touching the load
  void recompute_eligible(int64_t now_ms);

  load_view_options options_;
  load_view_counters counters_;
  uint64_t next_generation_ = 1;
  std::vector<slot> slots_;
  std::vector<uint32_t> load_;
  std::vector<uint8_t> eligible_;
  // Eligibility cache: valid while !dirty_ and computed_ms_ <= now <= valid_until_ms_.
  bool dirty_ = true;
  int64_t computed_ms_ = 0;
  int64_t valid_until_ms_ = 0;
  uint32_t eligible_count_ = 0;
  // Tracked routes, oldest first (on_route time order), and an index into them by id. The map's
  // keys view the list nodes' strings, which never move while the node lives.
  route_list routes_;
  std::unordered_map<std::string_view, route_list::iterator> by_id_;
};

}  // namespace eldr
