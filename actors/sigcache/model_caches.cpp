// model_caches: see model_caches.hpp.
#include "actors/sigcache/model_caches.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "actors/sigcache/sigcache_actor.hpp"

namespace eldr {

std::string model_dir_name(const std::string& name) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (std::isalnum(c) || c == '_' || c == '-') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

result<std::vector<std::unique_ptr<signature_cache>>> open_model_caches(const node_config& config) {
  std::vector<std::unique_ptr<signature_cache>> out;
  for (const auto& m : config.models) {
    const auto dir = std::filesystem::path(config.data_dir) / "models" / model_dir_name(m.name);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return status::io_error("cannot create " + dir.string() + ": " + ec.message());
    signature_cache_options o;
    o.memory_cache_bytes = config.cache_memory_bytes;
    o.max_blocks = config.cache_max_blocks;
    o.max_blocks_per_publisher =
        std::max<size_t>(1, static_cast<size_t>(static_cast<double>(config.cache_max_blocks) *
                                                config.cache_publisher_share));
    o.uncounted_block_grace_ms = config.cache_uncounted_block_grace_ms;
    o.sync_wal = config.sync_wal;
    o.background_writes = true;  // a RocksDB write never delays a route request's signature
    auto c = signature_cache::open(dir.string(), o);
    if (!c.ok()) return status(c.error().code(), "model " + m.name + ": " + c.error().message());
    out.push_back(std::move(*c));
  }
  return out;
}

result<std::optional<centroid_file>> stored_current_set(signature_cache& cache,
                                                        const std::string& model) {
  auto epoch = cache.current_epoch();
  if (!epoch.ok()) return std::optional<centroid_file>();
  auto bytes = cache.centroid_set(*epoch);
  if (!bytes.ok()) return bytes.error();
  auto f = parse_centroid_file(*bytes, model + " epoch " + std::to_string(*epoch));
  if (!f.ok()) return f.error();
  f->epoch = *epoch;
  return std::optional<centroid_file>(std::move(*f));
}

}  // namespace eldr
