// load_view: the router's per-worker load count, its correction by load reports, liveness, drain,
// capacity, and the bounded table of routed request ids.
#include "core/load_view.hpp"

#include <algorithm>
#include <cassert>
#include <limits>
#include <utility>

namespace eldr {
namespace {

constexpr int64_t never = std::numeric_limits<int64_t>::max();

status bad_worker(uint32_t worker, uint32_t k) {
  return status::invalid_argument("load_view: worker " + std::to_string(worker) +
                                  " is outside the pool of " + std::to_string(k) + " workers");
}

status unregistered(uint32_t worker) {
  return status::failed_precondition("load_view: worker " + std::to_string(worker) +
                                     " is not registered");
}

}  // namespace

std::string_view to_string(worker_state s) {
  switch (s) {
    case worker_state::unregistered:
      return "unregistered";
    case worker_state::active:
      return "active";
    case worker_state::draining:
      return "draining";
    case worker_state::dead:
      return "dead";
    case worker_state::full:
      return "full";
  }
  return "unknown";
}

result<load_view> load_view::make(uint32_t k, const load_view_options& options) {
  if (k == 0) return status::invalid_argument("load_view: a pool needs at least one worker");
  if (options.report_timeout_ms < 0)
    return status::invalid_argument("load_view: report_timeout_ms must be >= 0 (0 = never)");
  if (options.max_tracked == 0)
    return status::invalid_argument("load_view: max_tracked must be >= 1");
  if (options.tracked_ttl_ms < 1)
    return status::invalid_argument("load_view: tracked_ttl_ms must be >= 1");
  if (options.max_id_bytes == 0)
    return status::invalid_argument("load_view: max_id_bytes must be >= 1");
  return load_view(k, options);
}

load_view::load_view(uint32_t k, const load_view_options& options) : options_(options) {
  // Reserve once so that the map never rehashes below max_tracked (rehashing is the only
  // allocation on_route would otherwise make besides its own node).
  by_id_.reserve(std::min<uint32_t>(options_.max_tracked, 1u << 16));
  // Cannot fail: make() refused k == 0, resize's only error.
  (void)resize(k);
}

status load_view::resize(uint32_t k) {
  if (k == 0) return status::invalid_argument("load_view: a pool needs at least one worker");
  const std::size_t old = slots_.size();
  slots_.resize(k);
  for (std::size_t w = old; w < k; ++w)
    slots_[w].generation = next_generation_++;
  load_.resize(k, 0);
  eligible_.resize(k, 0);
  dirty_ = true;
  return {};
}

status load_view::register_worker(uint32_t worker, std::string endpoint, uint32_t capacity,
                                  int64_t now_ms) {
  if (worker >= k()) return bad_worker(worker, k());
  if (endpoint.empty())
    return status::invalid_argument("load_view: worker " + std::to_string(worker) +
                                    " registered without an endpoint");
  slot& s = restart(worker, true);
  s.endpoint = std::move(endpoint);
  s.capacity = capacity;
  s.last_report_ms = now_ms;
  s.registered_ms = now_ms;
  s.has_scrape = false;
  return {};
}

status load_view::unregister_worker(uint32_t worker) {
  if (worker >= k()) return bad_worker(worker, k());
  if (!slots_[worker].registered) return {};
  slot& s = restart(worker, false);
  s.endpoint.clear();
  s.capacity = 0;
  return {};
}

load_view::slot& load_view::restart(uint32_t worker, bool registered) {
  slot& s = slots_[worker];
  s.registered = registered;
  s.draining = false;
  s.has_seq = false;
  s.seq = 0;
  s.generation = next_generation_++;
  s.estimated = 0;
  load_[worker] = 0;
  dirty_ = true;
  return s;
}

status load_view::drain(uint32_t worker) {
  if (worker >= k()) return bad_worker(worker, k());
  if (!slots_[worker].registered) return unregistered(worker);
  slots_[worker].draining = true;
  dirty_ = true;
  return {};
}

status load_view::undrain(uint32_t worker) {
  if (worker >= k()) return bad_worker(worker, k());
  if (!slots_[worker].registered) return unregistered(worker);
  slots_[worker].draining = false;
  dirty_ = true;
  return {};
}

status load_view::on_route(std::string_view request_id, uint32_t worker, int64_t now_ms) {
  if (worker >= k()) return bad_worker(worker, k());
  if (request_id.empty()) return status::invalid_argument("load_view: empty request id");
  if (request_id.size() > options_.max_id_bytes)
    return status::invalid_argument("load_view: request id of " +
                                    std::to_string(request_id.size()) + " bytes exceeds " +
                                    std::to_string(options_.max_id_bytes));
  if (!slots_[worker].registered) return unregistered(worker);

  expire_tracked(now_ms);
  if (auto found = by_id_.find(request_id); found != by_id_.end()) {
    ++counters_.rerouted;
    release(found->second);
  }
  while (by_id_.size() >= options_.max_tracked) {
    ++counters_.tracked_evicted;
    forget(routes_.begin());
  }

  slot& s = slots_[worker];
  routes_.push_back(tracked_route{std::string(request_id), worker, s.generation, now_ms});
  auto it = std::prev(routes_.end());
  by_id_.emplace(std::string_view(it->id), it);
  if (load_[worker] < std::numeric_limits<uint32_t>::max()) ++load_[worker];
  ++s.routed;
  ++counters_.routed;
  dirty_ = true;
  return {};
}

bool load_view::on_finished(std::string_view request_id, int64_t now_ms) {
  expire_tracked(now_ms);
  auto found = by_id_.find(request_id);
  if (found == by_id_.end()) {
    ++counters_.finished_unknown;
    return false;
  }
  const route_list::iterator it = found->second;
  const slot* s = it->worker < k() ? &slots_[it->worker] : nullptr;
  const bool same_instance = s != nullptr && s->registered && s->generation == it->generation;
  release(it);
  if (!same_instance) {
    ++counters_.finished_unknown;
    return false;
  }
  ++counters_.finished;
  return true;
}

bool load_view::on_finished(uint32_t worker, std::string_view request_id, int64_t now_ms) {
  expire_tracked(now_ms);
  auto found = by_id_.find(request_id);
  if (found == by_id_.end() || found->second->worker != worker) {
    ++counters_.finished_unknown;
    return false;
  }
  return on_finished(request_id, now_ms);
}

status load_view::on_report(uint32_t worker, uint32_t in_flight, uint64_t seq, int64_t now_ms) {
  if (worker >= k()) return bad_worker(worker, k());
  slot& s = slots_[worker];
  if (!s.registered) return unregistered(worker);
  // Liveness first, whatever seq says: a worker that reports is alive.
  s.last_report_ms = now_ms;
  dirty_ = true;
  if (s.has_seq && seq <= s.seq) {
    if (s.seq - seq <= options_.seq_reorder_window) {
      ++counters_.reports_stale;
      return {};
    }
    ++counters_.seq_resets;
  }
  s.has_seq = true;
  s.seq = seq;
  s.estimated = 0;
  load_[worker] = in_flight;
  ++counters_.reports;
  return {};
}

status load_view::on_scrape(uint32_t worker, uint32_t in_flight, int64_t issued_ms,
                            int64_t now_ms) {
  if (worker >= k()) return bad_worker(worker, k());
  slot& s = slots_[worker];
  if (!s.registered) return unregistered(worker);
  if (issued_ms < s.registered_ms) {
    ++counters_.scrapes_stale;
    return {};
  }
  s.last_report_ms = now_ms;
  s.last_scrape_ms = now_ms;
  s.has_scrape = true;
  ++s.scrapes;
  ++counters_.scrapes;
  dirty_ = true;
  // Newest routes are at the back (on_route appends in call order).
  uint64_t since = in_flight;
  for (auto it = routes_.rbegin(); it != routes_.rend() && it->routed_ms >= issued_ms; ++it)
    if (it->worker == worker && it->generation == s.generation) ++since;
  load_[worker] =
      static_cast<uint32_t>(std::min<uint64_t>(since, std::numeric_limits<uint32_t>::max()));
  s.estimated = 0;
  return {};
}

status load_view::on_shared(uint32_t worker, uint32_t in_flight, bool alive, int64_t now_ms,
                            uint32_t estimated) {
  if (worker >= k()) return bad_worker(worker, k());
  slot& s = slots_[worker];
  if (!s.registered) return unregistered(worker);
  if (alive) s.last_report_ms = now_ms;
  load_[worker] = in_flight;
  s.estimated = std::min(estimated, in_flight);
  dirty_ = true;
  ++counters_.shared;
  return {};
}

status load_view::add_estimate(uint32_t worker, uint32_t n) {
  if (worker >= k()) return bad_worker(worker, k());
  slot& s = slots_[worker];
  if (!s.registered) return unregistered(worker);
  const uint32_t added = std::min(n, std::numeric_limits<uint32_t>::max() - load_[worker]);
  load_[worker] += added;
  s.estimated += added;
  dirty_ = true;
  counters_.estimated += n;
  return {};
}

status load_view::on_scrape_failed(uint32_t worker) {
  if (worker >= k()) return bad_worker(worker, k());
  ++slots_[worker].scrapes_failed;
  ++counters_.scrapes_failed;
  return {};
}

void load_view::expire_tracked(int64_t now_ms) {
  // Oldest first: on_route appends in call order, so the front is the oldest unless the owner's
  // clock went backwards, in which case expiry is delayed, never premature.
  while (!routes_.empty() && now_ms - routes_.front().routed_ms > options_.tracked_ttl_ms) {
    ++counters_.tracked_expired;
    forget(routes_.begin());
  }
}

void load_view::release(route_list::iterator it) {
  const uint32_t w = it->worker;
  if (w < k() && slots_[w].registered && slots_[w].generation == it->generation) {
    // A report may already have set the load below the router's count; never wrap.
    if (load_[w] > 0) --load_[w];
    slots_[w].estimated = std::min(slots_[w].estimated, load_[w]);
    ++slots_[w].finished;
    dirty_ = true;
  }
  forget(it);
}

void load_view::forget(route_list::iterator it) {
  by_id_.erase(std::string_view(it->id));
  routes_.erase(it);
}

bool load_view::live(const slot& s, int64_t now_ms) const {
  return options_.report_timeout_ms == 0 || now_ms - s.last_report_ms <= options_.report_timeout_ms;
}

worker_state load_view::state(uint32_t worker, int64_t now_ms) const {
  assert(worker < k());
  const slot& s = slots_[worker];
  if (!s.registered) return worker_state::unregistered;
  if (!live(s, now_ms)) return worker_state::dead;
  if (s.draining) return worker_state::draining;
  if (s.capacity != 0 && load_[worker] - s.estimated >= s.capacity) return worker_state::full;
  return worker_state::active;
}

void load_view::recompute_eligible(int64_t now_ms) {
  eligible_count_ = 0;
  valid_until_ms_ = never;
  for (uint32_t w = 0; w < k(); ++w) {
    const bool ok = state(w, now_ms) == worker_state::active;
    eligible_[w] = ok ? 1 : 0;
    eligible_count_ += ok ? 1u : 0u;
    // A live slot turns dead once now passes last report + timeout; a dead one revives only by a
    // report, which marks the cache dirty.
    const slot& s = slots_[w];
    if (s.registered && options_.report_timeout_ms != 0 && live(s, now_ms))
      valid_until_ms_ = std::min(valid_until_ms_, s.last_report_ms + options_.report_timeout_ms);
  }
  computed_ms_ = now_ms;
  dirty_ = false;
}

std::span<const uint8_t> load_view::eligible(int64_t now_ms) {
  if (dirty_ || now_ms < computed_ms_ || now_ms > valid_until_ms_) recompute_eligible(now_ms);
  return eligible_;
}

uint32_t load_view::eligible_count(int64_t now_ms) {
  eligible(now_ms);
  return eligible_count_;
}

load_view::routable_summary load_view::routable(int64_t now_ms) const {
  routable_summary out;
  for (const slot& s : slots_) {
    if (!s.registered || s.draining || !live(s, now_ms)) continue;
    ++out.workers;
    out.live_until_ms =
        options_.report_timeout_ms == 0
            ? never
            : std::max(out.live_until_ms, s.last_report_ms + options_.report_timeout_ms);
  }
  return out;
}

result<worker_snapshot> load_view::snapshot(uint32_t worker, int64_t now_ms) const {
  if (worker >= k()) return bad_worker(worker, k());
  const slot& s = slots_[worker];
  worker_snapshot out;
  out.index = worker;
  out.endpoint = s.endpoint;
  out.capacity = s.capacity;
  out.state = state(worker, now_ms);
  out.draining = s.draining;
  out.load = load_[worker];
  out.last_report_age_ms = s.registered ? now_ms - s.last_report_ms : -1;
  out.has_reported_seq = s.has_seq;
  out.reported_seq = s.seq;
  out.routed = s.routed;
  out.finished = s.finished;
  out.last_scrape_age_ms = s.registered && s.has_scrape ? now_ms - s.last_scrape_ms : -1;
  out.scrapes = s.scrapes;
  out.scrapes_failed = s.scrapes_failed;
  return out;
}

std::vector<worker_snapshot> load_view::snapshot_all(int64_t now_ms) const {
  std::vector<worker_snapshot> out;
  out.reserve(k());
  for (uint32_t w = 0; w < k(); ++w)
    out.push_back(std::move(snapshot(w, now_ms)).value());
  return out;
}

}  // namespace eldr
