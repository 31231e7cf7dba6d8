// wide_model: the method end to end on models of more than 256 experts (the shapes of Kimi K2,
// 384 experts, and Qwen3-Next, 512): a trace written and read in version 2, dense and per-block
// counts, signatures from blocks equal to signatures from dense counts, balanced K-means, a
// centroid file round trip, and a centroid set that sends each domain's requests to "its" worker.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/centroid_set.hpp"
#include "core/expert_counts.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/formats/trace.hpp"
#include "core/signature.hpp"
#include "core/sim/fit.hpp"
#include "core/sim/synthetic.hpp"

namespace eldr {
namespace {

// A few layers of the preset's shape: the experts per layer and top-k are the model's.
synthetic_params wide_params(const char* preset) {
  synthetic_params p = synthetic_preset(preset).value();
  p.geometry.layers = 6;
  p.requests = 160;
  p.prompt_min = 32;
  p.prompt_max = 64;
  p.output_min = p.output_max = 16;
  p.seed = 3;
  return p;
}

TEST(WideModel, FitsCentroidsThatRouteEachDomainToOneWorkerAt384And512Experts) {
  for (const char* preset : {"kimi-k2-task", "qwen3-next-task"}) {
    SCOPED_TRACE(preset);
    const synthetic_params p = wide_params(preset);
    const model_geometry g = p.geometry;
    ASSERT_GT(g.experts, 256u);
    // Through the file format: version 2, read back unchanged.
    const trace generated = generate_synthetic(p).value();
    const std::vector<uint8_t> bytes = encode_trace(generated);
    result<trace> parsed = parse_trace(bytes.data(), bytes.size(), preset);
    ASSERT_TRUE(parsed.ok()) << parsed.error().to_string();
    const trace& t = *parsed;
    ASSERT_EQ(t, generated);

    // The offline fit: 4 workers for 4 domains.
    result<calibration_counts> cal = count_trace(t);
    ASSERT_TRUE(cal.ok()) << cal.error().to_string();
    fit_options o;
    o.workers = 4;
    o.transform = signature_transform::count;
    o.all_layers = true;
    o.pairs = 2000;
    o.threads = 1;
    result<fit_result> fit = fit_centroids(*cal, o);
    ASSERT_TRUE(fit.ok()) << fit.error().to_string();
    EXPECT_GT(fit->rho[0], 0.3);  // prefill predicts decode at this width too
    ASSERT_EQ(fit->spec->width(), g.width());

    // A centroid file of this geometry round-trips.
    centroid_file f;
    f.model_name = preset;
    f.spec = *fit->spec;
    f.epoch = 1;
    f.workers = 4;
    f.centroids = fit->kmeans.centroids;
    ASSERT_TRUE(validate_centroid_file(f).ok()) << validate_centroid_file(f).to_string();
    result<centroid_file> back = parse_centroid_file(encode_centroid_file(f), "mem");
    ASSERT_TRUE(back.ok()) << back.error().to_string();
    EXPECT_EQ(back->spec.geometry(), g);
    EXPECT_EQ(back->centroids, f.centroids);
    result<centroid_set> set =
        centroid_set::make(4, static_cast<uint32_t>(back->spec.width()), back->centroids, 1);
    ASSERT_TRUE(set.ok()) << set.error().to_string();

    // Route every request by the signature its prompt's KV blocks give (as the node does from
    // per-block counts), checking it equals the one from dense counts on the way.
    auto spec = std::make_shared<const signature_spec>(back->spec);
    std::map<std::string, std::map<uint32_t, int>> workers_of_label;
    for (const trace_request& r : t.requests) {
      auto blocks = count_blocks(g, r.experts, 0, r.prompt_tokens, 16);
      ASSERT_TRUE(blocks.ok()) << blocks.error().to_string();
      signature_builder from_blocks(spec);
      for (const block_counts& b : *blocks)
        ASSERT_TRUE(from_blocks.add(b).ok());
      signature sig;
      from_blocks.finish(sig);
      std::vector<uint32_t> dense(g.width(), 0);
      ASSERT_TRUE(add_token_counts(g, r.experts, 0, r.prompt_tokens, dense).ok());
      std::vector<float> direct(spec->width());
      spec->dense_from_counts(dense, direct);
      for (std::size_t i = 0; i < sig.index.size(); ++i)
        ASSERT_NEAR(sig.value[i], direct[sig.index[i]], 1e-6f);
      std::vector<float> scores(4);
      ASSERT_TRUE(set->score(sig, scores).ok());
      const auto best =
          static_cast<uint32_t>(std::max_element(scores.begin(), scores.end()) - scores.begin());
      ++workers_of_label[r.label][best];
    }
    // Strong locality (qwen-task's parameters): most of a domain's requests share one worker.
    for (const auto& [label, counts] : workers_of_label) {
      int total = 0, top = 0;
      for (const auto& [worker, n] : counts) {
        total += n;
        top = std::max(top, n);
      }
      EXPECT_GE(top * 10, total * 7) << label << ": " << top << " of " << total;
    }
  }
}

}  // namespace
}  // namespace eldr
