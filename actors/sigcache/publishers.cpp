// publishers: the publishers the signature cache follows -- configured, registered over the
// worker protocol, restored from the store -- and their ingest: subscriptions asked of the
// frontend, replays, persistence, forgetting the silent ones, and the frames they send applied in
// slices so route requests are answered between two slices. The actor's own file: it sends and
// receives CAF messages.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <string_view>
#include <tuple>

#include "actors/sigcache/sigcache_actor_internal.hpp"

namespace eldr::sigcache {
namespace {

void answer_waiters(sigcache_state& st, const std::string& endpoint, uint8_t code,
                    const std::string& message) {
  auto it = st.waiting.find(endpoint);
  if (it == st.waiting.end()) return;
  for (auto& rp : it->second)
    rp.deliver(code, message);
  st.waiting.erase(it);
}

// Asks the frontend for the publisher's sockets. It reports back on its own thread, as messages
// to this actor (subscribed_atom, replay_atom): the actor never waits for ZeroMQ.
void request_subscription(sigcache_actor_t* self, const publisher_registration& r) {
  auto me = caf::actor_cast<caf::actor>(self);
  subscription_request req;
  req.endpoint = r.endpoint;
  req.replay_endpoint = r.replay_endpoint;
  req.done = [me, endpoint = r.endpoint](result<uint32_t> id) {
    if (id.ok())
      return caf::anon_send(me, subscribed_atom::value, endpoint, *id, uint8_t{0}, std::string());
    const auto code = id.error().code() == status_code::invalid_argument
                          ? wire_error_code::malformed
                          : wire_error_code::internal;
    caf::anon_send(me, subscribed_atom::value, endpoint, uint32_t{0}, static_cast<uint8_t>(code),
                   id.error().message());
  };
  req.on_replay = [me](replay_message m) {
    caf::anon_send(me, replay_atom::value,
                   replay_message_ptr(std::make_shared<const replay_message>(std::move(m))));
  };
  self->state.ctx->edge->subscribe(std::move(req));
}

// Refused registrations and subscriptions are logged at most once per 10 s (a client may send
// them in a loop); the counters carry the rest.
void log_refusal(sigcache_state& st, const std::string& endpoint, const std::string& why) {
  const int64_t now = st.ctx->now_ms();
  if (st.refusal_logged_ms != INT64_MIN && now - st.refusal_logged_ms < 10'000) return;
  st.refusal_logged_ms = now;
  spdlog::warn("publisher {} not followed ({} refused, {} refused by ZeroMQ so far): {}", endpoint,
               st.metrics->registrations_refused->value(), st.metrics->subscribe_failed->value(),
               why);
}

// The SUB socket exists: the publisher's frames and replays reach its ingest from now on.
void attach_ingest(sigcache_state& st, const publisher_entry& e) {
  const auto& r = e.reg;
  auto& ev = *st.models[r.model].events;
  const auto key = std::make_tuple(r.model, r.counts, r.endpoint);
  auto it = st.ingest_index.find(key);
  const uint32_t p = it != st.ingest_index.end() ? it->second
                     : r.counts                  ? ev.add_counts_publisher(r.endpoint)
                                                 : ev.add_kv_publisher(r.endpoint);
  st.ingest_index[key] = p;
  if (!r.counts) {
    replay_request_fn request;
    if (!r.replay_endpoint.empty())
      request = [edge = st.ctx->edge, id = e.subscription](uint64_t token, uint64_t start) {
        edge->request_replay(id, token, start);
        return true;
      };
    ev.set_replay_requester(p, std::move(request));
  }
  subscription sub;
  sub.model = r.model;
  sub.counts = r.counts;
  sub.publisher = p;
  sub.by_topic =
      !r.counts && std::string_view(r.endpoint).substr(0, kv_bind_prefix.size()) == kv_bind_prefix;
  sub.endpoint = r.endpoint;
  if (auto old = st.subscriptions.find(e.subscription); old != st.subscriptions.end())
    sub.topics = std::move(old->second.topics);
  st.subscriptions[e.subscription] = std::move(sub);
}

// How much the publisher has sent so far (applied or dropped): it grows with every message.
uint64_t publisher_activity(const sigcache_state& st, const publisher_entry& e) {
  auto it = st.subscriptions.find(e.subscription);
  if (it == st.subscriptions.end()) return 0;
  const auto& ev = *st.models[it->second.model].events;
  const auto& all = it->second.counts ? ev.counts_metrics() : ev.kv_metrics();
  const auto& m = all.at(it->second.publisher);
  uint64_t n = m.messages;
  for (uint64_t d : m.dropped)
    n += d;
  return n;
}

// A registered publisher that went silent: its subscription closes, its blocks go, its
// registration is removed from the store.
void forget_publisher(sigcache_state& st, const std::string& endpoint) {
  const publisher_entry e = *st.publishers.find(endpoint);
  auto& mc = st.models[e.reg.model];
  if (auto it = st.subscriptions.find(e.subscription); it != st.subscriptions.end()) {
    if (!e.reg.counts) {
      mc.events->drop_replay(it->second.publisher);
      mc.cache->clear_worker(mc.cache->worker_id(endpoint), true);
    }
    st.subscriptions.erase(it);
  }
  st.ctx->edge->unsubscribe(e.subscription);
  st.publishers.remove(endpoint);
  persist_publishers(st, e.reg.model);
  st.metrics->publishers_forgotten->inc();
  spdlog::warn("model {}: publisher {} sent nothing for {} ms: forgotten, its blocks released",
               st.ctx->config.models[e.reg.model].name, endpoint,
               st.ctx->config.publisher_forget_ms);
}

}  // namespace

void persist_publishers(sigcache_state& st, uint32_t model) {
  auto& mc = st.models[model];
  mc.cache->stage_metadata(publishers_metadata_key, st.publishers.encode_model(model));
  mc.dirty = true;
}

std::optional<follow_answer> follow(sigcache_actor_t* self, const publisher_registration& r,
                                    bool configured, const caf::response_promise* rp) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  const auto a = st.publishers.admit(r, configured, now);
  switch (a.outcome) {
    case admit_outcome::full:
    case admit_outcome::conflict:
      st.metrics->registrations_refused->inc();
      log_refusal(st, r.endpoint, a.message);
      return follow_answer{
          static_cast<uint8_t>(a.outcome == admit_outcome::full ? wire_error_code::overloaded
                                                                : wire_error_code::malformed),
          a.message};
    case admit_outcome::existing:
      if (st.publishers.find(r.endpoint)->active) return follow_answer{0, ""};
      break;  // answered with the first registration, when its socket exists
    case admit_outcome::added:
    case admit_outcome::updated:
      request_subscription(self, st.publishers.find(r.endpoint)->reg);
      break;
  }
  if (rp) st.waiting[r.endpoint].push_back(*rp);
  return std::nullopt;
}

int64_t publishers_tick_ms(const node_config& c) {
  if (c.publisher_forget_ms <= 0) return 1000;
  return std::clamp<int64_t>(c.publisher_forget_ms / 4, 10, 1000);
}

void on_subscribed(sigcache_actor_t* self, const std::string& endpoint, uint32_t id, uint8_t code,
                   const std::string& message) {
  auto& st = self->state;
  const publisher_entry* e = st.publishers.find(endpoint);
  if (code != 0) {
    st.metrics->subscribe_failed->inc();
    log_refusal(st, endpoint, message);
    if (e && !e->active) {
      // A restored registration ZeroMQ now refuses is not tried again at the next start.
      const bool persisted = e->registered && !e->configured;
      const uint32_t model = e->reg.model;
      st.publishers.remove(endpoint);
      if (persisted) persist_publishers(st, model);
    }
    answer_waiters(st, endpoint, code, message);
    return;
  }
  if (!e) return;  // gone meanwhile
  if (!e->active)  // once per socket: a client may register the same endpoint in a loop
    spdlog::info("model {}: following {} publisher {}{}", st.ctx->config.models[e->reg.model].name,
                 e->reg.counts ? "counts" : "KV-event", endpoint,
                 e->reg.replay_endpoint.empty() ? "" : " (replay " + e->reg.replay_endpoint + ")");
  st.publishers.activate(endpoint, id);
  attach_ingest(st, *e);
  if (e->registered && !e->configured) persist_publishers(st, e->reg.model);
  answer_waiters(st, endpoint, 0, "");
}

void on_replay(sigcache_actor_t* self, const replay_message_ptr& m) {
  auto& st = self->state;
  auto it = st.subscriptions.find(m->subscription);
  if (it == st.subscriptions.end() || it->second.counts) return;
  auto& mc = st.models[it->second.model];
  mc.dirty = true;
  if (m->end)
    mc.events->on_replay_end(it->second.publisher, m->token, m->ok);
  else
    mc.events->on_replay_batch(it->second.publisher, m->token, m->seq, m->payload);
  // Replayed batches and the messages the replay held are applied in slices too.
  if (mc.events->pending() && !mc.resume_posted) {
    mc.resume_posted = true;
    self->send(self, ingest_more_atom::value, it->second.model);
  }
}

void on_publishers_tick(sigcache_actor_t* self) {
  auto& st = self->state;
  const int64_t now = st.ctx->now_ms();
  for (const auto& [endpoint, e] : st.publishers.entries())
    if (e.active && e.registered)
      st.publishers.note_activity(endpoint, publisher_activity(st, e), now);
  for (const auto& endpoint : st.publishers.silent(now))
    forget_publisher(st, endpoint);
  st.metrics->publish_publishers(st);
  self->delayed_send(self, std::chrono::milliseconds(publishers_tick_ms(st.ctx->config)),
                     publishers_tick_atom::value);
}

void on_publisher_frames(sigcache_actor_t* self, const publisher_frames_ptr& f) {
  auto& st = self->state;
  auto it = st.subscriptions.find(f->subscription);
  if (it == st.subscriptions.end()) {
    ++st.unknown_subscription;
    return;
  }
  st.frames.clear();
  for (const auto& fr : f->frames)
    st.frames.emplace_back(fr.data(), fr.size());
  const uint32_t model = it->second.model;
  auto& mc = st.models[model];
  mc.dirty = true;
  auto& ev = *mc.events;
  uint32_t publisher = it->second.publisher;
  if (it->second.by_topic && !st.frames.empty() && st.frames[0].size() <= max_topic_bytes) {
    const std::string_view topic(reinterpret_cast<const char*>(st.frames[0].data()),
                                 st.frames[0].size());
    auto& topics = it->second.topics;
    if (auto t = topics.find(topic); t != topics.end()) {
      publisher = t->second;
    } else if (topics.size() < max_bound_topics) {
      publisher = ev.add_kv_publisher(it->second.endpoint + "#" + std::string(topic));
      topics.emplace(std::string(topic), publisher);
    }
  }
  if (it->second.counts)
    ev.on_counts_message(publisher, st.frames);
  else
    ev.on_kv_message(publisher, st.frames);
  // The rest of a large batch goes behind whatever is queued now (route requests).
  if (ev.pending() && !mc.resume_posted) {
    mc.resume_posted = true;
    self->send(self, ingest_more_atom::value, model);
  }
}

void on_ingest_more(sigcache_actor_t* self, uint32_t model) {
  auto& mc = self->state.models.at(model);
  mc.resume_posted = false;
  mc.dirty = true;
  mc.events->resume();
  if (mc.events->pending()) {
    mc.resume_posted = true;
    self->send(self, ingest_more_atom::value, model);
  }
}

}  // namespace eldr::sigcache
