// load_exchange: see load_exchange.hpp.
#include "core/membership/load_exchange.hpp"
#include "core/membership/router_activity.hpp"

#include <algorithm>
#include <limits>

namespace eldr {
namespace {

// A report this far behind the last applied one is a new sequence (the worker restarted), not a
// reordered one: the same window as load_view's.
constexpr uint64_t seq_reorder_window = 64;

}  // namespace

void decision_ledger::resize(uint32_t workers) {
  if (workers <= totals_.size()) return;
  totals_.resize(workers, 0);
  routed_flag_.resize(workers, 0);
}

status decision_ledger::on_route(uint32_t worker) {
  if (worker >= totals_.size())
    return status::invalid_argument("worker " + std::to_string(worker) + " outside the ledger's " +
                                    std::to_string(totals_.size()));
  ++totals_[worker];
  if (!routed_flag_[worker]) {
    routed_flag_[worker] = 1;
    routed_.push_back(worker);
  }
  return {};
}

std::vector<uint32_t> decision_ledger::take_routed() {
  for (const uint32_t w : routed_)
    routed_flag_[w] = 0;
  return std::exchange(routed_, {});
}

void delta_outbox::acknowledged(const std::string& authority, uint64_t seq) {
  auto it = streams_.find(authority);
  if (it == streams_.end()) return;
  stream& s = it->second;
  std::erase_if(s.pending, [&](const auto& p) { return p.second != 0 && p.second <= seq; });
  if (s.resync && s.resync_first != 0 && s.resync_first <= seq) {
    s.resync = false;  // it anchored this router at the totals it was resent
    s.resync_first = 0;
  }
}

void delta_outbox::resync(const std::string& authority) {
  stream& s = streams_[authority];
  s.resync = true;
  s.resync_first = 0;
}

size_t delta_outbox::pending() const {
  size_t n = 0;
  for (const auto& [a, s] : streams_)
    n += s.pending.size();
  return n;
}

load_authority::load_authority(std::string name, int64_t report_timeout_ms)
    : name_(std::move(name)), report_timeout_ms_(report_timeout_ms) {}

uint64_t load_authority::contribution(const worker_view& wv, uint32_t worker,
                                      const std::string& router, const router_view& view) const {
  const auto t = view.totals.find(worker);
  if (t == view.totals.end()) return 0;
  const auto a = wv.anchor.find(router);
  const uint64_t anchor = a == wv.anchor.end() ? 0 : a->second;
  return t->second > anchor ? t->second - anchor : 0;
}

void load_authority::recount(uint32_t worker, worker_view& wv) const {
  wv.routed = 0;
  for (const auto& [router, view] : routers_)
    wv.routed += contribution(wv, worker, router, view);
}

void load_authority::add_worker(uint32_t worker, int64_t now_ms) {
  auto [it, added] = workers_.try_emplace(worker);
  if (!added) return;
  it->second.last_heard_ms = now_ms;
  // Decisions routers made to this slot before it was added are not in flight here: anchor every
  // known router at its current total.
  for (const auto& [router, view] : routers_) {
    auto t = view.totals.find(worker);
    it->second.anchor[router] = t == view.totals.end() ? 0 : t->second;
  }
  recount(worker, it->second);
}

void load_authority::adopt_worker(uint32_t worker, uint32_t in_flight, int64_t now_ms) {
  auto [it, added] = workers_.try_emplace(worker);
  if (!added) return;
  worker_view& wv = it->second;
  wv.base = in_flight;
  wv.reported = true;
  wv.adopted = true;
  wv.last_heard_ms = now_ms;
  recount(worker, wv);
}

void load_authority::remove_worker(uint32_t worker) {
  workers_.erase(worker);
}

void load_authority::on_delta(const load_delta& d) {
  const bool first_seen = routers_.find(d.router) == routers_.end();
  router_view& r = routers_[d.router];
  if (first_seen) {
    r.incarnation = d.incarnation;
  } else if (r.incarnation != d.incarnation) {
    // The router restarted: its old decisions are still running, so their contribution moves
    // into the base, and its new totals count from 0.
    ++counters_.incarnations;
    for (auto& [w, wv] : workers_) {
      auto t = r.totals.find(w);
      const uint64_t total = t == r.totals.end() ? 0 : t->second;
      const uint64_t anchor = wv.anchor.count(d.router) ? wv.anchor[d.router] : 0;
      if (total > anchor) wv.base += static_cast<int64_t>(total - anchor);
      wv.anchor[d.router] = 0;
    }
    r = router_view{d.incarnation, 0, {}};
    for (auto& [w, wv] : workers_)
      recount(w, wv);
  }
  if (d.seq <= r.seq) {
    ++counters_.deltas_stale;
    return;
  }
  r.seq = d.seq;
  ++counters_.deltas;
  for (const auto& [w, total] : d.totals) {
    auto wv = workers_.find(w);
    if (wv == workers_.end()) {
      ++counters_.unknown_worker;
      continue;
    }
    uint64_t& mine = r.totals[w];
    if (total < mine) continue;  // totals only grow within an incarnation: a bad sender
    worker_view& wvv = wv->second;
    const auto a = wvv.anchor.find(d.router);
    uint64_t anchor = a == wvv.anchor.end() ? 0 : a->second;
    const uint64_t before = mine > anchor ? mine - anchor : 0;
    // A router that was not known here when the worker last reported (first seen after it: an
    // authority that took over) made decisions the report already counts, or that the next one
    // will: anchored at its first total for the worker (deltas carry only the totals that
    // changed, so that may come in a later delta than its first). Every router known at a report
    // was anchored by it. Before any report the base is 0 and every decision counts from the
    // first. An adopted worker anchors every router so (adopt_worker), and so does a resync
    // (this process restarted: the totals are older than it).
    if (a == wvv.anchor.end() && (wvv.reported || wvv.adopted || d.resync)) {
      wvv.anchor.emplace(d.router, total);
      anchor = total;
    }
    mine = total;
    // Modulo 2^64: the sum stays exact when this router's share shrinks (a new anchor).
    wvv.routed += (mine > anchor ? mine - anchor : 0) - before;
  }
}

void load_authority::on_report(uint32_t worker, uint32_t in_flight, uint64_t seq, int64_t now_ms) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) {
    ++counters_.unknown_worker;
    return;
  }
  worker_view& wv = it->second;
  wv.last_heard_ms = now_ms;
  if (wv.reported && seq <= wv.report_seq && wv.report_seq - seq <= seq_reorder_window) {
    ++counters_.reports_stale;
    return;
  }
  ++counters_.reports;
  wv.reported = true;
  wv.report_seq = seq;
  wv.base = in_flight;
  wv.finished_since = 0;
  for (const auto& [router, view] : routers_) {
    auto t = view.totals.find(worker);
    // A router that has not sent an adopted worker's total yet is anchored at its first one.
    if (t == view.totals.end() && wv.adopted) continue;
    wv.anchor[router] = t == view.totals.end() ? 0 : t->second;
  }
  recount(worker, wv);
}

void load_authority::on_finished(uint32_t worker, uint32_t n) {
  auto it = workers_.find(worker);
  if (it == workers_.end()) {
    ++counters_.unknown_worker;
    return;
  }
  it->second.finished_since += n;
  counters_.finished += n;
}

uint32_t load_authority::in_flight(uint32_t worker) const {
  auto it = workers_.find(worker);
  if (it == workers_.end()) return 0;
  const worker_view& wv = it->second;
  const int64_t load =
      wv.base + static_cast<int64_t>(wv.routed) - static_cast<int64_t>(wv.finished_since);
  return static_cast<uint32_t>(std::clamp<int64_t>(load, 0, std::numeric_limits<uint32_t>::max()));
}

load_vector load_authority::publish(int64_t now_ms) {
  load_vector v;
  v.authority = name_;
  v.seq = ++seq_;
  v.workers.reserve(workers_.size());
  for (const auto& [w, wv] : workers_)
    v.workers.push_back({w, in_flight(w),
                         report_timeout_ms_ == 0 || now_ms - wv.last_heard_ms <= report_timeout_ms_,
                         0, wv.reported || wv.adopted});
  for (const auto& [router, view] : routers_)
    v.included[router] = {view.incarnation, view.seq};
  return v;
}

void load_overlay::sent(const std::string& authority, uint64_t seq,
                        std::vector<std::pair<uint32_t, uint64_t>> totals) {
  auto& a = authorities_[authority];
  // compose_one looks workers up by binary search.
  if (!std::is_sorted(totals.begin(), totals.end())) std::sort(totals.begin(), totals.end());
  a.sent.emplace_back(seq, std::move(totals));
  while (a.sent.size() > history)
    a.sent.pop_front();
}

load_overlay::vector_outcome load_overlay::on_vector(const load_vector& v, const std::string& self,
                                                     uint64_t incarnation,
                                                     router_activity* activity, int64_t now_ms) {
  auto& a = authorities_[v.authority];
  const bool known = !a.vector.authority.empty();
  const bool restarted = known && a.vector.incarnation != v.incarnation;
  // A vector of a process this one replaced, arriving late (over the old connection, read after
  // the new one's): not a restart back.
  if (restarted && std::find(a.retired.begin(), a.retired.end(), v.incarnation) != a.retired.end())
    return vector_outcome::stale;
  if (restarted) {
    a.retired.push_back(a.vector.incarnation);
    if (a.retired.size() > retired_kept) a.retired.erase(a.retired.begin());
    // A new process counts its vectors from 1 and knows nothing this router sent the old one:
    // the newest-seq rule would ignore it until its seq passed the old one's (hours at 5 ms).
    // The sends stay: the new process may have applied some of them (its `included` says).
    // `applied` stays too, until the totals resent to the new process are included: the new
    // process's load comes from its workers' reports, which count the decisions before them, so
    // adding what was decided since the old process's last included delta over-counts the few
    // decided between that delta and the report -- where dropping it would add every decision
    // this router ever made to those workers.
    a.included = 0;
  } else if (known && a.vector.seq >= v.seq) {
    return vector_outcome::stale;
  }
  // Only two vectors of one process compare: a new one has applied nobody's deltas yet.
  if (activity != nullptr)
    activity->on_vector(known && !restarted ? &a.vector.included : nullptr, v.included, now_ms);
  a.vector = v;
  auto inc = v.included.find(self);
  // Another incarnation's seq (this router restarted since) says nothing of this one's deltas.
  a.included =
      inc == v.included.end() || inc->second.incarnation != incarnation ? 0 : inc->second.seq;
  // What the included sends carried is what the authority applied; a send lost on the way was
  // overtaken by a later one that carried its workers again (delta_outbox).
  while (!a.sent.empty() && a.sent.front().first <= a.included) {
    for (const auto& [w, total] : a.sent.front().second)
      a.applied[w] = total;
    a.sent.pop_front();
  }
  return restarted ? vector_outcome::restarted : vector_outcome::applied;
}

uint64_t load_overlay::included(const std::string& authority) const {
  const auto it = authorities_.find(authority);
  return it == authorities_.end() ? 0 : it->second.included;
}

template <class F>
void load_overlay::compose_one(const authority_view& a, std::span<const uint64_t> totals,
                               uint32_t routers, F&& f) {
  if (a.vector.authority.empty()) return;
  // This router's totals as the authority has applied them: the newest total the included
  // deltas carried per worker. When it includes none yet, an authority that anchors (the worker
  // reported or was adopted) will take this router's first total as counted: count what was
  // decided since the oldest send kept; one that counts from 0 (no report yet) has counted none
  // of this router's decisions: count them all (taking the first send as counted there dropped
  // the decisions made before it until the first vector that included it). A worker no included
  // delta carried had no decision of this router then (total 0) -- or moved to this authority
  // since, when every decision to it counts until a delta carrying it is included: one interval. A
  // send dropped from the history before it was included leaves an older total (an over-estimate
  // too).
  const totals_at_send* first =
      a.included == 0 && a.applied.empty() && !a.sent.empty() ? &a.sent.front().second : nullptr;
  for (const auto& e : a.vector.workers) {
    const uint64_t now_total = e.worker < totals.size() ? totals[e.worker] : 0;
    uint64_t then = 0;
    if (const auto it = a.applied.find(e.worker); it != a.applied.end()) {
      then = it->second;
    } else if (first != nullptr && e.anchors) {
      const auto at = std::lower_bound(first->begin(), first->end(),
                                       std::pair<uint32_t, uint64_t>{e.worker, 0});
      if (at != first->end() && at->first == e.worker) then = at->second;
    }
    const uint64_t own = now_total > then ? now_total - then : 0;
    const uint64_t peers = peer_estimate(own, routers);
    constexpr uint64_t most = std::numeric_limits<uint32_t>::max();
    const uint64_t in_flight = std::min(uint64_t{e.in_flight} + own + peers, most);
    f(e.worker, static_cast<uint32_t>(in_flight), e.alive,
      static_cast<uint32_t>(std::min(peers, in_flight)));
  }
}

void load_overlay::compose(const decision_ledger& ledger, std::span<uint32_t> out,
                           std::span<uint8_t> covered, uint32_t routers) const {
  for (const auto& [name, a] : authorities_)
    compose_one(a, ledger.totals(), routers,
                [&](uint32_t w, uint32_t in_flight, bool alive, uint32_t /*estimated*/) {
                  if (w >= out.size() || w >= covered.size()) return;
                  out[w] = in_flight;
                  covered[w] = alive ? 1 : 2;
                });
}

std::optional<load_vector_entry> load_overlay::entry(const std::string& authority,
                                                     uint32_t worker) const {
  const auto it = authorities_.find(authority);
  if (it == authorities_.end()) return std::nullopt;
  for (const auto& e : it->second.vector.workers)
    if (e.worker == worker) return e;
  return std::nullopt;
}

std::vector<composed_load> load_overlay::compose_vector(const std::string& authority,
                                                        const decision_ledger& ledger,
                                                        uint32_t routers) const {
  std::vector<composed_load> out;
  const auto it = authorities_.find(authority);
  if (it == authorities_.end()) return out;
  out.reserve(it->second.vector.workers.size());
  compose_one(it->second, ledger.totals(), routers,
              [&](uint32_t w, uint32_t in_flight, bool alive, uint32_t estimated) {
                out.push_back({w, in_flight, alive, estimated});
              });
  return out;
}

}  // namespace eldr
