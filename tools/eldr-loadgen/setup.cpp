// setup: the options, the node's status, the workload and the centroid set (setup.hpp).
#include "tools/eldr-loadgen/setup.hpp"

#include <algorithm>
#include <cmath>

#include "core/centroid_file.hpp"
#include "core/sim_policies.hpp"
#include "core/synthetic.hpp"
#include "core/trace.hpp"
#include "core/version.hpp"
#include "core/workload.hpp"

namespace eldr::loadgen {

using json = nlohmann::json;

status check_options(const loadgen_options& o) {
  if (o.trace_path.empty() == o.synthetic.empty())
    return status::invalid_argument("give exactly one of --trace and --synthetic");
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
  if (o.max_outstanding == 0) return status::invalid_argument("--max-outstanding must be >= 1");
  if (o.prompt_min > o.prompt_max)
    return status::invalid_argument("--prompt-min must be <= --prompt-max");
  if (o.report_ms == 0) return status::invalid_argument("--report-ms must be >= 1");
  if (o.swap_at && !(*o.swap_at >= 0 && std::isfinite(*o.swap_at)))
    return status::invalid_argument("--swap-at must be >= 0");
  if (o.swap_at && o.no_import)
    return status::invalid_argument(
        "--swap-at needs the centroid set the loadgen imports "
        "(not --no-import)");
  if (!o.synthetic.empty())
    if (auto p = synthetic_preset(o.synthetic); !p.ok()) return p.error();
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
  uint64_t source_size = 0;
  if (!o.trace_path.empty()) {
    auto t = read_trace_file(o.trace_path);
    if (!t.ok()) return t.error();
    source_size = t->requests.size();
    s.source_name = o.trace_path;
    s.source = make_trace_source(std::make_shared<const trace>(std::move(t).value()));
  } else {
    auto p = synthetic_preset(o.synthetic);
    if (!p.ok()) return p.error();
    p->seed = o.seed;
    p->prompt_min = o.prompt_min;
    p->prompt_max = o.prompt_max;
    p->output_min = p->output_max = o.output_tokens;
    // The lazy model draws request i from (seed, i) alone; params.requests only bounds the size
    // of a written trace (2^34 bytes of ids). A long route benchmark exceeds that bound, so it
    // is capped, which changes no request.
    const uint64_t longest =
        (uint64_t{p->prompt_max} + p->output_max) * p->geometry.layers * p->geometry.top_k;
    const uint64_t bound = (uint64_t{1} << 34) / std::max<uint64_t>(1, longest);
    p->requests = static_cast<uint32_t>(
        std::max<uint64_t>(1, std::min<uint64_t>(uint64_t{requests} + o.calibration, bound)));
    p->threads = o.threads;
    auto m = synthetic_model::make(*p);
    if (!m.ok()) return m.error();
    s.source_name = "synthetic:" + o.synthetic;
    s.source = make_synthetic_source(std::make_shared<const synthetic_model>(std::move(m).value()),
                                     o.decode_pool);
  }
  workload_options wo;
  wo.requests = requests;
  wo.calibration = o.calibration;
  wo.rate_rps = o.rate_rps;
  wo.seed = o.seed;
  wo.calibration_fraction = o.calibration_fraction;
  wo.prompt_pool = o.prompt_pool;
  wo.threads = o.threads;
  auto w = make_workload(s.source, source_size, wo);
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
    policy_factory_options fo;
    fo.workers = o.decode_workers;
    fo.seed = o.seed;
    fo.threads = o.threads;
    fo.pairs = o.pairs;
    auto factory = policy_factory::make(*s.w, fo, [&](const std::string& m) { say(o, m); });
    if (!factory.ok()) return factory.error();
    auto fit = factory->default_fit();
    if (!fit.ok()) return fit.error();
    const fit_result& fr = **fit;
    f.model_name = s.model;
    f.spec = *fr.spec;
    f.workers = o.decode_workers;
    f.centroids = fr.kmeans.centroids;
    f.provenance = {s.source_name, "eldr-loadgen " + std::string(eldr::version),
                    o.seed,        static_cast<uint32_t>(s.w->calibration.size()),
                    fr.rho_masked, fr.kmeans.objective,
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
