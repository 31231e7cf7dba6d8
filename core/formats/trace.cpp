// trace: eldr-trace v1/v2 decoding (field tables: the file's map, its model map and each
// request's map), validation, encoding, file I/O.
#include "core/formats/trace.hpp"

#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "core/base/field_table.hpp"
#include "core/base/file_io.hpp"
#include "core/base/msgpack.hpp"
#include "core/base/msgpack_fields.hpp"
#include "core/expert_ids.hpp"
#include "core/formats/format_head.hpp"

namespace eldr {

namespace {

constexpr std::string_view format_name = "eldr-trace";
// Version 1: one byte per id (E <= 256). Version 2: little-endian uint16 ids, any valid E.
constexpr uint32_t narrow_version = 1;
constexpr uint32_t wide_version = 2;
constexpr uint64_t max_bin_bytes = 0xffffffffu;

std::string in_quotes(std::string_view s) {
  // Appended piecewise: g++ 12 at -O3 misreports "\"" + std::string(s) under -Wrestrict.
  std::string q;
  q.reserve(s.size() + 2);
  q.push_back('"');
  q.append(s);
  q.push_back('"');
  return q;
}

// "requests[3] (id "abc")", the way every message names a request.
std::string request_name(size_t index, std::string_view id) {
  std::string s = "requests[" + std::to_string(index) + "]";
  if (!id.empty()) s += " (id " + in_quotes(id) + ")";
  return s;
}

// ---- decoding ----

// What the request fields read beyond their own map: the width of an expert id in the file's
// version.
struct trace_ids {
  uint32_t id_bytes = narrow_id_bytes;
};

using ctx = file_context<trace_ids>;
using table::once;
constexpr unsigned required_once = table::required | once;

// The file's map as read.
struct trace_map {
  std::optional<std::string> format;
  std::optional<uint32_t> version;
  format_model model;
  std::string source;
  std::vector<trace_request> requests;
};

using request_fields = table::fields<trace_request, file_limits, trace_ids>;

status read_experts(msgpack::reader& r, const request_fields::spec&, const ctx& c,
                    std::string_view what, trace_request& m) {
  msgpack::item it;
  if (status s = table::next_of(r, msgpack::kind::bin, what, it); !s.ok()) return s;
  // Bounded by twice the file's own size: the reader checked the length against the bytes
  // present, and an id takes at least one byte.
  if (!read_expert_ids(it.bytes(), c.extra.id_bytes, m.experts))
    return status::invalid_argument(table::join(what, ": ") + std::to_string(it.length) +
                                    " bytes, not a whole number of " +
                                    std::to_string(c.extra.id_bytes) + "-byte ids");
  return {};
}

// A request's map. Its errors name it "request.x"; read_requests names the request instead.
const table::message_table<trace_request, file_limits, trace_ids> request_table{
    "request",
    {
        request_fields::str<&trace_request::id>("id", &file_limits::max_name_bytes, required_once),
        request_fields::str<&trace_request::label>("label", &file_limits::max_name_bytes, once),
        request_fields::u32<&trace_request::prompt_tokens>("prompt_tokens", required_once),
        request_fields::u32<&trace_request::output_tokens>("output_tokens", required_once),
        request_fields::f64<&trace_request::arrival_s>("arrival_s", once),
        // Last, and written by encode_trace (write_all_but): the ids' width is the version's.
        request_fields::custom("experts", required_once, read_experts, nullptr),
    }};

using trace_fields = table::fields<trace_map, file_limits, trace_ids>;

// Each request is named by its index and, once read, its id: "eldr-trace.requests[3] (id "x")
// .prompt_tokens: expected int, found str".
status read_requests(msgpack::reader& r, const trace_fields::spec&, const ctx& c,
                     std::string_view what, trace_map& m) {
  msgpack::item a;
  if (status s = table::read_array(r, what, UINT32_MAX, "requests", a); !s.ok()) return s;
  // No reserve by the declared count: a request is worth ~100 bytes in memory but may be 1 byte
  // on the wire (and then fails), so growing with the requests actually decoded bounds memory by
  // the input's size.
  m.requests.clear();
  for (uint32_t i = 0; i < a.length; ++i) {
    trace_request req;
    if (status s = request_table.read(r, c, req); !s.ok()) {
      // The table names "request.prompt_tokens", "request key" or "request": the request's
      // index and id take the place of "request".
      std::string_view rest = s.message();
      if (rest.starts_with(request_table.type())) rest.remove_prefix(request_table.type().size());
      return {s.code(), table::field("eldr-trace", request_name(i, req.id)) + std::string(rest)};
    }
    m.requests.push_back(std::move(req));
  }
  return {};
}

const auto trace_model_table = model_table<trace_ids>("eldr-trace.model");

const table::message_table<trace_map, file_limits, trace_ids> trace_table{
    format_name,
    {
        format_field<trace_map, trace_ids>(),
        version_field<trace_map, trace_ids>(),
        trace_fields::map<&trace_map::model, trace_model_table>("model", required_once),
        trace_fields::str<&trace_map::source>("source", &file_limits::max_text_bytes, once),
        // Last, and written by encode_trace, as a request's experts.
        trace_fields::custom("requests", required_once, read_requests, nullptr),
    }};

// Writes m's map but for its last field, `last`, whose key it writes and whose value the caller
// appends: the table writes every other field (the experts' width is the version's, which a
// field's writer does not see).
template <class M>
void write_all_but(const table::message_table<M, file_limits, trace_ids>& fields_of,
                   std::string_view last, const M& m, std::vector<uint8_t>& out) {
  const uint64_t set = fields_of.present(m) & ~fields_of.bit(last);
  msgpack::writer w(out);
  w.write_map_header(static_cast<uint32_t>(std::popcount(set)) + 1);
  fields_of.write_fields(out, m, set);
  w.write_str(last);
}

// Turns the bytes of one file into a trace. Every error it returns is corrupt and reads
// "<file>: eldr-trace.<field>: <problem>" (the tables' form), a request being named by its index
// and id.
result<trace> decode(const uint8_t* data, size_t size, const std::string& name) {
  const auto fail = [&](const std::string& what) { return status::corrupt(name + ": " + what); };
  if (size == 0) return fail("empty file, expected an eldr-trace MessagePack map");
  const std::span<const uint8_t> bytes(data, size);
  // format and version before anything else: a different file type or a future version should
  // say so, not fail on some field it happens to lay out differently.
  uint32_t version = 0;
  if (status s = check_format_head(bytes, format_name, {narrow_version, wide_version}, version);
      !s.ok())
    return fail(s.message());
  msgpack::reader in(data, size);
  const file_limits limits;
  trace_ids ids{version == narrow_version ? narrow_id_bytes : wide_id_bytes};
  trace_map m;
  if (status s = trace_table.read(in, {limits, bytes, ids}, m); !s.ok()) return fail(s.message());
  if (!in.at_end())
    return fail(std::to_string(in.remaining()) + " trailing byte(s) after the top-level map" +
                " (at byte " + std::to_string(in.offset()) + ")");
  trace t;
  t.model_name = std::move(m.model.name);
  t.geometry = m.model.geometry();
  if (status s = t.geometry.validate(); !s.ok()) return fail("eldr-trace.model: " + s.message());
  if (version == narrow_version && !t.geometry.narrow_ids())
    return fail("eldr-trace.model.experts: " + std::to_string(t.geometry.experts) +
                ", but version 1 holds one byte per id (experts <= " +
                std::to_string(narrow_experts) + "); wider models need version 2");
  t.source = std::move(m.source);
  t.requests = std::move(m.requests);
  if (status s = validate_trace(t); !s.ok()) return fail(s.message());
  return t;
}

// ---- validation ----

std::string token_name(const trace_request& r, uint64_t token, uint32_t layer) {
  std::string s = "token " + std::to_string(token) + " (";
  s += token < r.prompt_tokens ? "prompt token " + std::to_string(token)
                               : "output token " + std::to_string(token - r.prompt_tokens);
  return s + "), layer " + std::to_string(layer);
}

status validate_request(const trace_request& r, size_t index, const model_geometry& g) {
  auto fail = [&](const std::string& what) {
    return status::invalid_argument(request_name(index, r.id) + ": " + what);
  };
  if (r.prompt_tokens < 1) return fail("prompt_tokens must be >= 1, got 0");
  if (r.arrival_s && !(std::isfinite(*r.arrival_s) && *r.arrival_s >= 0.0))
    return fail("arrival_s must be a finite number >= 0, got " + std::to_string(*r.arrival_s));

  // At most 2^33 tokens * 2^20 (L * k <= L * E): cannot overflow 64 bits.
  const uint64_t expected = r.total_tokens() * g.layers * g.top_k;
  auto formula = [&] {
    return "(prompt_tokens + output_tokens) * layers * top_k = (" +
           std::to_string(r.prompt_tokens) + " + " + std::to_string(r.output_tokens) + ") * " +
           std::to_string(g.layers) + " * " + std::to_string(g.top_k) + " = " +
           std::to_string(expected);
  };
  const uint32_t id_bytes = id_bytes_for(g);
  if (expected * id_bytes > max_bin_bytes)
    return fail("experts would need " + formula() + " ids of " + std::to_string(id_bytes) +
                " byte(s), more than a MessagePack bin holds");
  if (r.experts.size() != expected)
    return fail("experts has " + std::to_string(r.experts.size()) + " ids, expected " + formula());

  const expert_id* ids = r.experts.data();
  // One bit per possible id, cleared again after each token-layer (k bits, not E).
  std::array<uint64_t, max_experts / 64> chosen{};
  for (uint64_t t = 0; t < r.total_tokens(); ++t) {
    for (uint32_t l = 0; l < g.layers; ++l, ids += g.top_k) {
      for (uint32_t c = 0; c < g.top_k; ++c) {
        const expert_id e = ids[c];
        if (e >= g.experts)
          return fail(token_name(r, t, l) + ": expert id " + std::to_string(e) + " >= experts (" +
                      std::to_string(g.experts) + ")");
        uint64_t& word = chosen[e >> 6];
        const uint64_t bit = uint64_t{1} << (e & 63);
        if (word & bit)
          return fail(token_name(r, t, l) + ": expert id " + std::to_string(e) +
                      " chosen twice among its top_k");
        word |= bit;
      }
      for (uint32_t c = 0; c < g.top_k; ++c)
        chosen[ids[c] >> 6] = 0;
    }
  }
  return {};
}

}  // namespace

const expert_id* trace_request::token_experts(const model_geometry& g, uint32_t token,
                                              uint32_t layer) const {
  assert(token < total_tokens() && layer < g.layers);
  const size_t at = (static_cast<size_t>(token) * g.layers + layer) * g.top_k;
  assert(at + g.top_k <= experts.size());
  return experts.data() + at;
}

uint64_t trace::total_tokens() const {
  uint64_t n = 0;
  for (const trace_request& r : requests)
    n += r.total_tokens();
  return n;
}

status validate_trace(const trace& t) {
  if (status s = t.geometry.validate(); !s.ok()) return s;
  if (t.requests.size() > std::numeric_limits<uint32_t>::max())
    return status::invalid_argument("trace has " + std::to_string(t.requests.size()) +
                                    " requests, more than a MessagePack array holds");
  std::unordered_map<std::string_view, size_t> first_use;
  first_use.reserve(t.requests.size());
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const trace_request& r = t.requests[i];
    if (r.id.empty()) return status::invalid_argument(request_name(i, "") + ": id is empty");
    const auto [it, inserted] = first_use.emplace(r.id, i);
    if (!inserted)
      return status::invalid_argument(request_name(i, r.id) + ": duplicate id, first used by " +
                                      request_name(it->second, r.id));
    if (status s = validate_request(r, i, t.geometry); !s.ok()) return s;
  }
  return {};
}

result<trace> parse_trace(const uint8_t* data, size_t size, const std::string& name_for_errors) {
  return decode(data, size, name_for_errors);
}

result<trace> read_trace_file(const std::string& path) {
  result<std::vector<uint8_t>> bytes = read_file(path);
  if (!bytes) return bytes.error();
  return parse_trace(bytes->data(), bytes->size(), path);
}

uint32_t trace_version_for(const model_geometry& g) {
  return g.narrow_ids() ? narrow_version : wide_version;
}

std::vector<uint8_t> encode_trace(const trace& t) {
  return encode_trace(t, trace_version_for(t.geometry));
}

std::vector<uint8_t> encode_trace(const trace& t, uint32_t version) {
  const uint32_t id_bytes = version == narrow_version ? narrow_id_bytes : wide_id_bytes;
  std::vector<uint8_t> out;
  size_t payload = 256 + t.model_name.size() + t.source.size();
  for (const trace_request& r : t.requests)
    payload += 96 + r.id.size() + r.label.size() + r.experts.size() * id_bytes;
  out.reserve(payload);

  const trace_map head{
      .format = std::string(format_name),
      .version = version,
      .model = {t.model_name, t.geometry.layers, t.geometry.experts, t.geometry.top_k},
      .source = t.source,
      .requests = {}};
  write_all_but(trace_table, "requests", head, out);
  msgpack::writer w(out);
  w.write_array_header(static_cast<uint32_t>(t.requests.size()));
  for (const trace_request& r : t.requests) {
    write_all_but(request_table, "experts", r, out);
    const size_t bytes = r.experts.size() * id_bytes;
    w.write_bin_header(bytes);
    if (bytes <= max_bin_bytes) append_expert_ids(r.experts, id_bytes, out);
  }
  if (!w.ok()) out.clear();  // a bin over 4 GiB: documented as unencodable
  return out;
}

status write_trace_file(const trace& t, const std::string& path) {
  if (status s = validate_trace(t); !s.ok()) return s;
  return write_file_atomic(path, encode_trace(t));
}

}  // namespace eldr
