// publisher_registry: the publishers (vLLM KV-event and eldr counts) a node's signature cache
// follows -- those of the config file and those registered over the worker protocol -- with the
// rules that keep them bounded and durable (docs/signature-cache.md, "Publishers of a node"):
//
// - at most max_publishers per node, whatever their kind or model; the excess is refused;
// - one entry per endpoint: registering an endpoint again changes nothing (no second socket),
//   except a new replay endpoint, which replaces the old; an endpoint already followed for
//   another model or as another kind is refused;
// - an entry is pending until its SUB socket exists (the frontend reports it), then active;
// - a registered (not configured) entry whose publisher sent nothing for forget_ms is forgotten;
// - registered entries are persisted per model (encode/decode below) and come back at start-up.
//
// No sockets, no actors, no clock of its own: the caller passes `now` (milliseconds, any
// monotonic origin). Thread safety: none; the signature cache actor owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/status.hpp"

namespace eldr {

struct publisher_registration {
  uint32_t model = 0;
  std::string endpoint;
  std::string replay_endpoint;  // "" = none (counts publishers have none)
  bool counts = false;          // an eldr counts publisher, else vLLM KV events
};

struct publisher_entry {
  publisher_registration reg;
  bool configured = false;    // named in the config file: never forgotten, never persisted
  bool registered = false;    // came over the worker protocol (or from the persisted list)
  bool active = false;        // its SUB socket exists
  uint32_t subscription = 0;  // the frontend's id, once active
  // Forgetting: the publisher's activity counter as last seen, and when it last changed.
  uint64_t activity = 0;
  int64_t last_seen_ms = 0;
};

enum class admit_outcome {
  added,     // a new entry (pending): subscribe to it
  existing,  // already followed (or pending) with the same settings: nothing to do
  updated,   // already followed; its replay endpoint changed (persist it again)
  full,      // max_publishers reached: refused
  conflict,  // the endpoint is followed for another model or as another kind: refused
};

struct admit_result {
  admit_outcome outcome = admit_outcome::added;
  std::string message;  // why it was refused, for the client ("" otherwise)
};

class publisher_registry {
 public:
  // max_publishers >= 1; forget_ms = 0: registered publishers are never forgotten.
  publisher_registry(uint32_t max_publishers, int64_t forget_ms);

  // Takes a publisher in (see the rules above). `configured`: from the config file, else over
  // the worker protocol. A configured admit of an existing registered entry marks it configured.
  admit_result admit(const publisher_registration& r, bool configured, int64_t now);
  // Its SUB socket exists now.
  void activate(const std::string& endpoint, uint32_t subscription);
  // Gone (ZeroMQ refused it, or it was forgotten); the slot is free again.
  void remove(const std::string& endpoint);

  const publisher_entry* find(const std::string& endpoint) const;
  const std::map<std::string, publisher_entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  uint32_t max_publishers() const { return max_; }

  // The publisher's activity counter (any count that grows with every message received from it)
  // as read at `now`: a change means it was heard from.
  void note_activity(const std::string& endpoint, uint64_t activity, int64_t now);
  // Registered, active, not configured entries silent for at least forget_ms at `now`.
  std::vector<std::string> silent(int64_t now) const;

  // The registered entries of one model, as persisted: a JSON array of
  // {"endpoint", "replay_endpoint", "kind": "kv"|"counts"}.
  std::string encode_model(uint32_t model) const;
  // The inverse, for `model`. Error (corrupt): not such an array; entries with an empty
  // endpoint are skipped.
  static result<std::vector<publisher_registration>> decode(std::string_view json, uint32_t model);

 private:
  uint32_t max_;
  int64_t forget_ms_;
  std::map<std::string, publisher_entry> entries_;  // by endpoint
};

}  // namespace eldr
