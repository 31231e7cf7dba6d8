// trace: eldr-trace v1/v2 decoding (two passes over each map: first find the known keys, then
// decode them in a fixed order so errors can name the request by id), validation, encoding, file
// I/O.
#include "core/formats/trace.hpp"

#include <array>
#include <cassert>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "core/base/file_io.hpp"
#include "core/base/msgpack.hpp"
#include "core/expert_ids.hpp"
#include "core/formats/format_head.hpp"

namespace eldr {

namespace {

constexpr std::string_view format_name = "eldr-trace";
// Version 1: one byte per id (E <= 256). Version 2: little-endian uint16 ids, any valid E.
constexpr uint64_t narrow_version = 1;
constexpr uint64_t wide_version = 2;
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

// Where the values of a map's known keys start. Unknown keys are skipped and forgotten.
class map_fields {
 public:
  explicit map_fields(std::initializer_list<std::string_view> known) : keys_(known) {
    offsets_.fill(not_present);
  }
  std::optional<size_t> offset(std::string_view key) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (keys_[i] == key && offsets_[i] != not_present) return offsets_[i];
    return std::nullopt;
  }

 private:
  friend class decoder;
  static constexpr size_t not_present = std::numeric_limits<size_t>::max();
  std::vector<std::string_view> keys_;
  std::array<size_t, 8> offsets_{};
};

// Turns the bytes of one file into a trace. Every error it returns is corrupt and reads
// "<file>: <map>: <problem>", the map being "model" or "requests[3] (id "x")" (nothing at the top
// level) and the problem naming the key; a MessagePack-level error names "<map>.<key>" instead.
class decoder {
 public:
  decoder(const uint8_t* data, size_t size, const std::string& name)
      : in_(data, size), name_(name) {}

  result<trace> run();

 private:
  status fail(const std::string& where, const std::string& what) const {
    return status::corrupt(name_ + ": " + (where.empty() ? "" : where + ": ") + what);
  }
  // "x" at the top level, "model.x" inside a map.
  static std::string field(const std::string& where, std::string_view key) {
    return where.empty() ? std::string(key) : where + "." + std::string(key);
  }

  // Reads a map at the cursor, recording where each known key's value starts; keys must be str
  // and a known key may appear once. Leaves the cursor after the map.
  status scan_map(const std::string& where, map_fields& fields);
  // Positions the cursor on a required key's value, or fails naming the missing key.
  status seek_required(const map_fields& fields, const std::string& where, std::string_view key);

  result<uint32_t> read_u32(const std::string& where, std::string_view key);
  result<std::string> read_string(const std::string& where, std::string_view key);
  // Reads an optional string key; "" when absent.
  result<std::string> read_optional_string(const map_fields& fields, const std::string& where,
                                           std::string_view key);
  status read_model(trace& t);
  status read_request(size_t index, trace_request& req);

  msgpack::reader in_;
  const std::string& name_;
  uint32_t id_bytes_ = narrow_id_bytes;  // of the file's version
};

status decoder::scan_map(const std::string& where, map_fields& fields) {
  msgpack::item it;
  if (status s = in_.next(it); !s.ok()) return fail(where, s.message());
  if (it.type != msgpack::kind::map)
    return fail(where, std::string("expected a map, found ") + msgpack::to_string(it.type));
  assert(fields.keys_.size() <= fields.offsets_.size());
  for (uint32_t i = 0; i < it.length; ++i) {
    msgpack::item key;
    if (status s = in_.next(key); !s.ok()) return fail(where, s.message());
    if (key.type != msgpack::kind::str)
      return fail(where, "key #" + std::to_string(i) + " is not a str (found " +
                             msgpack::to_string(key.type) + ")");
    for (size_t k = 0; k < fields.keys_.size(); ++k) {
      if (fields.keys_[k] != key.str()) continue;
      if (fields.offsets_[k] != map_fields::not_present)
        return fail(where, "duplicate key '" + std::string(key.str()) + "'");
      fields.offsets_[k] = in_.offset();
    }
    if (status s = in_.skip(); !s.ok()) return fail(field(where, key.str()), s.message());
  }
  return {};
}

status decoder::seek_required(const map_fields& fields, const std::string& where,
                              std::string_view key) {
  const std::optional<size_t> off = fields.offset(key);
  if (!off) return fail(where, "missing key '" + std::string(key) + "'");
  in_.seek(*off);
  return {};
}

result<uint32_t> decoder::read_u32(const std::string& where, std::string_view key) {
  msgpack::item it;
  if (status s = in_.next(it); !s.ok()) return fail(field(where, key), s.message());
  if (it.type == msgpack::kind::negative_int)
    return fail(where, std::string(key) + " must be >= 0, got " + std::to_string(it.int_value));
  if (it.type != msgpack::kind::positive_int)
    return fail(where,
                std::string(key) + " must be an integer, found " + msgpack::to_string(it.type));
  if (it.uint_value > std::numeric_limits<uint32_t>::max())
    return fail(where, std::string(key) + " is " + std::to_string(it.uint_value) +
                           ", more than 4294967295");
  return static_cast<uint32_t>(it.uint_value);
}

result<std::string> decoder::read_string(const std::string& where, std::string_view key) {
  msgpack::item it;
  if (status s = in_.next(it); !s.ok()) return fail(field(where, key), s.message());
  if (it.type != msgpack::kind::str)
    return fail(where, std::string(key) + " must be a str, found " + msgpack::to_string(it.type));
  return std::string(it.str());
}

result<std::string> decoder::read_optional_string(const map_fields& fields,
                                                  const std::string& where, std::string_view key) {
  const std::optional<size_t> off = fields.offset(key);
  if (!off) return std::string();
  in_.seek(*off);
  return read_string(where, key);
}

status decoder::read_model(trace& t) {
  const std::string where = "model";
  map_fields fields{"name", "layers", "experts", "top_k"};
  if (status s = scan_map(where, fields); !s.ok()) return s;
  if (status s = seek_required(fields, where, "name"); !s.ok()) return s;
  result<std::string> name = read_string(where, "name");
  if (!name) return name.error();
  t.model_name = std::move(*name);
  const std::pair<std::string_view, uint32_t*> dims[] = {{"layers", &t.geometry.layers},
                                                         {"experts", &t.geometry.experts},
                                                         {"top_k", &t.geometry.top_k}};
  for (const auto& [key, target] : dims) {
    if (status s = seek_required(fields, where, key); !s.ok()) return s;
    result<uint32_t> v = read_u32(where, key);
    if (!v) return v.error();
    *target = *v;
  }
  if (status s = t.geometry.validate(); !s.ok()) return fail(where, s.message());
  if (id_bytes_ == narrow_id_bytes && !t.geometry.narrow_ids())
    return fail(where, "experts is " + std::to_string(t.geometry.experts) +
                           ", but version 1 holds one byte per id (experts <= " +
                           std::to_string(narrow_experts) + "); wider models need version 2");
  return {};
}

status decoder::read_request(size_t index, trace_request& req) {
  std::string where = request_name(index, "");
  map_fields fields{"id", "label", "prompt_tokens", "output_tokens", "arrival_s", "experts"};
  if (status s = scan_map(where, fields); !s.ok()) return s;
  const size_t end = in_.offset();  // the next request starts here, whatever is read below

  // The id first, so that every later message can name the request by it.
  if (status s = seek_required(fields, where, "id"); !s.ok()) return s;
  result<std::string> id = read_string(where, "id");
  if (!id) return id.error();
  req.id = std::move(*id);
  where = request_name(index, req.id);

  result<std::string> label = read_optional_string(fields, where, "label");
  if (!label) return label.error();
  req.label = std::move(*label);

  const std::pair<std::string_view, uint32_t*> counts[] = {{"prompt_tokens", &req.prompt_tokens},
                                                           {"output_tokens", &req.output_tokens}};
  for (const auto& [key, target] : counts) {
    if (status s = seek_required(fields, where, key); !s.ok()) return s;
    result<uint32_t> v = read_u32(where, key);
    if (!v) return v.error();
    *target = *v;
  }

  if (const std::optional<size_t> off = fields.offset("arrival_s")) {
    in_.seek(*off);
    msgpack::item it;
    if (status s = in_.next(it); !s.ok()) return fail(field(where, "arrival_s"), s.message());
    if (it.is_float()) {
      req.arrival_s = it.float_value;
    } else if (it.type == msgpack::kind::positive_int) {
      req.arrival_s = static_cast<double>(it.uint_value);
    } else if (it.type == msgpack::kind::negative_int) {
      req.arrival_s = static_cast<double>(it.int_value);  // validate_trace rejects it
    } else {
      return fail(where,
                  std::string("arrival_s must be a number, found ") + msgpack::to_string(it.type));
    }
  }

  if (status s = seek_required(fields, where, "experts"); !s.ok()) return s;
  msgpack::item it;
  if (status s = in_.next(it); !s.ok()) return fail(field(where, "experts"), s.message());
  if (it.type != msgpack::kind::bin)
    return fail(where, std::string("experts must be a bin, found ") + msgpack::to_string(it.type));
  // Bounded by twice the file's own size: the reader checked the length against the bytes
  // present, and an id takes at least one byte.
  if (!read_expert_ids(it.bytes(), id_bytes_, req.experts))
    return fail(where, "experts has " + std::to_string(it.length) +
                           " bytes, not a whole number of " + std::to_string(id_bytes_) +
                           "-byte ids");
  in_.seek(end);
  return {};
}

result<trace> decoder::run() {
  if (in_.size() == 0) return fail("", "empty file, expected an eldr-trace MessagePack map");
  msgpack::item top;
  if (status s = in_.peek(top); !s.ok()) return fail("", s.message());
  if (top.type != msgpack::kind::map)
    return fail("", std::string("not an eldr-trace file: the top-level value is a ") +
                        msgpack::to_string(top.type) + ", expected a map");

  map_fields fields{"format", "version", "model", "source", "requests"};
  if (status s = scan_map("", fields); !s.ok()) return s;
  if (!in_.at_end())
    return fail("", std::to_string(in_.remaining()) + " trailing byte(s) after the top-level map" +
                        " (at byte " + std::to_string(in_.offset()) + ")");

  // format and version before anything else: a different file type or a future version should
  // say so, not fail on some field it happens to lay out differently.
  if (!fields.offset("format"))
    return fail("", "missing key 'format' (expected " + in_quotes(format_name) + ")");
  in_.seek(*fields.offset("format"));
  result<std::string> format = read_string("", "format");
  if (!format) return format.error();
  if (*format != format_name)
    return fail("", "format is " + in_quotes(*format) + ", expected " + in_quotes(format_name));

  if (status s = seek_required(fields, "", "version"); !s.ok()) return s;
  msgpack::item version;
  if (status s = in_.next(version); !s.ok()) return fail("version", s.message());
  if (!version.is_integer())
    return fail(
        "", std::string("version must be an integer, found ") + msgpack::to_string(version.type));
  if (version.type != msgpack::kind::positive_int ||
      (version.uint_value != narrow_version && version.uint_value != wide_version))
    return fail(
        "", "unsupported version " +
                (version.type == msgpack::kind::positive_int ? std::to_string(version.uint_value)
                                                             : std::to_string(version.int_value)) +
                " (this reader supports versions " + std::to_string(narrow_version) + " and " +
                std::to_string(wide_version) + ")");
  id_bytes_ = version.uint_value == narrow_version ? narrow_id_bytes : wide_id_bytes;

  trace t;
  if (status s = seek_required(fields, "", "model"); !s.ok()) return s;
  if (status s = read_model(t); !s.ok()) return s;

  result<std::string> source = read_optional_string(fields, "", "source");
  if (!source) return source.error();
  t.source = std::move(*source);

  if (status s = seek_required(fields, "", "requests"); !s.ok()) return s;
  msgpack::item requests;
  if (status s = in_.next(requests); !s.ok()) return fail("requests", s.message());
  if (requests.type != msgpack::kind::array)
    return fail(
        "", std::string("requests must be an array, found ") + msgpack::to_string(requests.type));
  // No reserve by the declared count: a request is worth ~100 bytes in memory but may be 1 byte
  // on the wire (and then fails), so growing with the requests actually decoded bounds memory by
  // the input's size.
  for (uint32_t i = 0; i < requests.length; ++i) {
    trace_request req;
    if (status s = read_request(i, req); !s.ok()) return s;
    t.requests.push_back(std::move(req));
  }

  if (status s = validate_trace(t); !s.ok()) return fail("", s.message());
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
  return decoder(data, size, name_for_errors).run();
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

  msgpack::writer w(out);
  w.write_map_header(5);
  write_format_head(w, format_name, version, t.model_name, t.geometry);
  w.write_str("source");
  w.write_str(t.source);
  w.write_str("requests");
  w.write_array_header(static_cast<uint32_t>(t.requests.size()));
  for (const trace_request& r : t.requests) {
    w.write_map_header(r.arrival_s ? 6 : 5);
    w.write_str("id");
    w.write_str(r.id);
    w.write_str("label");
    w.write_str(r.label);
    w.write_str("prompt_tokens");
    w.write_uint(r.prompt_tokens);
    w.write_str("output_tokens");
    w.write_uint(r.output_tokens);
    if (r.arrival_s) {
      w.write_str("arrival_s");
      w.write_float64(*r.arrival_s);
    }
    w.write_str("experts");
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
