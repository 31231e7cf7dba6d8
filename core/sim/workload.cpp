// workload: trace and synthetic request sources, and the seeded drawing of evaluated and
// calibration requests.
#include "core/sim/workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>

#include "core/base/parallel.hpp"
#include "core/base/random.hpp"
#include "core/expert_counts.hpp"

namespace eldr {
namespace {

class trace_decode_stream final : public decode_stream {
 public:
  trace_decode_stream(const expert_id* first, std::size_t stride, uint32_t tokens)
      : next_(first), stride_(stride), left_(tokens) {}
  void next(expert_id* out) override {
    // A request is never asked for more tokens than it has; past the end it repeats its last
    // token rather than read out of bounds.
    std::memcpy(out, next_, stride_ * sizeof(expert_id));
    if (left_ > 1) {
      next_ += stride_;
      --left_;
    }
  }

 private:
  const expert_id* next_;
  std::size_t stride_;
  uint32_t left_;
};

class trace_source final : public request_source {
 public:
  explicit trace_source(std::shared_ptr<const trace> t) : t_(std::move(t)) {}
  const model_geometry& geometry() const override { return t_->geometry; }
  uint32_t prompt_tokens(uint64_t i) const override { return t_->requests[i].prompt_tokens; }
  uint32_t output_tokens(uint64_t i) const override { return t_->requests[i].output_tokens; }
  const std::string& label(uint64_t i) const override { return t_->requests[i].label; }
  void prompt_experts(uint64_t i, std::vector<expert_id>& out) const override {
    const trace_request& r = t_->requests[i];
    const std::size_t n = std::size_t{r.prompt_tokens} * stride();
    out.assign(r.experts.begin(), r.experts.begin() + static_cast<std::ptrdiff_t>(n));
  }
  std::unique_ptr<decode_stream> open_decode(uint64_t i) const override {
    const trace_request& r = t_->requests[i];
    return std::make_unique<trace_decode_stream>(
        r.experts.data() + std::size_t{r.prompt_tokens} * stride(), stride(), r.output_tokens);
  }
  void add_decode_counts(uint64_t i, std::span<uint32_t> counts) const override {
    const trace_request& r = t_->requests[i];
    // The trace is validated, so this cannot fail.
    (void)add_token_counts(t_->geometry, r.experts, r.prompt_tokens,
                           r.prompt_tokens + r.output_tokens, counts);
  }
  const trace& data() const { return *t_; }

 private:
  std::size_t stride() const { return std::size_t{t_->geometry.layers} * t_->geometry.top_k; }
  std::shared_ptr<const trace> t_;
};

class synthetic_decode_stream final : public decode_stream {
 public:
  explicit synthetic_decode_stream(synthetic_decode_sampler s) : s_(std::move(s)) {}
  void next(expert_id* out) override { s_.next(out); }

 private:
  synthetic_decode_sampler s_;
};

class synthetic_source final : public request_source {
 public:
  synthetic_source(std::shared_ptr<const synthetic_model> m, uint32_t pool_tokens)
      : m_(std::move(m)), pool_tokens_(pool_tokens) {}
  const model_geometry& geometry() const override { return m_->geometry(); }
  uint32_t prompt_tokens(uint64_t i) const override { return m_->info(i).prompt_tokens; }
  uint32_t output_tokens(uint64_t i) const override { return m_->info(i).output_tokens; }
  const std::string& label(uint64_t i) const override {
    return m_->params().domains[m_->info(i).domain];
  }
  void prompt_experts(uint64_t i, std::vector<expert_id>& out) const override {
    m_->prompt_experts(i, out);
  }
  std::unique_ptr<decode_stream> open_decode(uint64_t i) const override {
    return std::make_unique<synthetic_decode_stream>(m_->open_decode(i, pool_tokens_));
  }
  void add_decode_counts(uint64_t i, std::span<uint32_t> counts) const override {
    const model_geometry& g = m_->geometry();
    synthetic_decode_sampler s = m_->open_decode(i, pool_tokens_);
    std::vector<expert_id> token(std::size_t{g.layers} * g.top_k);
    const uint32_t n = output_tokens(i);
    for (uint32_t t = 0; t < n; ++t) {
      s.next(token.data());
      (void)add_token_counts(g, token, 0, 1, counts);
    }
  }

 private:
  std::shared_ptr<const synthetic_model> m_;
  uint32_t pool_tokens_;
};

double exponential_draw(rng_engine& rng, double rate) {
  return -std::log(1.0 - uniform_unit(rng)) / rate;
}

}  // namespace

std::unique_ptr<request_source> make_trace_source(std::shared_ptr<const trace> t) {
  return std::make_unique<trace_source>(std::move(t));
}

std::unique_ptr<request_source> make_synthetic_source(std::shared_ptr<const synthetic_model> m,
                                                      uint32_t pool_tokens) {
  return std::make_unique<synthetic_source>(std::move(m), pool_tokens);
}

std::span<const uint32_t> workload::prefill_of(std::size_t request) const {
  const std::size_t w = geometry().width();
  return std::span(prefill_counts).subspan(prefill_row_of_request[request] * w, w);
}

result<workload> make_workload(std::shared_ptr<const request_source> source, uint64_t source_size,
                               const workload_options& o) {
  if (!(o.rate_rps >= 0.0 && std::isfinite(o.rate_rps)))
    return status::invalid_argument("workload: the rate must be a finite number >= 0");
  if (o.requests == 0) return status::invalid_argument("workload: requests must be >= 1");
  if (o.drift_phases > 1 && o.rate_rps == 0.0)
    return status::invalid_argument(
        "workload: drift phases need a rate (rate 0 replays the trace's order)");
  const auto* ts = dynamic_cast<const trace_source*>(source.get());
  workload w;
  w.source = source;
  rng_engine rng(o.seed ^ 0x3c6ef372fe94f82bull);

  // Pools: a trace is split by a seeded shuffle; the synthetic model evaluates requests
  // 0..N-1 and calibrates on N..N+C-1.
  std::vector<uint64_t> eval_pool;
  if (ts != nullptr) {
    if (source_size < 2)
      return status::invalid_argument(
          "workload: a trace needs at least 2 requests to split "
          "into calibration and evaluation");
    std::vector<uint64_t> order(source_size);
    for (uint64_t i = 0; i < source_size; ++i)
      order[i] = i;
    for (uint64_t i = source_size - 1; i > 0; --i)
      std::swap(order[i], order[uniform_index(rng, i + 1)]);
    uint64_t cal = static_cast<uint64_t>(std::llround(o.calibration_fraction * source_size));
    cal = std::clamp<uint64_t>(cal, 1, source_size - 1);
    cal = std::min<uint64_t>(cal, std::max<uint32_t>(o.calibration, 1));
    w.calibration.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(cal));
    eval_pool.assign(order.begin() + static_cast<std::ptrdiff_t>(cal), order.end());
    std::sort(eval_pool.begin(), eval_pool.end());
  } else {
    for (uint64_t i = 0; i < o.calibration; ++i)
      w.calibration.push_back(o.requests + i);
  }

  // Label indices in order of first use by the calibration requests.
  std::map<std::string, int32_t> index_of;
  for (uint64_t c : w.calibration) {
    const std::string& name = source->label(c);
    if (name.empty()) continue;
    auto [it, fresh] = index_of.emplace(name, static_cast<int32_t>(w.labels.size()));
    if (fresh) {
      w.labels.push_back(name);
      w.domain_counts.push_back(0);
    }
    ++w.domain_counts[static_cast<std::size_t>(it->second)];
  }
  auto label_index = [&](uint64_t i) {
    auto it = index_of.find(source->label(i));
    return it == index_of.end() ? -1 : it->second;
  };

  // Evaluated requests.
  const bool replay_arrivals = o.rate_rps == 0.0;
  const uint32_t pool_prompts = o.prompt_pool;
  std::vector<uint64_t> pool_sources;  // prefix caching: the distinct prompts
  if (pool_prompts > 0) {
    for (uint32_t k = 0; k < pool_prompts; ++k)
      pool_sources.push_back(ts != nullptr ? eval_pool[uniform_index(rng, eval_pool.size())] : k);
  }
  double clock = 0.0;
  rng_engine arrivals(o.seed ^ 0x6a09e667f3bcc909ull);
  for (uint32_t n = 0; n < o.requests; ++n) {
    sim_request r;
    if (pool_prompts > 0) {
      r.prompt_id = static_cast<uint32_t>(uniform_index(rng, pool_prompts));
      r.source = pool_sources[r.prompt_id];
    } else if (ts == nullptr) {
      r.source = n;
    } else if (replay_arrivals) {
      if (n >= eval_pool.size()) break;
      r.source = eval_pool[n];
    } else {
      r.source = eval_pool[uniform_index(rng, eval_pool.size())];
    }
    if (pool_prompts == 0) r.prompt_id = n;
    if (replay_arrivals) {
      const auto& arrival =
          ts != nullptr ? ts->data().requests[r.source].arrival_s : std::optional<double>{};
      if (!arrival)
        return status::invalid_argument(
            "workload: rate 0 replays the trace's arrival_s, but request " +
            std::to_string(r.source) + " has none; give a rate");
      r.arrival_s = *arrival;
    } else {
      clock += exponential_draw(arrivals, o.rate_rps);
      r.arrival_s = clock;
    }
    r.prompt_tokens = source->prompt_tokens(r.source);
    r.output_tokens = source->output_tokens(r.source);
    r.label = label_index(r.source);
    w.requests.push_back(r);
  }
  if (o.drift_phases > 1) {
    // Label l (in order of first calibration use) is in phase l * phases / labels; unlabelled
    // requests in the first.
    const auto phase = [&](const sim_request& r) {
      return r.label < 0 ? uint64_t{0}
                         : static_cast<uint64_t>(r.label) * o.drift_phases / w.labels.size();
    };
    std::vector<double> arrivals_in_order;
    for (const sim_request& r : w.requests)
      arrivals_in_order.push_back(r.arrival_s);
    std::stable_sort(
        w.requests.begin(), w.requests.end(),
        [&](const sim_request& a, const sim_request& b) { return phase(a) < phase(b); });
    for (std::size_t n = 0; n < w.requests.size(); ++n)
      w.requests[n].arrival_s = arrivals_in_order[n];
  }
  if (replay_arrivals) {
    std::stable_sort(
        w.requests.begin(), w.requests.end(),
        [](const sim_request& a, const sim_request& b) { return a.arrival_s < b.arrival_s; });
    const double t0 = w.requests.empty() ? 0.0 : w.requests.front().arrival_s;
    for (sim_request& r : w.requests)
      r.arrival_s -= t0;
  }

  // Prefill counts, once per distinct source.
  std::map<uint64_t, uint32_t> row_of;
  for (const sim_request& r : w.requests) {
    auto [it, fresh] = row_of.emplace(r.source, static_cast<uint32_t>(w.prefill_sources.size()));
    if (fresh) w.prefill_sources.push_back(r.source);
    w.prefill_row_of_request.push_back(it->second);
  }
  const model_geometry& g = source->geometry();
  const std::size_t width = g.width();
  w.prefill_counts.assign(w.prefill_sources.size() * width, 0);
  parallel_for_each_index(o.threads, w.prefill_sources.size(), [&](std::size_t k) {
    thread_local std::vector<expert_id> ids;
    source->prompt_experts(w.prefill_sources[k], ids);
    (void)add_token_counts(g, ids, 0, static_cast<uint32_t>(ids.size() / (g.layers * g.top_k)),
                           std::span(w.prefill_counts).subspan(k * width, width));
  });
  return w;
}

calibration_counts count_calibration(const workload& w, uint32_t threads) {
  const model_geometry& g = w.geometry();
  const std::size_t width = g.width();
  calibration_counts cal;
  cal.geometry = g;
  cal.prefill.assign(w.calibration.size() * width, 0);
  cal.decode.assign(w.calibration.size() * width, 0);
  parallel_for_each_index(threads, w.calibration.size(), [&](std::size_t k) {
    thread_local std::vector<expert_id> ids;
    w.source->prompt_experts(w.calibration[k], ids);
    (void)add_token_counts(g, ids, 0, static_cast<uint32_t>(ids.size() / (g.layers * g.top_k)),
                           std::span(cal.prefill).subspan(k * width, width));
    w.source->add_decode_counts(w.calibration[k], std::span(cal.decode).subspan(k * width, width));
  });
  return cal;
}

}  // namespace eldr
