// What tests of the node's actors under CAF's deterministic test scheduler share: the scheduler's
// configuration, a reply sink that records what the actors answer instead of sending it, and the
// fixture members that hold them with a data folder and a clock the test advances.
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/node_context.hpp"
#include "cluster/zmq/zmq_frontend.hpp"
#include "tests/support/temp_dir.hpp"

namespace eldr::testing {

// Makes `cfg` run actors on CAF's test coordinator (messages delivered one by one when the test
// runs the scheduler) with the logger quiet; returns it, for a member initialiser.
inline caf::actor_system_config& use_test_scheduler(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  return cfg;
}

// Records every answer with its address until take(), and counts route replies for good. Each
// subscribed endpoint gets the next id (0, 1, ...) and keeps it, as reply_sink promises. Thread-
// safe, as reply_sink promises.
class recording_sink final : public reply_sink {
 public:
  void reply(const reply_address& to, std::vector<uint8_t> payload) override {
    std::lock_guard lock(mutex_);
    if (to.channel == frontend_channel::route) ++route_replies_;
    sent_.emplace_back(to, std::move(payload));
  }
  void subscribe(subscription_request r) override {
    uint32_t id = 0;
    {
      std::lock_guard lock(mutex_);
      id = ids_.try_emplace(r.endpoint, static_cast<uint32_t>(ids_.size())).first->second;
    }
    if (r.done) r.done(id);
  }
  void unsubscribe(uint32_t) override {}
  void request_replay(uint32_t, uint64_t, uint64_t) override {}

  // The answers recorded since the last call, in the order they were sent.
  std::vector<std::pair<reply_address, std::vector<uint8_t>>> take() {
    std::lock_guard lock(mutex_);
    return std::exchange(sent_, {});
  }
  // The id subscribe() gave the endpoint.
  uint32_t id_of(const std::string& endpoint) {
    std::lock_guard lock(mutex_);
    return ids_.at(endpoint);
  }
  // Route replies since the sink was made (take() does not reset it).
  size_t route_replies() {
    std::lock_guard lock(mutex_);
    return route_replies_;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<reply_address, std::vector<uint8_t>>> sent_;
  std::map<std::string, uint32_t> ids_;
  size_t route_replies_ = 0;
};

// The members an actor test's fixture shares, declared in the order they must be torn down in
// reverse: the fixture sends its actors exit and runs the scheduler in its destructor, then the
// system goes, then the sink and clock the actors used, the data folder last.
class actor_fixture {
 protected:
  explicit actor_fixture(const std::string& dir_tag)
      : dir_(dir_tag),
        sys_(use_test_scheduler(cfg_)),
        sched_(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())) {}

  // A context for actors of a node configured by `config`: answers go to sink_, the clock is
  // now_, the metrics are new.
  std::shared_ptr<node_context> make_context(const node_config& config) {
    auto ctx = std::make_shared<node_context>();
    ctx->config = config;
    ctx->edge = &sink_;
    ctx->metrics = std::make_shared<node_metrics>();
    ctx->now_ms = [this] { return now_; };
    return ctx;
  }

  temp_dir dir_;
  recording_sink sink_;
  int64_t now_ = 1000;
  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
};

}  // namespace eldr::testing
