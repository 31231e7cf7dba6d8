// workload_builder: the shared workload options into core's objects (workload_builder.hpp).
#include "tools/common/workload_builder.hpp"

#include <algorithm>

namespace eldr::tools {
namespace {

// validate_synthetic_params refuses params whose largest trace would hold more than this many
// bytes of expert ids in memory.
constexpr uint64_t synthetic_memory_bound = uint64_t{1} << 34;

status synthetic_error(const status& s) {
  return status(s.code(), "--synthetic: " + s.message());
}

}  // namespace

status check_workload_spec(const workload_spec& spec) {
  if (spec.trace_path.empty() == spec.synthetic.empty())
    return status::invalid_argument("give exactly one of --trace and --synthetic");
  if (spec.shape && spec.shape->prompt_min > spec.shape->prompt_max)
    return status::invalid_argument("--prompt-min must be <= --prompt-max");
  return {};
}

std::string source_name(const workload_spec& spec) {
  return spec.trace_path.empty() ? "synthetic:" + spec.synthetic : spec.trace_path;
}

result<synthetic_params> synthetic_params_for(const workload_spec& spec, uint32_t requests) {
  auto p = synthetic_preset(spec.synthetic);
  if (!p.ok()) return p.error();
  p->seed = spec.seed;
  p->threads = spec.threads;
  if (requests > 0) p->requests = requests;
  if (spec.shape) {
    p->prompt_min = spec.shape->prompt_min;
    p->prompt_max = spec.shape->prompt_max;
    p->output_min = p->output_max = spec.shape->output_tokens;
    p->subdomains = spec.shape->subdomains;
    p->subdomain_weight = spec.shape->subdomain_weight;
  }
  return p;
}

result<workload_source> open_source(const workload_spec& spec, uint64_t requests) {
  workload_source out;
  out.name = source_name(spec);
  if (!spec.trace_path.empty()) {
    auto t = read_trace_file(spec.trace_path);
    if (!t.ok()) return t.error();
    out.size = t->requests.size();
    out.model_name = t->model_name;
    out.source = make_trace_source(std::make_shared<const trace>(std::move(t).value()));
    return out;
  }
  auto p = synthetic_params_for(spec, 0);  // the count, which no request depends on, is below
  if (!p.ok()) return synthetic_error(p.error());
  const uint64_t longest = (uint64_t{p->prompt_max} + p->output_max) * p->geometry.layers *
                           p->geometry.top_k * sizeof(expert_id);
  const uint64_t bound = synthetic_memory_bound / std::max<uint64_t>(1, longest);
  p->requests =
      static_cast<uint32_t>(std::clamp<uint64_t>(requests, 1, std::max<uint64_t>(1, bound)));
  auto m = synthetic_model::make(*p);
  if (!m.ok()) return synthetic_error(m.error());
  out.model_name = m->params().model_name;
  const uint32_t pool = spec.shape ? spec.shape->decode_pool : synthetic_shape{}.decode_pool;
  out.source =
      make_synthetic_source(std::make_shared<const synthetic_model>(std::move(m).value()), pool);
  return out;
}

result<workload> draw_workload(const workload_source& source, const workload_spec& spec,
                               uint32_t requests, double rate_rps) {
  workload_options wo;
  wo.requests = requests;
  wo.calibration = spec.calibration;
  wo.rate_rps = rate_rps;
  wo.seed = spec.seed;
  wo.calibration_fraction = spec.calibration_fraction;
  wo.prompt_pool = spec.prompt_pool;
  wo.drift_phases = spec.drift_phases;
  wo.threads = spec.threads;
  return make_workload(source.source, source.size, wo);
}

result<trace> load_trace(const workload_spec& spec, uint32_t requests) {
  if (!spec.trace_path.empty()) return read_trace_file(spec.trace_path);
  auto p = synthetic_params_for(spec, requests);
  if (!p.ok()) return synthetic_error(p.error());
  auto t = generate_synthetic(*p);
  if (!t.ok()) return synthetic_error(t.error());
  return t;
}

policy_factory_options policy_options(const workload_spec& spec, uint32_t workers) {
  policy_factory_options fo;
  fo.workers = workers;
  fo.seed = spec.seed;
  fo.threads = spec.threads;
  fo.pairs = spec.pairs;
  fo.refit.rule.seed = spec.seed;
  return fo;
}

}  // namespace eldr::tools
