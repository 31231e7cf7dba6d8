// synthetic: presets, parameter checks, determinism, validity of what is generated, and the
// locality the presets promise (same-domain requests alike, unless the preset removes locality).
#include "core/sim/synthetic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "core/expert_counts.hpp"

namespace eldr {
namespace {

// A preset shrunk to test size: few requests, short prompts, a few output tokens.
synthetic_params small(std::string_view preset, uint32_t requests = 24, uint64_t seed = 1) {
  result<synthetic_params> p = synthetic_preset(preset);
  EXPECT_TRUE(p.ok()) << p.error().to_string();
  p->requests = requests;
  p->prompt_min = 16;
  p->prompt_max = 48;
  p->output_min = 4;
  p->output_max = 8;
  p->seed = seed;
  return *p;
}

trace generate(const synthetic_params& p) {
  result<trace> t = generate_synthetic(p);
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  return t.ok() ? *t : trace{};
}

// Expert counts of tokens [begin, end) of a request, [l][e].
std::vector<double> counts(const trace& t, const trace_request& r, uint32_t begin, uint32_t end) {
  std::vector<uint32_t> c(t.geometry.width(), 0);
  EXPECT_TRUE(add_token_counts(t.geometry, r.experts, begin, end, c).ok());
  return {c.begin(), c.end()};
}
std::vector<double> counts(const trace& t, const trace_request& r) {
  return counts(t, r, 0, static_cast<uint32_t>(r.total_tokens()));
}

double cosine(const std::vector<double>& a, const std::vector<double>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

struct pair_similarity {
  double same_domain = 0, cross_domain = 0;
};

// Mean cosine of count vectors over all pairs of requests with the same label, and with different
// labels.
pair_similarity similarity(const trace& t) {
  std::vector<std::vector<double>> c;
  for (const trace_request& r : t.requests)
    c.push_back(counts(t, r));
  double same = 0, cross = 0;
  size_t n_same = 0, n_cross = 0;
  for (size_t i = 0; i < c.size(); ++i)
    for (size_t j = i + 1; j < c.size(); ++j) {
      const double x = cosine(c[i], c[j]);
      if (t.requests[i].label == t.requests[j].label) {
        same += x;
        ++n_same;
      } else {
        cross += x;
        ++n_cross;
      }
    }
  EXPECT_GT(n_same, 0u);
  EXPECT_GT(n_cross, 0u);
  return {same / static_cast<double>(n_same), cross / static_cast<double>(n_cross)};
}

TEST(SyntheticPresets, EveryNamedPresetIsValidWithThePapersGeometry) {
  for (std::string_view name : synthetic_preset_names()) {
    result<synthetic_params> p = synthetic_preset(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ(p->preset, name);
    EXPECT_TRUE(validate_synthetic_params(*p).ok()) << name;
  }
  EXPECT_EQ(synthetic_preset("qwen-task")->geometry, (model_geometry{48, 128, 8}));
  EXPECT_EQ(synthetic_preset("qwen-language")->geometry, (model_geometry{48, 128, 8}));
  EXPECT_EQ(synthetic_preset("gpt-oss-task")->geometry, (model_geometry{36, 128, 4}));
  EXPECT_EQ(synthetic_preset("qwen-task")->domains,
            (std::vector<std::string>{"code", "math", "medical", "legal"}));
  EXPECT_EQ(synthetic_preset("no-locality")->global_blend, 1.0);
}

TEST(SyntheticPresets, UnknownNameListsTheValidOnes) {
  result<synthetic_params> p = synthetic_preset("qwen-tsak");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code(), status_code::invalid_argument);
  EXPECT_NE(p.error().message().find("\"qwen-tsak\""), std::string::npos);
  for (std::string_view name : synthetic_preset_names())
    EXPECT_NE(p.error().message().find(name), std::string::npos) << name;
}

TEST(SyntheticPresets, TheListNamesThemInOrder) {
  EXPECT_EQ(synthetic_preset_list(),
            "qwen-task, qwen-language, gpt-oss-task, no-locality, kimi-k2-task, qwen3-next-task");
  EXPECT_NE(synthetic_preset("x").error().message().find(synthetic_preset_list()),
            std::string::npos);
}

TEST(SyntheticPresets, TaskPresetsShareTheCalibratedLocality) {
  for (std::string_view name : {"qwen-task", "gpt-oss-task", "kimi-k2-task", "qwen3-next-task"}) {
    const synthetic_params p = synthetic_preset(name).value();
    EXPECT_EQ(p.domains, (std::vector<std::string>{"code", "math", "medical", "legal"})) << name;
    EXPECT_EQ(p.zipf_exponent, 1.4) << name;
    EXPECT_EQ(p.global_blend, 0.0) << name;
    EXPECT_EQ(p.secondary_weight_max, 0.05) << name;
    EXPECT_EQ(p.request_noise, 0.6) << name;
  }
  const synthetic_params none = synthetic_preset("no-locality").value();
  EXPECT_EQ(none.secondary_weight_max, 0.0);
  EXPECT_EQ(none.zipf_exponent, 1.4);
  EXPECT_EQ(none.request_noise, 0.6);
}

TEST(SyntheticParams, OutOfRangeValuesAreRejectedByName) {
  struct case_t {
    void (*edit)(synthetic_params&);
    std::string piece;
  };
  const case_t cases[] = {
      {[](synthetic_params& p) { p.geometry.top_k = 0; }, "top_k"},
      {[](synthetic_params& p) { p.domains.clear(); }, "domains must not be empty"},
      {[](synthetic_params& p) {
         p.domains = {"a", "a"};
       },
       "duplicate domain label \"a\""},
      {[](synthetic_params& p) {
         p.domains = {"a", ""};
       },
       "domain labels must not be empty"},
      {[](synthetic_params& p) { p.zipf_exponent = -1; }, "zipf_exponent"},
      {[](synthetic_params& p) { p.global_blend = 1.5; }, "global_blend"},
      {[](synthetic_params& p) { p.global_blend = std::nan(""); }, "global_blend"},
      {[](synthetic_params& p) { p.secondary_weight_max = -0.1; }, "secondary_weight_max"},
      {[](synthetic_params& p) { p.request_noise = -1; }, "request_noise"},
      {[](synthetic_params& p) { p.reuse_probability = 2; }, "reuse_probability"},
      {[](synthetic_params& p) { p.prompt_min = 0; }, "prompt_min must be >= 1"},
      {[](synthetic_params& p) { p.prompt_min = 600; }, "prompt_min must be <= prompt_max"},
      {[](synthetic_params& p) { p.output_min = 65; }, "output_min must be <= output_max"},
      {[](synthetic_params& p) { p.arrival_rate = -1; }, "arrival_rate"},
      {[](synthetic_params& p) { p.threads = 0; }, "threads must be in 1..256"},
  };
  for (const case_t& c : cases) {
    synthetic_params p = *synthetic_preset("qwen-task");
    c.edit(p);
    const status s = validate_synthetic_params(p);
    EXPECT_EQ(s.code(), status_code::invalid_argument) << c.piece;
    EXPECT_NE(s.message().find(c.piece), std::string::npos) << s.message();
    EXPECT_FALSE(generate_synthetic(p).ok()) << c.piece;
  }
}

TEST(SyntheticParams, SizesThatCannotBeHeldAreOutOfRangeNotAllocated) {
  synthetic_params p = *synthetic_preset("qwen-task");
  p.requests = 4000000000u;
  EXPECT_EQ(validate_synthetic_params(p).code(), status_code::out_of_range);
  p = *synthetic_preset("qwen-task");
  p.prompt_max = 4000000000u;  // one request alone exceeds a MessagePack bin
  EXPECT_EQ(generate_synthetic(p).error().code(), status_code::out_of_range);
}

TEST(Synthetic, SameSeedSameTraceOtherSeedOtherTrace) {
  const trace a = generate(small("qwen-task", 12, 5));
  const trace b = generate(small("qwen-task", 12, 5));
  const trace c = generate(small("qwen-task", 12, 6));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.requests.size(), c.requests.size());
  size_t differing = 0;
  for (size_t i = 0; i < a.requests.size(); ++i)
    differing += a.requests[i].experts != c.requests[i].experts;
  EXPECT_EQ(differing, a.requests.size());
}

TEST(Synthetic, ThreadCountDoesNotChangeTheTrace) {
  synthetic_params p = small("qwen-task", 11, 9);
  p.arrival_rate = 5.0;
  const trace one = generate(p);
  p.threads = 3;
  EXPECT_EQ(generate(p), one);
  p.threads = 16;  // more threads than requests
  EXPECT_EQ(generate(p), one);
}

TEST(Synthetic, RequestIDoesNotDependOnTheRequestCount) {
  synthetic_params p = small("gpt-oss-task", 5);
  p.arrival_rate = 10.0;
  const trace few = generate(p);
  p.requests = 9;
  const trace more = generate(p);
  ASSERT_EQ(more.requests.size(), 9u);
  for (size_t i = 0; i < few.requests.size(); ++i)
    EXPECT_EQ(few.requests[i], more.requests[i]);
}

TEST(Synthetic, EveryPresetGeneratesValidTraces) {
  for (std::string_view name : synthetic_preset_names()) {
    const synthetic_params p = small(name, 10);
    const trace t = generate(p);
    const status s = validate_trace(t);
    EXPECT_TRUE(s.ok()) << name << ": " << s.to_string();
    EXPECT_EQ(t.geometry, p.geometry);
    EXPECT_EQ(t.model_name, p.model_name);
    EXPECT_NE(t.source.find(std::string(name)), std::string::npos) << t.source;
    ASSERT_EQ(t.requests.size(), 10u);
    std::set<std::string> ids;
    for (const trace_request& r : t.requests) {
      ids.insert(r.id);
      EXPECT_NE(std::find(p.domains.begin(), p.domains.end(), r.label), p.domains.end());
      EXPECT_GE(r.prompt_tokens, p.prompt_min);
      EXPECT_LE(r.prompt_tokens, p.prompt_max);
      EXPECT_GE(r.output_tokens, p.output_min);
      EXPECT_LE(r.output_tokens, p.output_max);
      EXPECT_FALSE(r.arrival_s.has_value());
      // The property validate_trace also checks, stated directly: k distinct ids < E everywhere.
      for (uint32_t tok = 0; tok < r.total_tokens(); ++tok)
        for (uint32_t l = 0; l < t.geometry.layers; ++l) {
          const expert_id* e = r.token_experts(t.geometry, tok, l);
          const std::set<expert_id> distinct(e, e + t.geometry.top_k);
          ASSERT_EQ(distinct.size(), t.geometry.top_k);
          ASSERT_LT(*distinct.rbegin(), t.geometry.experts);
        }
    }
    EXPECT_EQ(ids.size(), t.requests.size());
  }
}

TEST(Synthetic, WidePresetsUseExpertIdsAbove255AndKeepTheirLocality) {
  for (std::string_view name : {"kimi-k2-task", "qwen3-next-task"}) {
    const trace t = generate(small(name, 16));
    ASSERT_TRUE(validate_trace(t).ok()) << validate_trace(t).to_string();
    EXPECT_GT(t.geometry.experts, 256u);
    expert_id highest = 0;
    for (const trace_request& r : t.requests)
      highest = std::max(highest, *std::max_element(r.experts.begin(), r.experts.end()));
    EXPECT_GT(highest, 255u) << name;
    EXPECT_LT(highest, t.geometry.experts) << name;
    // Written as version 2 and read back unchanged.
    const std::vector<uint8_t> bytes = encode_trace(t);
    result<trace> back = parse_trace(bytes.data(), bytes.size(), std::string(name));
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(*back, t);
    const pair_similarity sim = similarity(generate(small(name, 32)));
    EXPECT_GT(sim.same_domain, sim.cross_domain + 0.2)
        << name << ": same " << sim.same_domain << " cross " << sim.cross_domain;
  }
  EXPECT_EQ(synthetic_preset("kimi-k2-task")->geometry, (model_geometry{60, 384, 8}));
  EXPECT_EQ(synthetic_preset("qwen3-next-task")->geometry, (model_geometry{48, 512, 10}));
}

TEST(Synthetic, LocalityPresetsMakeSameDomainRequestsAlike) {
  // Margins are about half the gaps measured over seeds 1-6 (task ~0.40-0.45, language ~0.06).
  const pair_similarity task = similarity(generate(small("qwen-task", 32)));
  const pair_similarity gpt = similarity(generate(small("gpt-oss-task", 32)));
  const pair_similarity language = similarity(generate(small("qwen-language", 32)));
  EXPECT_GT(task.same_domain, task.cross_domain + 0.2)
      << "same " << task.same_domain << " cross " << task.cross_domain;
  EXPECT_GT(gpt.same_domain, gpt.cross_domain + 0.2)
      << "same " << gpt.same_domain << " cross " << gpt.cross_domain;
  EXPECT_GT(language.same_domain, language.cross_domain + 0.03)
      << "same " << language.same_domain << " cross " << language.cross_domain;
  // Task domains are more separated than languages, as the presets say.
  EXPECT_GT(task.same_domain - task.cross_domain, language.same_domain - language.cross_domain);
}

TEST(Synthetic, NoLocalityPresetMakesDomainsIndistinguishable) {
  const pair_similarity s = similarity(generate(small("no-locality", 32)));
  EXPECT_NEAR(s.same_domain, s.cross_domain, 0.01)
      << "same " << s.same_domain << " cross " << s.cross_domain;
}

TEST(Synthetic, PrefillPredictsDecode) {
  // Prompt and output come from one request distribution: a request's decode counts are closer
  // to its own prefill counts than to another domain's request's prefill counts.
  synthetic_params p = small("qwen-task", 16);
  p.output_min = p.output_max = 32;
  const trace t = generate(p);
  auto phase_counts = [&](const trace_request& r, bool prefill) {
    return prefill ? counts(t, r, 0, r.prompt_tokens)
                   : counts(t, r, r.prompt_tokens, static_cast<uint32_t>(r.total_tokens()));
  };
  double own = 0, other = 0;
  size_t n_other = 0;
  for (const trace_request& a : t.requests) {
    own += cosine(phase_counts(a, true), phase_counts(a, false));
    for (const trace_request& b : t.requests)
      if (b.label != a.label) {
        other += cosine(phase_counts(b, true), phase_counts(a, false));
        ++n_other;
      }
  }
  own /= static_cast<double>(t.requests.size());
  other /= static_cast<double>(n_other);
  EXPECT_GT(own, other + 0.1) << "own " << own << " other " << other;
}

TEST(Synthetic, FullReuseRepeatsThePreviousTokensExperts) {
  synthetic_params p = small("qwen-task", 3);
  p.reuse_probability = 1.0;
  const trace t = generate(p);
  for (const trace_request& r : t.requests)
    for (uint32_t tok = 1; tok < r.total_tokens(); ++tok)
      for (uint32_t l = 0; l < t.geometry.layers; ++l)
        ASSERT_TRUE(std::equal(r.token_experts(t.geometry, tok, l),
                               r.token_experts(t.geometry, tok, l) + t.geometry.top_k,
                               r.token_experts(t.geometry, 0, l)));
}

TEST(Synthetic, SamplesWithoutReplacementEvenWhenAlmostAllMassIsTaken) {
  // k = E with a very steep Zipf: the last picks have probabilities far below what the alias
  // table resolves, so the generator must fall back to drawing from what is left.
  synthetic_params p;
  p.geometry = {4, 16, 16};
  p.domains = {"only"};
  p.zipf_exponent = 40.0;
  p.request_noise = 0.0;
  p.reuse_probability = 0.0;
  p.prompt_min = p.prompt_max = 3;
  p.output_min = p.output_max = 2;
  p.requests = 3;
  const trace t = generate(p);
  EXPECT_TRUE(validate_trace(t).ok()) << validate_trace(t).to_string();
}

TEST(Synthetic, PoissonArrivalsIncreaseAtTheRequestedRate) {
  synthetic_params p = small("qwen-task", 2000);
  p.prompt_min = p.prompt_max = 1;
  p.output_min = p.output_max = 0;
  p.geometry = {1, 8, 1};
  p.arrival_rate = 50.0;
  const trace t = generate(p);
  double last = 0.0;
  for (const trace_request& r : t.requests) {
    ASSERT_TRUE(r.arrival_s.has_value());
    EXPECT_GT(*r.arrival_s, last);
    last = *r.arrival_s;
  }
  // Mean gap 1/50 s; over 2000 gaps the standard error is ~2.2%, so 10% is a wide margin.
  EXPECT_NEAR(last / 2000.0, 1.0 / 50.0, 0.1 / 50.0);
}

TEST(Synthetic, LengthsAreLogUniformBetweenTheBounds) {
  synthetic_params p = small("qwen-task", 4000);
  p.geometry = {1, 8, 1};
  p.prompt_min = 1;
  p.prompt_max = 1023;
  p.output_min = p.output_max = 7;
  const trace t = generate(p);
  // log2(P + 1) uniform on [1, 10]: each octave [2^j - 1, 2^(j+1) - 1) holds about 1/9 of them.
  std::vector<size_t> octave(11, 0);
  for (const trace_request& r : t.requests) {
    EXPECT_EQ(r.output_tokens, 7u);
    ++octave[static_cast<size_t>(std::floor(std::log2(r.prompt_tokens + 1.0)))];
  }
  for (size_t j = 1; j < 10; ++j)
    EXPECT_NEAR(static_cast<double>(octave[j]) / 4000.0, 1.0 / 9.0, 0.025) << "octave " << j;
}

}  // namespace
}  // namespace eldr
