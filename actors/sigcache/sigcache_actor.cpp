// sigcache_actor: see sigcache_actor.hpp. The actor's behaviour: its start (the caches' ingest,
// the registered publishers restored, the timers), the commit tick, the centroid history and the
// wiring of every message to the modules in actors/sigcache/.
#include "actors/sigcache/sigcache_actor.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "actors/caf_status.hpp"
#include "actors/sigcache/sigcache_actor_internal.hpp"
#include "actors/sigcache/sigcache_status.hpp"
#include "actors/sigcache/signing.hpp"

namespace eldr::sigcache {
namespace {

// Something is staged or a backlog of expired grace periods waits: the commit tick has work.
bool commit_owed(const sigcache_state& st) {
  for (const auto& mc : st.models)
    if (mc.dirty || mc.events->expiry_pending()) return true;
  return false;
}

void arm_commit(sigcache_actor_t* self, const wake_timer::arm& a) {
  if (a.delay_ms == 0)
    self->send(self, commit_atom::value, a.token);  // after the message being handled
  else
    self->delayed_send(self, std::chrono::milliseconds(a.delay_ms), commit_atom::value, a.token);
}

// After a message that may have staged changes: the commit runs as soon as commit_interval_ms
// has passed since the last one (at once after a quiet spell), not on a fixed tick. Each timer
// costs the node two wake-ups of CAF's clock thread and one of the scheduler's; a fixed 10 ms
// tick woke an idle node 100 times a second (BENCHMARKS.md, "Timers and thread wake-ups").
void wake_commit(sigcache_actor_t* self) {
  auto& st = self->state;
  if (!commit_owed(st)) return;
  if (auto a = st.commit_timer.wake(st.ctx->now_ms())) arm_commit(self, *a);
}

// Group-commits every model's staged changes (idle stores write nothing), logs and publishes the
// stores' health, copies the ingest and store series into the registry (at most every
// metrics_refresh_ms), and schedules the next tick: within commit_interval_ms while work is
// owed, else metrics_refresh_ms (the health and metrics of an idle node stay that fresh).
void on_commit(sigcache_actor_t* self, uint64_t token) {
  auto& st = self->state;
  if (!st.commit_timer.fired(token)) return;  // superseded by an earlier wake-up
  ++st.commit_ticks;
  const int64_t now = st.ctx->now_ms();
  bool staged = false;
  for (size_t m = 0; m < st.models.size(); ++m) {
    auto& mc = st.models[m];
    staged = staged || mc.dirty;
    // Idle stores write nothing; grace periods still expire once a second.
    if (!mc.dirty && !mc.events->expiry_pending() && now - mc.last_expire_ms < 1000) continue;
    mc.dirty = false;
    mc.last_expire_ms = now;
    const auto t0 = std::chrono::steady_clock::now();
    auto committed = mc.events->commit();
    const auto took = std::chrono::steady_clock::now() - t0;
    st.ctx->metrics->cache_committed(st.ctx->config.models[m].name,
                                     std::chrono::duration<double>(took).count());
    // Staging runs on the route path; a long one shows up in route latency.
    if (took > std::chrono::milliseconds(50))
      spdlog::warn("model {}: staging a commit took {} us", st.ctx->config.models[m].name,
                   std::chrono::duration_cast<std::chrono::microseconds>(took).count());
    // A degraded store fails every commit until it recovers: logged once, by its health.
    if (auto s = committed; !s.ok()) {
      ++st.commit_errors;
      if (!mc.cache->health().degraded)
        spdlog::error("model {}: signature cache commit failed: {}", st.ctx->config.models[m].name,
                      s.to_string());
    }
  }
  for (size_t m = 0; m < st.models.size(); ++m) {
    log_store_health(st.models[m], st.ctx->config.models[m].name, now);
    // /readyz: a degraded store keeps the node ready (it routes on from memory) but is
    // listed with its reason, so probes and operators see it.
    if (st.ctx->readiness) {
      const auto h = st.models[m].cache->health();
      st.ctx->readiness->set_store(st.ctx->config.models[m].name, !h.degraded, h.degraded,
                                   h.degraded ? h.reason : std::string());
    }
  }
  if (st.metrics_rendered_ms == INT64_MIN || now - st.metrics_rendered_ms >= metrics_refresh_ms) {
    st.metrics_rendered_ms = now;
    st.metrics->publish_ingest(st);
    st.metrics->publish_store(st);
  }
  // A tick that committed something runs again within commit_interval_ms, so that steady
  // traffic keeps one timer going (going idle after each commit would arm the slow timer and
  // then, at the next change, a fast one beside it); the first tick with nothing staged slows.
  if (staged) ++st.staged_commits;
  arm_commit(self, st.commit_timer.ran(now, staged || commit_owed(st)));
}

// centroids.export {model, epoch?}: the stored set of an epoch (the current one by default).
void export_centroids(const sigcache_state& st, const admin_job& job) {
  const auto& args = job.request.args;
  const auto model_arg = string_arg(args, "model");
  const auto epoch_arg = uint_arg(args, "epoch");
  for (const status* bad : {&model_arg.error(), &epoch_arg.error()})
    if (!bad->ok())
      return answer_admin_error(*st.ctx, job, wire_error_code::malformed, bad->message());
  const std::string model = model_arg->value_or("");
  uint32_t index = 0;
  while (index < st.ctx->config.models.size() && st.ctx->config.models[index].name != model)
    ++index;
  if (index == st.ctx->config.models.size())
    return answer_admin_error(*st.ctx, job, wire_error_code::unknown_model,
                              "no model named '" + model + "'");
  auto& cache = *st.models[index].cache;
  uint64_t epoch = 0;
  if (*epoch_arg) {
    epoch = **epoch_arg;
  } else {
    auto cur = cache.current_epoch();
    if (!cur.ok())
      return answer_admin_error(*st.ctx, job, wire_error_code::malformed,
                                "model '" + model + "' has no centroid set");
    epoch = *cur;
  }
  auto bytes = cache.centroid_set(epoch);
  if (!bytes.ok())
    return answer_admin_error(*st.ctx, job, wire_error_code::malformed,
                              "epoch " + std::to_string(epoch) + " is not stored");
  answer_admin(*st.ctx, job, nlohmann::json::binary(std::move(*bytes)));
}

using cache_list = std::shared_ptr<std::vector<std::unique_ptr<signature_cache>>>;

caf::behavior sigcache_behavior(sigcache_actor_t* self, node_context_ptr ctx, cache_list caches) {
  self->state.ctx = ctx;
  self->state.metrics = std::make_unique<sigcache_metrics>(ctx->metrics->registry(), *ctx);
  for (auto& c : *caches) {
    model_cache mc;
    ingest_limits work;
    work.hashes_per_turn = ingest_hashes_per_turn;
    work.expire_per_commit = expire_per_commit;
    mc.events = std::make_unique<ingest>(*c, kv_decode_limits{}, clock_fn{}, work);
    mc.cache = std::move(c);
    // What the WAL's recovery dropped at open is said once, at start-up.
    const auto h = mc.cache->health();
    const auto& model = ctx->config.models[self->state.models.size()].name;
    for (const auto& note : h.recovery_notes)
      spdlog::error("model {}: the signature store lost data while recovering its WAL: {}", model,
                    note);
    self->state.models.push_back(std::move(mc));
  }
  // A stopping node commits what is staged: counts acknowledged to nobody yet would otherwise be
  // lost at every clean restart.
  self->set_exit_handler([self](caf::exit_msg& msg) {
    spdlog::debug("signature cache: exit ({})", self->system().render(msg.reason));
    for (auto& mc : self->state.models)
      if (auto s = mc.events->commit(); !s.ok() || !(s = mc.cache->flush()).ok())
        spdlog::error("signature cache commit at exit failed: {} ({} changes not persisted)",
                      s.to_string(), mc.cache->health().pending_changes);
    self->quit(msg.reason);
  });
  self->set_exception_handler([](caf::scheduled_actor*, std::exception_ptr& e) -> caf::error {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      spdlog::error("signature cache: {}", x.what());
    } catch (...) {
      spdlog::error("signature cache: unknown exception");
    }
    return caf::exit_reason::unhandled_exception;
  });
  self->state.commit_timer = wake_timer(ctx->config.commit_interval_ms, metrics_refresh_ms);
  arm_commit(self, self->state.commit_timer.ran(ctx->now_ms(), true));
  // Publishers registered before the last stop come back first (the configured ones follow as
  // messages from the node); those beyond a since lowered max_publishers are dropped, logged.
  self->state.publishers =
      publisher_registry(ctx->config.max_publishers, ctx->config.publisher_forget_ms);
  for (uint32_t m = 0; m < self->state.models.size(); ++m) {
    const auto stored = self->state.models[m].cache->metadata(publishers_metadata_key);
    if (!stored) continue;
    auto regs = publisher_registry::decode(*stored, m);
    if (!regs.ok()) {
      spdlog::error("model {}: registered publishers not restored: {}", ctx->config.models[m].name,
                    regs.error().message());
      continue;
    }
    for (const auto& r : *regs) {
      if (auto refused = follow(self, r, false, nullptr)) {
        spdlog::warn("model {}: registered publisher {} not restored: {}",
                     ctx->config.models[m].name, r.endpoint, refused->second);
        persist_publishers(self->state, m);
      }
    }
    if (!regs->empty())
      spdlog::info("model {}: following {} registered publisher(s) again",
                   ctx->config.models[m].name, regs->size());
  }
  self->delayed_send(self, std::chrono::milliseconds(publishers_tick_ms(ctx->config)),
                     publishers_tick_atom::value);
  return {
      [=](sign_atom, sign_job_ptr job) -> sign_result_ptr {
        auto signed_ = sign(self->state.models.at(job->model), *job);
        wake_commit(self);
        return signed_;
      },
      // This node's router: its shard's part of a request, by pointer (messages.hpp).
      [=](sign_atom, shard_job_ptr job) -> caf::result<shard_sign_reply> {
        if (job->model >= self->state.models.size()) return caf::sec::invalid_argument;
        return shard_sign(self->state.models[job->model], *job);
      },
      [=](shard_sign_atom, const shard_sign_request& req) -> caf::result<shard_sign_reply> {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return caf::sec::invalid_argument;
        auto* mc = find_model(self->state, req.model);
        if (!mc) return caf::sec::invalid_argument;
        return shard_sign(*mc, req);
      },
      [=](members_atom, const std::vector<member_info>& members, uint32_t) {
        on_members(self, members);
        wake_commit(self);
      },
      // Blocks this node now owns, from a node that held them.
      [=](handoff_atom, const std::string& model, uint32_t layers, uint32_t experts, uint32_t top_k,
          const std::vector<handoff_block>& blocks) -> caf::result<uint64_t> {
        auto taken = on_handoff(self, model, model_geometry{layers, experts, top_k}, blocks);
        wake_commit(self);
        return taken;
      },
      [=](handoff_step_atom, uint64_t id) { on_handoff_step(self, id); },
      [=](handoff_watch_atom) { on_handoff_watch(self); },
      [=](shard_store_atom, const std::string& model, const std::vector<uint8_t>& counts) {
        if (!trusted_sender(self, self->state.ctx->trust.get())) return;
        if (auto* mc = find_model(self->state, model)) (void)store_counts(*mc, counts);
        wake_commit(self);
      },
      // This node's router: the counts of a request for the blocks this shard owns, by pointer.
      [=](shard_store_atom, shard_job_ptr job) {
        if (!local_sender(self) || job->model >= self->state.models.size()) return;
        (void)store_local_counts(self->state.models[job->model], *job);
        wake_commit(self);
      },
      // A publisher of the config file (node.cpp): followed, never forgotten nor persisted.
      [=](subscribe_atom, uint32_t model, const std::string& endpoint, bool counts) {
        if (model >= self->state.models.size()) return;
        if (auto refused =
                follow(self, publisher_registration{model, endpoint, "", counts}, true, nullptr))
          spdlog::error("model {}: publisher {} not followed: {}",
                        self->state.ctx->config.models[model].name, endpoint, refused->second);
        wake_commit(self);
      },
      // A publisher registered over the worker protocol (the load monitor): answered (code,
      // message; 0 = subscribed) once its SUB socket exists or was refused.
      [=](subscribe_atom, uint32_t model, const std::string& endpoint,
          const std::string& replay_endpoint, bool counts) -> caf::result<uint8_t, std::string> {
        if (model >= self->state.models.size())
          return caf::result<uint8_t, std::string>(
              static_cast<uint8_t>(wire_error_code::unknown_model), std::string("no such model"));
        auto rp = self->make_response_promise();
        if (auto now = follow(
                self, publisher_registration{model, endpoint, replay_endpoint, counts}, false, &rp))
          rp.deliver(now->first, now->second);
        wake_commit(self);
        return rp;
      },
      [=](subscribed_atom, const std::string& endpoint, uint32_t id, uint8_t code,
          const std::string& message) {
        on_subscribed(self, endpoint, id, code, message);
        wake_commit(self);
      },
      [=](replay_atom, replay_message_ptr m) {
        on_replay(self, m);
        wake_commit(self);
      },
      [=](publishers_tick_atom) {
        on_publishers_tick(self);
        wake_commit(self);
      },
      [=](publisher_atom, publisher_frames_ptr f) {
        on_publisher_frames(self, f);
        wake_commit(self);
      },
      [=](ingest_more_atom, uint32_t model) {
        on_ingest_more(self, model);
        wake_commit(self);
      },
      [=](commit_atom, uint64_t token) { on_commit(self, token); },
      // A new epoch: newest stored + 1, so epochs only grow whatever the file says.
      [=](store_set_atom, uint32_t model, stored_set_ptr s) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (model >= st.models.size()) return caf::sec::invalid_argument;
        auto& cache = *st.models[model].cache;
        uint64_t epoch = std::max<uint64_t>(1, s->at_least);
        for (uint64_t e : cache.centroid_epochs())
          epoch = std::max(epoch, e + 1);
        if (s->epoch != 0) epoch = s->epoch;
        centroid_file f = s->file;
        f.epoch = epoch;
        if (auto w = cache.put_centroid_set(epoch, encode_centroid_file(f)); !w.ok())
          return to_caf_error(w);
        return epoch;
      },
      // A stored epoch (made the current one on request).
      [=](load_set_atom, uint32_t model, uint64_t epoch,
          bool make_current) -> caf::result<stored_set_ptr> {
        auto& st = self->state;
        if (model >= st.models.size()) return caf::sec::invalid_argument;
        auto& cache = *st.models[model].cache;
        auto bytes = cache.centroid_set(epoch);
        if (!bytes.ok())
          return caf::make_error(caf::sec::runtime_error,
                                 "epoch " + std::to_string(epoch) + " is not stored");
        auto f = parse_centroid_file(*bytes, "stored epoch " + std::to_string(epoch));
        if (!f.ok()) return to_caf_error(f.error());
        if (make_current)
          if (auto r = cache.rollback_to(epoch); !r.ok()) return to_caf_error(r);
        return stored_set_ptr(std::make_shared<const stored_set>(stored_set{epoch, std::move(*f)}));
      },
      [=](history_atom, uint32_t model) -> std::vector<uint64_t> {
        auto& st = self->state;
        if (model >= st.models.size()) return {};
        return st.models[model].cache->centroid_epochs();
      },
      // The operator page's ingest per publisher, per model: the first max_page_publishers
      // publishers (the page's size stays bounded however many follow), and how many in all.
      [=](page_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        return page_text(self->state);
      },
      [=](cache_stats_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        return cache_stats_text(self->state);
      },
      [=](admin_atom, admin_job_ptr job) { export_centroids(self->state, *job); },
  };
}

}  // namespace
}  // namespace eldr::sigcache

namespace eldr {

caf::actor spawn_sigcache(caf::actor_system& sys, node_context_ptr ctx,
                          std::vector<std::unique_ptr<signature_cache>> caches, bool detached) {
  // CAF copies spawn arguments: the move-only caches travel in a shared holder.
  auto holder = std::make_shared<std::vector<std::unique_ptr<signature_cache>>>(std::move(caches));
  if (!detached) return sys.spawn(sigcache::sigcache_behavior, std::move(ctx), holder);
  return sys.spawn<caf::detached>(sigcache::sigcache_behavior, std::move(ctx), holder);
}

}  // namespace eldr
