// trace: recorded expert routing of MoE requests, the eldr-trace file format (versions 1 and 2,
// docs/trace-format.md), and its reader, writer and validator.
//
// A trace is what the offline fit, the simulator and the load generator consume: per request, the
// top-k expert ids every prompt and output token chose at every MoE layer. Files come from outside
// (recorders, other tools, hand edits), so the reader trusts nothing: every error names the file
// and the offending field or request, and no input can crash it or make its expert ids take more
// than twice the file's own size (a version 1 id is one byte on disk, two in memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/base/status.hpp"
#include "core/geometry.hpp"

namespace eldr {

struct trace_request {
  std::string id;                   // unique within a trace, never empty
  std::string label;                // domain/task/language label; "" when unknown
  uint32_t prompt_tokens = 0;       // >= 1: tokens routed during prefill
  uint32_t output_tokens = 0;       // tokens routed during decode
  std::optional<double> arrival_s;  // absent: the load generator decides when it arrives
  // (prompt_tokens + output_tokens) * L * k expert ids, token-major: choice r of token t at layer
  // l is experts[(t * L + l) * k + r]. Tokens 0..P-1 are the prompt, P..P+O-1 the output.
  std::vector<expert_id> experts;

  uint64_t total_tokens() const { return uint64_t{prompt_tokens} + output_tokens; }
  // The k distinct ids token `token` chose at layer `layer`. Preconditions (asserted): the request
  // is valid for g, token < total_tokens(), layer < g.layers. Points into experts.
  const expert_id* token_experts(const model_geometry& g, uint32_t token, uint32_t layer) const;

  bool operator==(const trace_request&) const = default;
};

struct trace {
  std::string model_name;
  model_geometry geometry;
  std::string source;  // free-text provenance
  std::vector<trace_request> requests;

  uint64_t total_tokens() const;  // prompt + output tokens over all requests

  bool operator==(const trace&) const = default;
};

// Checks everything the format promises: geometry bounds (model_geometry::validate: 1 <= k <= E
// <= 4096, 1 <= L <= 4096, L * E <= 2^20), non-empty and unique request ids, prompt_tokens >= 1,
// experts of exactly (P + O) * L * k ids (encoded in at most 2^32 - 1 bytes, the largest
// MessagePack bin, at the width the writer uses for this geometry), every id < E, the k ids of one
// token at one layer distinct, arrival_s finite and >= 0 when present.
// Returns ok or invalid_argument naming the request (index and id), token and layer at fault.
status validate_trace(const trace& t);

// Decodes and validates one eldr-trace file, version 1 (one byte per id, E <= 256) or 2 (little-
// endian uint16 ids, any E), held in [data, data + size). Unknown keys are ignored; `label` and
// `source` may be absent (""); `arrival_s` may be absent, a float or an integer. Anything else
// (not a map, wrong format, another version, a version 1 file of more than 256 experts, a v2
// `experts` bin of odd length, a missing key, a wrong type, a validate_trace violation, bytes
// after the top-level map) returns corrupt, with a message that starts with name_for_errors and
// names the field. Copies what it keeps; data may be freed after.
result<trace> parse_trace(const uint8_t* data, size_t size, const std::string& name_for_errors);

// Reads and parses a whole file (read_file from core/base/file_io.hpp): not_found when it does not
// exist, io_error when it cannot be read, out_of_range above 4 GiB, otherwise as parse_trace with
// the path as the name.
result<trace> read_trace_file(const std::string& path);

// The version encode_trace writes for a geometry: 1 when every id fits a byte (E <= 256), so that
// files of such models stay readable by older readers, else 2.
uint32_t trace_version_for(const model_geometry& g);

// Encodes t as eldr-trace (version trace_version_for(t.geometry); keys in the order of the format
// document, arrival_s only when present). Does NOT validate, so tests can produce files that
// break one rule at a time; callers that want a valid file call validate_trace first
// (write_trace_file does). A request whose experts exceed 2^32 - 1 bytes cannot be encoded
// (validate_trace rejects it): the result is then empty.
std::vector<uint8_t> encode_trace(const trace& t);
// As encode_trace, but in the given version (1 or 2; 1 truncates ids to their low byte, so it is
// meant for E <= 256). For tests and tools that need a specific version.
std::vector<uint8_t> encode_trace(const trace& t, uint32_t version);

// Validates t, encodes it and writes it with write_file_atomic (core/base/file_io.hpp): a temporary
// file beside path renamed over it, so readers never see half a file and a crash never leaves one.
// invalid_argument from validate_trace (nothing is written), io_error when writing fails.
status write_trace_file(const trace& t, const std::string& path);

}  // namespace eldr
