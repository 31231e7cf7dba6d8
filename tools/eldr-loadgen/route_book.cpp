// route_book: the route requests' records and the route figures (route_book.hpp).
#include "tools/eldr-loadgen/route_book.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <variant>

#include "core/sim/simulator.hpp"

namespace eldr::loadgen {

route_book::route_book(std::string run_id, uint32_t requests, uint32_t workers, double warmup_s)
    : run_id_(std::move(run_id)), workers_(workers), warmup_s_(warmup_s), rec_(requests) {
  rtts_.reserve(requests);
}

void route_book::sending(uint32_t i, policy_result& res) {
  rec_[i].sent_at = wall_clock::now();
  if (res.sent == 0) first_send_ = rec_[i].sent_at;
  ++res.sent;
}

void route_book::send_failed(uint32_t i, policy_result& res) {
  rec_[i].fate = route_fate::send_error;
  ++res.errors;  // counted as an error, not retried
}

void route_book::sent(uint32_t i) {
  rec_[i].fate = route_fate::outstanding;
  ++outstanding_;
  in_order_.push_back(i);
}

std::optional<uint32_t> route_book::on_reply(const route_outcome& out, wall_clock::time_point now,
                                             policy_result& res) {
  const std::string* id = nullptr;
  if (const auto* rr = std::get_if<route_reply>(&out)) {
    id = &rr->id;
  } else if (const auto& er = std::get<error_reply>(out); er.id) {
    id = &*er.id;
  }
  const uint32_t N = static_cast<uint32_t>(rec_.size());
  uint32_t i = UINT32_MAX;
  if (id != nullptr && id->size() > run_id_.size() + 1 && id->rfind(run_id_ + "-", 0) == 0) {
    uint32_t v = 0;
    const char* b = id->data() + run_id_.size() + 1;
    if (std::from_chars(b, id->data() + id->size(), v).ec == std::errc{} && v < N) i = v;
  }
  const auto* er = std::get_if<error_reply>(&out);
  if (er != nullptr) {
    ++res.error_replies;
    ++res.error_codes[to_string(er->code)];
  }
  // Unmatched, a foreign id, or a late reply to a request already counted as timed out.
  if (i == UINT32_MAX || !rec_[i].outstanding()) return std::nullopt;
  request_record& rr = rec_[i];
  rr.fate = er != nullptr ? route_fate::error_reply : route_fate::replied;
  rr.received_at = now;
  --outstanding_;
  const double rtt_us = std::chrono::duration<double, std::micro>(now - rr.sent_at).count();
  const double sent_s = std::chrono::duration<double>(rr.sent_at - first_send_).count();
  if (sent_s >= warmup_s_) rtts_.push_back(rtt_us);
  const auto second = static_cast<size_t>(std::max(0.0, sent_s));
  if (second >= rtts_by_second_.size()) rtts_by_second_.resize(second + 1);
  rtts_by_second_[second].push_back(rtt_us);
  ++res.replied;
  last_reply_ = now;
  const auto* d = std::get_if<route_reply>(&out);
  if (d == nullptr) return std::nullopt;
  if (d->worker >= workers_) {
    ++res.error_replies;
    ++res.error_codes["worker_out_of_range"];
    rr.fate = route_fate::error_reply;
    return std::nullopt;
  }
  ++decisions_;
  ++res.decisions[d->worker];
  rr.epoch = d->epoch;
  epochs_.insert(d->epoch);
  if (d->total_blocks > 0)
    coverage_sum_ += static_cast<double>(d->covered_blocks) / d->total_blocks;
  return i;
}

void route_book::expire(wall_clock::time_point now, int timeout_ms, policy_result& res) {
  while (!in_order_.empty()) {
    request_record& r = rec_[in_order_.front()];
    if (r.outstanding() && now - r.sent_at < std::chrono::milliseconds(timeout_ms)) break;
    if (r.outstanding()) {
      r.fate = route_fate::timeout;
      --outstanding_;
      ++res.timeouts;
    }
    in_order_.pop_front();
  }
}

void route_book::summarize(policy_result& res) {
  const uint32_t D = workers_;
  res.route_max_us = rtts_.empty() ? 0.0 : *std::max_element(rtts_.begin(), rtts_.end());
  res.route_p50_us = percentile(rtts_, 0.50);
  res.route_p99_us = percentile(rtts_, 0.99);
  std::vector<double> every;
  for (auto& sec : rtts_by_second_) {
    policy_result::route_second rs;
    rs.replies = sec.size();
    if (!sec.empty()) {
      rs.max_us = *std::max_element(sec.begin(), sec.end());
      rs.p50_us = percentile(sec, 0.50);
      rs.p99_us = percentile(sec, 0.99);
    }
    res.route_seconds.push_back(rs);
    every.insert(every.end(), sec.begin(), sec.end());
  }
  res.route_p99_all_us = percentile(every, 0.99);
  const double span_s = std::chrono::duration<double>(last_reply_ - first_send_).count();
  res.route_rps = span_s > 0 ? static_cast<double>(res.replied) / span_s : 0.0;
  res.coverage_mean = decisions_ > 0 ? coverage_sum_ / static_cast<double>(decisions_) : 0.0;
  uint64_t max_d = 0;
  for (uint64_t d : res.decisions)
    max_d = std::max(max_d, d);
  res.decision_imbalance =
      decisions_ > 0 ? static_cast<double>(max_d) * D / static_cast<double>(decisions_) : 0.0;
  res.decision_cv = decision_cv(std::span<const uint64_t>(res.decisions));
  res.epochs.assign(epochs_.begin(), epochs_.end());
}

}  // namespace eldr::loadgen
