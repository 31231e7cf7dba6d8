// router_admin: the router's admin commands (docs/protocol.md section 5; eldrctl), one function
// per command in a table, and the changes of a model's current set -- import, swap, rollback,
// refit -- which in a cluster the refit leader makes (change_via_leader), so that two routers can
// never number one epoch twice and every router's rollback history follows one sequence.
#include <spdlog/spdlog.h>

#include <map>
#include <string_view>

#include "actors/caf_status.hpp"
#include "actors/router/model_policy.hpp"
#include "actors/router/router_actor_internal.hpp"
#include "actors/router/router_files.hpp"
#include "actors/router/router_status.hpp"

namespace eldr::router {

// Runs `file` through the store (new epoch) and installs it, then calls done(epoch or error).
using install_done = std::function<void(result<uint64_t>)>;
// `cause` goes to the rollback history (install); `what` to the log. `term`: the refit leader's
// term, in which the new epoch is numbered (core/membership/leadership.hpp's next_epoch); 0 outside
// a cluster.
void store_and_install(router_actor_t* self, model_state& m, centroid_file file, std::string cause,
                       std::string what, install_done done, uint64_t term) {
  m.fence.observe_term(term);
  if (auto s = check_installable(m, file); !s.ok()) return done(s);
  if (auto s = check_policy_accepts(m, file); !s.ok()) return done(s);
  const auto at_least = next_epoch(m.epoch, term);
  if (!at_least)
    return done(status::failed_precondition(
        "term " + std::to_string(term) + " cannot number an epoch after " +
        std::to_string(m.epoch) + " (a newer term's set is installed, or the term's range is " +
        "used up)"));
  if (!self->state.sigcache) {
    // No store on this node: the set lives in the routers' memories (and their snapshots).
    const uint64_t epoch = *at_least;
    if (auto s = install(self->state, m, file, epoch, cause); !s.ok()) return done(s);
    (void)m.fence.offer(term, epoch);
    spdlog::info("model {}: {} installed as epoch {}", m.cfg->name, what, epoch);
    announce_epoch(self, self->state, m);
    return done(epoch);
  }
  const uint32_t index = m.index;
  // Above every epoch this router has routed with, even one adopted from a peer, and inside the
  // term's range.
  auto stored = std::make_shared<const stored_set>(stored_set{0, std::move(file), *at_least});
  self->request(self->state.sigcache, caf::infinite, store_set_atom::value, index,
                stored_set_ptr(stored))
      .then(
          [=](uint64_t epoch) {
            auto& mm = *self->state.models[index];
            if (term != 0 && term_of_epoch(epoch) != term)
              return done(status::failed_precondition(
                  "the store numbered the set " + std::to_string(epoch) + ", outside term " +
                  std::to_string(term) + " (it holds a newer term's epoch)"));
            if (auto s = install(self->state, mm, stored->file, epoch, cause); !s.ok())
              return done(s);
            (void)mm.fence.offer(term, epoch);
            spdlog::info("model {}: {} installed as epoch {}", mm.cfg->name, what, epoch);
            announce_epoch(self, self->state, mm);
            done(epoch);
          },
          [=](caf::error& e) { done(to_status(self->system(), e)); });
}

install_done answer_with_epoch(router_actor_t* self, admin_job_ptr job) {
  return [self, job](result<uint64_t> r) {
    if (!r.ok())
      return answer_admin_error(*self->state.ctx, *job, wire_error_for_refusal(r.error()),
                                r.error().message());
    answer_admin(*self->state.ctx, *job, {{"epoch", *r}});
  };
}

// An install's outcome for an actor that asked for it: the epoch, or the error as text.
install_done deliver_epoch(caf::typed_response_promise<uint64_t> rp) {
  return [rp](result<uint64_t> r) mutable {
    if (r.ok())
      rp.deliver(*r);
    else
      rp.deliver(to_caf_error(r.error()));
  };
}

// The text of an error another actor delivered with caf::make_error(code, text): the text, not
// CAF's rendering of the whole error (which an operator should not have to read).
std::string error_text(router_actor_t* self, const caf::error& e) {
  const auto& ctx = e.context();
  if (ctx.size() >= 1 && ctx.match_element<std::string>(ctx.size() - 1))
    return ctx.get_as<std::string>(ctx.size() - 1);
  return self->system().render(e);
}

// A change of the current set that the refit leader makes (or this node outside a cluster):
// its outcome is the epoch the set was installed as and the stored epoch it came from (0 for an
// import), or the error.
using change_done = std::function<void(result<uint64_t> epoch, uint64_t source)>;

// "epoch 9 is not stored; stored epochs: 1, 2" (not_found), or ok when `epoch` is among them.
status check_stored(uint64_t epoch, const std::vector<uint64_t>& epochs) {
  if (std::find(epochs.begin(), epochs.end(), epoch) != epochs.end()) return {};
  std::string stored;
  for (uint64_t s : epochs)
    stored += (stored.empty() ? "" : ", ") + std::to_string(s);
  return status::not_found("epoch " + std::to_string(epoch) +
                           " is not stored; stored epochs: " + (stored.empty() ? "none" : stored));
}

// On the refit leader (term > 0): makes the change, numbering a new epoch in the term. A swap or
// rollback re-publishes the stored set as a new epoch rather than going back to its number: the
// routers' fences accept only newer epochs (docs/cluster.md), and every router then records the
// change alike (core/formats/centroid_history.hpp).
void change_as_leader(router_actor_t* self, model_state& m, const std::string& command,
                      const std::vector<uint8_t>& bytes, uint64_t epoch, uint64_t term,
                      change_done done) {
  if (command == "import") {
    auto file = parse_centroid_file(std::span<const uint8_t>(bytes.data(), bytes.size()), "import");
    if (!file.ok()) return done(file.error(), 0);
    return store_and_install(
        self, m, std::move(*file), "import", "imported set",
        [done](result<uint64_t> r) { done(std::move(r), 0); }, term);
  }
  uint64_t source = epoch;
  if (command == "rollback") {
    auto previous = m.history.previous();
    if (!previous.ok()) return done(previous.error(), 0);
    source = previous->epoch;
  }
  if (!self->state.sigcache)
    return done(status::failed_precondition(
                    "the refit leader " + self->state.ctx->config.name +
                    " has no signature-cache role, so it keeps no stored sets to " + command +
                    " to; give the refit role to nodes that also hold the signature cache"),
                0);
  const uint32_t index = m.index;
  self->request(self->state.sigcache, caf::infinite, history_atom::value, index)
      .then(
          [=](std::vector<uint64_t> epochs) {
            if (auto s = check_stored(source, epochs); !s.ok())
              return done(command == "rollback"
                              ? status::not_found("the set rollback returns to (epoch " +
                                                  std::to_string(source) +
                                                  ") is no longer stored: " + s.message())
                              : s,
                          0);
            self->request(self->state.sigcache, caf::infinite, load_set_atom::value, index, source,
                          false)
                .then(
                    [=](stored_set_ptr s) {
                      store_and_install(
                          self, *self->state.models[index], s->file, command,
                          command + " to the set of epoch " + std::to_string(source),
                          [done, source](result<uint64_t> r) { done(std::move(r), source); }, term);
                    },
                    [=](caf::error& e) { done(status::not_found(error_text(self, e)), 0); });
          },
          [=](caf::error& e) { done(status::io_error(error_text(self, e)), 0); });
}

namespace {

// How long a change waits for a refit leader to be known (an election under way) before it is
// refused: timeouts.leader_wait_ms.
int64_t leader_wait_ms(const router_state& st) {
  return st.ctx->config.timeouts.leader_wait_ms;
}

// "5 s", or "500 ms" for a wait that is no whole number of seconds.
std::string wait_text(int64_t ms) {
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

}  // namespace

// A change of the current set in a cluster (import, swap, rollback): made by the refit leader
// (this node's router when this node leads, else the leader's router, asked over the cluster), so
// that two changes at two routers can never get one epoch number and every router's history
// follows the same sequence. Waits up to leader_wait_ms for a leader to be known.
void change_via_leader(router_actor_t* self, uint32_t index, admin_job_ptr job, std::string command,
                       std::vector<uint8_t> bytes, uint64_t epoch, int64_t deadline_ms) {
  auto& st = self->state;
  auto& m = *st.models[index];
  auto answer = [self, job](result<uint64_t> r, uint64_t source, const std::string& leader) {
    if (!r.ok())
      return answer_admin_error(*self->state.ctx, *job, wire_error_for_refusal(r.error()),
                                r.error().message());
    nlohmann::json out{{"epoch", *r}, {"numbered_by", leader}};
    if (source != 0) out["set_of_epoch"] = source;
    answer_admin(*self->state.ctx, *job, out);
  };
  if (!st.leader.empty() && st.leader == st.ctx->config.name) {
    const std::string me = st.leader;
    return change_as_leader(
        self, m, command, bytes, epoch, st.leader_term,
        [answer, me](result<uint64_t> r, uint64_t source) { answer(std::move(r), source, me); });
  }
  auto it = st.leader.empty() ? st.routers_by_name.end() : st.routers_by_name.find(st.leader);
  if (it == st.routers_by_name.end()) {
    if (st.ctx->now_ms() < deadline_ms) {
      self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.timeouts.leader_retry_ms),
                         set_change_retry_atom::value, index, job, std::move(command),
                         std::move(bytes), epoch, deadline_ms);
      return;
    }
    return answer_admin_error(
        *st.ctx, *job, wire_error_code::internal,
        "no refit leader is known after " + wait_text(leader_wait_ms(st)) +
            ": in a cluster only the refit leader changes the current set (it needs a node "
            "with the router and refit roles that sees a majority of the members); nothing "
            "changed");
  }
  ++st.changes_forwarded;
  const std::string leader = st.leader;
  self->request(it->second, std::chrono::milliseconds(st.ctx->config.timeouts.set_change_ms),
                set_change_atom::value, m.cfg->name, command, std::move(bytes), epoch)
      .then([=](uint64_t installed, uint64_t source) { answer(installed, source, leader); },
            [=](caf::error& e) {
              // The leader's refusal keeps its code in the text ("not_found: ..."): the operator
              // gets the same answer as from the leader itself.
              const std::string text = error_text(self, e);
              const auto code = text.rfind("not_found: ", 0) == 0 ? wire_error_code::not_found
                                : text.rfind("invalid_argument: ", 0) == 0
                                    ? wire_error_code::malformed
                                    : wire_error_code::internal;
              answer_admin_error(
                  *self->state.ctx, *job, code,
                  "the refit leader " + leader + " did not " + command + ": " + text);
            });
}

// Makes a stored epoch current on a node outside a cluster (swap, rollback); `cause` goes to the
// rollback history.
void swap_to(router_actor_t* self, model_state& m, uint64_t epoch, std::string cause,
             admin_job_ptr job) {
  const uint32_t index = m.index;
  const uint64_t from = m.epoch;
  self->request(self->state.sigcache, caf::infinite, load_set_atom::value, index, epoch, true)
      .then(
          [=](stored_set_ptr s) {
            auto& mm = *self->state.models[index];
            if (auto c = check_installable(mm, s->file); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, wire_error_code::malformed, c.message());
              return;
            }
            if (auto c = check_policy_accepts(mm, s->file); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, wire_error_code::malformed, c.message());
              return;
            }
            if (auto c = install(self->state, mm, s->file, s->epoch, cause); !c.ok()) {
              answer_admin_error(*self->state.ctx, *job, wire_error_code::internal, c.to_string());
              return;
            }
            spdlog::info("model {}: {} to stored epoch {} (from {})", mm.cfg->name, cause, s->epoch,
                         from);
            announce_epoch(self, self->state, mm);
            answer_admin(*self->state.ctx, *job, {{"epoch", s->epoch}, {"from_epoch", from}});
          },
          [=](caf::error& e) {
            answer_admin_error(*self->state.ctx, *job, wire_error_code::not_found,
                               error_text(self, e));
          });
}

// After a change: persist every admin policy, then answer. A write that fails (a full disk) does
// not undo the change -- an operator switching policy in an emergency must get it -- but the
// answer says it will not survive a restart (persisted false, and why), and the log says it once.
void answer_policy(router_state& st, model_state& m, const admin_job& job) {
  auto r = policy_json(m);
  const status s = persist_policies(st);
  r["persisted"] = s.ok();
  if (!s.ok()) {
    r["persist_error"] = s.message();
    spdlog::error("model {}: policy change not persisted (lost on a restart): {}", m.cfg->name,
                  s.message());
  }
  answer_admin(*st.ctx, job, r);
}

namespace {

// One admin command's call: the request, the model it names (null when none or unknown) and the
// argument checks every command shares.
struct admin_call {
  router_actor_t* self;
  const admin_job_ptr& job;
  router_state& st;
  const std::string& cmd;
  const nlohmann::json& args;
  std::optional<std::string> model_name;
  model_state* m;

  // The named model, or false after answering unknown_model.
  bool need_model() {
    if (m) return true;
    answer_admin_error(*st.ctx, *job, wire_error_code::unknown_model,
                       model_name ? "no model named '" + *model_name + "'"
                                  : "argument 'model' (string) is required");
    return false;
  }
  // The required uint argument `key` (at most max), or nullopt after answering malformed.
  std::optional<uint64_t> need_uint(const char* key, uint64_t max = UINT64_MAX) {
    auto v = uint_arg(args, key, max);
    if (!v.ok() || !*v) {
      answer_admin_error(
          *st.ctx, *job, wire_error_code::malformed,
          v.ok() ? "argument '" + std::string(key) + "' (uint) is required" : v.error().message());
      return std::nullopt;
    }
    return **v;
  }
  // The 'worker' argument, or nullopt after answering malformed.
  std::optional<uint32_t> need_worker() {
    auto w = need_uint("worker", UINT32_MAX);
    if (!w) return std::nullopt;
    return static_cast<uint32_t>(*w);
  }
};

void cmd_workers(admin_call& c) {
  auto& st = c.st;
  const auto& job = c.job;
  const auto& model_name = c.model_name;
  auto* m = c.m;
  nlohmann::json rows = nlohmann::json::array();
  if (model_name && !c.need_model()) return;
  for (auto& mm : st.models)
    if (!m || mm.get() == m)
      for (auto& r : workers_json(st, *mm))
        rows.push_back(std::move(r));
  answer_admin(*st.ctx, *job, rows);
}

void cmd_drain(admin_call& c) {
  auto& st = c.st;
  const auto& job = c.job;
  auto* m = c.m;
  if (!c.need_model()) return;
  auto w = c.need_worker();
  if (!w) return;
  auto s = c.cmd == "drain" ? m->pool.drain(*w) : m->pool.undrain(*w);
  publish_readiness(st, *m);
  if (!s.ok()) return answer_admin_error(*st.ctx, *job, wire_error_code::malformed, s.message());
  spdlog::info("model {}: worker {} {}ed by admin", m->cfg->name, *w, c.cmd);
  auto snap = m->pool.snapshot(*w, st.ctx->now_ms());
  answer_admin(*st.ctx, *job, {{"worker", *w}, {"state", std::string(to_string(snap->state))}});
}

void cmd_centroids_show(admin_call& c) {
  auto* self = c.self;
  auto& st = c.st;
  const auto& job = c.job;
  auto* m = c.m;
  if (!c.need_model()) return;
  nlohmann::json r = spec_json(*m);
  // What rollback would undo, newest last (the stored epochs are under "history").
  nlohmann::json changes = nlohmann::json::array();
  for (const auto& ch : m->history.changes())
    changes.push_back({{"epoch", ch.epoch}, {"cause", ch.cause}, {"at_ms", ch.at_ms}});
  r["changes"] = std::move(changes);
  const uint32_t index = m->index;
  self->request(st.sigcache, caf::infinite, history_atom::value, index)
      .then(
          [=](std::vector<uint64_t> epochs) mutable {
            r["history"] = epochs;
            answer_admin(*self->state.ctx, *job, r);
          },
          [=](caf::error&) mutable { answer_admin(*self->state.ctx, *job, r); });
}

void cmd_centroids_import(admin_call& c) {
  auto* self = c.self;
  auto& st = c.st;
  const auto& job = c.job;
  const auto& args = c.args;
  auto* m = c.m;
  if (!c.need_model()) return;
  auto it = args.find("file");
  if (it == args.end() || !it->is_binary())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                              "argument 'file' (bin: a centroid file) is required");
  const auto& bin = it->get_binary();
  auto file = parse_centroid_file(std::span<const uint8_t>(bin.data(), bin.size()), "import");
  if (!file.ok())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed, file.error().message());
  bool force = false;
  if (auto f = args.find("force"); f != args.end() && !f->is_null()) {
    if (!f->is_boolean())
      return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                                "argument 'force' must be a bool");
    force = f->get<bool>();
  }
  if (auto fits = check_import_fits(*m, *file); !fits.ok()) {
    if (!force)
      return answer_admin_error(*st.ctx, *job, wire_error_code::malformed, fits.message());
    spdlog::warn("model {}: importing a set anyway (--force): {}", m->cfg->name, fits.message());
  }
  if (!st.ctx->config.clustered())
    return store_and_install(self, *m, std::move(*file), "import", "imported set",
                             answer_with_epoch(self, job), 0);
  change_via_leader(self, m->index, job, "import", std::vector<uint8_t>(bin.begin(), bin.end()), 0,
                    st.ctx->now_ms() + leader_wait_ms(st));
}

void cmd_centroids_change(admin_call& c) {
  auto* self = c.self;
  auto& st = c.st;
  const auto& job = c.job;
  auto* m = c.m;
  if (!c.need_model()) return;
  const bool swap = c.cmd == "centroids.swap";
  uint64_t epoch = 0;
  if (swap) {
    auto e = c.need_uint("epoch");
    if (!e) return;
    epoch = *e;
  }
  if (st.ctx->config.clustered())
    return change_via_leader(self, m->index, job, swap ? "swap" : "rollback", {}, epoch,
                             st.ctx->now_ms() + leader_wait_ms(st));
  if (!st.sigcache)
    return answer_admin_error(*st.ctx, *job, wire_error_code::internal,
                              "this node has no signature-cache role, so it keeps no stored "
                              "sets");
  if (!swap) {
    // Undo the newest change of the current set (core/formats/centroid_history.hpp), whatever its
    // epoch number.
    auto previous = m->history.previous();
    if (!previous.ok())
      return answer_admin_error(*st.ctx, *job, wire_error_code::not_found,
                                previous.error().message());
    epoch = previous->epoch;
  }
  // An epoch that is not stored is named with the ones that are, so the operator can pick.
  const uint32_t index = m->index;
  self->request(st.sigcache, caf::infinite, history_atom::value, index)
      .then(
          [=](std::vector<uint64_t> epochs) {
            if (auto s = check_stored(epoch, epochs); !s.ok())
              return answer_admin_error(*self->state.ctx, *job, wire_error_code::not_found,
                                        swap ? s.message()
                                             : "the set rollback returns to (epoch " +
                                                   std::to_string(epoch) +
                                                   ") is no longer stored: " + s.message());
            swap_to(self, *self->state.models[index], epoch, swap ? "swap" : "rollback", job);
          },
          [=](caf::error& err) {
            answer_admin_error(*self->state.ctx, *job, wire_error_code::internal,
                               error_text(self, err));
          });
}

void cmd_explain(admin_call& c) {
  auto& st = c.st;
  const auto& job = c.job;
  const auto& args = c.args;
  auto* m = c.m;
  if (!c.need_model()) return;
  auto id_arg = string_arg(args, "request");
  if (!id_arg.ok() || !*id_arg)
    return answer_admin_error(
        *st.ctx, *job, wire_error_code::malformed,
        id_arg.ok() ? "argument 'request' (string) is required" : id_arg.error().message());
  const auto& id = *id_arg;
  for (auto it = m->recent.rbegin(); it != m->recent.rend(); ++it) {
    if (it->request != *id) continue;
    answer_admin(*st.ctx, *job, explain_json(*m, *it));
    return;
  }
  answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                     "request '" + *id + "' is not among the " + std::to_string(m->recent.size()) +
                         " recent decisions");
}

void cmd_policy(admin_call& c) {
  auto& st = c.st;
  const auto& job = c.job;
  const auto& args = c.args;
  auto* m = c.m;
  if (!c.need_model()) return;
  if (auto r = args.find("reset"); r != args.end() && !r->is_null()) {
    // Back to the config's policy and tau, and forget the persisted change.
    if (!r->is_boolean())
      return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                                "argument 'reset' must be a bool");
    if (r->get<bool>()) {
      if (args.contains("policy") || args.contains("tau") || args.contains("widen_single"))
        return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                                  "argument 'reset' goes without 'policy', 'tau' and "
                                  "'widen_single'");
      const auto old_name = m->policy_name;
      const auto old_tau = m->tau;
      const auto old_widen = m->widen_single;
      const auto old_source = m->policy_source;
      m->policy_name = m->cfg->policy;
      m->tau = m->cfg->tau;
      m->widen_single = m->cfg->widen_single;
      m->policy_source = "config";
      if (auto s = rebuild_policy(*m); !s.ok()) {
        m->policy_name = old_name;
        m->tau = old_tau;
        m->widen_single = old_widen;
        m->policy_source = old_source;
        (void)rebuild_policy(*m);
        return answer_admin_error(*st.ctx, *job, wire_error_code::internal, s.message());
      }
      publish_readiness(st, *m);
      spdlog::info("model {}: policy {} tau {} from the config again", m->cfg->name, m->policy_name,
                   m->tau);
      return answer_policy(st, *m, *job);
    }
  }
  // Every argument is checked, and the new policy built, before the model changes: a refused
  // change leaves the policy and tau as they were (issue 12 defect 7).
  const bool has_name = args.contains("policy") && !args["policy"].is_null();
  const bool has_tau = args.contains("tau") && !args["tau"].is_null();
  const bool has_widen = args.contains("widen_single") && !args["widen_single"].is_null();
  if (has_widen && !args["widen_single"].is_boolean())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                              "argument 'widen_single': expected a bool");
  if (has_name && !args["policy"].is_string())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                              "argument 'policy': expected a string");
  if (has_tau && !args["tau"].is_number())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                              "argument 'tau': expected a number");
  if (has_name || has_tau || has_widen) {
    const std::string name = has_name ? args["policy"].get<std::string>() : m->policy_name;
    const double tau = has_tau ? args["tau"].get<double>() : static_cast<double>(m->tau);
    const bool widen = has_widen ? args["widen_single"].get<bool>() : m->widen_single;
    if (auto s = check_tau(tau); !s.ok())
      return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                                "argument 'tau': " + s.message());
    auto built = build_policy(*m, name, static_cast<float>(tau), widen, m->set, m->pool.k());
    if (!built.ok())
      return answer_admin_error(*st.ctx, *job, wire_error_code::malformed, built.error().message());
    m->policy_name = name;
    m->tau = static_cast<float>(tau);
    m->widen_single = widen;
    m->policy = std::move(built->policy);
    m->eldr_active = built->eldr_active;
    publish_readiness(st, *m);
    spdlog::info("model {}: policy {} tau {} widen_single {}", m->cfg->name, m->policy_name, m->tau,
                 m->widen_single);
    m->policy_source = "admin";
    return answer_policy(st, *m, *job);
  }
  answer_admin(*st.ctx, *job, policy_json(*m));
}

using admin_command = void (*)(admin_call&);

const std::map<std::string_view, admin_command>& admin_commands() {
  static const std::map<std::string_view, admin_command> table = {
      {"workers", cmd_workers},
      {"drain", cmd_drain},
      {"undrain", cmd_drain},
      {"centroids.show", cmd_centroids_show},
      {"centroids.import", cmd_centroids_import},
      {"centroids.swap", cmd_centroids_change},
      {"centroids.rollback", cmd_centroids_change},
      {"explain", cmd_explain},
      {"policy", cmd_policy},
  };
  return table;
}

}  // namespace

void handle_admin(router_actor_t* self, const admin_job_ptr& job) {
  auto& st = self->state;
  const auto& cmd = job->request.command;
  const auto& args = job->request.args;
  const auto model_arg = string_arg(args, "model");
  if (!model_arg.ok())
    return answer_admin_error(*st.ctx, *job, wire_error_code::malformed,
                              model_arg.error().message());
  const auto it = admin_commands().find(cmd);
  if (it == admin_commands().end())
    return answer_admin_error(*st.ctx, *job, wire_error_code::unknown_type,
                              "the router has no admin command '" + cmd + "'");
  admin_call call{
      self, job, st, cmd, args, *model_arg, *model_arg ? st.find(**model_arg) : nullptr};
  it->second(call);
}

}  // namespace eldr::router
