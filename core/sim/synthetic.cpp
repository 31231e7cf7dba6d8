// synthetic: presets, parameter checks, and the generator (alias tables for O(1) weighted draws,
// rejection of repeats for sampling without replacement).
#include "core/sim/synthetic.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <sstream>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>

#include "core/base/random.hpp"
#include "core/expert_ids.hpp"

namespace eldr {

namespace {

// ---- randomness: rng_engine (std::mt19937_64) is specified bit for bit, and every draw goes
// through core/base/random.hpp or the helpers below, never std::*_distribution ----

// SplitMix64's finaliser: derives independent stream seeds from (seed, purpose, index), so that
// request i is the same whatever the request count.
uint64_t mix_seed(uint64_t seed, uint64_t purpose, uint64_t index) {
  uint64_t z = seed ^ (purpose * 0x9e3779b97f4a7c15ull) ^ (index * 0xbf58476d1ce4e5b9ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n standard normal values (Box-Muller, both values of each pair used).
void fill_normals(rng_engine& rng, double* out, size_t n) {
  for (size_t i = 0; i < n; i += 2) {
    const double u1 = 1.0 - uniform_unit(rng);  // (0, 1]: the log stays finite
    const double u2 = uniform_unit(rng);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[i] = radius * std::cos(2.0 * std::numbers::pi * u2);
    if (i + 1 < n) out[i + 1] = radius * std::sin(2.0 * std::numbers::pi * u2);
  }
}

// Exponential with the given rate (> 0).
double exponential(rng_engine& rng, double rate) {
  return -std::log(1.0 - uniform_unit(rng)) / rate;
}

// Integer in [lo, hi] with log(n + 1) uniform: short lengths as likely per octave as long ones,
// and defined for lo = 0 (output lengths).
uint32_t log_uniform(rng_engine& rng, uint32_t lo, uint32_t hi) {
  if (lo >= hi) return lo;
  const double a = std::log(static_cast<double>(lo) + 1.0);
  const double b = std::log(static_cast<double>(hi) + 2.0);
  const double x = std::floor(std::exp(a + uniform_unit(rng) * (b - a))) - 1.0;
  return static_cast<uint32_t>(std::clamp(x, static_cast<double>(lo), static_cast<double>(hi)));
}

// Walker/Vose alias tables, one per layer over E experts: one 64-bit draw per sample and no
// data-dependent branch. The high 32 bits pick a column (multiply-shift, bias below 2^-24), the
// low bits flip its biased coin. A column packs its coin threshold and its alias in 4 bytes, so a
// 48 x 128 model's tables fit in L1: for E <= 256 the alias takes 8 bits and the threshold 24
// (weights resolve to 2^-24 of a column), above that the alias takes 12 bits and the threshold 20
// (2^-20). Models of up to 256 experts draw exactly what they drew before ids were widened.
class alias_tables {
 public:
  alias_tables(uint32_t layers, uint32_t n)
      : n_(n), alias_bits_(n <= narrow_experts ? 8 : 12), entries_(size_t{layers} * n) {}

  // Rebuilds layer l from n non-negative weights with a positive sum.
  void build(uint32_t l, const double* weights) {
    uint32_t* table = &entries_[size_t{l} * n_];
    double sum = 0.0;
    for (uint32_t i = 0; i < n_; ++i)
      sum += weights[i];
    scaled_.resize(n_);
    small_.clear();
    large_.clear();
    for (uint32_t i = 0; i < n_; ++i) {
      scaled_[i] = weights[i] * n_ / sum;
      (scaled_[i] < 1.0 ? small_ : large_).push_back(static_cast<expert_id>(i));
    }
    while (!small_.empty() && !large_.empty()) {
      const expert_id s = small_.back(), g = large_.back();
      small_.pop_back();
      table[s] = pack(scaled_[s], g);
      scaled_[g] -= 1.0 - scaled_[s];
      if (scaled_[g] < 1.0) {
        large_.pop_back();
        small_.push_back(g);
      }
    }
    // What is left is 1 up to rounding: a column that is its own alias always keeps itself.
    for (expert_id i : small_)
      table[i] = pack(0.0, i);
    for (expert_id i : large_)
      table[i] = pack(0.0, i);
  }

  expert_id draw(uint32_t l, uint64_t r) const {
    return draw_from(&entries_[size_t{l} * n_], n_, alias_bits_, r);
  }
  const uint32_t* layer(uint32_t l) const { return &entries_[size_t{l} * n_]; }
  uint32_t size() const { return n_; }
  uint32_t alias_bits() const { return alias_bits_; }

  // draw() on one layer's table, for loops that keep the table pointer in a register.
  static expert_id draw_from(const uint32_t* table, uint32_t n, uint32_t alias_bits, uint64_t r) {
    const uint64_t column = ((r >> 32) * n) >> 32;
    const uint32_t e = table[column];
    const uint32_t coin = static_cast<uint32_t>(r) & (0xffffffffu >> alias_bits);
    // Select by mask, not ?: -- g++ emits a branch for that, which mispredicts on every other coin.
    const uint32_t keep_mask = 0u - static_cast<uint32_t>(coin < (e >> alias_bits));
    const uint32_t alias = e & ((1u << alias_bits) - 1u);
    return static_cast<expert_id>(alias ^ ((static_cast<uint32_t>(column) ^ alias) & keep_mask));
  }

 private:
  // threshold in the high 32 - alias_bits bits (keep the column when the coin is below), alias in
  // the low alias_bits.
  uint32_t pack(double keep_probability, expert_id alias) const {
    const double t =
        std::clamp(keep_probability, 0.0, 1.0) * static_cast<double>(0xffffffffu >> alias_bits_);
    return (static_cast<uint32_t>(t) << alias_bits_) | alias;
  }

  uint32_t n_;
  uint32_t alias_bits_;
  std::vector<uint32_t> entries_;  // [l][column]
  // Scratch for build(), kept to avoid reallocating per request and layer.
  std::vector<double> scaled_;
  std::vector<expert_id> small_, large_;
};

// Zipf-like weights over a fresh random permutation of n experts: a different favourite set per
// (domain, layer).
void zipf_over_permutation(rng_engine& rng, uint32_t n, double exponent, double* out) {
  std::vector<uint32_t> order(n);
  for (uint32_t i = 0; i < n; ++i)
    order[i] = i;
  for (uint32_t i = n - 1; i > 0; --i)
    std::swap(order[i], order[uniform_index(rng, i + 1)]);
  double sum = 0.0;
  for (uint32_t rank = 0; rank < n; ++rank) {
    const double w = std::pow(static_cast<double>(rank) + 1.0, -exponent);
    out[order[rank]] = w;
    sum += w;
  }
  for (uint32_t i = 0; i < n; ++i)
    out[i] /= sum;
}

// False for NaN too.
bool in_unit_interval(double x) {
  return x >= 0.0 && x <= 1.0;
}

std::string describe(const synthetic_params& p) {
  std::ostringstream s;
  s << "eldr synthetic generator: preset=" << p.preset << " seed=" << p.seed
    << " requests=" << p.requests << " domains=" << p.domains.size()
    << " zipf_exponent=" << p.zipf_exponent << " global_blend=" << p.global_blend
    << " secondary_weight_max=" << p.secondary_weight_max << " request_noise=" << p.request_noise
    << " reuse_probability=" << p.reuse_probability << " subdomains=" << p.subdomains
    << " subdomain_weight=" << p.subdomain_weight << " prompt=" << p.prompt_min << ".."
    << p.prompt_max << " output=" << p.output_min << ".." << p.output_max
    << " arrival_rate=" << p.arrival_rate;
  return s.str();
}

// Stream purposes for mix_seed.
constexpr uint64_t stream_domains = 1, stream_request = 2, stream_arrivals = 3, stream_decode = 4,
                   stream_subdomains = 5;

// A counter-based generator (SplitMix64) for the simulator's lazily sampled decode tokens: a
// request's decode stream is drawn again for every simulated policy, 1.4 G ids for 7,200 requests
// of 512 tokens, and mt19937_64's state refills are measurably slower there. Fully specified, so
// portable like rng_engine.
struct fast_engine {
  uint64_t state;
  using result_type = uint64_t;
  uint64_t operator()() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

template <class Engine>
double unit_draw(Engine& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);  // as uniform_unit
}

// Per-expert stamps: mark[e] == round means e is already among this token's choices at this
// layer. A stamp rather than a bitmask, so that successive draws do not serialise on one word.
struct choice_marks {
  explicit choice_marks(uint32_t experts) : mark(experts, 0) {}
  std::vector<uint32_t> mark;  // one per expert
  uint32_t round = 0;
  void next_round() {
    if (++round == 0) {  // wrapped after 2^32 token-layers: old stamps could collide
      clear();
      round = 1;
    }
  }
  void clear() { std::fill(mark.begin(), mark.end(), 0u); }
};

// Routes one token: at every layer, k distinct experts from tables (the request's distribution,
// whose exact weights are `weights`, [l][e]), first keeping each of the previous token's experts
// (prev, nullptr for the first token) with probability reuse_threshold / 65536. Written without
// data-dependent branches where it can be: the choices are random, so branches would mispredict
// half the time.
template <class Engine, class Weight>
void route_token(const model_geometry& g, uint32_t reuse_threshold, const alias_tables& tables,
                 const Weight* weights, Engine& rng, const expert_id* prev, expert_id* out,
                 choice_marks& marks) {
  const uint32_t L = g.layers, E = g.experts, k = g.top_k;
  uint32_t* const mark = marks.mark.data();
  for (uint32_t l = 0; l < L; ++l, out += k) {
    marks.next_round();
    const uint32_t round = marks.round;
    uint32_t n = 0;
    if (prev != nullptr && reuse_threshold > 0) {
      const expert_id* before = prev + size_t{l} * k;
      uint64_t coins = 0;
      for (uint32_t c = 0; c < k; ++c) {
        if (c % 4 == 0) coins = rng();  // four 16-bit coins per draw
        const uint32_t keep = (coins & 0xffffu) < reuse_threshold;
        coins >>= 16;
        out[n] = before[c];  // distinct already: they were one token's choices
        n += keep;
        mark[before[c]] = keep * round;  // 0 (never a live round) when not kept
      }
    }
    // Rejecting repeats samples exactly from the distribution renormalised over the experts not
    // yet chosen. When most of the mass is already taken (large k, steep weights) that could
    // loop long, so after a bounded number of misses draw from what is left directly.
    uint32_t misses = 0;
    while (n < k) {
      const expert_id e = tables.draw(l, rng());
      const uint32_t fresh = mark[e] != round;
      out[n] = e;  // kept only if fresh: n does not advance otherwise
      n += fresh;
      mark[e] = round;
      misses += 1 - fresh;
      if (misses <= 16 * k) continue;
      const Weight* w = weights + size_t{l} * E;
      double left = 0.0;
      for (uint32_t x = 0; x < E; ++x)
        if (mark[x] != round) left += w[x];
      double u = unit_draw(rng) * left;
      expert_id pick = 0;
      for (uint32_t x = 0; x < E; ++x) {
        if (mark[x] == round) continue;
        pick = static_cast<expert_id>(x);  // the last free one absorbs rounding
        u -= w[x];
        if (u < 0.0) break;
      }
      out[n++] = pick;
      mark[pick] = round;
      misses = 0;
    }
  }
}

uint32_t reuse_threshold_of(double reuse) {
  return static_cast<uint32_t>(std::lround(reuse * 65536.0));
}

// Routes tokens [0, tokens) of a request into out (tokens * L * k ids, token-major).
void route_tokens(const model_geometry& g, double reuse, const alias_tables& tables,
                  const std::vector<double>& weights, rng_engine& rng, uint64_t tokens,
                  expert_id* out) {
  const size_t stride = size_t{g.layers} * g.top_k;  // ids per token
  const uint32_t threshold = reuse_threshold_of(reuse);
  choice_marks marks(g.experts);
  for (uint64_t tok = 0; tok < tokens; ++tok, out += stride)
    route_token(g, threshold, tables, weights.data(), rng, tok > 0 ? out - stride : nullptr, out,
                marks);
}

// Per-(domain, layer) distributions, [d][l][e], already blended with the global one.
std::vector<double> make_domain_weights(const synthetic_params& p) {
  const uint32_t L = p.geometry.layers, E = p.geometry.experts;
  const size_t LE = size_t{L} * E;
  std::vector<double> domain_weights(p.domains.size() * LE);
  rng_engine rng(mix_seed(p.seed, stream_domains, 0));
  std::vector<double> global(LE), own(E);
  for (uint32_t l = 0; l < L; ++l)
    zipf_over_permutation(rng, E, p.zipf_exponent, &global[size_t{l} * E]);
  for (size_t d = 0; d < p.domains.size(); ++d)
    for (uint32_t l = 0; l < L; ++l) {
      zipf_over_permutation(rng, E, p.zipf_exponent, own.data());
      double* dst = &domain_weights[d * LE + size_t{l} * E];
      for (uint32_t e = 0; e < E; ++e)
        dst[e] = (1.0 - p.global_blend) * own[e] + p.global_blend * global[size_t{l} * E + e];
    }
  // Sub-domains, [d][s][l][e] after the domains, from a stream of their own so that the domains
  // are the same with and without them.
  if (p.subdomains > 0) {
    rng_engine sub(mix_seed(p.seed, stream_subdomains, 0));
    const size_t first = domain_weights.size();
    domain_weights.resize(first + p.domains.size() * p.subdomains * LE);
    for (size_t ds = 0; ds < p.domains.size() * p.subdomains; ++ds)
      for (uint32_t l = 0; l < L; ++l)
        zipf_over_permutation(sub, E, p.zipf_exponent,
                              &domain_weights[first + ds * LE + size_t{l} * E]);
  }
  return domain_weights;
}

// The first draws of request i's stream: its domain, lengths, and its own distribution
// (`weights`, [l][e]: its domain, a little of another, jittered; `noise` is scratch of the same
// size). rng is left positioned at the request's first token.
synthetic_request_info draw_request(const synthetic_params& p,
                                    const std::vector<double>& domain_weights, rng_engine& rng,
                                    std::vector<double>& weights, std::vector<double>& noise) {
  const size_t D = p.domains.size();
  const size_t LE = size_t{p.geometry.layers} * p.geometry.experts;
  synthetic_request_info info;
  const size_t primary = uniform_index(rng, D);
  info.domain = static_cast<uint32_t>(primary);
  info.prompt_tokens = log_uniform(rng, p.prompt_min, p.prompt_max);
  info.output_tokens = log_uniform(rng, p.output_min, p.output_max);
  size_t secondary = primary;
  double mix = 0.0;
  if (D > 1) {
    secondary = (primary + 1 + uniform_index(rng, D - 1)) % D;
    mix = uniform_unit(rng) * p.secondary_weight_max;
  }
  const double* a = &domain_weights[primary * LE];
  const double* b = &domain_weights[secondary * LE];
  weights.resize(LE);
  for (size_t j = 0; j < LE; ++j)
    weights[j] = (1.0 - mix) * a[j] + mix * b[j];
  if (p.subdomains > 0) {  // a topic within the domain (drawn only then: streams stay unchanged)
    const size_t topic = uniform_index(rng, p.subdomains);
    const double* t = &domain_weights[(D + primary * p.subdomains + topic) * LE];
    const double w = (1.0 - mix) * p.subdomain_weight;
    for (size_t j = 0; j < LE; ++j)
      weights[j] = (1.0 - w) * weights[j] + w * t[j];
  }
  if (p.request_noise > 0.0) {
    noise.resize(LE);
    fill_normals(rng, noise.data(), LE);
    for (size_t j = 0; j < LE; ++j)
      weights[j] *= std::exp(p.request_noise * noise[j]);
  }
  return info;
}

}  // namespace

status validate_synthetic_params(const synthetic_params& p) {
  auto bad = [](const std::string& what) {
    return status::invalid_argument("synthetic params: " + what);
  };
  if (status s = p.geometry.validate(); !s.ok()) return bad(s.message());
  if (p.domains.empty()) return bad("domains must not be empty");
  std::unordered_set<std::string> seen;
  for (const std::string& d : p.domains) {
    if (d.empty()) return bad("domain labels must not be empty");
    if (!seen.insert(d).second) return bad("duplicate domain label \"" + d + "\"");
  }
  if (!(p.zipf_exponent >= 0.0 && std::isfinite(p.zipf_exponent)))
    return bad("zipf_exponent must be a finite number >= 0");
  if (!in_unit_interval(p.global_blend)) return bad("global_blend must be in [0, 1]");
  if (!in_unit_interval(p.secondary_weight_max))
    return bad("secondary_weight_max must be in [0, 1]");
  if (!(p.request_noise >= 0.0 && p.request_noise <= 10.0))
    return bad("request_noise must be in [0, 10]");
  if (!in_unit_interval(p.reuse_probability)) return bad("reuse_probability must be in [0, 1]");
  if (p.subdomains > 64) return bad("subdomains must be in 0..64");
  if (!in_unit_interval(p.subdomain_weight)) return bad("subdomain_weight must be in [0, 1]");
  if (p.prompt_min < 1) return bad("prompt_min must be >= 1");
  if (p.prompt_min > p.prompt_max) return bad("prompt_min must be <= prompt_max");
  if (p.output_min > p.output_max) return bad("output_min must be <= output_max");
  if (p.threads < 1 || p.threads > 256) return bad("threads must be in 1..256");
  if (!(p.arrival_rate >= 0.0 && std::isfinite(p.arrival_rate)))
    return bad("arrival_rate must be a finite number >= 0");

  const uint64_t per_token = uint64_t{p.geometry.layers} * p.geometry.top_k;
  const uint64_t longest = (uint64_t{p.prompt_max} + p.output_max) * per_token;  // ids
  const uint64_t longest_bytes = longest * id_bytes_for(p.geometry);             // in a trace file
  if (longest_bytes > std::numeric_limits<uint32_t>::max())
    return status::out_of_range(
        "synthetic params: a request of prompt_max + output_max tokens needs " +
        std::to_string(longest_bytes) + " bytes of expert ids, more than a trace request holds");
  // At most 2^34 bytes of ids in memory (2 bytes each), so that a typo fails instead of
  // exhausting memory.
  constexpr uint64_t max_total = uint64_t{1} << 34;
  const uint64_t total_bytes = longest * p.requests * sizeof(expert_id);
  if (total_bytes > max_total)
    return status::out_of_range("synthetic params: up to " + std::to_string(total_bytes) +
                                " bytes of expert ids in memory, above the 2^34 limit");
  return {};
}

namespace {

// The task presets' domains and locality, calibrated on the Qwen3-30B-A3B shape
// (docs/evaluation.md): batches of one domain touch 20-21% fewer distinct experts per layer than
// mixed ones at 10-24 running sequences, the paper's 17-21%.
void set_task_locality(synthetic_params& p) {
  p.domains = {"code", "math", "medical", "legal"};
  p.zipf_exponent = 1.4;
  p.global_blend = 0.0;
  p.secondary_weight_max = 0.05;
  p.request_noise = 0.6;
}

}  // namespace

result<synthetic_params> synthetic_preset(std::string_view name) {
  synthetic_params p;
  p.preset = std::string(name);
  if (name == "qwen-task" || name == "no-locality") {
    p.model_name = "synthetic, Qwen3-30B-A3B shape";
    p.geometry = {48, 128, 8};
    set_task_locality(p);
    if (name == "no-locality") {
      p.global_blend = 1.0;  // every domain is the shared distribution
      p.secondary_weight_max = 0.0;
    }
  } else if (name == "qwen-language") {
    p.model_name = "synthetic, Qwen3-30B-A3B shape";
    p.geometry = {48, 128, 8};
    p.domains = {"english", "chinese", "russian", "spanish", "french", "german"};
    // Calibrated: about half the task preset's locality (9-11% fewer distinct experts).
    p.zipf_exponent = 1.3;
    p.global_blend = 0.5;
    p.secondary_weight_max = 0.3;
    p.request_noise = 0.6;
  } else if (name == "gpt-oss-task") {
    p.model_name = "synthetic, GPT-OSS-120B shape";
    p.geometry = {36, 128, 4};
    set_task_locality(p);
  } else if (name == "kimi-k2-task" || name == "qwen3-next-task") {
    // Shapes of models with more than 256 experts (ids need two bytes in files and messages):
    // Kimi K2, 61 layers of which the first is dense, 384 routed experts, top-8; Qwen3-Next-80B-
    // A3B, 48 layers all MoE, 512 routed experts, top-10 (the models' published configurations;
    // the shared experts are not routed, so not recorded). Locality as qwen-task's, NOT
    // calibrated against these models: for tests and benchmarks of wide geometries.
    p.model_name =
        name == "kimi-k2-task" ? "synthetic, Kimi K2 shape" : "synthetic, Qwen3-Next shape";
    p.geometry = name == "kimi-k2-task" ? model_geometry{60, 384, 8} : model_geometry{48, 512, 10};
    set_task_locality(p);
  } else {
    return status::invalid_argument("unknown synthetic preset \"" + std::string(name) +
                                    "\"; valid presets: " + synthetic_preset_list());
  }
  return p;
}

std::vector<std::string_view> synthetic_preset_names() {
  return {"qwen-task",   "qwen-language", "gpt-oss-task",
          "no-locality", "kimi-k2-task",  "qwen3-next-task"};
}

std::string synthetic_preset_list() {
  std::string names;
  for (std::string_view n : synthetic_preset_names())
    names += (names.empty() ? "" : ", ") + std::string(n);
  return names;
}

result<trace> generate_synthetic(const synthetic_params& p) {
  if (status s = validate_synthetic_params(p); !s.ok()) return s;
  const uint32_t L = p.geometry.layers, E = p.geometry.experts;
  const std::vector<double> domain_weights = make_domain_weights(p);

  trace t;
  t.model_name = p.model_name;
  t.geometry = p.geometry;
  t.source = describe(p);
  t.requests.resize(p.requests);

  // Arrivals are a running sum, so they are drawn in order up front; everything else about
  // request i depends only on (seed, i), which lets worker threads split the requests freely.
  if (p.arrival_rate > 0.0) {
    rng_engine arrivals(mix_seed(p.seed, stream_arrivals, 0));
    double clock = 0.0;
    for (trace_request& r : t.requests) {
      clock += exponential(arrivals, p.arrival_rate);
      r.arrival_s = clock;
    }
  }

  auto generate_range = [&](uint32_t begin, uint32_t end) {
    std::vector<double> weights, noise;  // one request's distribution, [l][e]
    alias_tables tables(L, E);
    for (uint32_t i = begin; i < end; ++i) {
      rng_engine rng(mix_seed(p.seed, stream_request, i));
      trace_request& r = t.requests[i];
      r.id = "syn-" + std::to_string(i);
      const synthetic_request_info info = draw_request(p, domain_weights, rng, weights, noise);
      r.label = p.domains[info.domain];
      r.prompt_tokens = info.prompt_tokens;
      r.output_tokens = info.output_tokens;
      for (uint32_t l = 0; l < L; ++l)
        tables.build(l, &weights[size_t{l} * E]);
      r.experts.resize(static_cast<size_t>(r.total_tokens()) * L * p.geometry.top_k);
      route_tokens(p.geometry, p.reuse_probability, tables, weights, rng, r.total_tokens(),
                   r.experts.data());
    }
  };

  // Contiguous chunks, one per thread; this thread takes the first. A thread that cannot be
  // started (std::system_error) has its chunk generated here instead: same result, just slower.
  const uint32_t workers = std::min(p.threads, std::max(p.requests, 1u));
  std::vector<std::thread> pool;
  std::vector<std::pair<uint32_t, uint32_t>> inline_chunks;
  for (uint32_t w = 1; w < workers; ++w) {
    const uint32_t begin = static_cast<uint32_t>(uint64_t{p.requests} * w / workers);
    const uint32_t end = static_cast<uint32_t>(uint64_t{p.requests} * (w + 1) / workers);
    try {
      pool.emplace_back(generate_range, begin, end);
    } catch (const std::system_error&) {
      inline_chunks.emplace_back(begin, end);
    }
  }
  generate_range(0, static_cast<uint32_t>(uint64_t{p.requests} / workers));
  for (const auto& [begin, end] : inline_chunks)
    generate_range(begin, end);
  for (std::thread& th : pool)
    th.join();
  return t;
}

// ---- the lazy model ----

result<synthetic_model> synthetic_model::make(const synthetic_params& p) {
  if (status s = validate_synthetic_params(p); !s.ok()) return s;
  synthetic_model m;
  m.params_ = p;
  m.domain_weights_ = std::make_shared<const std::vector<double>>(make_domain_weights(p));
  return m;
}

synthetic_request_info synthetic_model::info(uint64_t i) const {
  // The lengths come before the distribution in the request stream, so this stops early.
  rng_engine rng(mix_seed(params_.seed, stream_request, i));
  synthetic_request_info info;
  info.domain = static_cast<uint32_t>(uniform_index(rng, params_.domains.size()));
  info.prompt_tokens = log_uniform(rng, params_.prompt_min, params_.prompt_max);
  info.output_tokens = log_uniform(rng, params_.output_min, params_.output_max);
  return info;
}

void synthetic_model::prompt_experts(uint64_t i, std::vector<expert_id>& out) const {
  const model_geometry& g = params_.geometry;
  rng_engine rng(mix_seed(params_.seed, stream_request, i));
  std::vector<double> weights, noise;
  const synthetic_request_info info = draw_request(params_, *domain_weights_, rng, weights, noise);
  alias_tables tables(g.layers, g.experts);
  for (uint32_t l = 0; l < g.layers; ++l)
    tables.build(l, &weights[size_t{l} * g.experts]);
  out.resize(size_t{info.prompt_tokens} * g.layers * g.top_k);
  route_tokens(g, params_.reuse_probability, tables, weights, rng, info.prompt_tokens, out.data());
}

struct synthetic_decode_sampler::state {
  state(const model_geometry& geometry, uint64_t seed)
      : g(geometry),
        tables(geometry.layers, geometry.experts),
        marks(geometry.experts),
        rng{seed},
        bits(std::max<size_t>(4, (geometry.experts + 63) / 64)) {}
  model_geometry g;
  uint32_t reuse_threshold = 0;
  alias_tables tables;
  std::vector<float> weights;   // [l][e], for route_token's rare exact fallback
  std::vector<expert_id> prev;  // the previous token's ids, empty before the first
  choice_marks marks;
  fast_engine rng;
  std::vector<expert_id> pool;  // pooled mode: T tokens of L * k ids; empty = streaming
  // next()'s chosen set of one layer, one bit per expert; at least the 2 words narrow draws use.
  std::vector<uint64_t> bits;
  uint32_t pool_tokens = 0;
};

synthetic_decode_sampler::synthetic_decode_sampler() = default;
synthetic_decode_sampler::synthetic_decode_sampler(synthetic_decode_sampler&&) noexcept = default;
synthetic_decode_sampler& synthetic_decode_sampler::operator=(synthetic_decode_sampler&&) noexcept =
    default;
synthetic_decode_sampler::~synthetic_decode_sampler() = default;

synthetic_decode_sampler synthetic_model::open_decode(uint64_t i, uint32_t pool_tokens) const {
  const model_geometry& g = params_.geometry;
  rng_engine rng(mix_seed(params_.seed, stream_request, i));
  std::vector<double> weights, noise;
  draw_request(params_, *domain_weights_, rng, weights, noise);
  synthetic_decode_sampler sampler;
  sampler.state_ = std::make_unique<synthetic_decode_sampler::state>(
      g, mix_seed(params_.seed, stream_decode, i));
  auto& st = *sampler.state_;
  st.reuse_threshold = reuse_threshold_of(params_.reuse_probability);
  for (uint32_t l = 0; l < g.layers; ++l)
    st.tables.build(l, &weights[size_t{l} * g.experts]);
  st.weights.assign(weights.begin(), weights.end());
  if (pool_tokens > 0) {
    const size_t stride = size_t{g.layers} * g.top_k;
    std::vector<expert_id> pool(pool_tokens * stride);
    for (uint32_t t = 0; t < pool_tokens; ++t)
      sampler.next(pool.data() + t * stride);
    st.pool = std::move(pool);
    st.pool_tokens = pool_tokens;
  }
  return sampler;
}

void synthetic_decode_sampler::next(expert_id* out) {
  state& st = *state_;
  const uint32_t L = st.g.layers, k = st.g.top_k;
  const size_t stride = size_t{L} * k;
  if (st.pool_tokens > 0) {
    const uint64_t pick = ((st.rng() >> 32) * st.pool_tokens) >> 32;
    std::memcpy(out, st.pool.data() + pick * stride, stride * sizeof(expert_id));
    return;
  }
  if (st.prev.empty()) {
    route_token(st.g, st.reuse_threshold, st.tables, st.weights.data(), st.rng, nullptr, out,
                st.marks);
    st.prev.assign(out, out + stride);
    return;
  }
  // The decode hot path (every running request, every simulated step): route_token's rule, with
  // the chosen set kept in an E-bit mask instead of stamps, and four reuse coins per draw. The
  // generator state and table live in locals, so that stores of ids need not force a reload of
  // the state after every id written.
  const expert_id* prev = st.prev.data();
  fast_engine rng = st.rng;
  const uint32_t threshold = st.reuse_threshold;
  const uint32_t columns = st.tables.size();
  const uint32_t alias_bits = st.tables.alias_bits();
  const bool narrow = st.g.experts <= 128;
  uint64_t* const bits = st.bits.data();
  const size_t words = st.bits.size();
  expert_id* o = out;
  for (uint32_t l = 0; l < L; ++l, o += k) {
    const uint32_t* table = st.tables.layer(l);
    std::fill_n(bits, words, uint64_t{0});
    uint64_t lo = 0, hi = 0;
    uint32_t n = 0;
    const expert_id* before = prev + size_t{l} * k;
    uint64_t coins = 0;
    for (uint32_t c = 0; c < k; ++c) {
      if (c % 4 == 0) coins = rng();
      const uint64_t keep = (coins & 0xffffu) < threshold;
      coins >>= 16;
      const expert_id e = before[c];
      o[n] = e;
      n += static_cast<uint32_t>(keep);
      if (narrow) {
        // E <= 128 (every preset): the mask lives in two registers, so successive ids do not
        // wait on a store to the same word.
        const uint64_t high = e >> 6;  // 0 or 1
        const uint64_t bit = keep << (e & 63u);
        lo |= bit & (high - 1);
        hi |= bit & (0 - high);
      } else {
        bits[e >> 6] |= keep << (e & 63u);
      }
    }
    uint32_t draws = 0;
    while (n < k && narrow) {
      const expert_id e = alias_tables::draw_from(table, columns, alias_bits, rng());
      const uint64_t bit = uint64_t{1} << (e & 63u);
      const uint64_t high = e >> 6;  // 0 or 1
      const uint64_t word = high ? hi : lo;
      const uint32_t fresh = (word & bit) == 0;
      o[n] = e;
      n += fresh;
      lo |= bit & (high - 1);
      hi |= bit & (0 - high);
      if (++draws > 16 * k) break;
    }
    if (narrow) {
      bits[0] = lo;
      bits[1] = hi;
    }
    while (n < k) {
      const expert_id e = alias_tables::draw_from(table, columns, alias_bits, rng());
      const uint64_t bit = uint64_t{1} << (e & 63u);
      const uint64_t fresh = (bits[e >> 6] & bit) == 0;
      o[n] = e;
      n += static_cast<uint32_t>(fresh);
      bits[e >> 6] |= bit;
      if (++draws > 16 * k) {
        // Most of the mass is taken: finish this layer exactly through the generic path.
        st.marks.clear();
        st.marks.round = 1;
        for (uint32_t j = 0; j < n; ++j)
          st.marks.mark[o[j]] = 1;
        const float* w = st.weights.data() + size_t{l} * st.g.experts;
        while (n < k) {
          double left = 0.0;
          for (uint32_t x = 0; x < st.g.experts; ++x)
            if (st.marks.mark[x] != 1) left += w[x];
          double u = unit_draw(rng) * left;
          expert_id pick = 0;
          for (uint32_t x = 0; x < st.g.experts; ++x) {
            if (st.marks.mark[x] == 1) continue;
            pick = static_cast<expert_id>(x);
            u -= w[x];
            if (u < 0.0) break;
          }
          o[n++] = pick;
          st.marks.mark[pick] = 1;
        }
        st.marks.clear();
        st.marks.round = 0;
      }
    }
  }
  st.rng = rng;
  std::memcpy(st.prev.data(), out, stride * sizeof(expert_id));
}

}  // namespace eldr
