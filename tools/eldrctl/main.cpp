// eldrctl: the operator's CLI of an eldr node, over the node's admin endpoint (docs/protocol.md
// section 5, cluster/wire/admin_protocol.hpp).
//
//   eldrctl [--node tcp://HOST:5702] [--timeout-ms N] [--json] COMMAND ...
//     status                                 node, endpoints, one row per model, counters
//     workers [--model M]                    one row per decode worker
//     drain MODEL WORKER | undrain MODEL WORKER
//     centroids show MODEL
//     centroids export MODEL [--epoch E] -o FILE
//     centroids import MODEL FILE [--force]  validated here first; an invalid file is refused, so
//                                            is one of another model or geometry unless --force
//     centroids swap MODEL EPOCH | centroids rollback MODEL
//     refit MODEL                            exit 1 when the node rejects the candidate
//     explain MODEL REQUEST_ID
//     policy MODEL [--set NAME] [--tau T] [--widen-single true|false] | policy MODEL --reset
//                                            a change is persisted (survives a restart) until
//                                            --reset returns the model to its config
//
// Output: aligned tables for people, or the node's raw result as JSON with --json. Errors go to
// stderr. Exit codes: 0 ok; 1 the node refused the command (its error code's name and message are
// printed); 2 usage error, or a local file refused or unwritable; 3 transport failure (timeout,
// node unreachable, an answer that does not decode).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/base/spelling.hpp"
#include "tools/cli.hpp"
#include "tools/eldrctl/commands.hpp"
#include "tools/eldrctl/node_call.hpp"
#include "tools/eldrctl/render.hpp"
#include "tools/eldrctl/views.hpp"

// The handlers' names (eldr::ctl) read unqualified, as when they lived in this file.
using namespace eldr::ctl;

namespace {

// When `word` is not one of `valid` (the subcommands at that level), the message that names the
// closest one (within 2 edits) or lists them all; "" when it is valid.
std::string unknown_subcommand(const std::string& context, const std::string& word,
                               const std::vector<std::string>& valid) {
  if (std::find(valid.begin(), valid.end(), word) != valid.end()) return "";
  std::string all;
  std::vector<std::string_view> names;
  for (const auto& v : valid) {
    all += (all.empty() ? "" : ", ") + v;
    names.push_back(v);
  }
  std::string msg = "eldrctl: unknown command \"" + context + word + "\"";
  if (const auto best = eldr::closest_spelling(word, names))
    msg += "; did you mean \"" + context + std::string(*best) + "\"?";
  return msg + "\n  " + (context.empty() ? "commands" : context + "commands") + ": " + all;
}

// The subcommand words of argv (global options and their values skipped), for the check above.
std::vector<std::string> command_words(int argc, char** argv) {
  static const std::vector<std::string> with_value = {
      "--node", "--timeout-ms", "--curve-server-key", "--curve-secret-key-file"};
  std::vector<std::string> out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (std::find(with_value.begin(), with_value.end(), a) != with_value.end()) {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    out.push_back(a);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"eldrctl: administer an eldr node over its admin endpoint"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand (eldrctl status --json).
  app.fallthrough();

  global_options g;
  app.add_option("--node", g.node, "the node's admin endpoint")
      ->envname("ELDR_ADMIN_ENDPOINT")
      ->capture_default_str();
  app.add_option("--timeout-ms", g.timeout_ms, "wait for the node's answer")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", g.json, "print the node's raw result as JSON instead of tables");
  app.add_flag("--wide", g.wide,
               "status: every column and counter (default: what an operator scans first, in 100 "
               "columns)");
  app.add_option("--curve-server-key", g.curve_server_key,
                 "the node's CURVE public key (Z85), when its endpoints use CURVE")
      ->envname("ELDR_CURVE_SERVER_KEY");
  app.add_option("--curve-secret-key-file", g.curve_secret_key_file,
                 "this client's CURVE secret key file, for nodes that allowlist clients")
      ->envname("ELDR_CURVE_SECRET_KEY_FILE");

  std::string model, request, out_path, file, policy_name;
  uint32_t worker = 0;
  uint64_t epoch = 0;
  double tau = 0.0;

  auto* status_cmd = app.add_subcommand("status", "node, endpoints, models, counters");
  auto* workers_cmd = app.add_subcommand("workers", "decode workers, one row each");
  auto* workers_model = workers_cmd->add_option("--model", model, "only this model's workers");
  auto* drain_cmd = app.add_subcommand("drain", "stop routing to a worker (in-flight finish)");
  auto* undrain_cmd = app.add_subcommand("undrain", "route to a drained worker again");
  for (auto* c : {drain_cmd, undrain_cmd}) {
    c->add_option("model", model, "model")->required();
    c->add_option("worker", worker, "worker index in the model's pool")->required();
  }

  auto* centroids = app.add_subcommand("centroids", "centroid sets: show, export, import, ...");
  centroids->require_subcommand(1);
  auto* show_cmd = centroids->add_subcommand("show", "the current centroid set and its history");
  show_cmd->add_option("model", model, "model")->required();
  auto* export_cmd = centroids->add_subcommand("export", "write a centroid set to a file");
  export_cmd->add_option("model", model, "model")->required();
  auto* export_epoch = export_cmd->add_option("--epoch", epoch, "epoch (default: the current)");
  export_cmd->add_option("-o,--output", out_path, "file to write")->required();
  auto* import_cmd = centroids->add_subcommand("import", "validate a centroid file, then load it");
  import_cmd->add_option("model", model, "model")->required();
  import_cmd->add_option("file", file, "centroid file (eldr-fit's output)")->required();
  bool force = false;
  import_cmd->add_flag("--force", force,
                       "import a set fitted for another model name or geometry (refused without)");
  auto* swap_cmd = centroids->add_subcommand(
      "swap", "make a stored epoch current (in a cluster: on every router, through the leader)");
  swap_cmd->add_option("model", model, "model")->required();
  swap_cmd->add_option("epoch", epoch, "epoch")->required();
  auto* rollback_cmd = centroids->add_subcommand(
      "rollback",
      "undo the newest change of the current set (an import, refit, swap or rollback's "
      "predecessor), whatever its epoch number: after `swap M 1` from 2 it goes back to 2; "
      "repeat to walk further back (in a cluster: on every router, through the leader)");
  rollback_cmd->add_option("model", model, "model")->required();

  auto* refit_cmd = app.add_subcommand("refit", "fit new centroids from recent traffic");
  refit_cmd->add_option("model", model, "model")->required();
  auto* explain_cmd = app.add_subcommand("explain", "the recorded decision of a recent request");
  explain_cmd->add_option("model", model, "model")->required();
  explain_cmd->add_option("request", request, "request id")->required();
  auto* policy_cmd = app.add_subcommand("policy", "show or set a model's routing policy");
  policy_cmd->add_option("model", model, "model")->required();
  auto* policy_set =
      policy_cmd->add_option("--set", policy_name, "policy name (eldr-adaptive, eldr, jsq, ...)");
  auto* policy_tau =
      policy_cmd->add_option("--tau", tau, "band half-width")->check(CLI::NonNegativeNumber);
  bool widen_single = true;
  auto* policy_widen = policy_cmd->add_option(
      "--widen-single", widen_single,
      "true: a band of one worker is widened to the best two (the paper's rule); false: not");
  bool policy_reset = false;
  policy_cmd
      ->add_flag("--reset", policy_reset,
                 "back to the config's policy and tau (forget the change persisted by --set/--tau)")
      ->excludes(policy_set)
      ->excludes(policy_tau)
      ->excludes(policy_widen);

  auto* keygen_cmd = app.add_subcommand(
      "keygen", "make a CURVE key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub");
  keygen_cmd->add_option("prefix", out_path, "path prefix of the two files")->required();

  // A mistyped subcommand: CLI11 would only say "A subcommand is required".
  if (const auto words = command_words(argc, argv); !words.empty()) {
    std::vector<std::string> top, under_centroids;
    for (const auto* c : app.get_subcommands([](CLI::App*) { return true; }))
      top.push_back(c->get_name());
    for (const auto* c : centroids->get_subcommands([](CLI::App*) { return true; }))
      under_centroids.push_back(c->get_name());
    std::string msg = unknown_subcommand("", words[0], top);
    if (msg.empty() && words[0] == "centroids" && words.size() > 1)
      msg = unknown_subcommand("centroids ", words[1], under_centroids);
    if (!msg.empty()) {
      std::cerr << msg << "\n";
      return exit_usage;
    }
  }
  // Help is a success; every other parse failure is a usage error, exit code 2 for scripts.
  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;

  if (*keygen_cmd) return run_keygen(out_path);
  if (*status_cmd)
    return run(g, "status", json::object(), g.wide ? print_status_wide : print_status);
  if (*workers_cmd) {
    json args = json::object();
    if (workers_model->count() > 0) args["model"] = model;
    return run(g, "workers", std::move(args), print_workers);
  }
  if (*drain_cmd || *undrain_cmd)
    return run(g, *drain_cmd ? "drain" : "undrain", {{"model", model}, {"worker", worker}},
               keyed({"model", "worker", "state"}));
  if (*show_cmd)
    return run(g, "centroids.show", {{"model", model}},
               keyed({"model", "epoch", "k", "width", "transform", "layers", "history"}));
  if (*export_cmd) return run_export(g, model, export_epoch, epoch, out_path);
  if (*import_cmd) return run_import(g, model, file, force);
  if (*swap_cmd)
    return run(g, "centroids.swap", {{"model", model}, {"epoch", epoch}},
               keyed({"model", "epoch", "from_epoch", "set_of_epoch", "numbered_by"}));
  if (*rollback_cmd)
    return run(g, "centroids.rollback", {{"model", model}},
               keyed({"model", "epoch", "from_epoch", "set_of_epoch", "numbered_by"}));
  if (*refit_cmd) {
    // A rejected candidate is the node refusing the command (README: exit 1), with its reason on
    // stderr; the figures are printed either way.
    outcome o = call_node(g, "refit", {{"model", model}});
    if (o.exit != exit_ok) return o.exit;
    if (g.json)
      std::cout << o.result.dump(2) << "\n";
    else
      print_object(std::cout, o.result, {"accepted", "epoch", "reason"});
    if (o.result.is_object() && o.result.contains("accepted") &&
        o.result["accepted"].is_boolean() && !o.result["accepted"].get<bool>()) {
      std::cerr << "eldrctl: refit: rejected: " << text(o.result.value("reason", json("-")))
                << "\n";
      return exit_node_error;
    }
    return exit_ok;
  }
  if (*explain_cmd)
    return run(g, "explain", {{"model", model}, {"request", request}}, print_explain);
  if (*policy_cmd) {
    json args = {{"model", model}};
    if (policy_set->count() > 0) args["policy"] = policy_name;
    if (policy_tau->count() > 0) args["tau"] = tau;
    if (policy_widen->count() > 0) args["widen_single"] = widen_single;
    if (policy_reset) args["reset"] = true;
    return run(g, "policy", std::move(args),
               keyed({"model", "policy", "tau", "widen_single", "policy_source"}));
  }
  return exit_usage;  // unreachable: require_subcommand
}
