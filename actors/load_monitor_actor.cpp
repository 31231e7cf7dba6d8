// load_monitor_actor: see load_monitor_actor.hpp.
#include "actors/load_monitor_actor.hpp"

#include <spdlog/spdlog.h>

#include "actors/cluster/cluster_protocol.hpp"

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

struct monitor_state {
  std::vector<caf::actor> peer_routers;  // routers of the other live members
};

caf::behavior load_monitor(caf::stateful_actor<monitor_state>* self, node_context_ptr ctx,
                           caf::actor router, caf::actor sigcache) {
  return {
      [=](members_atom, const std::vector<member_info>& members, uint32_t) {
        if (!accept_member_list(self, *ctx->metrics)) return;
        auto& peers = self->state.peer_routers;
        peers.clear();
        for (const auto& m : members)
          if (m.router) peers.push_back(m.router);
      },
      [=](worker_atom, worker_job_ptr job) {
        ctx->metrics->worker_message(type_name(job->message));
        if (const auto* p = std::get_if<publisher_register>(&job->message)) {
          uint32_t model = 0;
          while (model < ctx->config.models.size() && ctx->config.models[model].name != p->model)
            ++model;
          if (model == ctx->config.models.size())
            return ctx->edge->reply_error(job->from, p->id, wire_error_code::unknown_model,
                                          "no model named '" + p->model + "'");
          auto tcp_or_ipc = [](const std::string& e) {
            return e.rfind("tcp://", 0) == 0 || e.rfind("ipc://", 0) == 0;
          };
          if (!tcp_or_ipc(p->endpoint))
            return ctx->edge->reply_error(job->from, p->id, wire_error_code::malformed,
                                          "publisher endpoint must be tcp:// or ipc://");
          if (!p->replay_endpoint.empty() && !tcp_or_ipc(p->replay_endpoint))
            return ctx->edge->reply_error(job->from, p->id, wire_error_code::malformed,
                                          "publisher replay_endpoint must be tcp:// or ipc://");
          if (!sigcache)
            return ctx->edge->reply_error(job->from, p->id, wire_error_code::unknown_type,
                                          "this node has no signature-cache role");
          // Acknowledged once the cache's SUB socket exists (or answered with why not): the
          // frontend thread reports it, so this waits without blocking anyone.
          self->request(sigcache, std::chrono::milliseconds(ctx->config.timeouts.subscribe_ms),
                        subscribe_atom::value, model, p->endpoint, p->replay_endpoint, false)
              .then(
                  [=](uint8_t code, const std::string& message) {
                    if (code != 0)
                      return ctx->edge->reply_error(job->from, p->id,
                                                    static_cast<wire_error_code>(code), message);
                    worker_ack ack;
                    ack.id = p->id;
                    ack.state = "subscribed";
                    ctx->edge->reply(job->from, encode_worker_ack(ack));
                  },
                  [=](caf::error& e) {
                    ctx->edge->reply_error(job->from, p->id, wire_error_code::internal,
                                           "the signature cache did not answer the registration: " +
                                               self->system().render(e));
                  });
          return;
        }
        // Every router of the cluster keeps its own load view: the local one applies the
        // message and answers the worker, the others get the message's bytes and apply them
        // silently. A finished event is applied once per router (by request id).
        // With load authorities (cluster.load_sharing = "authority") this node alone applies its
        // workers' reports and finished events; the others learn registrations and drains, the
        // pool's shape, and the load from this node's vectors.
        const bool shared_with_peers = ctx->config.cluster.load_sharing != "authority" ||
                                       std::holds_alternative<worker_register>(job->message) ||
                                       std::holds_alternative<worker_drain>(job->message);
        if (shared_with_peers && !self->state.peer_routers.empty()) {
          const auto bytes = encode_worker_message(job->message);
          for (const auto& r : self->state.peer_routers)
            self->send(r, peer_worker_atom::value, bytes);
        }
        if (router) return self->send(router, worker_atom::value, std::move(job));
        // No router here: the message went to the cluster's routers; acknowledge receipt.
        worker_ack ack;
        ack.id = std::visit([](const auto& m) { return m.id; }, job->message);
        ack.state = "forwarded";
        ctx->edge->reply(job->from, encode_worker_ack(ack));
      },
  };
}

}  // namespace

caf::actor spawn_load_monitor(caf::actor_system& sys, node_context_ptr ctx, caf::actor router,
                              caf::actor sigcache) {
  return sys.spawn(load_monitor, std::move(ctx), std::move(router), std::move(sigcache));
}

}  // namespace eldr
