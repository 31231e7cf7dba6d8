// vllm_metrics: reads a decode worker's load out of vLLM's Prometheus /metrics body (the text
// exposition format, version 0.0.4, as prometheus_client writes it).
//
// The gauges read (vllm/v1/metrics/loggers.py at commit 005a810b, PrometheusStatLogger; the table
// is in docs/vllm.md section (c)): vllm:num_requests_running, vllm:num_requests_waiting and
// vllm:kv_cache_usage_perc (or its deprecated twin vllm:gpu_cache_usage_perc). Each carries the
// labels model_name and engine; the series of several data-parallel engines are summed (usage:
// the largest). Every other line -- comments, histograms, other metrics -- is skipped unread
// beyond its name.
//
// Pure and bounded: the body is never copied, a body over max_bytes is refused before it is read,
// and a malformed line of a gauge that is read is an error naming its line. No sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/base/status.hpp"

namespace eldr {

inline constexpr size_t default_max_metrics_bytes = size_t{4} << 20;

struct vllm_load {
  uint32_t running = 0;        // requests in the running batch, all engines
  uint32_t waiting = 0;        // requests queued, all engines
  float kv_usage = 0.0f;       // 0..1, the fullest engine (0 when vLLM exposes neither gauge)
  uint32_t in_flight() const;  // running + waiting, saturating
};

// The load of model `model_name` in `body`. Samples are taken for the series whose model_name
// label equals `model_name`; when none does and every series read names the same model (one vLLM
// serves one model, whose served name may differ from eldr's), that one's. Errors:
// out_of_range (body larger than max_bytes), corrupt (a malformed line of a gauge read: bad
// labels, a value that is not a number, negative, NaN or infinite; the message names the line
// number), invalid_argument (several models and none named model_name), not_found (no
// vllm:num_requests_running or no vllm:num_requests_waiting sample for the model).
result<vllm_load> parse_vllm_metrics(std::string_view body, std::string_view model_name,
                                     size_t max_bytes = default_max_metrics_bytes);

}  // namespace eldr
