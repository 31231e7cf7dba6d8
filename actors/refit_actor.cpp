// refit_actor: see refit_actor.hpp.
#include "actors/refit_actor.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <nlohmann/json.hpp>

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
};
using refit_actor_t = caf::stateful_actor<refit_state>;

// Ends one refit: log, metrics, admin answer (when an operator asked), next timer.
void finish(refit_actor_t* self, uint32_t model, const admin_job_ptr& job, nlohmann::json out,
            bool accepted) {
  const auto& ctx = *self->state.ctx;
  const auto& cfg = ctx.config.models[model];
  ctx.metrics->refit_done(cfg.name, accepted);
  if (accepted)
    spdlog::info("model {}: refit accepted, epoch {}", cfg.name, out.value("epoch", 0));
  else
    spdlog::warn("model {}: refit rejected: {}", cfg.name, out.value("reason", std::string()));
  if (job) answer_admin(ctx, *job, std::move(out));
  if (!job && cfg.refit_interval_s > 0)
    self->delayed_send(self, std::chrono::seconds(cfg.refit_interval_s), refit_atom::value, model);
}

void run_refit(refit_actor_t* self, uint32_t model, admin_job_ptr job) {
  ++self->state.runs;
  self->request(self->state.router, caf::infinite, sample_atom::value, model)
      .then(
          [=](refit_input_ptr in) {
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
            if (rows < cfg.min_sample)
              return reject("sample too small: " + std::to_string(rows) + " live signatures, " +
                            std::to_string(cfg.min_sample) + " needed (models.min_sample)");
            refit_options ro;
            ro.k = in->current->k();
            ro.kmeans.seed = cfg.seed + self->state.runs;
            ro.kmeans.threads = 1;  // the router and the frontend keep the other core
            ro.kmeans.worker_weights.assign(in->current_file->worker_weights.begin(),
                                            in->current_file->worker_weights.end());
            ro.validation.max_balance_ratio = cfg.max_balance_ratio;
            ro.validation.score_tolerance = cfg.score_tolerance;
            ro.validation.batch_size = cfg.refit_batch_size;
            ro.validation.seed = cfg.seed;
            auto out = refit_candidate(in->points, width, in->current.get(), ro);
            if (!out.ok()) return reject("fit failed: " + out.error().to_string());
            auto report = report_json(out->report);
            report["seen"] = in->seen;
            report["from_epoch"] = in->current->epoch();
            if (!out->report.accepted) return finish(self, model, job, report, false);
            centroid_file f = *in->current_file;
            const auto rows_span = out->candidate->rows();
            f.centroids.assign(rows_span.begin(), rows_span.end());
            f.epoch = 0;
            f.provenance.source = "refit of epoch " + std::to_string(in->current->epoch()) +
                                  " on " + std::to_string(rows) + " live signatures";
            f.provenance.tool = "eldr-node refit";
            f.provenance.objective = 1.0 - out->report.objective;
            f.provenance.calibration_requests = static_cast<uint32_t>(rows);
            auto stored = std::make_shared<const stored_set>(stored_set{0, std::move(f)});
            self->request(self->state.router, caf::infinite, install_atom::value, model,
                          stored_set_ptr(stored))
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
          },
          [=](caf::error& e) {
            finish(self, model, job,
                   {{"accepted", false}, {"reason", "no sample: " + self->system().render(e)}},
                   false);
          });
}

caf::behavior refit_behavior(refit_actor_t* self, node_context_ptr ctx, caf::actor router) {
  self->state.ctx = ctx;
  self->state.router = router;
  for (uint32_t m = 0; m < ctx->config.models.size(); ++m)
    if (ctx->config.models[m].refit_interval_s > 0)
      self->delayed_send(self, std::chrono::seconds(ctx->config.models[m].refit_interval_s),
                         refit_atom::value, m);
  return {
      [=](refit_atom, uint32_t model) { run_refit(self, model, nullptr); },
      [=](admin_atom, admin_job_ptr job) {
        const auto& c = *self->state.ctx;
        const auto name = string_arg(job->request.args, "model").value_or("");
        for (uint32_t m = 0; m < c.config.models.size(); ++m)
          if (c.config.models[m].name == name) return run_refit(self, m, job);
        answer_admin_error(c, *job, route_error_code::unknown_model,
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
