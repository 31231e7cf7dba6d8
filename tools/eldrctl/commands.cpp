// commands: eldrctl's handlers that read or write local files (commands.hpp).
#include "tools/eldrctl/commands.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cluster/security/curve_keys.hpp"
#include "core/base/file_io.hpp"
#include "core/formats/centroid_file.hpp"

namespace eldr::ctl {

int run_export(const global_options& g, const std::string& model, const CLI::Option* epoch_opt,
               uint64_t epoch, const std::string& path) {
  json args = {{"model", model}};
  if (epoch_opt->count() > 0) args["epoch"] = epoch;
  outcome o = call_node(g, "centroids.export", std::move(args));
  if (o.exit != exit_ok) return o.exit;
  const json* blob = nullptr;
  if (o.result.is_binary())
    blob = &o.result;
  else if (o.result.is_object() && o.result.contains("file") && o.result["file"].is_binary())
    blob = &o.result["file"];
  if (blob == nullptr) {
    std::cerr << "eldrctl: centroids.export: the node's answer holds no centroid file\n";
    return exit_node_error;
  }
  const std::vector<uint8_t>& bytes = blob->get_binary();
  // A file that would not import again is not worth keeping: check it as import would.
  auto f = eldr::parse_centroid_file(bytes, "the node's export");
  if (!f.ok()) {
    std::cerr << "eldrctl: centroids.export: " << f.error().message() << "\n";
    return exit_node_error;
  }
  if (eldr::status s = eldr::write_file_atomic(path, bytes); !s.ok()) {
    std::cerr << "eldrctl: " << s.message() << "\n";
    return exit_usage;
  }
  const json summary = {{"path", path},      {"bytes", bytes.size()}, {"model", f->model_name},
                        {"epoch", f->epoch}, {"workers", f->workers}, {"width", f->spec.width()}};
  if (g.json)
    std::cout << summary.dump(2) << "\n";
  else
    std::cout << "wrote " << path << ": model " << f->model_name << ", epoch " << f->epoch << ", "
              << f->workers << " workers, width " << f->spec.width() << ", " << bytes.size()
              << " bytes\n";
  return exit_ok;
}

namespace {

// What the file says against the model: another model's name (eldr-fit --model sets it), or a
// geometry or K other than the node's current set. Empty when it fits (or the node has no set to
// compare with: the node checks again either way).
std::vector<std::string> import_mismatches(const eldr::centroid_file& f, const std::string& model,
                                           const json& shown) {
  std::vector<std::string> out;
  if (f.model_name != model)
    out.push_back("it was fitted for model \"" + f.model_name + "\", not \"" + model +
                  "\" (eldr-fit --model " + model + ")");
  if (!shown.is_object()) return out;
  const auto& g = f.spec.geometry();
  if (shown.contains("geometry") && shown["geometry"].is_array() && shown["geometry"].size() == 3 &&
      shown["geometry"] != json::array({g.layers, g.experts, g.top_k}))
    out.push_back("its geometry " + g.to_string() + " differs from the node's current set's (" +
                  text(shown["geometry"]) + " as layers,experts,top_k)");
  if (shown.contains("k") && shown["k"].is_number_unsigned() && shown["k"].get<uint32_t>() != 0 &&
      shown["k"].get<uint32_t>() != f.workers)
    out.push_back("it has " + std::to_string(f.workers) + " centroids, the node's current set " +
                  text(shown["k"]));
  return out;
}

}  // namespace

int run_import(const global_options& g, const std::string& model, const std::string& path,
               bool force) {
  // Read once, validate those very bytes, send those very bytes: what was checked is what the
  // node gets. parse_centroid_file runs validate_centroid_file after decoding.
  auto bytes = eldr::read_file(path, eldr::admin_protocol_limits{}.max_payload_bytes);
  if (!bytes.ok()) {
    std::cerr << "eldrctl: refusing " << path << ": " << bytes.error().message() << "\n";
    return exit_usage;
  }
  auto f = eldr::parse_centroid_file(*bytes, path);
  if (!f.ok()) {
    std::cerr << "eldrctl: refusing " << path << ": " << f.error().message() << "\n";
    return exit_usage;
  }
  // Compared with the node's current set before anything is sent; the node checks again (every
  // client gets its refusal), so a failed show only skips this early check.
  json shown;
  if (auto c = connect_admin(g); c.ok())
    if (auto r = (*c)->call("centroids.show", {{"model", model}}); r.ok()) shown = std::move(*r);
  const auto mismatches = import_mismatches(*f, model, shown);
  for (const auto& m : mismatches)
    std::cerr << "eldrctl: " << (force ? "warning" : "refusing " + path) << ": " << m << "\n";
  if (!mismatches.empty() && !force) {
    std::cerr << "eldrctl: nothing was sent; import it anyway with --force\n";
    return exit_usage;
  }
  json args = {{"model", model}, {"file", json::binary(std::move(*bytes))}};
  if (force) args["force"] = true;
  return run(g, "centroids.import", std::move(args), keyed({"model", "epoch"}));
}

// Local: no node involved. The secret key file is created 0600 before anything is written.
int run_keygen(const std::string& prefix) {
  auto pair = eldr::generate_curve_keypair();
  if (!pair.ok()) {
    std::cerr << "eldrctl: keygen: " << pair.error().message() << "\n";
    return exit_node_error;
  }
  const std::string secret_path = prefix + ".key", public_path = prefix + ".pub";
  // The keys' directory must exist (it is usually /etc/eldr/NODE, made with the right owner).
  if (const auto dir = std::filesystem::path(prefix).parent_path();
      !dir.empty() && !std::filesystem::is_directory(dir)) {
    std::cerr << "eldrctl: keygen: directory " << dir.string()
              << " does not exist; create it first (mkdir -p " << dir.string() << ")\n";
    return exit_usage;
  }
  // Both files are created exclusively (the secret one 0600): existing keys are never replaced.
  auto write_new = [](const std::string& path, const std::string& text, mode_t mode) -> bool {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode);
    if (fd < 0) {
      std::cerr << "eldrctl: keygen: " << path << ": " << std::strerror(errno)
                << " (existing keys are never overwritten)\n";
      return false;
    }
    const bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    const bool closed = ::close(fd) == 0;
    if (!wrote || !closed) std::cerr << "eldrctl: keygen: cannot write " << path << "\n";
    return wrote && closed;
  };
  if (!write_new(secret_path,
                 "# eldr CURVE secret key (Z85); keep private\n" + pair->secret_key + "\n", 0600))
    return exit_usage;
  if (!write_new(public_path, pair->public_key + "\n", 0644)) {
    ::unlink(secret_path.c_str());  // no half-made pair
    return exit_usage;
  }
  std::cout << "public key " << pair->public_key << "\nwrote " << secret_path << " and "
            << public_path << "\n";
  return exit_ok;
}

}  // namespace eldr::ctl
