// json_log: the node's log as one JSON object per line (runtime.log_format = "json"), for
// Kubernetes log pipelines (Loki, Fluent Bit, Elasticsearch) that index fields rather than text.
//
//   {"time":"2026-12-02T09:30:41.088Z","level":"warning","component":"model","model":"toy",
//    "request":"probe-96","message":"model toy: request probe-96 routed by load only (no_counts)"}
//
// The fields come from the conventions every eldr log line already follows (conventions.md):
// a message starts with its subject and a colon ("model NAME: ...", "ingest ENDPOINT: ...",
// "cluster: ..."); the first word of that subject is the component, a "model NAME" subject gives
// "model", an ingest/publisher/replay subject gives "publisher", and "request ID" anywhere in the
// message gives "request". A line without a subject has component "node". The message is always
// there whole, so nothing is lost when a rule does not apply. Invalid UTF-8 (a peer's bytes in a
// message) is replaced by U+FFFD rather than breaking the line.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include <spdlog/formatter.h>

namespace eldr {

// The fields a line carries besides time, level and message ("" = absent).
struct log_fields {
  std::string component;
  std::string model;
  std::string publisher;
  std::string request;
};

// What json_log_line puts in a line, from the message text alone.
log_fields log_fields_of(std::string_view message);

// One JSON object (no newline): time as RFC 3339 UTC with milliseconds, level as spdlog names it
// ("trace", "debug", "info", "warning", "error", "critical").
std::string json_log_line(std::chrono::system_clock::time_point time, std::string_view level,
                          std::string_view message);

// The spdlog formatter that writes json_log_line + '\n' (spdlog::set_formatter takes it).
class json_log_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

}  // namespace eldr
