// eldr-sigcache: the signature cache on its own, for operators and outside tests.
//
//   eldr-sigcache ingest --db DIR --kv-endpoint tcp://HOST:PORT [--kv-endpoint ...]
//                        [--replay-endpoint ...] [--counts-endpoint ...]
//   eldr-sigcache dump --db DIR [--block HASH]
//
// ingest runs until SIGTERM or SIGINT, then commits what it holds and exits 0. With
// --print-acks it writes one JSON line per publisher whose acknowledged sequence advanced, after
// the commit that made it durable (the crash test relies on exactly that order).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cluster/zmq/zmq_ingest.hpp"
#include "storage/signature_cache.hpp"
#include "tools/cli.hpp"

namespace {

// Names and media stored by earlier versions came from publishers unchecked: a byte that is not
// UTF-8 is printed as U+FFFD rather than aborting the dump (nlohmann's type_error.316).
constexpr auto replace_invalid = nlohmann::json::error_handler_t::replace;

volatile std::sig_atomic_t stop_requested = 0;
extern "C" void on_stop_signal(int) {
  stop_requested = 1;
}

std::vector<uint32_t> parse_list(const std::string& s) {
  std::vector<uint32_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) out.push_back(static_cast<uint32_t>(std::stoul(item)));
  return out;
}

int run_ingest(const std::string& db, const eldr::zmq_ingest_options& zo,
               eldr::signature_cache_options co, bool print_acks) {
  auto cache = eldr::signature_cache::open(db, std::move(co));
  if (!cache.ok()) {
    std::cerr << "eldr-sigcache: " << cache.error().to_string() << "\n";
    return 1;
  }
  auto in = eldr::zmq_ingest::create(**cache, zo);
  if (!in.ok()) {
    std::cerr << "eldr-sigcache: " << in.error().to_string() << "\n";
    return 1;
  }
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::vector<uint32_t> workers;
  for (const std::string& ep : zo.kv_endpoints)
    workers.push_back((*cache)->worker_id(ep));
  std::vector<std::optional<uint64_t>> acked(workers.size());
  for (size_t i = 0; i < workers.size(); ++i)
    acked[i] = (*cache)->last_sequence(workers[i]);
  std::cout << nlohmann::json{{"ready", true}}.dump(-1, ' ', false, replace_invalid) << std::endl;
  while (!stop_requested) {
    auto handled = (*in)->poll_once(100);
    if (!handled.ok()) {
      std::cerr << "eldr-sigcache: " << handled.error().to_string() << "\n";
      return 1;
    }
    if (!print_acks) continue;
    for (size_t i = 0; i < workers.size(); ++i) {
      const auto seq = (*cache)->last_sequence(workers[i]);
      if (seq && seq != acked[i])
        std::cout << nlohmann::json{{"ack", {{"endpoint", zo.kv_endpoints[i]}, {"seq", *seq}}}}
                         .dump(-1, ' ', false, replace_invalid)
                  << std::endl;
      acked[i] = seq;
    }
  }
  // poll_once commits before returning: all that was received is durable here.
  std::cout << nlohmann::json{{"stopped", true},
                              {"metrics", nlohmann::json::parse((*in)->logic().metrics_json())}}
                   .dump(-1, ' ', false, replace_invalid)
            << std::endl;
  return 0;
}

nlohmann::json block_json(const eldr::block_info& b, const std::vector<std::string>& names) {
  nlohmann::json holders = nlohmann::json::array();
  for (const eldr::holder& h : b.holders)
    holders.push_back({{"worker", h.key.worker < names.size() ? names[h.key.worker] : ""},
                       {"worker_id", h.key.worker},
                       {"dp_rank", h.key.dp_rank},
                       {"medium", h.key.medium},
                       {"group", h.key.group},
                       {"refs", h.refs}});
  return {{"hash", b.hash},
          {"parent", b.parent ? nlohmann::json(*b.parent) : nlohmann::json(nullptr)},
          {"holders", holders},
          {"has_counts", b.has_counts}};
}

int run_dump(const std::string& db, const std::string& block) {
  eldr::signature_cache_options o;
  o.read_only = true;
  auto cache = eldr::signature_cache::open(db, o);
  if (!cache.ok()) {
    std::cerr << "eldr-sigcache: " << cache.error().to_string() << "\n";
    return 1;
  }
  const auto& names = (*cache)->worker_names();
  int rc = 0;
  if (!block.empty()) {
    uint64_t hash = 0;
    const auto [end, ec] = std::from_chars(block.data(), block.data() + block.size(), hash);
    if (ec != std::errc() || end != block.data() + block.size()) {
      std::cerr << "eldr-sigcache: --block " << block << ": not an unsigned decimal hash\n";
      return 2;
    }
    auto b = (*cache)->block(hash);
    if (b.ok()) {
      std::cout << block_json(*b, names).dump(-1, ' ', false, replace_invalid) << "\n";
    } else {
      std::cerr << "eldr-sigcache: block " << block << " is not in the store ("
                << b.error().message() << ")\n";
      rc = 1;
    }
  } else {
    (*cache)->for_each_block([&](const eldr::block_info& b) {
      std::cout << block_json(b, names).dump(-1, ' ', false, replace_invalid) << "\n";
    });
  }
  const auto st = (*cache)->stats();
  nlohmann::json stats = {{"blocks", st.blocks},
                          {"holders", st.holders},
                          {"blocks_with_counts", st.blocks_with_counts}};
  nlohmann::json metrics = nlohmann::json::object();
  if (auto m = (*cache)->metadata("ingest_metrics"))
    metrics = nlohmann::json::parse(*m, nullptr, false);
  stats["dropped"] = metrics.value("dropped", nlohmann::json::object());
  stats["gaps"] = metrics.value("gaps", 0);
  stats["gaps_unfilled"] = metrics.value("gaps_unfilled", 0);
  stats["restarts"] = metrics.value("restarts", 0);
  nlohmann::json workers = nlohmann::json::array();
  for (uint32_t w = 0; w < names.size(); ++w) {
    const auto seq = (*cache)->last_sequence(w);
    workers.push_back(
        {{"name", names[w]}, {"last_seq", seq ? nlohmann::json(*seq) : nlohmann::json(nullptr)}});
  }
  stats["workers"] = workers;
  std::cout << nlohmann::json{{"stats", stats}}.dump(-1, ' ', false, replace_invalid) << std::endl;
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"eldr-sigcache: the RocksDB-persisted signature cache on its own"};
  app.require_subcommand(1);

  std::string db;
  eldr::zmq_ingest_options zo;
  std::string geometry, layers;
  bool print_acks = false, sync_wal = false;
  int64_t grace_ms = 30'000, uncounted_grace_ms = -1;
  size_t max_blocks = size_t{1} << 22;
  auto* ingest = app.add_subcommand("ingest", "ingest vLLM KV events and counts until SIGTERM");
  ingest->add_option("--db", db, "database directory (created if missing)")->required();
  ingest->add_option("--kv-endpoint", zo.kv_endpoints, "vLLM KV-event publisher (repeatable)")
      ->required();
  ingest->add_option("--replay-endpoint", zo.replay_endpoints,
                     "replay ROUTER of the kv endpoint at the same position (repeatable)");
  ingest->add_option("--counts-endpoint", zo.counts_endpoints,
                     "eldr counts publisher (repeatable; docs/protocol.md)");
  ingest->add_option("--geometry", geometry,
                     "L,E,k of the counts (default: from the database "
                     "or the first counts message)");
  ingest->add_option("--layers", layers, "layer mask kept, e.g. 0,3,5 (default: all)");
  ingest->add_option("--grace-ms", grace_ms, "grace for counts no worker holds");
  ingest->add_option("--uncounted-grace-ms", uncounted_grace_ms,
                     "grace for held blocks without counts (default: --grace-ms with a counts "
                     "endpoint, else keep)");
  ingest->add_option("--max-blocks", max_blocks, "bound on stored blocks");
  ingest->add_option("--replay-timeout-ms", zo.replay_timeout_ms, "wait per replay answer");
  ingest->add_option("--max-messages-per-commit", zo.max_messages_per_commit,
                     "group commit size: messages handled per RocksDB write");
  ingest->add_flag("--sync-wal", sync_wal, "fsync the WAL on every commit");
  ingest->add_flag("--print-acks", print_acks, "print a JSON line per acknowledged sequence");

  std::string dump_db, block;
  auto* dump = app.add_subcommand("dump", "print stored blocks as JSON lines, then stats");
  dump->add_option("--db", dump_db, "database directory")->required();
  dump->add_option("--block", block, "only this block hash (unsigned decimal)");

  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;
  // stdout carries the JSON lines (acks, blocks, stats); logs go to stderr.
  spdlog::set_default_logger(spdlog::stderr_color_mt("eldr-sigcache"));
  if (*dump) return run_dump(dump_db, block);

  eldr::signature_cache_options co;
  if (!geometry.empty()) {
    const auto g = parse_list(geometry);
    if (g.size() != 3) {
      std::cerr << "eldr-sigcache: --geometry wants L,E,k\n";
      return 2;
    }
    co.geometry = {g[0], g[1], g[2]};
  }
  co.layer_mask = parse_list(layers);
  co.orphan_counts_grace_ms = grace_ms;
  co.uncounted_block_grace_ms =
      uncounted_grace_ms >= 0 ? uncounted_grace_ms : (zo.counts_endpoints.empty() ? 0 : grace_ms);
  co.max_blocks = max_blocks;
  co.sync_wal = sync_wal;
  return run_ingest(db, zo, std::move(co), print_acks);
}
