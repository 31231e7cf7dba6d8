// Fuzz target: parse_vllm_metrics and parse_http_url on arbitrary bytes return a value or an
// error, never crash or read outside the input; what they accept respects their contracts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "cluster/http/http_url.hpp"
#include "cluster/http/vllm_metrics.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto load = eldr::parse_vllm_metrics(text, "m", 1 << 16);
  if (load.ok() && (load->kv_usage < 0.0f || load->kv_usage > 1.0f)) std::abort();
  if (size > (1 << 16) && load.ok()) std::abort();
  const auto url = eldr::parse_http_url(text);
  if (url.ok()) {
    if (url->host.empty() || url->port == 0 || url->path.empty() || url->path[0] != '/')
      std::abort();
    // What was accepted prints to a URL that parses to the same parts.
    const auto again = eldr::parse_http_url(url->to_string());
    if (!again.ok() || again->host != url->host || again->port != url->port ||
        again->path != url->path)
      std::abort();
  }
  return 0;
}
