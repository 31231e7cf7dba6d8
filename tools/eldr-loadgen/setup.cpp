// setup: the options, the node's status, the workload and the centroid set (setup.hpp).
#include "tools/eldr-loadgen/setup.hpp"

#include <algorithm>
#include <cmath>

#include "core/base/version.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/sim/sim_policies.hpp"
#include "core/sim/synthetic.hpp"
#include "core/sim/workload.hpp"
#include "tools/common/workload_builder.hpp"

namespace eldr::loadgen {

using json = nlohmann::json;

status check_options(const loadgen_options& o) {
  if (status st = tools::check_workload_spec(o.workload); !st.ok()) return st;
  if (!(o.rate_rps > 0 && std::isfinite(o.rate_rps)))
    return status::invalid_argument("--rate must be > 0");
  if (!(o.duration_s > 0 && std::isfinite(o.duration_s)))
    return status::invalid_argument("--duration must be > 0");
  if (o.decode_workers == 0) return status::invalid_argument("--decode-workers must be >= 1");
  if (o.prefill_workers == 0) return status::invalid_argument("--prefill-workers must be >= 1");
  if (o.block_size == 0 || o.block_size > 255)
    return status::invalid_argument("--block-size must be in 1..255");
  if (!(o.time_scale > 0 && std::isfinite(o.time_scale)))
    return status::invalid_argument("--time-scale must be > 0");
  if (o.policies.empty()) return status::invalid_argument("--policies is empty");
  if (!o.router_weights.empty()) {
    if (o.router_weights.size() != o.routers.size())
      return status::invalid_argument("--router-weights needs one weight per --routers entry");
    if (std::all_of(o.router_weights.begin(), o.router_weights.end(),
                    [](uint32_t w) { return w == 0; }))
      return status::invalid_argument("--router-weights: every weight is 0");
  }
  if (o.routers_by_prefill && !o.router_weights.empty())
    return status::invalid_argument(
        "--routers-by-prefill and --router-weights: the prefill workers pick the routers");
  if (o.max_outstanding == 0) return status::invalid_argument("--max-outstanding must be >= 1");
  if (o.report_ms == 0) return status::invalid_argument("--report-ms must be >= 1");
  if (o.swap_at && !(*o.swap_at >= 0 && std::isfinite(*o.swap_at)))
    return status::invalid_argument("--swap-at must be >= 0");
  if (o.swap_at && o.no_import)
    return status::invalid_argument(
        "--swap-at needs the centroid set the loadgen imports "
        "(not --no-import)");
  if (!o.workload.synthetic.empty())
    if (auto p = synthetic_preset(o.workload.synthetic); !p.ok()) return p.error();
  return o.cost.validate();
}

status read_status(session& s, const json& st) {
  const loadgen_options& o = *s.o;
  if (!st.is_object() || !st.contains("endpoints") || !st["endpoints"].is_object())
    return status::invalid_argument("the node's status has no endpoints");
  const json& ep = st["endpoints"];
  for (const char* k : {"route", "worker"})
    if (!ep.contains(k) || !ep[k].is_string() || ep[k].get<std::string>().empty())
      return status::invalid_argument(std::string("the node's status names no ") + k + " endpoint");
  s.route_endpoint = reachable(ep["route"].get<std::string>(), o.node);
  s.worker_endpoint = reachable(ep["worker"].get<std::string>(), o.node);
  const json models = st.value("models", json::array());
  const json* chosen = nullptr;
  if (models.is_array())
    for (const json& m : models) {
      if (!m.is_object() || !m.contains("name") || !m["name"].is_string()) continue;
      if (o.model.empty() || m["name"].get<std::string>() == o.model) {
        chosen = &m;
        break;
      }
    }
  if (chosen != nullptr) {
    s.model = (*chosen)["name"].get<std::string>();
    // Only a pool whose size the node's config fixes must match; an open pool takes K from
    // the centroid set the loadgen imports and from the workers it registers.
    const bool k_fixed = !chosen->contains("k_fixed") ||
                         ((*chosen)["k_fixed"].is_boolean() && (*chosen)["k_fixed"].get<bool>());
    if (k_fixed && chosen->contains("k") && (*chosen)["k"].is_number_unsigned() &&
        (*chosen)["k"].get<uint32_t>() != 0 && (*chosen)["k"].get<uint32_t>() != o.decode_workers)
      return status::invalid_argument("the node's model " + s.model +
                                      " has K = " + std::to_string((*chosen)["k"].get<uint32_t>()) +
                                      " decode workers, but " + "--decode-workers is " +
                                      std::to_string(o.decode_workers));
    if (chosen->contains("epoch") && (*chosen)["epoch"].is_number_unsigned())
      s.import_epoch = (*chosen)["epoch"].get<uint64_t>() + 1;
  } else if (!o.model.empty()) {
    return status::invalid_argument("the node serves no model named " + o.model);
  } else {
    s.model = "default";
  }
  if (s.import_epoch == 0) s.import_epoch = 1;
  return {};
}

status build_workload(session& s) {
  const loadgen_options& o = *s.o;
  const uint32_t requests =
      static_cast<uint32_t>(std::max(1.0, std::ceil(o.rate_rps * o.duration_s)));
  auto source = tools::open_source(o.workload, uint64_t{requests} + o.workload.calibration);
  if (!source.ok()) return source.error();
  s.source_name = source->name;
  s.source = source->source;
  auto w = tools::draw_workload(*source, o.workload, requests, o.rate_rps);
  if (!w.ok()) return w.error();
  s.w = std::make_unique<workload>(std::move(w).value());
  return {};
}

result<std::vector<uint8_t>> centroid_bytes(session& s) {
  const loadgen_options& o = *s.o;
  centroid_file f;
  if (!o.centroids.empty()) {
    auto read = read_centroid_file(o.centroids);
    if (!read.ok()) return read.error();
    f = std::move(read).value();
  } else {
    auto factory = policy_factory::make(*s.w, tools::policy_options(o.workload, o.decode_workers),
                                        [&](const std::string& m) { say(o, m); });
    if (!factory.ok()) return factory.error();
    auto fit = factory->default_fit();
    if (!fit.ok()) return fit.error();
    const fit_result& fr = **fit;
    f.model_name = s.model;
    f.spec = *fr.spec;
    f.workers = o.decode_workers;
    f.centroids = fr.kmeans.centroids;
    f.provenance = {s.source_name,   "eldr-loadgen " + std::string(eldr::version),
                    o.workload.seed, static_cast<uint32_t>(s.w->calibration.size()),
                    fr.rho_masked,   fr.kmeans.objective,
                    "balanced"};
  }
  f.model_name = s.model;
  f.epoch = std::max(f.epoch, s.import_epoch);
  if (f.spec.geometry() != s.w->geometry())
    return status::invalid_argument("the centroid file is for a model of " +
                                    f.spec.geometry().to_string() + " but the workload is " +
                                    s.w->geometry().to_string());
  if (f.workers != o.decode_workers)
    return status::invalid_argument("the centroid file has " + std::to_string(f.workers) +
                                    " centroids for " + std::to_string(o.decode_workers) +
                                    " decode workers");
  if (status st = validate_centroid_file(f); !st.ok()) return st;
  s.imported = f;
  s.have_imported = true;
  return encode_centroid_file(f);
}

}  // namespace eldr::loadgen
