// hot_swap: --swap-at's second set, its import and its measurement (hot_swap.hpp).
#include "tools/eldr-loadgen/hot_swap.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <nlohmann/json.hpp>

#include "core/base/version.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr::loadgen {

result<std::vector<uint8_t>> swap_centroid_bytes(session& s) {
  centroid_file f = s.imported;
  const uint32_t width =
      static_cast<uint32_t>(f.centroids.size() / std::max<uint32_t>(1, f.workers));
  uint64_t x = s.o->workload.seed * 0x9E3779B97F4A7C15ULL + s.current_epoch + 1;
  auto next = [&x] {  // splitmix64
    uint64_t z = (x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  };
  for (uint32_t k = 0; k < f.workers; ++k) {
    float* row = f.centroids.data() + std::size_t{k} * width;
    double norm = 0;
    for (uint32_t j = 0; j < width; ++j) {
      const double u = static_cast<double>(next() >> 11) / 9007199254740992.0;  // [0, 1)
      row[j] = static_cast<float>(row[j] * (0.95 + 0.1 * u));
      norm += static_cast<double>(row[j]) * row[j];
    }
    norm = std::sqrt(norm);
    if (norm > 0)
      for (uint32_t j = 0; j < width; ++j)
        row[j] = static_cast<float>(row[j] / norm);
  }
  f.epoch = s.current_epoch + 1;
  f.provenance.tool = "eldr-loadgen " + std::string(eldr::version) + " (--swap-at: perturbed)";
  if (status st = validate_centroid_file(f); !st.ok()) return st;
  return encode_centroid_file(f);
}

result<std::unique_ptr<hot_swap>> hot_swap::prepare(session& s) {
  std::unique_ptr<hot_swap> h(new hot_swap());
  h->model_ = s.model;
  auto f = swap_centroid_bytes(s);
  if (!f.ok()) return f.error();
  h->file_ = std::move(f).value();
  client_options ao;
  ao.timeout_ms = 30000;
  auto a = admin_client::connect(s.o->node, ao);
  if (!a.ok()) return a.error();
  h->admin_ = std::move(a).value();
  return h;
}

void hot_swap::start(const run_clock& clock, double at_s, const std::atomic<bool>& stop) {
  thread_ = std::thread([this, &clock, at_s, &stop] {
    const auto at = clock.start + std::chrono::duration_cast<wall_clock::duration>(
                                      std::chrono::duration<double>(at_s));
    while (!stop.load() && !run_over_.load() && wall_clock::now() < at)
      std::this_thread::sleep_for(
          std::min<wall_clock::duration>(at - wall_clock::now(), std::chrono::milliseconds(20)));
    if (stop.load() || run_over_.load()) return;
    nlohmann::json args = {{"model", model_}, {"file", nlohmann::json::binary(file_)}};
    t_sent_ = wall_clock::now();
    auto r = admin_->call("centroids.import", std::move(args));
    t_acked_ = wall_clock::now();
    if (!r.ok()) {
      failure_ = r.error();
    } else if (!r->is_object() || !r->contains("epoch") || !(*r)["epoch"].is_number_unsigned()) {
      failure_ =
          status::invalid_argument("centroids.import answered without an epoch: " + r->dump());
    } else {
      epoch_after_ = (*r)["epoch"].get<uint64_t>();
    }
    done_ = true;
  });
}

void hot_swap::finish() {
  run_over_.store(true);
  if (thread_.joinable()) thread_.join();
}

swap_result hot_swap::measure(const std::vector<request_record>& rec, uint64_t epoch_before) const {
  swap_result x;
  x.attempted = done_;
  x.epoch_before = epoch_before;
  if (done_ && !failure_.ok()) x.error = failure_.message();
  if (!imported()) return x;
  x.epoch_after = epoch_after_;
  auto ms = [&](wall_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - t_sent_).count();
  };
  x.import_ms = ms(t_acked_);
  const auto window = std::chrono::seconds(1);
  for (const request_record& r : rec) {
    if (r.fate == route_fate::unsent) continue;
    const bool near = r.sent_at >= t_sent_ - window && r.sent_at <= t_sent_ + window;
    if (near) {
      ++x.requests_in_window;
      if (r.fate != route_fate::replied) ++x.failed_during_swap;
    }
    if (r.fate != route_fate::replied) continue;
    if (r.epoch == x.epoch_after) {
      const double t = ms(r.received_at);
      if (!x.first_new_epoch_ms || t < *x.first_new_epoch_ms) x.first_new_epoch_ms = t;
    } else if (r.epoch < x.epoch_after) {
      const double t = ms(r.received_at);
      if (!x.last_old_epoch_ms || t > *x.last_old_epoch_ms) x.last_old_epoch_ms = t;
      if (r.sent_at > t_acked_) ++x.old_epoch_after_ack;
    }
  }
  return x;
}

}  // namespace eldr::loadgen
