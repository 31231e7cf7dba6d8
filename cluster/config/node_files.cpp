// node_config: check_node_files, the checks of what start-up reads besides the config (files,
// the data directory). Apart from node_config.cpp because <filesystem> brings std::quoted into
// argument-dependent lookup there.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "cluster/config/first_error.hpp"
#include "cluster/config/node_config.hpp"
#include "cluster/security/curve_keys.hpp"
#include "core/base/file_io.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr {

namespace {

namespace fs = std::filesystem;

std::string in_quotes(std::string_view s) {
  return "\"" + std::string(s) + "\"";
}

// A file start-up reads: it must exist and be a regular file (or a link to one).
status check_regular_file(const std::string& key, const std::string& path) {
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    return status::not_found(key + ": " + in_quotes(path) + ": no such file");
  if (fs::is_directory(st))
    return status::invalid_argument(key + ": " + in_quotes(path) + " is a directory, not a file");
  if (!fs::is_regular_file(st))
    return status::invalid_argument(key + ": " + in_quotes(path) + " is not a regular file");
  if (::access(path.c_str(), R_OK) != 0)
    return status::io_error(key + ": " + in_quotes(path) + ": not readable by this user");
  return {};
}

// node.data_dir: an existing directory this user can write, or a path whose nearest existing
// ancestor is such a directory (start-up creates the rest).
status check_data_dir(const std::string& dir) {
  const std::string key = "node.data_dir";
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  if (ec) return status::io_error(key + ": " + in_quotes(dir) + ": " + ec.message());
  const auto st = fs::status(p, ec);
  if (fs::exists(st)) {
    if (!fs::is_directory(st))
      return status::invalid_argument(key + ": " + in_quotes(dir) +
                                      " exists and is not a directory");
    if (::access(p.c_str(), W_OK | X_OK) != 0)
      return status::io_error(key + ": " + in_quotes(dir) + " is not writable by this user");
    return {};
  }
  for (fs::path up = p.parent_path();; up = up.parent_path()) {
    const auto ust = fs::status(up, ec);
    if (fs::exists(ust)) {
      if (!fs::is_directory(ust))
        return status::invalid_argument(key + ": " + in_quotes(dir) + " cannot be created: " +
                                        in_quotes(up.string()) + " is not a directory");
      if (::access(up.c_str(), W_OK | X_OK) != 0)
        return status::io_error(key + ": " + in_quotes(dir) + " cannot be created: " +
                                in_quotes(up.string()) + " is not writable by this user");
      return {};
    }
    if (up == up.root_path() || up.empty())
      return status::io_error(key + ": " + in_quotes(dir) + " cannot be created");
  }
}

// The same rule as the cluster actor's read_cluster_secret (at least 16 bytes once trailing
// newlines are removed), checked here without the actor library.
status check_cluster_secret(const std::string& path) {
  const std::string key = "cluster.secret_file";
  if (auto s = check_regular_file(key, path); !s.ok()) return s;
  auto bytes = read_file(path, 1u << 16);
  if (!bytes.ok()) return status(bytes.error().code(), key + ": " + bytes.error().message());
  size_t n = bytes->size();
  while (n > 0 && ((*bytes)[n - 1] == '\n' || (*bytes)[n - 1] == '\r'))
    --n;
  if (n < 16)
    return status::invalid_argument(key + ": " + in_quotes(path) + " holds " + std::to_string(n) +
                                    " bytes; the secret must be at least 16 bytes");
  return {};
}

status check_centroids(const model_config& m, const std::string& p) {
  const std::string key = p + ".centroids";
  if (auto s = check_regular_file(key, m.centroids); !s.ok()) return s;
  auto file = read_centroid_file(m.centroids);
  if (!file.ok()) return status(file.error().code(), key + ": " + file.error().message());
  // Before this check a mismatch started, logged the file as loaded and routed by load only
  // (JSQ, every score 0): the set never fits the pool.
  if (m.workers != 0 && file->workers != m.workers)
    return status::invalid_argument(p + ".workers = " + std::to_string(m.workers) + " but " + key +
                                    " (" + in_quotes(m.centroids) +
                                    ") holds K = " + std::to_string(file->workers) +
                                    " centroids: one per decode worker; set " + p +
                                    ".workers = " + std::to_string(file->workers) +
                                    " (or 0 to take K from the file), or fit a set for " +
                                    std::to_string(m.workers) + " workers");
  if (file->workers > m.max_workers)
    return status::invalid_argument(
        key + ": " + in_quotes(m.centroids) + " holds K = " + std::to_string(file->workers) +
        " centroids, more than " + p + ".max_workers = " + std::to_string(m.max_workers));
  return {};
}

}  // namespace

status check_node_files(const node_config& c) {
  first_error e;
  e(check_data_dir(c.data_dir));
  if (c.clustered()) {
    e(check_cluster_secret(c.cluster.secret_file));
    for (const auto& [key, path] : {std::pair<const char*, const std::string*>{
                                        "cluster.tls_certificate", &c.cluster.tls_certificate},
                                    {"cluster.tls_key", &c.cluster.tls_key},
                                    {"cluster.tls_ca_file", &c.cluster.tls_ca_file}})
      if (!path->empty()) e(check_regular_file(key, *path));
  }
  if (!c.security.curve_secret_key_file.empty()) {
    const std::string key = "security.curve_secret_key_file";
    status s = check_regular_file(key, c.security.curve_secret_key_file);
    if (s.ok())
      if (auto k = read_curve_secret_key(c.security.curve_secret_key_file); !k.ok())
        s = status(k.error().code(), key + ": " + k.error().message());
    e(s);
  }
  if (!c.security.curve_authorized_keys_file.empty()) {
    const std::string key = "security.curve_authorized_keys_file";
    status s = check_regular_file(key, c.security.curve_authorized_keys_file);
    if (s.ok())
      if (auto k = read_curve_public_keys(c.security.curve_authorized_keys_file); !k.ok())
        s = status(k.error().code(), key + ": " + k.error().message());
    e(s);
  }
  for (size_t i = 0; i < c.models.size(); ++i)
    if (!c.models[i].centroids.empty())
      e(check_centroids(c.models[i], "models[" + std::to_string(i) + "]"));
  return e.get();
}

}  // namespace eldr
