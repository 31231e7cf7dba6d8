// counts_message: see counts_message.hpp and docs/protocol.md.
#include "cluster/wire/counts_message.hpp"

#include <string_view>

#include "core/base/msgpack.hpp"
#include "core/expert_ids.hpp"

namespace eldr {
namespace {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;

status read_hash(reader& r, uint64_t& out) {
  item it;
  if (status s = r.next(it); !s.ok()) return s;
  if (it.type == kind::positive_int) {
    out = it.uint_value;
  } else if (it.type == kind::negative_int) {
    out = static_cast<uint64_t>(it.int_value);
  } else if (it.type == kind::bin && it.length >= 1 && it.length <= 64) {
    const uint32_t n = it.length < 8 ? it.length : 8;
    out = 0;
    for (uint32_t i = it.length - n; i < it.length; ++i)
      out = (out << 8) | it.data[i];
  } else {
    return status::invalid_argument(std::string("hash is ") + msgpack::to_string(it.type));
  }
  return {};
}

result<uint32_t> read_u32(reader& r, const char* what) {
  auto v = r.read_uint();
  if (!v.ok() || *v > UINT32_MAX)
    return status::invalid_argument(std::string(what) + " is not a 32-bit unsigned integer");
  return static_cast<uint32_t>(*v);
}

// One block: [hash, parent|nil, tokens, [nnz x L], ids bin, counts bin]; ids take id_bytes each.
status decode_block(reader& r, const model_geometry& g, uint32_t id_bytes, counts_block& out) {
  auto n = r.read_array_header();
  if (!n.ok() || *n < 6) return status::invalid_argument("block is not an array of 6");
  if (status s = read_hash(r, out.hash); !s.ok()) return s;
  item p;
  if (status s = r.peek(p); !s.ok()) return s;
  if (p.type == kind::nil) {
    (void)r.skip();
    out.parent.reset();
  } else {
    uint64_t h = 0;
    if (status s = read_hash(r, h); !s.ok()) return s;
    out.parent = h;
  }
  auto tokens = read_u32(r, "tokens");
  if (!tokens.ok()) return tokens.error();
  auto layers = r.read_array_header();
  if (!layers.ok() || *layers != g.layers)
    return status::invalid_argument("layer sizes: expected an array of " +
                                    std::to_string(g.layers));
  std::vector<uint32_t> offsets(size_t{g.layers} + 1, 0);
  for (uint32_t l = 0; l < g.layers; ++l) {
    auto z = read_u32(r, "a layer size");
    if (!z.ok()) return z.error();
    if (*z > g.experts) return status::invalid_argument("a layer size exceeds E");
    offsets[l + 1] = offsets[l] + *z;
  }
  auto ids = r.read_bin();
  auto counts = r.read_bin();
  if (!ids.ok() || !counts.ok()) return status::invalid_argument("ids or counts is not a bin");
  if (ids->size() != size_t{offsets.back()} * id_bytes || counts->size() != offsets.back())
    return status::invalid_argument("ids must hold sum(layer sizes) ids of " +
                                    std::to_string(id_bytes) +
                                    " byte(s) and counts sum(layer sizes) bytes");
  for (uint32_t i = 6; i < *n; ++i)
    if (status s = r.skip(); !s.ok()) return s;
  std::vector<expert_id> id_values;
  (void)read_expert_ids(*ids, id_bytes, id_values);  // the length was checked above
  auto c = block_counts::from_parts(g, *tokens, std::move(offsets), std::move(id_values),
                                    std::vector<uint8_t>(counts->begin(), counts->end()));
  if (!c.ok()) return c.error();
  out.counts = std::move(*c);
  return {};
}

}  // namespace

uint32_t counts_message_version_for(const model_geometry& g) {
  return g.narrow_ids() ? counts_message_v1 : counts_message_v2;
}

std::vector<uint8_t> encode_counts_message(const counts_message& m) {
  return encode_counts_message(m, counts_message_version_for(m.geometry));
}

std::vector<uint8_t> encode_counts_message(const counts_message& m, uint32_t version) {
  const uint32_t id_bytes = version == counts_message_v1 ? narrow_id_bytes : wide_id_bytes;
  std::vector<uint8_t> out;
  // Reserved at a bound of the size: growing a message of megabytes (4,096 tokens of a 48-layer
  // model make 2 MB) by doubling would copy it again and again.
  size_t bound = 64;
  for (const counts_block& b : m.blocks)
    bound += 40 + size_t{b.counts.layers()} * 5 + b.counts.ids().size() * id_bytes +
             b.counts.counts().size();
  out.reserve(bound);
  msgpack::writer w(out);
  w.write_map_header(m.seq ? 4 : 3);
  w.write_str("v");
  w.write_uint(version);
  w.write_str("model");
  w.write_array_header(3);
  w.write_uint(m.geometry.layers);
  w.write_uint(m.geometry.experts);
  w.write_uint(m.geometry.top_k);
  if (m.seq) {
    w.write_str("seq");
    w.write_uint(*m.seq);
  }
  w.write_str("blocks");
  w.write_array_header(static_cast<uint32_t>(m.blocks.size()));
  for (const counts_block& b : m.blocks) {
    w.write_array_header(6);
    w.write_uint(b.hash);
    if (b.parent)
      w.write_uint(*b.parent);
    else
      w.write_nil();
    w.write_uint(b.counts.tokens());
    w.write_array_header(b.counts.layers());
    for (uint32_t l = 0; l < b.counts.layers(); ++l)
      w.write_uint(b.counts.offset(l + 1) - b.counts.offset(l));
    w.write_bin_header(b.counts.ids().size() * id_bytes);
    append_expert_ids(b.counts.ids(), id_bytes, out);
    w.write_bin(b.counts.counts());
  }
  return out;
}

drop_cause counts_error_cause(const status& s) {
  switch (s.code()) {
    case status_code::corrupt:
      return drop_cause::bad_msgpack;
    case status_code::failed_precondition:
      return drop_cause::unsupported_version;
    case status_code::out_of_range:
      return drop_cause::oversized;
    default:
      return drop_cause::bad_batch;
  }
}

result<counts_message> decode_counts_message(std::span<const uint8_t> payload,
                                             const counts_decode_limits& limits,
                                             std::vector<kv_decode_issue>& issues) {
  reader r(payload.data(), payload.size());
  item top;
  if (status s = r.peek(top); !s.ok()) return s;
  if (top.type != kind::map)
    return status::invalid_argument(std::string("counts message is ") +
                                    msgpack::to_string(top.type));
  const uint32_t pairs = *r.read_map_header();
  counts_message m;
  bool have_version = false, have_model = false;
  std::optional<size_t> blocks_at;  // blocks may precede "model": decode them after the loop
  for (uint32_t i = 0; i < pairs; ++i) {
    auto key = r.read_str();
    if (!key.ok()) return status::invalid_argument("counts message key is not a string");
    if (*key == "v") {
      auto v = read_u32(r, "v");
      if (!v.ok()) return v.error();
      if (*v != counts_message_v1 && *v != counts_message_v2)
        return status::failed_precondition(
            "counts message version " + std::to_string(*v) + ", this build reads versions " +
            std::to_string(counts_message_v1) + " and " + std::to_string(counts_message_v2));
      m.version = *v;
      have_version = true;
    } else if (*key == "model") {
      auto n = r.read_array_header();
      if (!n.ok() || *n != 3) return status::invalid_argument("model is not [L, E, k]");
      auto l = read_u32(r, "L");
      auto e = read_u32(r, "E");
      auto k = read_u32(r, "k");
      if (!l.ok() || !e.ok() || !k.ok()) return status::invalid_argument("model is not [L, E, k]");
      m.geometry = {*l, *e, *k};
      if (status s = m.geometry.validate(); !s.ok()) return status::invalid_argument(s.message());
      if (m.geometry.layers > 1024) return status::invalid_argument("model has over 1024 layers");
      have_model = true;
    } else if (*key == "seq") {
      auto v = r.read_uint();
      if (!v.ok()) return status::invalid_argument("seq is not an unsigned integer");
      m.seq = *v;
    } else if (*key == "blocks" && !blocks_at) {
      blocks_at = r.offset();
      if (status s = r.skip(); !s.ok()) return s;
    } else if (status s = r.skip(); !s.ok()) {
      return s;
    }
  }
  if (!r.at_end()) return status::corrupt("trailing bytes after the counts message");
  if (!have_version) return status::invalid_argument("counts message without \"v\"");
  if (!have_model) return status::invalid_argument("counts message without \"model\"");
  if (!blocks_at) return status::invalid_argument("counts message without \"blocks\"");
  if (m.version == counts_message_v1 && !m.geometry.narrow_ids())
    return status::invalid_argument(
        "counts message version 1 holds one byte per expert id, but the model has " +
        std::to_string(m.geometry.experts) + " experts (more than " +
        std::to_string(narrow_experts) + " need version 2)");
  const uint32_t id_bytes = m.version == counts_message_v1 ? narrow_id_bytes : wide_id_bytes;
  r.seek(*blocks_at);
  auto n = r.read_array_header();
  if (!n.ok()) return status::invalid_argument("blocks is not an array");
  if (*n > limits.max_blocks)
    return status::out_of_range("counts message of " + std::to_string(*n) + " blocks, limit " +
                                std::to_string(limits.max_blocks));
  m.blocks.reserve(*n);
  for (uint32_t i = 0; i < *n; ++i) {
    const size_t begin = r.offset();
    counts_block b;
    if (status s = decode_block(r, m.geometry, id_bytes, b); !s.ok()) {
      r.seek(begin);
      if (status skipped = r.skip(); !skipped.ok()) return skipped;
      issues.push_back({drop_cause::bad_counts, "block " + std::to_string(i) + ": " + s.message()});
      continue;
    }
    m.blocks.push_back(std::move(b));
  }
  return m;
}

}  // namespace eldr
