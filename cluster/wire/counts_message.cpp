// counts_message: see counts_message.hpp and docs/protocol.md. The top-level map is a field
// table (counts_table); the blocks, positional arrays on the node's hot path, are read and
// written by hand.
#include "cluster/wire/counts_message.hpp"

#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <variant>

#include "core/base/field_table.hpp"
#include "core/base/msgpack.hpp"
#include "core/base/msgpack_fields.hpp"
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

// The message's map as the table reads and writes it: the blocks stay where they are (the
// encoder's span, the decoder's offset) and are written and read by the positional code above.
struct counts_map {
  uint32_t version = 0;
  model_geometry geometry;
  std::optional<uint64_t> seq;
  size_t blocks_at = 0;  // decoding: where the blocks array starts
  // Encoding: the producer that adds the blocks (encode_as_added), the blocks it announced, and
  // where its outcome goes.
  const std::function<status(counts_block_writer&)>* produce = nullptr;
  uint32_t produce_blocks = 0;
  status* produced = nullptr;
};

using L = counts_decode_limits;
using F = table::fields<counts_map, L>;

status read_version(reader& r, const F::spec&, const F::context&, std::string_view what,
                    counts_map& m) {
  if (status s = table::read_u32(r, what, m.version); !s.ok()) return s;
  if (m.version != counts_message_v1 && m.version != counts_message_v2)
    return status::failed_precondition(
        table::join(what, ": ") + std::to_string(m.version) + ", this build reads versions " +
        std::to_string(counts_message_v1) + " and " + std::to_string(counts_message_v2));
  return {};
}

status read_model(reader& r, const F::spec&, const F::context&, std::string_view what,
                  counts_map& m) {
  item a;
  if (status s = table::next_of(r, kind::array, what, a); !s.ok()) return s;
  if (a.length != 3) return status::invalid_argument(table::join(what, ": not [L, E, k]"));
  model_geometry& g = m.geometry;
  for (auto [member, name] : {std::pair{&model_geometry::layers, "L"},
                              {&model_geometry::experts, "E"},
                              {&model_geometry::top_k, "k"}})
    if (status s = table::read_u32(r, table::field(what, name), g.*member); !s.ok()) return s;
  if (status s = g.validate(); !s.ok())
    return status::invalid_argument(table::at(what, s).message());
  if (g.layers > 1024)
    return status::invalid_argument(table::join(what, ": ") + std::to_string(g.layers) +
                                    " layers, limit 1024");
  return {};
}

void write_model(std::vector<uint8_t>& out, const counts_map& m) {
  msgpack::writer w(out);
  w.write_array_header(3);
  w.write_uint(m.geometry.layers);
  w.write_uint(m.geometry.experts);
  w.write_uint(m.geometry.top_k);
}

// Only checked and skipped here: "blocks" may precede "model", whose geometry decodes them.
status read_blocks(reader& r, const F::spec& f, const F::context& c, std::string_view what,
                   counts_map& m) {
  const size_t begin = r.offset();
  item a;
  if (status s = table::read_array(r, what, f.limit_in(c.limits), f.unit, a); !s.ok()) return s;
  r.seek(begin);
  if (status s = r.skip(); !s.ok()) return table::at(what, s);
  m.blocks_at = begin;
  return {};
}

void write_blocks(std::vector<uint8_t>& out, const counts_map& m) {
  const uint32_t id_bytes = m.version == counts_message_v1 ? narrow_id_bytes : wide_id_bytes;
  msgpack::writer(out).write_array_header(m.produce_blocks);
  counts_block_writer blocks(out, id_bytes);
  status s = (*m.produce)(blocks);
  if (s.ok() && blocks.added() != m.produce_blocks)
    s = status::failed_precondition("counts message: " + std::to_string(m.produce_blocks) +
                                    " blocks announced, " + std::to_string(blocks.added()) +
                                    " added");
  *m.produced = std::move(s);
}

const table::message_table<counts_map, L> counts_table{
    "eldr-counts",
    {
        F::custom("v", table::required, read_version,
                  [](std::vector<uint8_t>& out, const counts_map& m) {
                    msgpack::writer(out).write_uint(m.version);
                  }),
        F::custom("model", table::required, read_model, write_model),
        F::u64<&counts_map::seq>("seq"),
        F::custom("blocks", table::required, read_blocks, write_blocks)
            .limited(&L::max_blocks, "blocks"),
    },
    [](const counts_map& m, uint64_t) {
      if (m.version == counts_message_v1 && !m.geometry.narrow_ids())
        return status::invalid_argument(
            "eldr-counts.v: version 1 holds one byte per expert id, but the model has " +
            std::to_string(m.geometry.experts) + " experts (more than " +
            std::to_string(narrow_experts) + " need version 2)");
      return status{};
    }};

}  // namespace

uint32_t counts_message_version_for(const model_geometry& g) {
  return g.narrow_ids() ? counts_message_v1 : counts_message_v2;
}

// One block: [hash, parent|nil, tokens, [nnz x L], ids bin, counts bin]; ids take id_bytes each.
void counts_block_writer::add(uint64_t hash, std::optional<uint64_t> parent,
                              const block_counts_view& counts) {
  msgpack::writer w(out_);
  w.write_array_header(6);
  w.write_uint(hash);
  if (parent)
    w.write_uint(*parent);
  else
    w.write_nil();
  w.write_uint(counts.tokens);
  const size_t layers = counts.layer_offsets.empty() ? 0 : counts.layer_offsets.size() - 1;
  w.write_array_header(static_cast<uint32_t>(layers));
  for (size_t l = 0; l < layers; ++l)
    w.write_uint(counts.layer_offsets[l + 1] - counts.layer_offsets[l]);
  w.write_bin_header(counts.ids.size() * id_bytes_);
  append_expert_ids(counts.ids, id_bytes_, out_);
  w.write_bin(counts.counts);
  ++added_;
}

namespace {

// The one writer of a message: both encoders below.
result<std::vector<uint8_t>> encode_as_added(
    const model_geometry& g, std::optional<uint64_t> seq, uint32_t version, uint32_t n_blocks,
    size_t reserve, const std::function<status(counts_block_writer&)>& produce) {
  std::vector<uint8_t> out;
  out.reserve(reserve);
  status produced;
  counts_map m;
  m.version = version;
  m.geometry = g;
  m.seq = seq;
  m.produce = &produce;
  m.produce_blocks = n_blocks;
  m.produced = &produced;
  counts_table.write_map(out, m);
  if (!produced.ok()) return produced;
  return out;
}

}  // namespace

result<std::vector<uint8_t>> encode_counts_message_as_added(
    const model_geometry& g, std::optional<uint64_t> seq, uint32_t n_blocks, size_t reserve,
    const std::function<status(counts_block_writer&)>& produce) {
  return encode_as_added(g, seq, counts_message_version_for(g), n_blocks, reserve, produce);
}

std::vector<uint8_t> encode_counts_message(const counts_message& m) {
  return encode_counts_message(m, counts_message_version_for(m.geometry));
}

std::vector<uint8_t> encode_counts_message(const counts_message& m, uint32_t version) {
  const uint32_t id_bytes = version == counts_message_v1 ? narrow_id_bytes : wide_id_bytes;
  // Reserved at a bound of the size: growing a message of megabytes (4,096 tokens of a 48-layer
  // model make 2 MB) by doubling would copy it again and again.
  size_t bound = 64;
  for (const counts_block& b : m.blocks)
    bound += 40 + size_t{b.counts.layers()} * 5 + b.counts.ids().size() * id_bytes +
             b.counts.counts().size();
  auto out = encode_as_added(m.geometry, m.seq, version, static_cast<uint32_t>(m.blocks.size()),
                             bound, [&](counts_block_writer& w) {
                               for (const counts_block& b : m.blocks)
                                 w.add(b.hash, b.parent, b.counts.view());
                               return status{};
                             });
  return std::move(out).value();  // this producer adds every block it announced, without error
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
  counts_map map;
  std::monostate none;
  if (status s = counts_table.read(r, {limits, payload, none}, map); !s.ok()) return s;
  if (!r.at_end()) return status::corrupt("trailing bytes after the counts message");
  counts_message m;
  m.version = map.version;
  m.geometry = map.geometry;
  m.seq = map.seq;
  const uint32_t id_bytes = m.version == counts_message_v1 ? narrow_id_bytes : wide_id_bytes;
  r.seek(map.blocks_at);
  const uint32_t n = *r.read_array_header();  // read_blocks checked it and its limit
  m.blocks.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
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
