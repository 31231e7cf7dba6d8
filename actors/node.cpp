// node: see node.hpp.
#include "actors/node.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <caf/all.hpp>
#include <chrono>

#include "actors/admin_actor.hpp"
#include "actors/load_monitor_actor.hpp"
#include "actors/node_metrics.hpp"
#include "actors/refit_actor.hpp"
#include "actors/router_actor.hpp"
#include "actors/sigcache_actor.hpp"
#include "cluster/metrics_http.hpp"

namespace eldr {
namespace {

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The actors the frontend hands messages to. Filled after the actors are spawned; until `ready`
// the frontend answers "starting" instead (the sockets are bound before the actors exist, so that
// the actors can be given the frontend to answer through).
struct actor_handles {
  std::atomic<bool> ready{false};
  std::atomic<zmq_frontend*> frontend{nullptr};  // set once the frontend is started
  caf::actor router, sigcache, load_monitor, admin;
};

// Answers a request that arrived before the actors exist or after they stopped. Before the
// frontend pointer is published there is no one to answer through: the client's timeout covers
// that instant.
void not_ready(actor_handles& h, const reply_address& to, std::optional<std::string> id) {
  if (auto* f = h.frontend.load(std::memory_order_acquire))
    f->reply_error(to, std::move(id), route_error_code::overloaded,
                   "the node is starting or stopping");
}

// A centroid file named in the config becomes the first epoch of a model whose store has none.
result<std::optional<centroid_file>> initial_set(signature_cache& cache, const model_config& m) {
  auto stored = stored_current_set(cache, m.name);
  if (!stored.ok() || *stored || m.centroids.empty()) return stored;
  auto file = read_centroid_file(m.centroids);
  if (!file.ok())
    return status(file.error().code(),
                  "models." + m.name + ".centroids: " + file.error().message());
  const uint64_t epoch = std::max<uint64_t>(file->epoch, 1);
  file->epoch = epoch;
  if (auto s = cache.put_centroid_set(epoch, encode_centroid_file(*file)); !s.ok()) return s;
  spdlog::info("model {}: loaded {} as epoch {}", m.name, m.centroids, epoch);
  return std::optional<centroid_file>(std::move(*file));
}

caf::actor_system_config& configure(caf::actor_system_config& cfg, const node_config& c) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(c.threads));
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  return cfg;
}

}  // namespace

class node::impl {
 public:
  explicit impl(const node_config& c) : system(configure(system_config, c)) {}
  ~impl() {
    handles->ready = false;
    for (auto* a :
         {&handles->admin, &handles->load_monitor, &refit, &handles->router, &handles->sigcache})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    system.await_all_actors_done();
    // No actor answers any more: stop the edge, then drop every handle. A detached actor's thread
    // ends only when the last reference to the actor is gone, and ~actor_system waits for it.
    frontend.reset();
    http.reset();
    handles->router = handles->sigcache = handles->load_monitor = handles->admin = refit =
        caf::actor();
  }

  // Destruction runs bottom-up: the actor system stops first (actors answer through the
  // frontend), then the frontend, then the metrics server.
  std::shared_ptr<actor_handles> handles = std::make_shared<actor_handles>();
  std::unique_ptr<metrics_http_server> http;
  std::unique_ptr<zmq_frontend> frontend;
  std::shared_ptr<node_metrics> metrics = std::make_shared<node_metrics>();
  std::string metrics_url;
  caf::actor_system_config system_config;
  caf::actor_system system;
  caf::actor refit;
};

node::node(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
node::~node() = default;

result<std::unique_ptr<node>> node::start(node_config config, node_options options) {
  if (auto s = validate_node_config(config); !s.ok()) return s;
  // One node serves all four roles; running a subset needs peers to serve the others.
  if (config.roles.size() != 4)
    return status::invalid_argument(
        "node.roles: this version runs router, signature-cache, load-monitor and refit together "
        "on one node; a node with a subset of the roles needs a cluster (not yet available)");
  if (!options.now_ms) options.now_ms = steady_ms;

  auto caches = open_model_caches(config);
  if (!caches.ok()) return caches.error();
  std::vector<router_model_init> init(config.models.size());
  for (size_t m = 0; m < config.models.size(); ++m) {
    auto set = initial_set(*(*caches)[m], config.models[m]);
    if (!set.ok()) return set.error();
    init[m].current = std::move(*set);
  }

  auto p = std::make_unique<impl>(config);
  auto handles = p->handles;

  frontend_options fo;
  fo.endpoints = {config.route_endpoint, config.worker_endpoint, config.admin_endpoint};
  fo.route_limits.max_payload_bytes = config.max_message_bytes;
  fo.route_limits.max_blocks = config.max_blocks;
  fo.max_pending = config.max_pending;
  frontend_callbacks cb;
  // Each callback runs on the frontend thread; anon_send only enqueues.
  cb.on_route = [handles](route_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, job.request.id);
    caf::anon_send(handles->router, route_atom::value,
                   route_job_ptr(std::make_shared<const route_job>(std::move(job))));
  };
  cb.on_worker = [handles](worker_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, std::nullopt);
    caf::anon_send(handles->load_monitor, worker_atom::value,
                   worker_job_ptr(std::make_shared<const worker_job>(std::move(job))));
  };
  cb.on_admin = [handles](admin_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, job.request.id);
    caf::anon_send(handles->admin, admin_atom::value,
                   admin_job_ptr(std::make_shared<const admin_job>(std::move(job))));
  };
  cb.on_publisher = [handles](publisher_frames f) {
    if (!handles->ready.load(std::memory_order_acquire)) return;
    caf::anon_send(handles->sigcache, publisher_atom::value,
                   publisher_frames_ptr(std::make_shared<const publisher_frames>(std::move(f))));
  };
  auto frontend = zmq_frontend::start(std::move(fo), std::move(cb));
  if (!frontend.ok()) return frontend.error();
  p->frontend = std::move(*frontend);
  handles->frontend.store(p->frontend.get(), std::memory_order_release);

  if (!config.metrics_address.empty()) {
    auto metrics = p->metrics;
    auto http =
        metrics_http_server::start(config.metrics_address, [metrics] { return metrics->render(); });
    if (!http.ok())
      return status(http.error().code(), "endpoints.metrics: " + http.error().message());
    p->http = std::move(*http);
    const auto host = config.metrics_address.substr(0, config.metrics_address.rfind(':'));
    p->metrics_url = "http://" + host + ":" + std::to_string(p->http->port()) + "/metrics";
  }

  auto ctx = std::make_shared<node_context>();
  ctx->config = config;
  ctx->edge = p->frontend.get();
  ctx->frontend = p->frontend.get();
  ctx->metrics = p->metrics;
  ctx->now_ms = options.now_ms;
  ctx->started_ms = options.now_ms();
  ctx->metrics_url = p->metrics_url;
  node_context_ptr cctx = ctx;

  auto& sys = p->system;
  handles->sigcache = spawn_sigcache(sys, cctx, std::move(*caches), /*detached=*/false);
  handles->router = spawn_router(sys, cctx, handles->sigcache, std::move(init));
  handles->load_monitor = spawn_load_monitor(sys, cctx, handles->router, handles->sigcache);
  p->refit = spawn_refit(sys, cctx, handles->router);
  handles->admin = spawn_admin(sys, cctx, handles->router, handles->sigcache, p->refit);
  for (uint32_t m = 0; m < config.models.size(); ++m) {
    for (const auto& e : config.models[m].kv_endpoints)
      caf::anon_send(handles->sigcache, subscribe_atom::value, m, e, false);
    for (const auto& e : config.models[m].counts_endpoints)
      caf::anon_send(handles->sigcache, subscribe_atom::value, m, e, true);
  }
  for (auto [name, a] : {std::pair<const char*, caf::actor*>{"signature-cache", &handles->sigcache},
                         {"router", &handles->router},
                         {"load-monitor", &handles->load_monitor},
                         {"refit", &p->refit},
                         {"admin", &handles->admin}})
    caf::actor_cast<caf::abstract_actor*>(*a)->attach_functor(
        [n = name] { spdlog::debug("actor {} stopped", n); });
  handles->ready.store(true, std::memory_order_release);
  spdlog::info(
      "{} ready: route {} worker {} admin {} metrics {}", config.name,
      p->frontend->bound(frontend_channel::route), p->frontend->bound(frontend_channel::worker),
      p->frontend->bound(frontend_channel::admin), p->metrics_url.empty() ? "off" : p->metrics_url);
  return std::unique_ptr<node>(new node(std::move(p)));
}

const std::string& node::endpoint(frontend_channel c) const {
  return impl_->frontend->bound(c);
}
const std::string& node::metrics_url() const {
  return impl_->metrics_url;
}

}  // namespace eldr
