// admin_actor: see admin_actor.hpp.
#include "actors/admin_actor.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "actors/operator_page.hpp"
#include "core/base/version.hpp"

namespace eldr {

void answer_admin(const node_context& ctx, const admin_job& job, nlohmann::json result) {
  admin_reply r;
  r.id = job.request.id;
  r.ok = true;
  r.result = std::move(result);
  ctx.edge->reply(job.from, encode_admin_reply(r));
}

void answer_admin_error(const node_context& ctx, const admin_job& job, wire_error_code code,
                        std::string message) {
  admin_reply r;
  r.id = job.request.id;
  r.ok = false;
  r.code = code;
  r.error = std::move(message);
  ctx.edge->reply(job.from, encode_admin_reply(r));
}

result<std::optional<std::string>> string_arg(const nlohmann::json& args, const char* key) {
  return admin_string_arg(args, key);
}

result<std::optional<uint64_t>> uint_arg(const nlohmann::json& args, const char* key,
                                         uint64_t max) {
  return admin_uint_arg(args, key, max);
}

namespace {

nlohmann::json frontend_json(const zmq_frontend& f) {
  const auto& c = f.counters();
  return {{"route_received", c.received[0].load()},
          {"worker_received", c.received[1].load()},
          {"admin_received", c.received[2].load()},
          {"replies_sent", c.replies_sent.load()},
          {"replies_dropped", c.replies_dropped.load()},
          {"replies_over_cap", c.replies_over_cap.load()},
          {"queued_replies", c.queued_replies.load()},
          {"queued_reply_bytes", c.queued_reply_bytes.load()},
          {"queued_reply_bytes_peak", c.queued_reply_bytes_peak.load()},
          {"malformed", c.malformed.load()},
          {"too_large", c.too_large.load()},
          {"unknown_type", c.unknown_type.load()},
          {"overloaded", c.overloaded.load()},
          {"bad_frames", c.bad_frames.load()},
          {"publisher_messages", c.publisher_messages.load()},
          {"publisher_subscriptions", c.subscriptions.load()},
          {"publisher_subscribe_failed", c.subscribe_failed.load()},
          {"publisher_replays", c.replays.load()},
          {"publisher_replays_failed", c.replays_failed.load()},
          {"pending", c.pending.load()},
          {"curve_accepted", c.curve_accepted.load()},
          {"curve_refused", c.curve_refused.load()}};
}

// Asks `who` for its JSON part of `status` (an admin_atom-like request answered with a string);
// an absent role or a failure gives null, so a partial answer is still an answer.
// Waits timeouts.admin_query_ms.
template <class Atom>
void ask_json(caf::event_based_actor* self, const node_context& ctx, const caf::actor& who,
              Atom atom, std::function<void(nlohmann::json)> then) {
  if (!who) return then(nullptr);
  self->request(who, std::chrono::milliseconds(ctx.config.timeouts.admin_query_ms), atom)
      .then([then](std::string text) { then(nlohmann::json::parse(text, nullptr, false)); },
            [then](caf::error&) { then(nullptr); });
}

// `status` (eldrctl status --json) composed from every actor's part; `done` gets it. The one
// implementation of the node's status: the admin command answers it, the operator page shows it.
void compose_status(caf::event_based_actor* self, const node_context_ptr& ctx,
                    const caf::actor& router, const caf::actor& sigcache, const caf::actor& refit,
                    const caf::actor& cluster, std::function<void(nlohmann::json)> done) {
  ask_json(self, *ctx, router, admin_atom::value, [=](nlohmann::json r) {
    ask_json(self, *ctx, sigcache, cache_stats_atom::value, [=](nlohmann::json cache) {
      ask_json(self, *ctx, cluster, admin_atom::value, [=](nlohmann::json members) {
        ask_json(self, *ctx, cluster ? refit : caf::actor(), admin_atom::value,
                 [=](nlohmann::json lead) {
                   nlohmann::json out;
                   out["node"] = {{"name", ctx->config.name},
                                  {"version", std::string(eldr::version)},
                                  {"roles", ctx->config.roles},
                                  {"uptime_s", (ctx->now_ms() - ctx->started_ms) / 1000.0}};
                   nlohmann::json counters = nlohmann::json::object();
                   if (const auto* f = ctx->frontend) {
                     out["endpoints"] = {{"route", f->bound(frontend_channel::route)},
                                         {"worker", f->bound(frontend_channel::worker)},
                                         {"admin", f->bound(frontend_channel::admin)},
                                         {"metrics", ctx->metrics_url}};
                     // Clients need the node's CURVE public key; "" when CURVE is off.
                     out["curve_public_key"] = f->curve_public_key();
                     counters = frontend_json(*f);
                   }
                   out["models"] = r.is_object() ? r.value("models", nlohmann::json::array())
                                                 : nlohmann::json::array();
                   out["signature_cache"] = cache;
                   if (!members.is_null()) out["cluster"] = members;
                   if (!lead.is_null() && out["cluster"].is_object())
                     out["cluster"]["refit"] = lead;
                   counters["unknown_model"] = r.is_object() ? r.value("unknown_model", 0) : 0;
                   // The router's cluster counters (retries, peers' decisions and worker messages,
                   // shard requests and fail-overs), next to the membership they depend on.
                   if (r.is_object() && !members.is_null()) {
                     nlohmann::json routing = r;
                     routing.erase("models");
                     routing.erase("unknown_model");
                     out["cluster"]["router"] = routing;
                   }
                   out["counters"] = counters;
                   done(std::move(out));
                 });
      });
    });
  });
}

void status(caf::event_based_actor* self, const node_context_ptr& ctx, const caf::actor& router,
            const caf::actor& sigcache, const caf::actor& refit, const caf::actor& cluster,
            admin_job_ptr job) {
  compose_status(self, ctx, router, sigcache, refit, cluster,
                 [ctx, job](nlohmann::json out) { answer_admin(*ctx, *job, std::move(out)); });
}

// The stored epochs of models [from, n) appended to `epochs`, one request at a time; then `done`.
// Without a signature cache every list is empty.
void ask_epochs(caf::event_based_actor* self, const node_context_ptr& ctx,
                const caf::actor& sigcache, uint32_t from, uint32_t n,
                std::shared_ptr<std::vector<std::vector<uint64_t>>> epochs,
                std::function<void()> done) {
  if (from >= n || !sigcache) {
    epochs->resize(n);
    return done();
  }
  self->request(sigcache, std::chrono::milliseconds(ctx->config.timeouts.admin_query_ms),
                history_atom::value, from)
      .then(
          [=](std::vector<uint64_t> e) {
            epochs->push_back(std::move(e));
            ask_epochs(self, ctx, sigcache, from + 1, n, epochs, done);
          },
          [=](caf::error&) {
            epochs->emplace_back();
            ask_epochs(self, ctx, sigcache, from + 1, n, epochs, done);
          });
}

// One operator-page sample (operator_page.hpp): the status plus, per model, its worker rows and
// current spec, its stored epochs and its recent refit outcomes; the history's next point from the
// route metrics and the rows' in-flight counts. The next tick is scheduled when this one is done,
// so samples never pile up behind a slow actor.
void page_sample(caf::event_based_actor* self, const node_context_ptr& ctx,
                 const caf::actor& router, const caf::actor& sigcache, const caf::actor& refit,
                 const caf::actor& cluster) {
  auto next = [self, ctx] {
    self->delayed_send(self, std::chrono::milliseconds(ctx->operator_page->interval_ms()),
                       page_tick_atom::value);
  };
  compose_status(self, ctx, router, sigcache, refit, cluster, [=](nlohmann::json out) {
    ask_json(self, *ctx, router, page_atom::value, [=](nlohmann::json rows) {
      ask_json(self, *ctx, refit, page_atom::value, [=](nlohmann::json refits) {
        ask_json(self, *ctx, sigcache, page_atom::value, [=](nlohmann::json ingest) {
          const auto& names = ctx->operator_page->models();
          auto epochs = std::make_shared<std::vector<std::vector<uint64_t>>>();
          ask_epochs(
              self, ctx, sigcache, 0, static_cast<uint32_t>(names.size()), epochs, [=]() mutable {
                nlohmann::json page = nlohmann::json::object();
                std::vector<route_totals> totals;
                std::vector<std::vector<uint32_t>> in_flight(names.size());
                for (size_t m = 0; m < names.size(); ++m) {
                  nlohmann::json part = {{"name", names[m]},
                                         {"epochs", (*epochs)[m]},
                                         {"workers", nlohmann::json::array()},
                                         {"spec", nullptr},
                                         {"refit", nullptr},
                                         {"ingest", nullptr}};
                  if (rows.is_object() && rows.contains(names[m])) {
                    part["workers"] = rows[names[m]].value("workers", nlohmann::json::array());
                    part["spec"] = rows[names[m]].value("spec", nlohmann::json());
                  }
                  if (refits.is_object() && refits.contains(names[m]))
                    part["refit"] = refits[names[m]];
                  if (ingest.is_object() && ingest.contains(names[m]))
                    part["ingest"] = ingest[names[m]];
                  for (const auto& w : part["workers"]) {
                    const auto i = w.value("worker", uint32_t{0});
                    if (i >= operator_history::max_workers) continue;
                    if (in_flight[m].size() <= i) in_flight[m].resize(i + 1, 0);
                    in_flight[m][i] = w.value("load", uint32_t{0});
                  }
                  page[names[m]] = std::move(part);
                  totals.push_back(ctx->metrics->route_totals_of(names[m]));
                }
                out["page"] = {{"models", std::move(page)},
                               {"interval_ms", ctx->operator_page->interval_ms()}};
                ctx->operator_page->record(ctx->now_ms(), totals, std::move(in_flight));
                ctx->operator_page->set_status(out.dump());
                next();
              });
        });
      });
    });
  });
}

caf::behavior admin(caf::event_based_actor* self, node_context_ptr ctx, caf::actor router,
                    caf::actor sigcache, caf::actor refit, caf::actor cluster) {
  // A command for a role this node does not hold is refused by name (ask a node that holds it).
  auto to = [=](const caf::actor& who, const char* role, const admin_job_ptr& job) {
    if (!who)
      return answer_admin_error(*ctx, *job, wire_error_code::unknown_type,
                                "this node (" + ctx->config.name + ") has no " + role +
                                    " role; send '" + job->request.command +
                                    "' to a node that has");
    self->send(who, admin_atom::value, job);
  };
  if (ctx->operator_page) self->send(self, page_tick_atom::value);
  return {
      [=](page_tick_atom) { page_sample(self, ctx, router, sigcache, refit, cluster); },
      [=](admin_atom, admin_job_ptr job) {
        const auto& cmd = job->request.command;
        if (cmd == "status") return status(self, ctx, router, sigcache, refit, cluster, job);
        if (cmd == "centroids.export") return to(sigcache, "signature-cache", job);
        if (cmd == "refit") return to(refit, "refit", job);
        if (cmd == "workers" || cmd == "drain" || cmd == "undrain" || cmd == "centroids.show" ||
            cmd == "centroids.import" || cmd == "centroids.swap" || cmd == "centroids.rollback" ||
            cmd == "explain" || cmd == "policy")
          return to(router, "router", job);
        answer_admin_error(*ctx, *job, wire_error_code::unknown_type,
                           "unknown admin command '" + cmd +
                               "' (status, workers, drain, undrain, centroids.show, "
                               "centroids.export, centroids.import, centroids.swap, "
                               "centroids.rollback, refit, explain, policy)");
      },
  };
}

}  // namespace

caf::actor spawn_admin(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                       caf::actor sigcache, caf::actor refit, caf::actor cluster) {
  return sys.spawn(admin, std::move(ctx), std::move(router), std::move(sigcache), std::move(refit),
                   std::move(cluster));
}

}  // namespace eldr
