// eldr-node: one node of eldr's control plane -- router, signature cache, load monitor and refit
// -- serving ZeroMQ traffic (docs/protocol.md) with the configuration of docs/configuration.md.
//
//   eldr-node                      the embedded default: one node, all roles, loopback ports,
//                                  RocksDB under ./eldr-data
//   eldr-node --config eldr.toml   a configured node
//   eldr-node --config eldr.toml --check-config
//                                  validates the file (and overrides) and the files and
//                                  directory it names, and exits: 0 valid, 2 not
//
// Prints one line "eldr-node ready {json}" with the bound endpoints once it serves (and writes
// the same JSON to --ready-file), then runs until SIGINT or SIGTERM.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/node.hpp"
#include "cluster/config/json_log.hpp"
#include "core/base/file_io.hpp"
#include "tools/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"eldr-node: expert-locality router for disaggregated MoE serving"};
  std::string config_path, data_dir, ready_file, route, worker, admin, metrics, name, listen,
      advertise;
  std::vector<std::string> seeds;
  bool check_only = false;
  app.add_option("--config", config_path, "TOML configuration (docs/configuration.md)");
  app.add_option("--data-dir", data_dir, "overrides node.data_dir");
  app.add_option("--route", route, "overrides endpoints.route");
  app.add_option("--worker", worker, "overrides endpoints.worker");
  app.add_option("--admin", admin, "overrides endpoints.admin");
  app.add_option("--metrics", metrics, "overrides endpoints.metrics (host:port, \"\" = off)");
  app.add_option("--name", name, "overrides node.name");
  app.add_option("--cluster-listen", listen, "overrides cluster.listen (host:port)");
  app.add_option("--cluster-advertise", advertise, "overrides cluster.advertise (host:port)");
  app.add_option("--seeds", seeds, "overrides cluster.seeds (host:port ...)");
  app.add_option("--ready-file", ready_file, "write the bound endpoints as JSON here when ready");
  app.add_flag(
      "--check-config", check_only,
      "validate the configuration (with the overrides) and the files it names, and exit: 0 "
      "valid, 2 not");
  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;

  auto config = config_path.empty() ? eldr::result<eldr::node_config>(eldr::default_node_config())
                                    : eldr::load_node_config(config_path, /*validate=*/false);
  if (!config.ok()) {
    std::fprintf(stderr, "eldr-node: %s\n", config.error().message().c_str());
    return 2;
  }
  if (!data_dir.empty()) config->data_dir = data_dir;
  if (!route.empty()) config->route_endpoint = route;
  if (!worker.empty()) config->worker_endpoint = worker;
  if (!admin.empty()) config->admin_endpoint = admin;
  if (app.count("--metrics")) config->metrics_address = metrics;
  if (!name.empty()) config->name = name;
  if (!listen.empty()) config->cluster.listen = listen;
  if (!advertise.empty()) config->cluster.advertise = advertise;
  if (app.count("--seeds")) config->cluster.seeds = seeds;
  // Validated once the overrides are in (a pod's address arrives as --cluster-advertise).
  if (auto s = eldr::validate_node_config(*config); !s.ok()) {
    std::fprintf(stderr, "eldr-node: %s%s%s\n", config_path.c_str(),
                 config_path.empty() ? "" : ": ", s.message().c_str());
    return 2;
  }
  // What start-up would read (files, the data directory) is checked by --check-config too: the
  // systemd unit runs it as ExecStartPre.
  if (auto s = eldr::check_node_files(*config); !s.ok()) {
    std::fprintf(stderr, "eldr-node: %s%s%s\n", config_path.c_str(),
                 config_path.empty() ? "" : ": ", s.message().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("eldr-node: %s is valid\n",
                config_path.empty() ? "the embedded default" : config_path.c_str());
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config->log_level));
  if (config->log_format == "json")
    spdlog::set_formatter(std::make_unique<eldr::json_log_formatter>());

  // Block the stop signals before any thread starts, so that only sigwait below receives them.
  // They also get a handler (never run while blocked): as PID 1 of a container the kernel drops
  // every signal whose disposition is the default, so `docker stop` would not reach the node.
  struct sigaction noop {};
  noop.sa_handler = [](int) {};
  sigaction(SIGINT, &noop, nullptr);
  sigaction(SIGTERM, &noop, nullptr);
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto node = eldr::node::start(*config);
  if (!node.ok()) {
    std::fprintf(stderr, "eldr-node: %s\n", node.error().to_string().c_str());
    return 1;
  }
  nlohmann::json ready = {{"route", (*node)->endpoint(eldr::frontend_channel::route)},
                          {"worker", (*node)->endpoint(eldr::frontend_channel::worker)},
                          {"admin", (*node)->endpoint(eldr::frontend_channel::admin)},
                          {"metrics", (*node)->metrics_url()},
                          {"cluster", (*node)->cluster_address()},
                          {"pid", ::getpid()}};
  if (auto kv = (*node)->kv_events_endpoints(); !kv.empty()) ready["kv_events"] = kv;
  if (!ready_file.empty()) {
    const auto text = ready.dump();
    if (auto s = eldr::write_file_atomic(
            ready_file,
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
        !s.ok()) {
      std::fprintf(stderr, "eldr-node: --ready-file: %s\n", s.to_string().c_str());
      return 1;
    }
  }
  std::printf("eldr-node ready %s\n", ready.dump().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: stopping", sig);
  node->reset();
  return 0;
}
