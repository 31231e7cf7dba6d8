// fit: the calibration pipeline behind eldr-fit and the simulator's static centroids.
#include "core/sim/fit.hpp"

#include <chrono>
#include <string>

#include "core/expert_counts.hpp"

namespace eldr {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

result<calibration_counts> count_trace(const trace& t, std::span<const uint32_t> requests) {
  const model_geometry& g = t.geometry;
  const std::size_t n = requests.empty() ? t.requests.size() : requests.size();
  calibration_counts cal;
  cal.geometry = g;
  const std::size_t w = g.width();
  cal.prefill.assign(n * w, 0);
  cal.decode.assign(n * w, 0);
  for (std::size_t r = 0; r < n; ++r) {
    const std::size_t index = requests.empty() ? r : requests[r];
    if (index >= t.requests.size())
      return status::invalid_argument("count_trace: request index " + std::to_string(index) +
                                      " out of range (" + std::to_string(t.requests.size()) +
                                      " requests)");
    const trace_request& req = t.requests[index];
    const uint32_t p = req.prompt_tokens, o = req.output_tokens;
    status s = add_token_counts(g, req.experts, 0, p, std::span(cal.prefill).subspan(r * w, w));
    if (s.ok())
      s = add_token_counts(g, req.experts, p, p + o, std::span(cal.decode).subspan(r * w, w));
    if (!s.ok()) return status(s.code(), "request " + req.id + ": " + s.message());
  }
  return cal;
}

std::vector<float> signature_points(const signature_spec& spec, std::span<const uint32_t> counts,
                                    std::size_t* zero_rows) {
  const std::size_t full = spec.geometry().width(), width = spec.width();
  const std::size_t n = full == 0 ? 0 : counts.size() / full;
  std::vector<float> points;
  points.reserve(n * width);
  std::vector<float> row(width);
  for (std::size_t r = 0; r < n; ++r) {
    spec.dense_from_counts(counts.subspan(r * full, full), row);
    bool any = false;
    for (float v : row)
      any = any || v != 0.0f;
    if (!any) {
      if (zero_rows != nullptr) ++*zero_rows;
      continue;
    }
    points.insert(points.end(), row.begin(), row.end());
  }
  return points;
}

std::string rho_pairs_warning(const fit_result& r) {
  const bool repeats =
      static_cast<double>(r.rho_pairs_distinct) < 0.9 * static_cast<double>(r.rho_pairs_requested);
  const bool few = r.rho_pairs_distinct < min_reliable_rho_pairs;
  if (!repeats && !few) return "";
  std::string w = "rho was measured on only " + std::to_string(r.rho_pairs_distinct) +
                  " distinct pairs (" + std::to_string(r.rho_pairs_requested) + " drawn; " +
                  std::to_string(r.rho_requests) + " requests with decode tokens allow " +
                  std::to_string(r.rho_pairs_possible) + ")";
  w += few ? ": too few for a reliable rank correlation (fewer than " +
                 std::to_string(min_reliable_rho_pairs) + "); calibrate on more requests"
           : ": the trace is too small for --pairs; rho and the layer selection rest on "
             "repeated pairs";
  return w;
}

result<fit_result> fit_centroids(const calibration_counts& cal, const fit_options& o) {
  if (o.workers == 0) return status::invalid_argument("fit: workers must be >= 1");
  const model_geometry& g = cal.geometry;
  fit_result out;

  // IDF and rho per transform over all layers, as in the paper's Fig. 7.
  auto idf = fit_idf(g, cal.prefill);
  if (!idf.ok()) return idf.error();
  std::optional<rho_evaluator> chosen_eval;
  double best = -2.0;
  for (std::size_t i = 0; i < std::size(all_transforms); ++i) {
    const signature_transform t = all_transforms[i];
    auto ev = rho_evaluator::make(cal, t, *idf, o.pairs, o.seed);
    if (!ev.ok()) return ev.error();
    out.rho[i] = ev->rho_all_layers();
    if (o.transform ? t == *o.transform : out.rho[i] > best) {
      best = out.rho[i];
      out.transform = t;
      chosen_eval = std::move(ev).value();
    }
  }

  out.rho_pairs_requested = o.pairs;
  out.rho_pairs_distinct = chosen_eval->distinct_pairs();
  out.rho_pairs_possible = chosen_eval->possible_pairs();
  out.rho_requests = chosen_eval->usable_requests();

  // Greedy forward layer selection on the chosen transform.
  std::vector<uint32_t> mask;
  out.rho_masked = chosen_eval->rho_all_layers();
  if (!o.skip_layer_selection) {
    const auto t0 = std::chrono::steady_clock::now();
    out.curve = select_layers(*chosen_eval, o.threads);
    out.layer_seconds = seconds_since(t0);
    if (!o.all_layers) {
      mask = out.curve.mask;
      out.rho_masked = out.curve.rho[out.curve.n_star - 1];
    }
  }
  auto spec = signature_spec::make(g, out.transform, mask, *idf);
  if (!spec.ok()) return spec.error();
  out.spec = std::make_shared<const signature_spec>(std::move(spec).value());

  // Signatures of the calibration prompts; all-zero ones carry no direction and are left out.
  const std::size_t width = out.spec->width();
  const std::vector<float> points = signature_points(*out.spec, cal.prefill, &out.zero_signatures);
  out.fit_points = points.size() / width;
  if (out.fit_points < o.workers)
    return status::invalid_argument("fit: only " + std::to_string(out.fit_points) +
                                    " calibration requests have a non-zero signature, fewer "
                                    "than the " +
                                    std::to_string(o.workers) + " workers");

  kmeans_options ko;
  ko.seed = o.seed;
  ko.threads = o.threads;
  ko.worker_weights = o.worker_weights;
  ko.variant = o.variant;
  auto t0 = std::chrono::steady_clock::now();
  auto k = balanced_kmeans(points, width, o.workers, ko);
  if (!k.ok()) return status(k.error().code(), "K-means: " + k.error().message());
  out.kmeans = std::move(k).value();
  out.kmeans_seconds = seconds_since(t0);
  if (o.fit_other_variant) {
    ko.variant =
        o.variant == kmeans_variant::balanced ? kmeans_variant::vanilla : kmeans_variant::balanced;
    t0 = std::chrono::steady_clock::now();
    auto other = balanced_kmeans(points, width, o.workers, ko);
    if (!other.ok()) return status(other.error().code(), "K-means: " + other.error().message());
    out.other = std::move(other).value();
    out.other_seconds = seconds_since(t0);
  }
  return out;
}

}  // namespace eldr
