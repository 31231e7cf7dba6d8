// vllm_metrics: see vllm_metrics.hpp.
#include "cluster/http/vllm_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

namespace eldr {
namespace {

enum class gauge : uint8_t { running, waiting, usage, none };

gauge gauge_of(std::string_view name) {
  if (name == "vllm:num_requests_running") return gauge::running;
  if (name == "vllm:num_requests_waiting") return gauge::waiting;
  if (name == "vllm:kv_cache_usage_perc" || name == "vllm:gpu_cache_usage_perc")
    return gauge::usage;
  return gauge::none;
}

bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

struct sample {
  gauge which = gauge::none;
  std::string model;  // the model_name label, unescaped ("" when absent)
  double value = 0.0;
};

// Parses `{k="v",...}` at the start of `s`, keeping model_name; advances s past the '}'.
bool parse_labels(std::string_view& s, std::string& model) {
  s.remove_prefix(1);  // '{'
  for (;;) {
    while (!s.empty() && s.front() == ' ')
      s.remove_prefix(1);
    if (s.empty()) return false;
    if (s.front() == '}') {
      s.remove_prefix(1);
      return true;
    }
    size_t n = 0;
    while (n < s.size() && name_char(s[n], n == 0))
      ++n;
    if (n == 0) return false;
    const std::string_view key = s.substr(0, n);
    s.remove_prefix(n);
    if (s.size() < 2 || s[0] != '=' || s[1] != '"') return false;
    s.remove_prefix(2);
    std::string value;
    for (;;) {
      if (s.empty()) return false;
      const char c = s.front();
      s.remove_prefix(1);
      if (c == '"') break;
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      if (s.empty()) return false;
      const char e = s.front();
      s.remove_prefix(1);
      if (e == 'n')
        value.push_back('\n');
      else if (e == '\\' || e == '"')
        value.push_back(e);
      else
        return false;
    }
    if (key == "model_name") model = std::move(value);
    while (!s.empty() && s.front() == ' ')
      s.remove_prefix(1);
    if (!s.empty() && s.front() == ',') s.remove_prefix(1);
  }
}

// A finite, non-negative number: Prometheus writes floats ("3.0", "1e+06", "NaN", "+Inf").
std::optional<double> parse_value(std::string_view s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  char buf[65];
  s.copy(buf, s.size());
  buf[s.size()] = '\0';
  char* end = nullptr;
  const double v = std::strtod(buf, &end);
  if (end != buf + s.size() || !std::isfinite(v) || v < 0.0) return std::nullopt;
  return v;
}

uint32_t saturate(double v) {
  if (v >= static_cast<double>(std::numeric_limits<uint32_t>::max()))
    return std::numeric_limits<uint32_t>::max();
  return static_cast<uint32_t>(std::llround(v));
}

}  // namespace

uint32_t vllm_load::in_flight() const {
  const uint64_t sum = uint64_t{running} + waiting;
  return sum > std::numeric_limits<uint32_t>::max() ? std::numeric_limits<uint32_t>::max()
                                                    : static_cast<uint32_t>(sum);
}

result<vllm_load> parse_vllm_metrics(std::string_view body, std::string_view model_name,
                                     size_t max_bytes) {
  if (body.size() > max_bytes)
    return status::out_of_range("metrics body of " + std::to_string(body.size()) +
                                " bytes exceeds the limit of " + std::to_string(max_bytes));
  // Two passes over the gauges' lines would re-parse; instead keep per-gauge sums for the named
  // model and for "the only model seen" at once.
  struct sums {
    double running = 0, waiting = 0, usage = 0;
    bool have_running = false, have_waiting = false;
    void add(const sample& s) {
      switch (s.which) {
        case gauge::running:
          running += s.value;
          have_running = true;
          break;
        case gauge::waiting:
          waiting += s.value;
          have_waiting = true;
          break;
        case gauge::usage:
          usage = std::max(usage, s.value);
          break;
        case gauge::none:
          break;
      }
    }
  };
  sums named, only;
  bool named_seen = false;
  std::optional<std::string> only_model;
  bool several_models = false;
  size_t line_no = 0;
  while (!body.empty()) {
    ++line_no;
    const size_t eol = body.find('\n');
    std::string_view line = body.substr(0, eol);
    body.remove_prefix(eol == std::string_view::npos ? body.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    size_t n = 0;
    while (n < line.size() && name_char(line[n], n == 0))
      ++n;
    sample s;
    s.which = gauge_of(line.substr(0, n));
    if (s.which == gauge::none) continue;
    line.remove_prefix(n);
    auto bad = [&](std::string_view why) {
      return status::corrupt("metrics line " + std::to_string(line_no) + ": " + std::string(why));
    };
    if (!line.empty() && line.front() == '{' && !parse_labels(line, s.model))
      return bad("malformed labels");
    if (line.empty() || (line.front() != ' ' && line.front() != '\t'))
      return bad("no value after the name");
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
      line.remove_prefix(1);
    const size_t sp = line.find_first_of(" \t");  // an optional timestamp follows
    const auto v = parse_value(line.substr(0, sp));
    if (!v) return bad("value is not a finite, non-negative number");
    s.value = *v;
    if (s.model == model_name) {
      named.add(s);
      named_seen = true;
    }
    if (!only_model)
      only_model = s.model;
    else if (*only_model != s.model)
      several_models = true;
    only.add(s);
  }
  const sums* use = &named;
  if (!named_seen) {
    if (several_models)
      return status::invalid_argument("metrics hold several models and none is named '" +
                                      std::string(model_name.substr(0, 64)) + "'");
    use = &only;
  }
  if (!use->have_running) return status::not_found("no vllm:num_requests_running sample");
  if (!use->have_waiting) return status::not_found("no vllm:num_requests_waiting sample");
  vllm_load out;
  out.running = saturate(use->running);
  out.waiting = saturate(use->waiting);
  out.kv_usage = static_cast<float>(std::min(use->usage, 1.0));
  return out;
}

}  // namespace eldr
