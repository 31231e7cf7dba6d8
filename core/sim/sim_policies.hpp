// sim_policies: turns the policy names of eldr-sim's command line into sim_policy objects, fitting
// what they need on the workload's calibration requests (core/sim/fit.hpp), and caching the fits so
// that ablations sharing one fit pay for it once.
//
// Names: the router's policies "rr", "random", "jsq", "p2c", "domain", "eldr", "eldr-adaptive";
// "eldr-online" and "eldr-adaptive-online" (with online refit); "clairvoyant" and
// "clairvoyant-adaptive" (the bound: signatures are the requests' real decode-phase profiles,
// centroids are fitted on the calibration requests' decode profiles, the same band routes). The
// eldr ones take options after slashes, for the ablations: "eldr/tau=0.2", "eldr/transform=sqrt",
// "eldr/kmeans=vanilla", "eldr/layers=all", and for the adaptive ones "/slack=0.25", combinable
// ("eldr/transform=binary/layers=all").
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/formats/centroid_file.hpp"
#include "core/sim/fit.hpp"
#include "core/sim/simulator.hpp"
#include "core/sim/workload.hpp"

namespace eldr {

struct policy_factory_options {
  uint32_t workers = 16;
  uint64_t seed = 1;
  float tau = 0.1f;
  float load_slack = default_load_slack;  // "eldr-adaptive*" unless /slack= is given
  uint32_t pairs = default_rho_pairs;
  uint32_t threads = 2;
  online_refit refit;  // for "eldr-online" and "eldr-adaptive-online" (enabled set per policy)
  // Fitted centroids to use for "eldr"/"eldr-online" without options, instead of fitting on the
  // calibration requests. Its geometry must match the workload's and its K the workers.
  std::optional<centroid_file> centroids;
};

// Messages about slow steps (fits), for a CLI to print; may be empty.
using factory_log = std::function<void(const std::string&)>;

class policy_factory {
 public:
  // Errors (invalid_argument): a centroid file whose geometry differs from the workload's or
  // whose K differs from workers. The workload must outlive the factory.
  static result<policy_factory> make(const workload& w, policy_factory_options options,
                                     factory_log log = {});

  // Errors (invalid_argument): unknown name or option (the message lists the valid ones), and
  // those of the fits (too few calibration requests...).
  result<sim_policy> build(std::string_view name);

  // The fit behind plain "eldr" (fitting it now if needed); nullptr with --centroids.
  result<const fit_result*> default_fit();
  // Calibration counts (computed on first use).
  const calibration_counts& calibration();

 private:
  struct eldr_options {
    float tau = 0.1f;
    std::optional<signature_transform> transform{};
    kmeans_variant variant = kmeans_variant::balanced;
    bool all_layers = false;
    bool plain = true;  // no fit-changing option given
  };
  policy_factory(const workload& w, policy_factory_options o, factory_log log)
      : w_(&w), o_(std::move(o)), log_(std::move(log)) {}
  result<const fit_result*> fit(const eldr_options& e);

  const workload* w_;
  policy_factory_options o_;
  factory_log log_;
  std::optional<calibration_counts> cal_;
  std::map<std::string, fit_result> fits_;
};

}  // namespace eldr
