// router_files: see router_files.hpp.
#include "actors/router/router_files.hpp"

#include <spdlog/spdlog.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "core/base/file_io.hpp"

namespace eldr::router {
namespace {

// --- Router state files ---
//
// The router keeps small per-model documents in the data directory (the admin policies, the
// rollback histories): {"format": F, "version": 1, "models": {"<name>": ...}}, replaced
// atomically on each change.

std::string state_file_path(const node_config& c, const char* file) {
  return (std::filesystem::path(c.data_dir) / file).string();
}

status write_models_file(const node_config& c, const char* file, const char* format,
                         nlohmann::json models) {
  const std::string text =
      nlohmann::json{{"format", format}, {"version", 1}, {"models", std::move(models)}}.dump(2) +
      "\n";
  std::error_code ec;
  std::filesystem::create_directories(c.data_dir, ec);
  return write_file_atomic(state_file_path(c, file),
                           std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// The "models" object of such a file; nullopt when there is none, or when it does not read (then
// logged, with `instead`: what applies in its place -- a bad file must not stop routing).
std::optional<nlohmann::json> read_models_file(const node_config& c, const char* file,
                                               const char* format, size_t max_bytes,
                                               const char* instead) {
  const std::string path = state_file_path(c, file);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  auto bytes = read_file(path, max_bytes);
  if (!bytes.ok()) {
    spdlog::error("{}: not read ({}); {}", path, bytes.error().message(), instead);
    return std::nullopt;
  }
  auto doc = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("format", format) != format ||
      !doc.contains("models") || !doc["models"].is_object()) {
    spdlog::error("{}: not an {} file; {}", path, format, instead);
    return std::nullopt;
  }
  return std::move(doc["models"]);
}

}  // namespace

// --- Policy persistence ---
//
// `eldrctl policy` changes survive a restart: every model whose policy an operator set is written
// to one small JSON file in the data directory, {"models": {"<name>": {"policy": ..., "tau":
// ..., "widen_single": ...}}}, replaced atomically on each change (a file without widen_single,
// from before it could be set, keeps the config's). The config's policy is the default; a persisted
// admin change wins at start-up until `eldrctl policy M --reset` returns the model to the config.

constexpr const char* policy_file = "router-policy.json";
constexpr const char* policy_format = "eldr-router-policy";

std::string policy_file_path(const node_config& c) {
  return state_file_path(c, policy_file);
}

status persist_policies(const router_state& st) {
  nlohmann::json models = nlohmann::json::object();
  for (const auto& m : st.models)
    if (m->policy_source == "admin")
      models[m->cfg->name] = {
          {"policy", m->policy_name}, {"tau", m->tau}, {"widen_single", m->widen_single}};
  return write_models_file(st.ctx->config, policy_file, policy_format, std::move(models));
}

std::map<std::string, persisted_policy> read_persisted_policies(const node_config& c) {
  std::map<std::string, persisted_policy> out;
  const std::string path = policy_file_path(c);
  const auto models =
      read_models_file(c, policy_file, policy_format, 1u << 20, "the config's policies apply");
  if (!models) return out;
  for (const auto& [name, v] : models->items()) {
    if (!v.is_object() || !v.contains("policy") || !v["policy"].is_string() || !v.contains("tau") ||
        !v["tau"].is_number()) {
      spdlog::error("{}: model {}: no policy and tau; the config's policy applies", path, name);
      continue;
    }
    const double tau = v["tau"].get<double>();
    if (!std::isfinite(tau) || tau < 0.0) {
      spdlog::error("{}: model {}: tau {} is not finite and >= 0; the config's policy applies",
                    path, name, tau);
      continue;
    }
    persisted_policy pp{v["policy"].get<std::string>(), static_cast<float>(tau), std::nullopt};
    if (v.contains("widen_single") && v["widen_single"].is_boolean())
      pp.widen_single = v["widen_single"].get<bool>();
    out[name] = std::move(pp);
  }
  return out;
}

// --- Rollback history persistence ---
//
// Each model's centroid_history survives a restart in data_dir/centroid-history.json,
// {"format": "eldr-centroid-history", "version": 1, "models": {"<name>": "<history text>"}}
// (core/formats/centroid_history.hpp's text), replaced atomically after each install. A file that
// does not read is logged and ignored: the history then starts from the set installed at start-up.

constexpr const char* history_file = "centroid-history.json";
constexpr const char* history_format = "eldr-centroid-history";

std::string history_file_path(const node_config& c) {
  return state_file_path(c, history_file);
}

void persist_histories(const router_state& st) {
  nlohmann::json models = nlohmann::json::object();
  for (const auto& m : st.models)
    models[m->cfg->name] = m->history.encode();
  const auto s = write_models_file(st.ctx->config, history_file, history_format, std::move(models));
  // Installs are rare (imports, refits, swaps): every failure is worth its line.
  if (!s.ok())
    spdlog::error("{}: rollback history not persisted (a restart forgets it): {}",
                  history_file_path(st.ctx->config), s.message());
}

std::map<std::string, centroid_history> read_histories(const node_config& c) {
  std::map<std::string, centroid_history> out;
  const std::string path = history_file_path(c);
  const auto models =
      read_models_file(c, history_file, history_format, 4u << 20, "rollback history starts afresh");
  if (!models) return out;
  for (const auto& [name, text] : models->items()) {
    auto h = text.is_string() ? centroid_history::parse(text.get<std::string>())
                              : result<centroid_history>(status::invalid_argument("not a string"));
    if (!h.ok()) {
      spdlog::error("{}: model {}: {}; its rollback history starts afresh", path, name,
                    h.error().message());
      continue;
    }
    out.emplace(name, std::move(*h));
  }
  return out;
}

}  // namespace eldr::router
