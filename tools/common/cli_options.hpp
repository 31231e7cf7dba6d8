// cli_options: the command-line options eldr-sim and eldr-loadgen share (and eldr-fit's input),
// declared once with the --help text the tools print. The texts and checks are the tools'
// interface: a change here changes every tool's --help alike.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "core/cost_model.hpp"
#include "tools/common/workload_builder.hpp"

namespace eldr::tools {

// What a tool says about its --trace/--synthetic group.
struct input_help {
  std::string group;      // the group's description
  std::string trace;      // --trace's help
  std::string synthetic;  // --synthetic's help
  bool trace_must_exist;  // --trace checked by CLI11 (usage error) or left to the trace reader
};

// --trace and --synthetic into spec, in a group that requires exactly one of them.
void add_workload_input(CLI::App& app, workload_spec& spec, const input_help& help);

// --prompt-min, --prompt-max, --output-tokens ("synthetic: ...").
void add_synthetic_shape_options(CLI::App& app, synthetic_shape& shape);

// --pairs, for the calibration fit.
void add_pairs_option(CLI::App& app, uint32_t& pairs);

// --prefill-base-ms, --prefill-per-token-ms, --kv-transfer-ms.
void add_prefill_cost_options(CLI::App& app, double& base_ms, double& per_token_ms,
                              double& kv_transfer_ms);

// --max-batch, --kv-capacity: one decode worker's batch and KV capacity.
void add_decode_worker_options(CLI::App& app, uint32_t& max_batch, uint64_t& kv_capacity_tokens);

// --cost-base-ms, --cost-expert-ms, --cost-sequence-ms, --cost-kilotoken-ms: the decode cost
// model's parameters.
void add_decode_cost_options(CLI::App& app, decode_cost_params& cost);

// --block-size, the KV block size in tokens.
void add_block_size_option(CLI::App& app, uint32_t& block_size);

}  // namespace eldr::tools
