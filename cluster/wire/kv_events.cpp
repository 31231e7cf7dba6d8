// kv_events: see kv_events.hpp. Built on core's bounds-checked MessagePack reader, which never
// reads past the payload and bounds every declared length by the bytes left.
#include "cluster/wire/kv_events.hpp"

#include <algorithm>
#include <string_view>

#include "core/base/msgpack.hpp"

namespace eldr {
namespace {

using msgpack::item;
using msgpack::kind;
using msgpack::reader;

enum class field {
  block_hashes,
  parent_block_hash,
  token_ids,
  block_size,
  lora_id,
  medium,
  lora_name,
  extra_keys,
  group_idx,
  spec_kind,
  sliding_window,
  locality,
  ownership,
  unknown,
};

// Declaration order of the array form (the last array-form upstream version; older versions
// write a prefix of it, newer fields arrive only in map form).
constexpr field stored_fields[] = {field::block_hashes, field::parent_block_hash, field::token_ids,
                                   field::block_size,   field::lora_id,           field::medium,
                                   field::lora_name,    field::extra_keys,        field::group_idx,
                                   field::spec_kind,    field::sliding_window};
constexpr field removed_fields[] = {field::block_hashes, field::medium, field::group_idx};

field field_by_name(std::string_view k) {
  if (k == "block_hashes") return field::block_hashes;
  if (k == "parent_block_hash") return field::parent_block_hash;
  if (k == "token_ids") return field::token_ids;
  if (k == "block_size") return field::block_size;
  if (k == "lora_id") return field::lora_id;
  if (k == "medium") return field::medium;
  if (k == "lora_name") return field::lora_name;
  if (k == "extra_keys") return field::extra_keys;
  if (k == "group_idx") return field::group_idx;
  if (k == "kv_cache_spec_kind") return field::spec_kind;
  if (k == "kv_cache_spec_sliding_window") return field::sliding_window;
  if (k == "locality") return field::locality;
  if (k == "ownership") return field::ownership;
  return field::unknown;
}

std::optional<kv_event_type> type_by_tag(std::string_view t) {
  if (t == "BlockStored") return kv_event_type::block_stored;
  if (t == "BlockRemoved") return kv_event_type::block_removed;
  if (t == "AllBlocksCleared") return kv_event_type::all_blocks_cleared;
  return std::nullopt;
}

status wrong_type(const char* what, const item& it) {
  return status::invalid_argument(std::string(what) + " is " + msgpack::to_string(it.type));
}

status read_hash(reader& r, uint64_t& out, const char* what) {
  item it;
  if (status s = r.next(it); !s.ok()) return s;
  switch (it.type) {
    case kind::positive_int:
      out = it.uint_value;
      return {};
    case kind::negative_int:
      out = static_cast<uint64_t>(it.int_value);  // two's complement: the same low 64 bits
      return {};
    case kind::bin: {
      if (it.length == 0 || it.length > 64)
        return status::invalid_argument(std::string(what) + " is a bin of " +
                                        std::to_string(it.length) + " bytes");
      const uint32_t n = it.length < 8 ? it.length : 8;
      out = 0;
      for (uint32_t i = it.length - n; i < it.length; ++i)
        out = (out << 8) | it.data[i];
      return {};
    }
    default:
      return wrong_type(what, it);
  }
}

status read_opt_int(reader& r, std::optional<int64_t>& out, const char* what) {
  item it;
  if (status s = r.next(it); !s.ok()) return s;
  if (it.type == kind::nil) {
    out.reset();
    return {};
  }
  if (it.type == kind::negative_int) {
    out = it.int_value;
    return {};
  }
  if (it.type == kind::positive_int && it.uint_value <= uint64_t{INT64_MAX}) {
    out = static_cast<int64_t>(it.uint_value);
    return {};
  }
  return wrong_type(what, it);
}

status read_opt_str(reader& r, std::optional<std::string>& out, const char* what) {
  item it;
  if (status s = r.next(it); !s.ok()) return s;
  if (it.type == kind::nil) {
    out.reset();
    return {};
  }
  if (it.type != kind::str) return wrong_type(what, it);
  out = std::string(it.str());
  return {};
}

// Copies one whole value as raw MessagePack (nil gives an empty vector).
status read_raw(reader& r, std::span<const uint8_t> payload, std::vector<uint8_t>& out) {
  item it;
  if (status s = r.peek(it); !s.ok()) return s;
  const size_t begin = r.offset();
  if (status s = r.skip(); !s.ok()) return s;
  if (it.type == kind::nil)
    out.clear();
  else
    out.assign(payload.begin() + static_cast<std::ptrdiff_t>(begin),
               payload.begin() + static_cast<std::ptrdiff_t>(r.offset()));
  return {};
}

class event_decoder {
 public:
  event_decoder(std::span<const uint8_t> payload, const kv_decode_limits& limits)
      : payload_(payload), limits_(limits) {}

  // Whether an event went past max_batch_hashes: the batch as a whole is oversized.
  bool batch_over() const { return batch_over_; }

  // Decodes one event; `known` is false (and ok returned) for an unknown tag.
  status decode(reader& r, kv_event& ev, bool& known, std::string& tag) {
    item head;
    if (status s = r.peek(head); !s.ok()) return s;
    if (head.type == kind::array) {
      const uint32_t n = *r.read_array_header();
      if (n == 0) return status::invalid_argument("empty event array");
      auto t = r.read_str();
      if (!t.ok()) return status::invalid_argument("event tag is not a string");
      tag = std::string(*t);
      const auto type = type_by_tag(*t);
      known = type.has_value();
      if (!known) {
        for (uint32_t i = 1; i < n; ++i)
          if (status s = r.skip(); !s.ok()) return s;
        return {};
      }
      ev.type = *type;
      std::span<const field> fields;
      if (ev.type == kv_event_type::block_stored) fields = stored_fields;
      if (ev.type == kv_event_type::block_removed) fields = removed_fields;
      if (n - 1 < std::min<size_t>(fields.size(), 1))
        return status::invalid_argument(tag + " without block_hashes");
      for (uint32_t i = 1; i < n; ++i) {
        const field f = i - 1 < fields.size() ? fields[i - 1] : field::unknown;
        if (status s = read_field(r, f, ev); !s.ok()) return s;
      }
      return {};
    }
    if (head.type == kind::map) {
      const uint32_t pairs = *r.read_map_header();
      bool have_hashes = false;
      std::optional<kv_event_type> type;
      for (uint32_t i = 0; i < pairs; ++i) {
        auto key = r.read_str();
        if (!key.ok()) return status::invalid_argument("event key is not a string");
        if (*key == "type") {
          auto t = r.read_str();
          if (!t.ok()) return status::invalid_argument("event type is not a string");
          tag = std::string(*t);
          type = type_by_tag(*t);
          if (!type) {
            known = false;
            // Skip the rest of an unknown event without reading its fields.
            for (uint64_t j = 2 * (uint64_t{i} + 1); j < 2 * uint64_t{pairs}; ++j)
              if (status s = r.skip(); !s.ok()) return s;
            return {};
          }
          continue;
        }
        const field f = field_by_name(*key);
        have_hashes |= f == field::block_hashes;
        if (status s = read_field(r, f, ev); !s.ok()) return s;
      }
      if (!type) return status::invalid_argument("event map without a \"type\"");
      known = true;
      ev.type = *type;
      if (ev.type != kv_event_type::all_blocks_cleared && !have_hashes)
        return status::invalid_argument(tag + " without block_hashes");
      return {};
    }
    return wrong_type("event", head);
  }

 private:
  status read_field(reader& r, field f, kv_event& ev) {
    const bool details = limits_.keep_details;
    switch (f) {
      case field::block_hashes: {
        auto n = r.read_array_header();
        if (!n.ok()) return status::invalid_argument("block_hashes is not an array");
        if (*n > limits_.max_hashes)
          return status::out_of_range("block_hashes has " + std::to_string(*n) +
                                      " entries, limit " + std::to_string(limits_.max_hashes));
        // Checked before the hashes are read: an oversized batch costs no allocation.
        if (*n > batch_hashes_left_) {
          batch_over_ = true;
          return status::out_of_range("batch holds more than " +
                                      std::to_string(limits_.max_batch_hashes) + " block hashes");
        }
        batch_hashes_left_ -= *n;
        ev.block_hashes.resize(*n);
        for (uint64_t& h : ev.block_hashes)
          if (status s = read_hash(r, h, "a block hash"); !s.ok()) return s;
        return {};
      }
      case field::parent_block_hash: {
        item it;
        if (status s = r.peek(it); !s.ok()) return s;
        if (it.type == kind::nil) {
          ev.parent_block_hash.reset();
          return r.skip();
        }
        uint64_t h = 0;
        if (status s = read_hash(r, h, "parent_block_hash"); !s.ok()) return s;
        ev.parent_block_hash = h;
        return {};
      }
      case field::medium:
        return read_opt_str(r, ev.medium, "medium");
      case field::group_idx:
        return read_opt_int(r, ev.group_idx, "group_idx");
      case field::token_ids: {
        if (!details) return r.skip();
        auto n = r.read_array_header();
        if (!n.ok()) return status::invalid_argument("token_ids is not an array");
        ev.token_ids.resize(*n);
        for (int64_t& t : ev.token_ids) {
          std::optional<int64_t> v;
          if (status s = read_opt_int(r, v, "a token id"); !s.ok()) return s;
          if (!v) return status::invalid_argument("a token id is nil");
          t = *v;
        }
        return {};
      }
      case field::block_size:
        return details ? read_opt_int(r, ev.block_size, "block_size") : r.skip();
      case field::lora_id:
        return details ? read_opt_int(r, ev.lora_id, "lora_id") : r.skip();
      case field::lora_name:
        return details ? read_opt_str(r, ev.lora_name, "lora_name") : r.skip();
      case field::extra_keys:
        return details ? read_raw(r, payload_, ev.extra_keys) : r.skip();
      case field::spec_kind:
        return details ? read_opt_str(r, ev.kv_cache_spec_kind, "kv_cache_spec_kind") : r.skip();
      case field::sliding_window:
        return details ? read_opt_int(r, ev.kv_cache_spec_sliding_window,
                                      "kv_cache_spec_sliding_window")
                       : r.skip();
      case field::locality:
        return details ? read_opt_str(r, ev.locality, "locality") : r.skip();
      case field::ownership:
        return details ? read_raw(r, payload_, ev.ownership) : r.skip();
      case field::unknown:
        return r.skip();
    }
    return r.skip();
  }

  std::span<const uint8_t> payload_;
  const kv_decode_limits& limits_;
  uint64_t batch_hashes_left_ = limits_.max_batch_hashes;  // over all events decoded so far
  bool batch_over_ = false;
};

drop_cause event_cause(const status& s) {
  if (s.code() == status_code::out_of_range) return drop_cause::oversized;
  return drop_cause::bad_event;
}

status decode_events(reader& r, std::span<const uint8_t> payload, const kv_decode_limits& limits,
                     std::vector<kv_event>& out, std::vector<kv_decode_issue>& issues) {
  auto n = r.read_array_header();
  if (!n.ok()) return status::invalid_argument("events is not an array");
  if (*n > limits.max_events)
    return status::out_of_range("batch of " + std::to_string(*n) + " events, limit " +
                                std::to_string(limits.max_events));
  event_decoder dec(payload, limits);
  out.reserve(std::min<uint32_t>(*n, 256));  // events are ~400 bytes; a count is not a promise
  for (uint32_t i = 0; i < *n; ++i) {
    const size_t begin = r.offset();
    kv_event ev;
    bool known = true;
    std::string tag;
    status s = dec.decode(r, ev, known, tag);
    if (dec.batch_over()) return s;  // the whole batch is oversized, not this event alone
    if (!s.ok()) {
      r.seek(begin);
      if (status skipped = r.skip(); !skipped.ok()) return skipped;  // broken MessagePack
      issues.push_back({event_cause(s), "event " + std::to_string(i) + ": " + s.message()});
      continue;
    }
    if (!known) {
      issues.push_back({drop_cause::unknown_event_type,
                        "event " + std::to_string(i) + ": unknown type \"" + tag + "\""});
      continue;
    }
    out.push_back(std::move(ev));
  }
  return {};
}

}  // namespace

const char* to_string(drop_cause c) {
  switch (c) {
    case drop_cause::bad_frames:
      return "bad_frames";
    case drop_cause::bad_msgpack:
      return "bad_msgpack";
    case drop_cause::bad_batch:
      return "bad_batch";
    case drop_cause::bad_event:
      return "bad_event";
    case drop_cause::oversized:
      return "oversized";
    case drop_cause::unknown_event_type:
      return "unknown_event_type";
    case drop_cause::bad_counts:
      return "bad_counts";
    case drop_cause::counts_geometry:
      return "counts_geometry";
    case drop_cause::unsupported_version:
      return "unsupported_version";
    case drop_cause::capacity:
      return "capacity";
    case drop_cause::publisher_quota:
      return "publisher_quota";
  }
  return "unknown";
}

drop_cause kv_batch_error_cause(const status& s) {
  switch (s.code()) {
    case status_code::corrupt:
      return drop_cause::bad_msgpack;
    case status_code::out_of_range:
      return drop_cause::oversized;
    default:
      return drop_cause::bad_batch;
  }
}

std::optional<uint64_t> decode_sequence(std::span<const uint8_t> frame) {
  if (frame.size() != 8) return std::nullopt;
  uint64_t v = 0;
  for (uint8_t b : frame)
    v = (v << 8) | b;
  return v;
}

result<kv_batch> decode_kv_batch(std::span<const uint8_t> payload, const kv_decode_limits& limits,
                                 std::vector<kv_decode_issue>& issues) {
  if (payload.size() > limits.max_payload_bytes)
    return status::out_of_range("payload of " + std::to_string(payload.size()) + " bytes, limit " +
                                std::to_string(limits.max_payload_bytes));
  reader r(payload.data(), payload.size());
  item top;
  if (status s = r.peek(top); !s.ok()) return s;
  kv_batch batch;
  bool have_events = false;
  if (top.type == kind::array) {
    const uint32_t n = *r.read_array_header();
    if (n < 2) return status::invalid_argument("batch array of " + std::to_string(n) + " elements");
    auto ts = r.read_number();
    if (!ts.ok()) return status::invalid_argument("batch ts is not a number");
    batch.ts = *ts;
    if (status s = decode_events(r, payload, limits, batch.events, issues); !s.ok()) return s;
    have_events = true;
    if (n >= 3)
      if (status s = read_opt_int(r, batch.data_parallel_rank, "data_parallel_rank"); !s.ok())
        return s.code() == status_code::corrupt ? s : status::invalid_argument(s.message());
    for (uint32_t i = 3; i < n; ++i)
      if (status s = r.skip(); !s.ok()) return s;
  } else if (top.type == kind::map) {
    const uint32_t pairs = *r.read_map_header();
    for (uint32_t i = 0; i < pairs; ++i) {
      auto key = r.read_str();
      if (!key.ok()) return status::invalid_argument("batch key is not a string");
      if (*key == "ts") {
        auto ts = r.read_number();
        if (!ts.ok()) return status::invalid_argument("batch ts is not a number");
        batch.ts = *ts;
      } else if (*key == "events" && !have_events) {
        if (status s = decode_events(r, payload, limits, batch.events, issues); !s.ok()) return s;
        have_events = true;
      } else if (*key == "data_parallel_rank") {
        if (status s = read_opt_int(r, batch.data_parallel_rank, "data_parallel_rank"); !s.ok())
          return s.code() == status_code::corrupt ? s : status::invalid_argument(s.message());
      } else if (status s = r.skip(); !s.ok()) {
        return s;
      }
    }
    if (!have_events) return status::invalid_argument("batch map without events");
  } else {
    return status::invalid_argument(std::string("batch is ") + msgpack::to_string(top.type));
  }
  if (!r.at_end())
    return status::corrupt(std::to_string(r.remaining()) + " trailing bytes after the batch");
  return batch;
}

}  // namespace eldr
