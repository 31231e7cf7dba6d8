// tools/common: the workload builder the workload tools share (the same spec, the same requests)
// and the shared command-line options.
#include "tools/common/workload_builder.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tools/cli.hpp"
#include "tools/common/cli_options.hpp"

namespace eldr::tools {
namespace {

// A small synthetic spec: short requests, so that every test runs in milliseconds.
workload_spec small_spec(uint64_t seed = 3) {
  workload_spec spec;
  spec.synthetic = "gpt-oss-task";
  spec.shape->prompt_min = 4;
  spec.shape->prompt_max = 16;
  spec.shape->output_tokens = 4;
  spec.seed = seed;
  spec.calibration = 7;
  return spec;
}

std::vector<expert_id> prompt_of(const request_source& source, uint64_t i) {
  std::vector<expert_id> ids;
  source.prompt_experts(i, ids);
  return ids;
}

TEST(WorkloadBuilder, ChecksExactlyOneInputAndThePromptRange) {
  workload_spec spec = small_spec();
  EXPECT_TRUE(check_workload_spec(spec).ok());
  spec.trace_path = "x.eldrtrace";
  EXPECT_EQ(check_workload_spec(spec).message(), "give exactly one of --trace and --synthetic");
  spec.trace_path.clear();
  spec.synthetic.clear();
  EXPECT_EQ(check_workload_spec(spec).message(), "give exactly one of --trace and --synthetic");
  spec = small_spec();
  spec.shape->prompt_min = 17;
  EXPECT_EQ(check_workload_spec(spec).message(), "--prompt-min must be <= --prompt-max");
  spec.shape.reset();  // the preset's own lengths: nothing to check
  EXPECT_TRUE(check_workload_spec(spec).ok());
}

TEST(WorkloadBuilder, NamesTheSourceAsReportsDo) {
  workload_spec spec = small_spec();
  EXPECT_EQ(source_name(spec), "synthetic:gpt-oss-task");
  spec.synthetic.clear();
  spec.trace_path = "/data/law.eldrtrace";
  EXPECT_EQ(source_name(spec), "/data/law.eldrtrace");
}

TEST(WorkloadBuilder, SyntheticParamsTakeTheShapeSeedThreadsAndCount) {
  workload_spec spec = small_spec(9);
  spec.threads = 3;
  spec.shape->subdomains = 2;
  spec.shape->subdomain_weight = 0.25;
  auto p = synthetic_params_for(spec, 40);
  ASSERT_TRUE(p.ok()) << p.error().message();
  EXPECT_EQ(p->preset, "gpt-oss-task");
  EXPECT_EQ(p->seed, 9u);
  EXPECT_EQ(p->threads, 3u);
  EXPECT_EQ(p->requests, 40u);
  EXPECT_EQ(p->prompt_min, 4u);
  EXPECT_EQ(p->prompt_max, 16u);
  EXPECT_EQ(p->output_min, 4u);
  EXPECT_EQ(p->output_max, 4u);
  EXPECT_EQ(p->subdomains, 2u);
  EXPECT_DOUBLE_EQ(p->subdomain_weight, 0.25);

  // Without a shape (eldr-fit) and a count, the preset's own lengths and count stay.
  const synthetic_params preset = synthetic_preset("gpt-oss-task").value();
  spec.shape.reset();
  p = synthetic_params_for(spec, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->requests, preset.requests);
  EXPECT_EQ(p->prompt_min, preset.prompt_min);
  EXPECT_EQ(p->prompt_max, preset.prompt_max);
  EXPECT_EQ(p->output_max, preset.output_max);
  EXPECT_EQ(p->subdomains, preset.subdomains);
}

TEST(WorkloadBuilder, AnUnknownPresetIsRefusedNamingTheOption) {
  workload_spec spec = small_spec();
  spec.synthetic = "no-such-preset";
  auto p = synthetic_params_for(spec, 10);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().message().rfind("unknown synthetic preset \"no-such-preset\"", 0), 0u);
  auto source = open_source(spec, 10);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.error().message(), "--synthetic: " + p.error().message());
  auto t = load_trace(spec, 10);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().message(), "--synthetic: " + p.error().message());
}

TEST(WorkloadBuilder, TheLazyModelIsNotBoundedByTheWrittenTraceLimit) {
  // A long route benchmark: more requests than a written trace of this shape may hold.
  workload_spec spec = small_spec();
  spec.shape->prompt_max = 1024;
  spec.shape->output_tokens = 512;
  const uint64_t many = 40'000'000;
  auto uncapped = synthetic_params_for(spec, static_cast<uint32_t>(many));
  ASSERT_TRUE(uncapped.ok());
  ASSERT_FALSE(synthetic_model::make(*uncapped).ok()) << "the limit this test is about is gone";

  auto big = open_source(spec, many);
  ASSERT_TRUE(big.ok()) << big.error().message();
  auto small = open_source(spec, 10);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(big->size, 0u);
  EXPECT_EQ(big->name, "synthetic:gpt-oss-task");
  EXPECT_EQ(big->model_name, synthetic_preset("gpt-oss-task")->model_name);
  // The cap changes no request: request i is drawn from (seed, i) alone.
  for (uint64_t i : {0ull, 5ull, 999'999ull})
    EXPECT_EQ(prompt_of(*big->source, i), prompt_of(*small->source, i)) << i;
}

TEST(WorkloadBuilder, DrawsTheSameRequestsForTheSameSpec) {
  const workload_spec spec = small_spec();
  auto source = open_source(spec, 11 + spec.calibration);
  ASSERT_TRUE(source.ok());
  auto a = draw_workload(*source, spec, 11, 20.0);
  auto b = draw_workload(*open_source(spec, 18), spec, 11, 20.0);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(a->requests.size(), 11u);
  EXPECT_EQ(a->calibration.size(), 7u);
  EXPECT_EQ(a->calibration, b->calibration);
  for (std::size_t i = 0; i < a->requests.size(); ++i) {
    EXPECT_EQ(a->requests[i].source, b->requests[i].source);
    EXPECT_DOUBLE_EQ(a->requests[i].arrival_s, b->requests[i].arrival_s);
  }
  // The spec's seed draws the arrivals.
  auto other = draw_workload(*source, small_spec(4), 11, 20.0);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->requests.back().arrival_s, a->requests.back().arrival_s);
}

TEST(WorkloadBuilder, LoadsATraceOrGeneratesThePresets) {
  const workload_spec spec = small_spec();
  auto generated = load_trace(spec, 6);
  ASSERT_TRUE(generated.ok()) << generated.error().message();
  ASSERT_EQ(generated->requests.size(), 6u);
  auto direct = generate_synthetic(*synthetic_params_for(spec, 6));
  ASSERT_TRUE(direct.ok());
  for (std::size_t i = 0; i < 6; ++i)
    EXPECT_EQ(generated->requests[i].experts, direct->requests[i].experts) << i;

  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("eldr-wb-" + std::to_string(::getpid()) + ".eldrtrace");
  ASSERT_TRUE(write_trace_file(*generated, path.string()).ok());
  workload_spec from_file;
  from_file.trace_path = path.string();
  auto read = load_trace(from_file, 0);
  auto source = open_source(from_file, 0);
  std::filesystem::remove(path);
  ASSERT_TRUE(read.ok()) << read.error().message();
  ASSERT_TRUE(source.ok());
  ASSERT_EQ(read->requests.size(), 6u);
  EXPECT_EQ(read->requests[2].experts, generated->requests[2].experts);
  EXPECT_EQ(source->size, 6u);
  EXPECT_EQ(source->model_name, generated->model_name);
  EXPECT_EQ(prompt_of(*source->source, 2).size(),
            uint64_t{generated->requests[2].prompt_tokens} * 36 * 4);

  from_file.trace_path += ".missing";
  EXPECT_FALSE(load_trace(from_file, 0).ok());
  EXPECT_FALSE(open_source(from_file, 0).ok());
}

TEST(WorkloadBuilder, PolicyOptionsCarryTheSpecsFitSettings) {
  workload_spec spec = small_spec(12);
  spec.threads = 5;
  spec.pairs = 777;
  const policy_factory_options fo = policy_options(spec, 6);
  EXPECT_EQ(fo.workers, 6u);
  EXPECT_EQ(fo.seed, 12u);
  EXPECT_EQ(fo.refit.rule.seed, 12u);
  EXPECT_EQ(fo.threads, 5u);
  EXPECT_EQ(fo.pairs, 777u);
  EXPECT_FALSE(fo.centroids.has_value());
}

// Parses `args` into an app with the shared workload options; the exit code parse_command_line
// gives (nullopt: go on).
std::optional<int> parse(workload_spec& spec, const std::vector<std::string>& args) {
  CLI::App app{"test"};
  add_workload_input(app, spec, {"the workload", "a trace", "a preset", false});
  add_synthetic_shape_options(app, *spec.shape);
  add_pairs_option(app, spec.pairs);
  std::vector<char*> argv{const_cast<char*>("test")};
  for (const std::string& a : args)
    argv.push_back(const_cast<char*>(a.c_str()));
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  auto rc = parse_command_line(app, static_cast<int>(argv.size()), argv.data());
  testing::internal::GetCapturedStdout();
  testing::internal::GetCapturedStderr();
  return rc;
}

TEST(WorkloadCli, SharedOptionsFillTheSpec) {
  workload_spec spec;
  EXPECT_EQ(parse(spec, {"--synthetic", "qwen-task", "--prompt-min", "8", "--prompt-max", "64",
                         "--output-tokens", "0", "--pairs", "50"}),
            std::nullopt);
  EXPECT_EQ(spec.synthetic, "qwen-task");
  EXPECT_EQ(spec.shape->prompt_min, 8u);
  EXPECT_EQ(spec.shape->prompt_max, 64u);
  EXPECT_EQ(spec.shape->output_tokens, 0u);
  EXPECT_EQ(spec.pairs, 50u);
}

TEST(WorkloadCli, UsageErrorsExitTwo) {
  workload_spec spec;
  EXPECT_EQ(parse(spec, {"--synthetic", "qwen-task", "--trace", "x"}), 2);  // both inputs
  EXPECT_EQ(parse(spec, {"--prompt-min", "8"}), 2);                         // neither
  EXPECT_EQ(parse(spec, {"--synthetic", "qwen-task", "--pairs", "1"}), 2);  // out of range
  EXPECT_EQ(parse(spec, {"--synthetic", "qwen-task", "--prompt-min", "0"}), 2);
  EXPECT_EQ(parse(spec, {"--help"}), 0);
}

}  // namespace
}  // namespace eldr::tools
