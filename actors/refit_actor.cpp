// refit_actor: see refit_actor.hpp.
#include "actors/refit_actor.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <deque>
#include <nlohmann/json.hpp>

#include "actors/cluster/cluster_protocol.hpp"
#include "core/membership/leadership.hpp"
#include "core/refit.hpp"

namespace eldr {
namespace {

nlohmann::json report_json(const refit_report& r) {
  return {{"accepted", r.accepted},
          {"reason", r.reason},
          {"k", r.k},
          {"points", r.points},
          {"min_cluster_size", r.min_cluster_size},
          {"max_cluster_size", r.max_cluster_size},
          {"balance_ratio", r.balance_ratio},
          {"objective", r.objective},
          {"candidate_score", r.candidate_score},
          {"current_score", r.current_score},
          {"score_checked", r.score_checked},
          {"score_note", r.score_note}};
}

struct refit_state {
  node_context_ptr ctx;
  caf::actor router;
  uint64_t runs = 0;
  // Cluster only: who leads refits, and the live members (their routers give samples, their
  // refit actors and routers hear our term).
  std::optional<leadership> lead;
  std::vector<member_info> peers;
  uint32_t known = 1;
  std::string rule_leader;     // whom the rule names after the last membership change
  uint64_t remote_points = 0;  // rows taken from other routers' samples (last refit)
  caf::actor local_cluster;    // this node's cluster actor: it holds this node's vote
  uint64_t campaigns = 0, campaigns_won = 0;
  // Per model: refits run and accepted, and the last few outcomes (the operator page's).
  struct outcomes {
    uint64_t runs = 0, accepted = 0;
    std::deque<nlohmann::json> recent;  // newest last, at most max_recent_outcomes
  };
  std::vector<outcomes> by_model;
};
constexpr size_t max_recent_outcomes = 8;
using refit_actor_t = caf::stateful_actor<refit_state>;

// Ends one refit: log, metrics, admin answer (when an operator asked), next timer.
void finish(refit_actor_t* self, uint32_t model, const admin_job_ptr& job, nlohmann::json out,
            bool accepted) {
  const auto& ctx = *self->state.ctx;
  const auto& cfg = ctx.config.models[model];
  ctx.metrics->refit_done(cfg.name, accepted);
  auto& o = self->state.by_model[model];
  ++o.runs;
  o.accepted += accepted ? 1 : 0;
  o.recent.push_back({{"uptime_s", (ctx.now_ms() - ctx.started_ms) / 1000.0},
                      {"accepted", accepted},
                      {"by_operator", job != nullptr},
                      {"epoch", out.value("epoch", uint64_t{0})},
                      {"reason", out.value("reason", std::string())}});
  if (o.recent.size() > max_recent_outcomes) o.recent.pop_front();
  if (accepted)
    spdlog::info("model {}: refit accepted, epoch {}", cfg.name, out.value("epoch", 0));
  else
    spdlog::warn("model {}: refit rejected: {}", cfg.name, out.value("reason", std::string()));
  // In a cluster, how much of the sample came from the other routers, accepted or not.
  if (self->state.lead) out["points_from_other_routers"] = self->state.remote_points;
  if (job) answer_admin(ctx, *job, std::move(out));
  if (!job && cfg.refit_interval_s > 0)
    self->delayed_send(self, std::chrono::seconds(cfg.refit_interval_s), refit_atom::value, model);
}

void fit_and_install(refit_actor_t* self, uint32_t model, admin_job_ptr job, refit_input_ptr in);

// The leader's sample: its own router's reservoir plus every other router's rows signed under the
// same epoch (so the same spec); a router that does not answer in time is left out.
void gather_and_fit(refit_actor_t* self, uint32_t model, admin_job_ptr job, refit_input_ptr in) {
  auto& st = self->state;
  st.remote_points = 0;
  std::vector<caf::actor> routers;
  for (const auto& p : st.peers)
    if (p.router) routers.push_back(p.router);
  if (routers.empty() || !in->current || !in->spec) return fit_and_install(self, model, job, in);
  auto merged = std::make_shared<refit_input>(*in);
  auto pending = std::make_shared<size_t>(routers.size());
  const uint64_t epoch = in->current->epoch();
  const uint32_t width = in->spec->width();
  auto one_done = [=] {
    if (--*pending == 0) fit_and_install(self, model, job, merged);
  };
  for (const auto& r : routers)
    self->request(r, std::chrono::milliseconds(st.ctx->config.timeouts.peer_sample_ms),
                  peer_sample_atom::value, in->model_name)
        .then(
            [=](const sample_reply& s) {
              if (s.epoch == epoch && s.width == width &&
                  unpack_points(s.points, width, merged->points)) {
                merged->seen += s.seen;
                self->state.remote_points += s.points.size() / (sizeof(float) * width);
              }
              one_done();
            },
            [=](caf::error&) { one_done(); });
}

void run_refit(refit_actor_t* self, uint32_t model, admin_job_ptr job) {
  auto& st = self->state;
  if (st.lead && !st.lead->is_leader()) {
    // Only the leader refits; the others keep their timers, ready to take over.
    const auto& l = st.lead->leader();
    if (job)
      return answer_admin_error(
          *st.ctx, *job, wire_error_code::unknown_type,
          "this node is not the refit leader" +
              (l ? " (the leader is " + l->name + ", term " + std::to_string(l->term) + ")"
                 : std::string(" (no leader: no majority visible)")));
    const auto& cfg = st.ctx->config.models[model];
    if (cfg.refit_interval_s > 0)
      self->delayed_send(self, std::chrono::seconds(cfg.refit_interval_s), refit_atom::value,
                         model);
    return;
  }
  ++st.runs;
  self->request(st.router, caf::infinite, sample_atom::value, model)
      .then([=](refit_input_ptr in) { gather_and_fit(self, model, job, in); },
            [=](caf::error& e) {
              finish(self, model, job,
                     {{"accepted", false}, {"reason", "no sample: " + self->system().render(e)}},
                     false);
            });
}

void fit_and_install(refit_actor_t* self, uint32_t model, admin_job_ptr job, refit_input_ptr in) {
  {
    {
      const auto& cfg = self->state.ctx->config.models[model];
      auto reject = [&](std::string reason) {
        finish(self, model, job, {{"accepted", false}, {"reason", std::move(reason)}}, false);
      };
      if (!in->current || !in->spec || !in->current_file)
        return reject(
            "no current centroid set: the first set comes from eldr-fit (eldrctl centroids "
            "import); a refit re-clusters live signatures under its spec");
      const uint32_t width = in->spec->width();
      const size_t rows = in->points.size() / width;
      // The simulator's online refit runs the same rule (core/refit.hpp).
      const refit_rule rule{cfg.min_sample, cfg.max_balance_ratio, cfg.score_tolerance,
                            cfg.refit_batch_size, cfg.seed};
      if (std::string reason = rule.sample_shortfall(rows); !reason.empty())
        return reject(std::move(reason));
      auto out = refit_candidate(
          in->points, width, in->current.get(),
          rule.options(*in->current, in->current_file->worker_weights, self->state.runs));
      if (!out.ok()) return reject("fit failed: " + out.error().to_string());
      auto report = report_json(out->report);
      report["seen"] = in->seen;
      report["from_epoch"] = in->current->epoch();
      if (!out->report.accepted) return finish(self, model, job, report, false);
      centroid_file f = *in->current_file;
      const auto rows_span = out->candidate->rows();
      f.centroids.assign(rows_span.begin(), rows_span.end());
      f.epoch = 0;
      f.provenance.source = "refit of epoch " + std::to_string(in->current->epoch()) + " on " +
                            std::to_string(rows) + " live signatures";
      f.provenance.tool = "eldr-node refit";
      f.provenance.objective = 1.0 - out->report.objective;
      f.provenance.calibration_requests = static_cast<uint32_t>(rows);
      auto stored = std::make_shared<const stored_set>(stored_set{0, std::move(f)});
      const uint64_t term = self->state.lead ? self->state.lead->term() : 0;
      report["term"] = term;
      self->request(self->state.router, caf::infinite, install_atom::value, model,
                    stored_set_ptr(stored), term)
          .then(
              [=](uint64_t epoch) mutable {
                report["epoch"] = epoch;
                finish(self, model, job, report, true);
              },
              [=](caf::error& e) mutable {
                report["accepted"] = false;
                report["reason"] = "install failed: " + self->system().render(e);
                finish(self, model, job, report, false);
              });
    }
  }
}

// The leadership gauges (node_metrics::cluster_leadership), refreshed wherever it may change.
void export_leadership(const refit_state& st) {
  if (!st.lead) return;
  const auto& l = st.lead->leader();
  st.ctx->metrics->cluster_leadership(st.lead->is_leader(), l ? l->term : 0);
}

// Tells this node's router and every member's refit actor and router that this node leads under
// `term`, so that a deposed leader's publishes are refused.
void announce_term(refit_actor_t* self, uint64_t term) {
  auto& st = self->state;
  self->send(st.router, leader_atom::value, st.lead->self(), term);
  for (const auto& p : st.peers) {
    if (p.refit) self->send(p.refit, leader_atom::value, st.lead->self(), term);
    if (p.router) self->send(p.router, leader_atom::value, st.lead->self(), term);
  }
}

// How long a campaign waits for the members' votes (timeouts.vote_ms); a member that has not
// answered by then counts as a refusal.
std::chrono::milliseconds vote_timeout(const refit_state& st) {
  return std::chrono::milliseconds(st.ctx->config.timeouts.vote_ms);
}

// Asks every member (this node included) for its vote in `term`; leads once a strict majority of
// the known members granted it (core/membership/leadership.hpp). One leader per term is what lets
// epochs be numbered by term without two leaders ever handing out the same number.
void campaign(refit_actor_t* self, uint64_t term) {
  auto& st = self->state;
  ++st.campaigns;
  std::vector<caf::actor> voters;
  if (st.local_cluster) voters.push_back(st.local_cluster);
  for (const auto& p : st.peers)
    if (p.cluster) voters.push_back(p.cluster);
  auto granted = std::make_shared<size_t>(0);
  auto pending = std::make_shared<size_t>(voters.size());
  const uint32_t known = st.known;
  auto conclude = [self, term, granted, known] {
    auto& s = self->state;
    const bool won = s.lead->campaign_result(term, *granted, known);
    export_leadership(s);
    if (!won) {
      spdlog::info("refit: campaign for term {} ended with {} of {} votes", term, *granted, known);
      return;
    }
    ++s.campaigns_won;
    spdlog::info("refit: this node leads refits from term {} ({} of {} votes)", term, *granted,
                 known);
    s.ctx->metrics->cluster_event("leader");
    announce_term(self, term);
  };
  if (voters.empty()) return conclude();
  for (const auto& v : voters)
    self->request(v, vote_timeout(st), vote_atom::value, st.lead->self(), term)
        .then(
            [=](bool yes, uint64_t voted_term) {
              if (yes)
                ++*granted;
              else
                (void)self->state.lead->observe_term(voted_term);  // the next campaign goes above
              if (--*pending == 0) conclude();
            },
            [=](caf::error&) {
              if (--*pending == 0) conclude();
            });
}

// Re-evaluates leadership after a membership change (and every second while this node does not
// lead): a node the rule names campaigns for a new term; a leader re-announces its term.
void evaluate_leadership(refit_actor_t* self) {
  auto& st = self->state;
  std::vector<member_view> visible;
  for (const auto& p : st.peers)
    visible.push_back(member_view{p.name, p.has_role("refit") && p.has_role("router")});
  const bool was = st.lead->is_leader();
  const auto d = st.lead->evaluate(visible, st.known);
  st.rule_leader = d.leader;
  export_leadership(st);
  if (d.campaign) return campaign(self, d.term);
  if (d.self_leads) {
    // Announced at every membership change, so that members that joined since hear it too.
    announce_term(self, d.term);
  } else if (was && !st.lead->is_leader()) {
    spdlog::warn("refit: this node no longer leads refits ({})",
                 d.has_quorum ? "a smaller name leads" : "no majority visible");
    // Our router must stop numbering imports as the leader.
    self->send(st.router, leader_atom::value, std::string(), st.lead->highest_term_seen());
  }
}

nlohmann::json leadership_json(const refit_state& st) {
  if (!st.lead) return {{"leader", "self"}, {"term", 0}, {"self_leads", true}};
  const auto& l = st.lead->leader();
  // Before the leader's announcement arrives, the rule still names it (its term is not known).
  return {{"leader", l ? l->name : st.rule_leader},
          {"term", l ? l->term : 0},
          {"highest_term_seen", st.lead->highest_term_seen()},
          {"self_leads", st.lead->is_leader()},
          {"campaign_term", st.lead->campaign_term()},
          {"campaigns", st.campaigns},
          {"campaigns_won", st.campaigns_won},
          {"known_members", st.known}};
}

caf::behavior refit_behavior(refit_actor_t* self, node_context_ptr ctx, caf::actor router) {
  self->state.ctx = ctx;
  self->state.router = router;
  self->state.by_model.resize(ctx->config.models.size());
  if (ctx->config.clustered()) {
    self->state.lead.emplace(ctx->config.name, true);
    export_leadership(self->state);
    self->delayed_send(self, std::chrono::milliseconds(ctx->config.timeouts.leadership_tick_ms),
                       tick_atom::value);
  }
  for (uint32_t m = 0; m < ctx->config.models.size(); ++m)
    if (ctx->config.models[m].refit_interval_s > 0)
      self->delayed_send(self, std::chrono::seconds(ctx->config.models[m].refit_interval_s),
                         refit_atom::value, m);
  return {
      [=](refit_atom, uint32_t model) {
        // Only our own timer (a message from the network could be anonymous).
        if (self->current_sender() == self->ctrl()) run_refit(self, model, nullptr);
      },
      // The leader repeats its term every second: an announcement that raced a membership change
      // (and was dropped by a node that did not yet see us) is repaired.
      // A node the rule names but that lost its campaign (a vote went elsewhere, a member did not
      // answer) campaigns again here, under a new term.
      [=](tick_atom) {
        auto& st = self->state;
        if (self->current_sender() != self->ctrl() || !st.lead) return;
        if (st.lead->is_leader())
          announce_term(self, st.lead->term());
        else if (st.local_cluster && st.lead->campaign_term() == 0)
          evaluate_leadership(self);
        export_leadership(st);
        self->delayed_send(self,
                           std::chrono::milliseconds(st.ctx->config.timeouts.leadership_tick_ms),
                           tick_atom::value);
      },
      // From this node's cluster actor only (it also holds this node's vote).
      [=](members_atom, const std::vector<member_info>& members, uint32_t known) {
        auto& st = self->state;
        if (!accept_member_list(self, *st.ctx->metrics) || !st.lead) return;
        st.local_cluster = caf::actor_cast<caf::actor>(self->current_sender());
        st.peers = members;
        st.known = known;
        evaluate_leadership(self);
      },
      [=](leader_atom, const std::string& name, uint64_t term) {
        auto& st = self->state;
        if (!st.lead || !trusted_sender(self, st.ctx->trust.get())) return;
        const bool same_term_claim =
            st.lead->is_leader() && term == st.lead->term() && name != st.lead->self();
        if (st.lead->observe_leader(name, term))
          spdlog::warn("refit: {} leads from term {}; this node steps down", name, term);
        export_leadership(st);
        self->send(st.router, leader_atom::value, name, term);
        if (same_term_claim && st.lead->is_leader()) {
          // Another node claimed our term while it could not see us (a partition, or both
          // starting alone): we keep leading, under a new term that fences its publishes out.
          st.lead->step_down();
          evaluate_leadership(self);
        }
      },
      // The operator page's refit outcomes, per model.
      [=](page_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        const auto& st = self->state;
        nlohmann::json out = nlohmann::json::object();
        for (size_t m = 0; m < st.by_model.size(); ++m)
          out[st.ctx->config.models[m].name] = {
              {"runs", st.by_model[m].runs},
              {"accepted", st.by_model[m].accepted},
              {"interval_s", st.ctx->config.models[m].refit_interval_s},
              {"recent", st.by_model[m].recent}};
        return out.dump();
      },
      // The refit's part of `status`.
      [=](admin_atom) -> caf::result<std::string> {
        if (!local_sender(self)) return caf::sec::request_receiver_down;
        return leadership_json(self->state).dump();
      },
      [=](admin_atom, admin_job_ptr job) {
        const auto& c = *self->state.ctx;
        const auto arg = string_arg(job->request.args, "model");
        if (!arg.ok())
          return answer_admin_error(c, *job, wire_error_code::malformed, arg.error().message());
        const auto name = arg->value_or("");
        for (uint32_t m = 0; m < c.config.models.size(); ++m)
          if (c.config.models[m].name == name) return run_refit(self, m, job);
        answer_admin_error(c, *job, wire_error_code::unknown_model,
                           "no model named '" + name + "'");
      },
  };
}

}  // namespace

caf::actor spawn_refit(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                       bool detached) {
  if (!detached) return sys.spawn(refit_behavior, std::move(ctx), std::move(router));
  return sys.spawn<caf::detached>(refit_behavior, std::move(ctx), std::move(router));
}

}  // namespace eldr
