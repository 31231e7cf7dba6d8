// readiness: whether a node can do its job now, for GET /readyz (a Kubernetes readinessProbe,
// a load balancer). /healthz only says the process answers; /readyz says it can route:
//   - every configured model (on a node with the router role) has at least one worker that may
//     receive a request (registered, reporting within its timeout, not drained);
//   - every model whose policy needs a centroid set ("eldr", "eldr-adaptive") has one of the
//     pool's K;
//   - every model's signature store is writable, or the node runs explicitly degraded without it
//     (then ready, with the store listed under "degraded");
//   - in a cluster, membership is formed: the node knows the refit leader, which the cluster
//     code elects only among members that see a majority (core/membership/leadership.hpp).
//
// The board is written by the actors where their state changes (the router after worker
// messages, installs and policy changes; the cluster side when the leader changes; the store's
// owner through set_store) and read by the HTTP thread. Worker liveness ends without any message
// (a worker stops reporting), so the router publishes until when its workers stay live, and the
// reader compares that with its own clock.
//
// Thread safety: every method may be called from any thread (one mutex; updates are a few
// assignments, reads build one small JSON body).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace eldr {

// What GET /readyz answers: 200 when ready, else 503; the body is JSON either way.
struct readiness_verdict {
  bool ready = false;
  std::string body;  // {"ready":bool,"reasons":[...],"degraded":[...]}
};

class readiness_board {
 public:
  static constexpr int64_t forever = std::numeric_limits<int64_t>::max();

  // `models`: the configured model names. `routes`: the node has the router role (else the
  // per-model routing conditions do not apply). `clustered`: membership must be formed.
  readiness_board(std::vector<std::string> models, bool routes, bool clustered);

  // The router's view of one model: how many workers may receive a request, until when (on the
  // router's clock) at least one of them stays live without another report (forever when they
  // never time out), whether the policy needs a centroid set and whether one of the pool's K is
  // installed. Unknown model names are ignored.
  void set_routing(const std::string& model, uint32_t routable_workers, int64_t live_until_ms,
                   bool policy_needs_set, bool has_set);
  // The signature store of one model: writable by default. Degraded (the node routes on without
  // it, explicitly): ready, listed under "degraded" with `reason`. Not writable and not degraded:
  // not ready (`reason` says why).
  void set_store(const std::string& model, bool writable, bool degraded, std::string reason);
  // Cluster membership: formed once the node knows the refit leader. `reason` when not formed.
  void set_cluster(bool formed, std::string reason);

  // The verdict at `now_ms` (the same clock as live_until_ms).
  readiness_verdict evaluate(int64_t now_ms) const;

 private:
  struct model_entry {
    bool routing_known = false;  // the router has published at least once
    uint32_t routable = 0;
    int64_t live_until_ms = 0;
    bool needs_set = false;
    bool has_set = false;
    bool writable = true;
    bool degraded = false;
    std::string store_reason;
  };

  mutable std::mutex mu_;
  bool routes_;
  bool clustered_;
  bool cluster_formed_ = false;
  std::string cluster_reason_ = "cluster membership not formed yet";
  std::vector<std::string> order_;  // configured order, for stable output
  std::map<std::string, model_entry> models_;
};

}  // namespace eldr
