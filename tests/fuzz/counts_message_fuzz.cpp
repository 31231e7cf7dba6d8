// Fuzz target: decode_counts_message on arbitrary bytes never crashes or over-allocates; every
// block it accepts is valid for the message's geometry and survives a re-encode unchanged.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cluster/wire/counts_message.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  eldr::counts_decode_limits limits;
  limits.max_blocks = 64;
  std::vector<eldr::kv_decode_issue> issues;
  const auto m = eldr::decode_counts_message({data, size}, limits, issues);
  if (!m.ok()) return 0;
  if (m->blocks.size() > limits.max_blocks || !m->geometry.validate().ok()) std::abort();
  const std::vector<uint8_t> again = eldr::encode_counts_message(*m);
  std::vector<eldr::kv_decode_issue> issues2;
  const auto back = eldr::decode_counts_message(again, limits, issues2);
  if (!back.ok() || !issues2.empty() || back->blocks.size() != m->blocks.size()) std::abort();
  for (size_t i = 0; i < m->blocks.size(); ++i) {
    const auto& a = m->blocks[i];
    const auto& b = back->blocks[i];
    if (a.hash != b.hash || a.parent != b.parent || a.counts.ids() != b.counts.ids() ||
        a.counts.counts() != b.counts.counts() || a.counts.tokens() != b.counts.tokens())
      std::abort();
  }
  return 0;
}
