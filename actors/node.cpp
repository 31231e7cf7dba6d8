// node: see node.hpp.
#include "actors/node.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>
#include <chrono>
#include <filesystem>

#include "actors/admin_actor.hpp"
#include "actors/cluster/cluster_actor.hpp"
#include "actors/load_monitor_actor.hpp"
#include "actors/node_metrics.hpp"
#include "actors/operator_page.hpp"
#include "actors/readiness.hpp"
#include "actors/refit_actor.hpp"
#include "actors/router/router_actor.hpp"
#include "actors/sigcache/sigcache_actor.hpp"
#include "actors/tls_error_queue.hpp"
#include "cluster/http/metrics_http.hpp"
#include "cluster/security/curve_keys.hpp"
#include "cluster/zmq/zmq_frontend.hpp"
#include "core/membership/incarnation.hpp"

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
    f->reply_error(to, std::move(id), wire_error_code::overloaded,
                   "the node is starting or stopping");
}

// Answers a message for a role this node does not hold (a client pointed at the wrong node).
void no_role(actor_handles& h, const reply_address& to, std::optional<std::string> id,
             const char* role) {
  if (auto* f = h.frontend.load(std::memory_order_acquire))
    f->reply_error(to, std::move(id), wire_error_code::unknown_type,
                   std::string("this node has no ") + role + " role");
}

// A centroid file named in the config becomes the first epoch of a model whose store has none.
// Without a store (a router-only cluster node) the file is the first epoch as it is.
result<std::optional<centroid_file>> initial_set(signature_cache* cache, const model_config& m) {
  if (cache == nullptr) {
    if (m.centroids.empty()) return std::optional<centroid_file>();
    auto file = read_centroid_file(m.centroids);
    if (!file.ok())
      return status(file.error().code(),
                    "models." + m.name + ".centroids: " + file.error().message());
    file->epoch = std::max<uint64_t>(file->epoch, 1);
    return std::optional<centroid_file>(std::move(*file));
  }
  auto stored = stored_current_set(*cache, m.name);
  if (!stored.ok() || *stored || m.centroids.empty()) return stored;
  auto file = read_centroid_file(m.centroids);
  if (!file.ok())
    return status(file.error().code(),
                  "models." + m.name + ".centroids: " + file.error().message());
  const uint64_t epoch = std::max<uint64_t>(file->epoch, 1);
  file->epoch = epoch;
  if (auto s = cache->put_centroid_set(epoch, encode_centroid_file(*file)); !s.ok()) return s;
  spdlog::info("model {}: loaded {} as epoch {}", m.name, m.centroids, epoch);
  return std::optional<centroid_file>(std::move(*file));
}

// A warm restart's current set must fit the configured pool: one of another K would be installed
// as current and never used (the pool keeps its K, so the model would route by load only, every
// score 0). Refused, naming the key, rather than silently degraded.
status check_stored_k(const model_config& m, size_t index,
                      const std::optional<centroid_file>& set) {
  if (!set) return {};
  const std::string p = "models[" + std::to_string(index) + "]";
  if (m.workers != 0 && set->workers != m.workers)
    return status::failed_precondition(p + ".workers = " + std::to_string(m.workers) +
                                       " but the current centroid set of model " + m.name +
                                       " in node.data_dir (epoch " + std::to_string(set->epoch) +
                                       ") has K = " + std::to_string(set->workers) + ": set " + p +
                                       ".workers = " + std::to_string(set->workers) +
                                       " (or 0 to take K from the set), or start with another "
                                       "data_dir and import a set for " +
                                       std::to_string(m.workers) + " workers");
  if (set->workers > m.max_workers)
    return status::failed_precondition(
        "the current centroid set of model " + m.name + " in node.data_dir (epoch " +
        std::to_string(set->epoch) + ") has K = " + std::to_string(set->workers) + ", more than " +
        p + ".max_workers = " + std::to_string(m.max_workers));
  return {};
}

caf::actor_system_config& configure(caf::actor_system_config& cfg, const node_config& c) {
  cfg.set("scheduler.max-threads", static_cast<size_t>(c.threads));
  cfg.set("scheduler.policy", caf::atom("sharing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  if (c.clustered()) {
    // CAF's own failure detection: a connection silent for connection-timeout is closed, which
    // fires the monitors of the actors behind it (cluster_actor.hpp).
    cfg.load<caf::io::middleman>();
    cfg.set("middleman.heartbeat-interval",
            caf::timespan(std::chrono::milliseconds(c.cluster.heartbeat_ms)));
    cfg.set("middleman.connection-timeout",
            caf::timespan(std::chrono::milliseconds(c.cluster.connection_timeout_ms)));
    cfg.set("middleman.enable-automatic-connections", false);
    if (!c.cluster.tls_certificate.empty()) {
      cfg.load<caf::openssl::manager>();
      cfg.openssl_certificate = c.cluster.tls_certificate;
      cfg.openssl_key = c.cluster.tls_key;
      cfg.openssl_cafile = c.cluster.tls_ca_file;
    }
    register_cluster_types(cfg);
  }
  return cfg;
}

// Publishes the cluster actor (the gate) at cluster.listen; returns the bound port.
result<uint16_t> publish_gate(caf::actor_system& sys, const node_config& c,
                              const caf::actor& gate) {
  auto hp = parse_host_port(c.cluster.listen);
  if (!hp.ok()) return status::invalid_argument("cluster.listen: " + hp.error().message());
  auto port = c.cluster.tls_certificate.empty()
                  ? sys.middleman().publish(gate, hp->port, hp->host.c_str(), true)
                  : caf::openssl::publish(gate, hp->port, hp->host.c_str(), true);
  if (!port)
    return status::io_error("cluster.listen: cannot listen on " + c.cluster.listen + ": " +
                            sys.render(port.error()));
  return *port;
}

// The configuration key of a model's publisher endpoint, which names it in errors and lookups.
std::string kv_bind_key(size_t model) {
  return "models[" + std::to_string(model) + "].kv_events.bind";
}

}  // namespace

class node::impl {
 public:
  explicit impl(const node_config& c) : system(configure(system_config, c)) {}
  ~impl() {
    handles->ready = false;
    // The cluster actor first: it tells the peers we leave, so they stop counting on us now.
    for (auto* a : {&cluster, &handles->admin, &handles->load_monitor, &refit, &handles->router,
                    &handles->sigcache})
      if (*a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
    system.await_all_actors_done();
    // No actor answers any more: stop the edge, then drop every handle. A detached actor's thread
    // ends only when the last reference to the actor is gone, and ~actor_system waits for it.
    metrics->forget_frontend();  // /metrics reads the frontend's counters until here
    frontend.reset();
    http.reset();
    handles->router = handles->sigcache = handles->load_monitor = handles->admin = refit = cluster =
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
  caf::actor cluster;
  std::string cluster_address;                   // host:port peers dial, "" when standalone
  std::map<std::string, std::string> kv_events;  // model name -> bound publisher endpoint
};

node::node(std::unique_ptr<impl> p) : impl_(std::move(p)) {}
node::~node() = default;

result<std::unique_ptr<node>> node::start(node_config config, node_options options) {
  if (auto s = validate_node_config(config); !s.ok()) return s;
  if (auto s = check_node_files(config); !s.ok()) return s;
  if (!options.now_ms) options.now_ms = steady_ms;
  const bool has_router = config.has_role("router"), has_cache = config.has_role("signature-cache"),
             has_monitor = config.has_role("load-monitor"), has_refit = config.has_role("refit");
  std::string secret;
  if (config.clustered()) {
    auto s = read_cluster_secret(config.cluster.secret_file);
    if (!s.ok()) return s.error();
    secret = std::move(*s);
    if (std::string why; !config.cluster.tls_certificate.empty() && !tls_error_queue_cleared(&why))
      spdlog::warn("cluster TLS: {}; a stranger's failed handshake can drop member connections",
                   why);
  }

  std::vector<std::unique_ptr<signature_cache>> caches;
  if (has_cache) {
    auto opened = open_model_caches(config);
    if (!opened.ok()) return opened.error();
    caches = std::move(*opened);
  }
  std::vector<router_model_init> init(config.models.size());
  for (size_t m = 0; m < config.models.size(); ++m) {
    auto set = initial_set(has_cache ? caches[m].get() : nullptr, config.models[m]);
    if (!set.ok()) return set.error();
    if (auto s = check_stored_k(config.models[m], m, *set); !s.ok()) return s;
    init[m].current = std::move(*set);
  }

  auto p = std::make_unique<impl>(config);
  auto handles = p->handles;

  frontend_options fo;
  fo.endpoints = {config.route_endpoint, config.worker_endpoint, config.admin_endpoint};
  fo.route_limits.max_payload_bytes = config.max_message_bytes;
  fo.route_limits.max_blocks = config.max_blocks;
  fo.max_pending = config.max_pending;
  fo.max_queued_reply_bytes = config.max_queued_reply_bytes;
  // Each publisher holds a SUB socket and, during a replay, a DEALER: the cap leaves room for both
  // and for the ROUTERs, so that a subscription within max_publishers never hits it.
  fo.max_sockets = static_cast<int>(2 * config.max_publishers + 16);
  fo.replay_timeout_ms = static_cast<int>(config.replay_timeout_ms);
  // Bound now, not at the signature cache's first subscription: a taken port fails the start and
  // names its key, like the channels' ports.
  for (size_t m = 0; m < config.models.size() && has_cache; ++m)
    if (!config.models[m].kv_bind.empty())
      fo.publisher_binds.emplace_back(kv_bind_key(m), config.models[m].kv_bind);
  if (!config.security.curve_secret_key_file.empty()) {
    auto keys = read_curve_secret_key(config.security.curve_secret_key_file);
    if (!keys.ok())
      return status(keys.error().code(),
                    "security.curve_secret_key_file: " + keys.error().message());
    fo.curve.server_secret_key = keys->secret_key;
    if (!config.security.curve_authorized_keys_file.empty()) {
      auto allowed = read_curve_public_keys(config.security.curve_authorized_keys_file);
      if (!allowed.ok())
        return status(allowed.error().code(),
                      "security.curve_authorized_keys_file: " + allowed.error().message());
      fo.curve.authorized_client_keys = std::move(*allowed);
    }
  }
  frontend_callbacks cb;
  // Each callback runs on the frontend thread; anon_send only enqueues.
  cb.on_route = [handles, has_router](route_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, job.request.id);
    if (!has_router) return no_role(*handles, job.from, job.request.id, "router");
    caf::anon_send(handles->router, route_atom::value,
                   route_job_ptr(std::make_shared<const route_job>(std::move(job))));
  };
  cb.on_worker = [handles, has_monitor](worker_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, std::nullopt);
    if (!has_monitor)
      return no_role(*handles, job.from, worker_message_id(job.message), "load-monitor");
    caf::anon_send(handles->load_monitor, worker_atom::value,
                   worker_job_ptr(std::make_shared<const worker_job>(std::move(job))));
  };
  cb.on_admin = [handles](admin_job job) {
    if (!handles->ready.load(std::memory_order_acquire))
      return not_ready(*handles, job.from, job.request.id);
    caf::anon_send(handles->admin, admin_atom::value,
                   admin_job_ptr(std::make_shared<const admin_job>(std::move(job))));
  };
  cb.on_publisher = [handles, has_cache](publisher_frames f) {
    if (!handles->ready.load(std::memory_order_acquire) || !has_cache) return;
    caf::anon_send(handles->sigcache, publisher_atom::value,
                   publisher_frames_ptr(std::make_shared<const publisher_frames>(std::move(f))));
  };
  auto frontend = zmq_frontend::start(std::move(fo), std::move(cb));
  if (!frontend.ok()) return frontend.error();
  p->frontend = std::move(*frontend);
  handles->frontend.store(p->frontend.get(), std::memory_order_release);
  p->metrics->expose_frontend(p->frontend->counters());

  // /readyz reads the board the actors write (readiness.hpp); the store part is writable until
  // its owner says otherwise through set_store.
  std::vector<std::string> model_names;
  for (const auto& m : config.models)
    model_names.push_back(m.name);
  auto board =
      std::make_shared<readiness_board>(std::move(model_names), has_router, config.clustered());
  std::shared_ptr<operator_view> page;
  if (!config.metrics_address.empty()) {
    auto metrics = p->metrics;
    std::vector<std::string> names;
    for (const auto& m : config.models)
      names.push_back(m.name);
    page = std::make_shared<operator_view>(std::move(names));
    auto http = metrics_http_server::start(
        config.metrics_address, [metrics] { return metrics->render(); },
        [board, now = options.now_ms] {
          const auto v = board->evaluate(now());
          return metrics_http_server::readiness{v.ready, v.body};
        },
        [page](std::string_view path) { return page->page(path); });
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
  if (config.clustered()) ctx->trust = std::make_shared<cluster_trust>();
  ctx->readiness = board;
  ctx->operator_page = page;
  node_context_ptr cctx = ctx;

  auto& sys = p->system;
  if (has_cache) handles->sigcache = spawn_sigcache(sys, cctx, std::move(caches), false);
  if (has_router) handles->router = spawn_router(sys, cctx, handles->sigcache, std::move(init));
  if (has_monitor)
    handles->load_monitor = spawn_load_monitor(sys, cctx, handles->router, handles->sigcache);
  // The refit needs a router to sample and install; across nodes only the leader's refit runs
  // (refit_actor.cpp, core/membership/leadership.hpp).
  if (has_refit && has_router) p->refit = spawn_refit(sys, cctx, handles->router);
  if (config.clustered()) {
    cluster_setup cs;
    cs.secret = std::move(secret);
    cs.mm = config.cluster.tls_certificate.empty() ? sys.middleman().actor_handle()
                                                   : sys.openssl_manager().actor_handle();
    cs.self.name = config.name;
    cs.self.roles = config.roles;
    cs.self.incarnation = draw_incarnation();
    cs.self.router = handles->router;
    cs.self.load_monitor = handles->load_monitor;
    cs.self.sigcache = handles->sigcache;
    cs.self.refit = p->refit;
    cs.vote_file = (std::filesystem::path(config.data_dir) / "cluster-vote").string();
    auto vote = read_vote_file(cs.vote_file);
    if (!vote.ok()) return vote.error();
    cs.voted_term = vote->term;
    cs.voted_for = vote->candidate;
    for (const auto& a : {handles->router, handles->load_monitor, p->refit, handles->sigcache})
      if (a) cs.watchers.push_back(a);
    // The actor must exist to be published, and its address (what peers dial) needs the port
    // publishing bound when listen asks for port 0: it waits for address_atom before it dials.
    auto listen = parse_host_port(config.cluster.listen);
    auto address = std::make_shared<std::string>();
    cs.address = address;
    p->cluster = spawn_cluster(sys, cctx, std::move(cs));
    auto port = publish_gate(sys, config, p->cluster);
    if (!port.ok()) return port.error();
    p->cluster_address = config.cluster.advertise.empty()
                             ? listen->host + ":" + std::to_string(*port)
                             : config.cluster.advertise;
    *address = p->cluster_address;
    caf::anon_send(p->cluster, dial_atom::value);
  }
  handles->admin = spawn_admin(sys, cctx, handles->router, handles->sigcache, p->refit, p->cluster);
  for (uint32_t m = 0; m < config.models.size() && has_cache; ++m) {
    for (const auto& e : config.models[m].kv_endpoints)
      caf::anon_send(handles->sigcache, subscribe_atom::value, m, e, false);
    for (const auto& e : config.models[m].counts_endpoints)
      caf::anon_send(handles->sigcache, subscribe_atom::value, m, e, true);
    if (!config.models[m].kv_bind.empty())
      caf::anon_send(handles->sigcache, subscribe_atom::value, m,
                     std::string(kv_bind_prefix) + config.models[m].kv_bind, false);
  }
  for (auto [name, a] : {std::pair<const char*, caf::actor*>{"signature-cache", &handles->sigcache},
                         {"router", &handles->router},
                         {"load-monitor", &handles->load_monitor},
                         {"refit", &p->refit},
                         {"admin", &handles->admin},
                         {"cluster", &p->cluster}})
    if (*a)
      caf::actor_cast<caf::abstract_actor*>(*a)->attach_functor(
          [n = name] { spdlog::debug("actor {} stopped", n); });
  for (size_t m = 0; m < config.models.size(); ++m)
    if (auto ep = p->frontend->bound_publisher(kv_bind_key(m)); !ep.empty())
      p->kv_events[config.models[m].name] = std::move(ep);
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
const std::map<std::string, std::string>& node::kv_events_endpoints() const {
  return impl_->kv_events;
}
const std::string& node::cluster_address() const {
  return impl_->cluster_address;
}

}  // namespace eldr
