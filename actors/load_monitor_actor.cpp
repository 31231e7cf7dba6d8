// load_monitor_actor: see load_monitor_actor.hpp.
#include "actors/load_monitor_actor.hpp"

#include <spdlog/spdlog.h>

namespace eldr {
namespace {

const char* type_name(const worker_message& m) {
  switch (m.index()) {
    case 0:
      return "worker_register";
    case 1:
      return "load_report";
    case 2:
      return "finished";
    case 3:
      return "worker_drain";
    default:
      return "publisher_register";
  }
}

caf::behavior load_monitor(caf::event_based_actor* self, node_context_ptr ctx, caf::actor router,
                           caf::actor sigcache) {
  return {
      [=](worker_atom, worker_job_ptr job) {
        ctx->metrics->worker_message(type_name(job->message));
        if (const auto* p = std::get_if<publisher_register>(&job->message)) {
          uint32_t model = 0;
          while (model < ctx->config.models.size() && ctx->config.models[model].name != p->model)
            ++model;
          if (model == ctx->config.models.size())
            return ctx->edge->reply_error(job->from, p->id, route_error_code::unknown_model,
                                          "no model named '" + p->model + "'");
          if (p->endpoint.rfind("tcp://", 0) != 0 && p->endpoint.rfind("ipc://", 0) != 0)
            return ctx->edge->reply_error(job->from, p->id, route_error_code::malformed,
                                          "publisher endpoint must be tcp:// or ipc://");
          spdlog::info("model {}: following KV-event publisher {}", p->model, p->endpoint);
          self->send(sigcache, subscribe_atom::value, model, p->endpoint, false);
          worker_ack ack;
          ack.id = p->id;
          ack.state = "subscribed";
          ctx->edge->reply(job->from, encode_worker_ack(ack));
          return;
        }
        self->send(router, worker_atom::value, std::move(job));
      },
  };
}

}  // namespace

caf::actor spawn_load_monitor(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                              caf::actor sigcache) {
  return sys.spawn(load_monitor, std::move(ctx), std::move(router), std::move(sigcache));
}

}  // namespace eldr
