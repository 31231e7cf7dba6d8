// cli_options: the shared options and their --help texts (cli_options.hpp).
#include "tools/common/cli_options.hpp"

#include "tools/cli.hpp"

namespace eldr::tools {

void add_workload_input(CLI::App& app, workload_spec& spec, const input_help& help) {
  auto* input = app.add_option_group("input", help.group);
  auto* trace = input->add_option("--trace", spec.trace_path, help.trace);
  if (help.trace_must_exist) trace->check(CLI::ExistingFile);
  input->add_option("--synthetic", spec.synthetic, help.synthetic);
  input->require_option(1);
}

void add_synthetic_shape_options(CLI::App& app, synthetic_shape& shape) {
  add_defaulted(app, "--prompt-min", shape.prompt_min, "synthetic: shortest prompt",
                CLI::Range(1u, 1000000u));
  add_defaulted(app, "--prompt-max", shape.prompt_max, "synthetic: longest prompt (log-uniform)",
                CLI::Range(1u, 1000000u));
  add_defaulted(app, "--output-tokens", shape.output_tokens, "synthetic: output tokens per request",
                CLI::Range(0u, 1000000u));
}

void add_pairs_option(CLI::App& app, uint32_t& pairs) {
  add_defaulted(app, "--pairs", pairs, "random pairs for rho in the calibration fit",
                CLI::Range(2u, 10000000u));
}

void add_prefill_cost_options(CLI::App& app, double& base_ms, double& per_token_ms,
                              double& kv_transfer_ms) {
  add_defaulted(app, "--prefill-base-ms", base_ms, "fixed cost of one prefill",
                CLI::NonNegativeNumber);
  add_defaulted(app, "--prefill-per-token-ms", per_token_ms,
                "prefill cost per uncached prompt token", CLI::NonNegativeNumber);
  add_defaulted(app, "--kv-transfer-ms", kv_transfer_ms, "prefill-to-decode KV transfer time",
                CLI::NonNegativeNumber);
}

void add_decode_worker_options(CLI::App& app, uint32_t& max_batch, uint64_t& kv_capacity_tokens) {
  add_defaulted(app, "--max-batch", max_batch, "running sequences per decode worker",
                CLI::Range(1u, 100000u));
  app.add_option("--kv-capacity", kv_capacity_tokens,
                 "KV capacity per decode worker in tokens (0 = unlimited)")
      ->capture_default_str();
}

void add_decode_cost_options(CLI::App& app, decode_cost_params& cost) {
  add_defaulted(app, "--cost-base-ms", cost.base_ms, "decode step: fixed cost",
                CLI::NonNegativeNumber);
  add_defaulted(app, "--cost-expert-ms", cost.per_distinct_expert_ms,
                "decode step: cost per distinct (layer, expert)", CLI::NonNegativeNumber);
  add_defaulted(app, "--cost-sequence-ms", cost.per_sequence_ms,
                "decode step: cost per running sequence", CLI::NonNegativeNumber);
  add_defaulted(app, "--cost-kilotoken-ms", cost.per_context_kilotoken_ms,
                "decode step: cost per 1,000 context tokens in the batch", CLI::NonNegativeNumber);
}

void add_block_size_option(CLI::App& app, uint32_t& block_size) {
  add_defaulted(app, "--block-size", block_size, "KV block size in tokens", CLI::Range(1u, 255u));
}

}  // namespace eldr::tools
