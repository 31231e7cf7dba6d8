// publisher_registry: see publisher_registry.hpp.
#include "cluster/ingest/publisher_registry.hpp"

#include <nlohmann/json.hpp>

namespace eldr {

publisher_registry::publisher_registry(uint32_t max_publishers, int64_t forget_ms)
    : max_(max_publishers), forget_ms_(forget_ms) {}

admit_result publisher_registry::admit(const publisher_registration& r, bool configured,
                                       int64_t now) {
  auto it = entries_.find(r.endpoint);
  if (it != entries_.end()) {
    publisher_entry& e = it->second;
    if (e.reg.model != r.model || e.reg.counts != r.counts)
      return {
          admit_outcome::conflict,
          "publisher " + r.endpoint + " is already followed " +
              (e.reg.counts == r.counts
                   ? "for another model"
                   : std::string("as a ") + (e.reg.counts ? "counts" : "KV-event") + " publisher")};
    e.last_seen_ms = now;  // a registration is a sign of life
    if (configured) {
      e.configured = true;
      return {admit_outcome::existing, ""};
    }
    const bool was_registered = e.registered;
    e.registered = true;
    if (e.reg.replay_endpoint != r.replay_endpoint) {
      e.reg.replay_endpoint = r.replay_endpoint;
      return {admit_outcome::updated, ""};
    }
    return {was_registered ? admit_outcome::existing : admit_outcome::updated, ""};
  }
  if (entries_.size() >= max_)
    return {admit_outcome::full, "the node already follows its maximum of " + std::to_string(max_) +
                                     " publishers (signature_cache.max_publishers)"};
  publisher_entry e;
  e.reg = r;
  e.configured = configured;
  e.registered = !configured;
  e.last_seen_ms = now;
  entries_.emplace(r.endpoint, std::move(e));
  return {admit_outcome::added, ""};
}

void publisher_registry::activate(const std::string& endpoint, uint32_t subscription) {
  auto it = entries_.find(endpoint);
  if (it == entries_.end()) return;
  it->second.active = true;
  it->second.subscription = subscription;
}

void publisher_registry::remove(const std::string& endpoint) {
  entries_.erase(endpoint);
}

const publisher_entry* publisher_registry::find(const std::string& endpoint) const {
  auto it = entries_.find(endpoint);
  return it == entries_.end() ? nullptr : &it->second;
}

void publisher_registry::note_activity(const std::string& endpoint, uint64_t activity,
                                       int64_t now) {
  auto it = entries_.find(endpoint);
  if (it == entries_.end() || it->second.activity == activity) return;
  it->second.activity = activity;
  it->second.last_seen_ms = now;
}

std::vector<std::string> publisher_registry::silent(int64_t now) const {
  std::vector<std::string> out;
  if (forget_ms_ <= 0) return out;
  for (const auto& [endpoint, e] : entries_)
    if (e.registered && !e.configured && e.active && now - e.last_seen_ms >= forget_ms_)
      out.push_back(endpoint);
  return out;
}

std::string publisher_registry::encode_model(uint32_t model) const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [endpoint, e] : entries_)
    if (e.registered && !e.configured && e.reg.model == model)
      out.push_back({{"endpoint", endpoint},
                     {"replay_endpoint", e.reg.replay_endpoint},
                     {"kind", e.reg.counts ? "counts" : "kv"}});
  return out.dump();
}

result<std::vector<publisher_registration>> publisher_registry::decode(std::string_view json,
                                                                       uint32_t model) {
  const auto j = nlohmann::json::parse(json, nullptr, false);
  if (!j.is_array()) return status::corrupt("publisher registrations: not a JSON array");
  std::vector<publisher_registration> out;
  for (const auto& e : j) {
    if (!e.is_object()) return status::corrupt("publisher registrations: an entry not an object");
    const auto endpoint = e.find("endpoint");
    const auto replay = e.find("replay_endpoint");
    const auto kind = e.find("kind");
    if (endpoint == e.end() || !endpoint->is_string() ||
        (replay != e.end() && !replay->is_string()) || (kind != e.end() && !kind->is_string()))
      return status::corrupt("publisher registrations: an entry with a field of the wrong type");
    publisher_registration r;
    r.model = model;
    r.endpoint = endpoint->get<std::string>();
    if (replay != e.end()) r.replay_endpoint = replay->get<std::string>();
    r.counts = kind != e.end() && kind->get<std::string>() == "counts";
    if (!r.endpoint.empty()) out.push_back(std::move(r));
  }
  return out;
}

}  // namespace eldr
