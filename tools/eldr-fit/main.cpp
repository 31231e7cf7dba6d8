// eldr-fit: offline calibration. From a recorded (or synthetic) trace it fits IDF, measures the
// signature quality rho of every transform, selects layers greedily, fits one balanced centroid
// per decode worker, and writes a versioned centroid file plus an optional JSON report.
//
//   eldr-fit --trace FILE --workers K --out CENTROIDS [--model NAME] [--report REPORT.json]
//            [--transform auto|count|sqrt|count_idf|binary] [--seed S]
//
// Each request's prompt tokens are its prefill (they make the signature); its output tokens are
// its decode phase (they make the decode profile that rho is measured against).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "core/balanced_kmeans.hpp"
#include "core/base/version.hpp"
#include "core/formats/centroid_file.hpp"
#include "core/formats/trace.hpp"
#include "core/signature.hpp"
#include "core/signature_quality.hpp"
#include "core/sim/fit.hpp"
#include "tools/cli.hpp"
#include "tools/common/cli_options.hpp"
#include "tools/common/workload_builder.hpp"

namespace {

using eldr::result;
using eldr::status;
using json = nlohmann::json;

struct options {
  // --trace/--synthetic, seed, pairs, threads; a synthetic preset keeps its own lengths.
  eldr::tools::workload_spec workload;
  uint32_t requests = 0;  // synthetic only; 0 = the preset's default
  uint32_t workers = 0;
  std::string out;
  std::string report;
  std::string model;  // the centroid file's model name; "" = the trace's (a description)
  std::string transform = "auto";
  std::string variant = "balanced";
  std::vector<double> weights;
  uint64_t epoch = 1;
  bool all_layers = false;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "eldr-fit: %s\n", message.c_str());
  std::exit(1);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

json kmeans_json(const eldr::kmeans_result& k, double secs) {
  return {{"objective", k.objective},
          {"iterations", k.iterations},
          {"converged", k.converged},
          {"seconds", secs},
          {"cluster_sizes", k.cluster_sizes}};
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "eldr-fit: offline calibration of ELDR signatures and balanced centroids.\n"
      "Prompt tokens of each request are its prefill, output tokens its decode phase."};
  eldr::tools::workload_spec& input = o.workload;
  input.shape.reset();
  eldr::tools::add_workload_input(
      app, input,
      {"where the calibration requests come from", "eldr-trace file (v1 or v2) to calibrate on",
       "synthetic preset instead of a trace (" + eldr::synthetic_preset_list() + ")", true});
  app.add_option("--requests", o.requests,
                 "synthetic only: number of requests (default: preset's)");
  app.add_option("--workers", o.workers, "number of decode workers K (one centroid each)")
      ->required()
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--out", o.out, "centroid file to write")->required();
  app.add_option("--model", o.model,
                 "model name written into the centroid file: the node's [[models]] name, which "
                 "eldrctl centroids import checks (default: the trace's model description)");
  app.add_option("--report", o.report, "JSON report to write");
  app.add_option("--transform", o.transform, "auto|count|sqrt|count_idf|binary (auto: best rho)")
      ->capture_default_str();
  app.add_option("--variant", o.variant, "balanced|vanilla K-means")->capture_default_str();
  app.add_option("--weights", o.weights,
                 "per-worker capacity weights (K positive numbers) for heterogeneous workers")
      ->delimiter(',');
  app.add_option("--seed", input.seed, "seed for rho's pairs, k-means++ and synthetic data")
      ->capture_default_str();
  app.add_option("--epoch", o.epoch, "epoch stamped on the centroid set")->capture_default_str();
  eldr::add_defaulted(app, "--pairs", input.pairs, "random pairs for rho",
                      CLI::Range(2u, 10000000u));
  eldr::add_defaulted(app, "--threads", input.threads, "threads for layer selection and K-means",
                      CLI::Range(1u, 256u));
  app.add_flag("--all-layers", o.all_layers, "keep every layer instead of the selected N*");
  if (const auto rc = eldr::parse_command_line(app, argc, argv)) return *rc;

  const auto t_start = std::chrono::steady_clock::now();
  std::optional<eldr::signature_transform> forced;
  if (o.transform != "auto") {
    auto t = eldr::parse_transform(o.transform);
    if (!t.ok()) die("--transform: " + t.error().message());
    forced = *t;
  }
  eldr::kmeans_variant variant = eldr::kmeans_variant::balanced;
  if (o.variant == "vanilla") {
    variant = eldr::kmeans_variant::vanilla;
  } else if (o.variant != "balanced") {
    die("--variant must be balanced or vanilla, got '" + o.variant + "'");
  }
  if (!o.weights.empty() && o.weights.size() != o.workers)
    die("--weights has " + std::to_string(o.weights.size()) + " values for " +
        std::to_string(o.workers) + " workers");

  // 1. Calibration requests.
  auto loaded = eldr::tools::load_trace(input, o.requests);
  if (!loaded.ok()) die(loaded.error().message());
  const eldr::trace tr = std::move(loaded).value();
  const std::string source = eldr::tools::source_name(input);
  const eldr::model_geometry g = tr.geometry;
  const std::size_t n = tr.requests.size();
  if (o.workers > n)
    die("--workers (" + std::to_string(o.workers) + ") exceeds the calibration requests (" +
        std::to_string(n) + ")");
  auto counted = eldr::count_trace(tr);
  if (!counted.ok()) die(counted.error().message());
  const eldr::calibration_counts cal = std::move(counted).value();
  std::printf("calibration: %zu requests of %s (%s), from %s\n", n, tr.model_name.c_str(),
              g.to_string().c_str(), source.c_str());

  // 2-5. IDF, rho per transform, layer selection, signatures, balanced K-means (core/sim/fit.hpp);
  //      the vanilla variant is fitted alongside for the report.
  eldr::fit_options fo;
  fo.workers = o.workers;
  fo.transform = forced;
  fo.all_layers = o.all_layers;
  fo.variant = variant;
  fo.fit_other_variant = true;
  fo.worker_weights = o.weights;
  fo.pairs = input.pairs;
  fo.seed = input.seed;
  fo.threads = input.threads;
  auto fitted = eldr::fit_centroids(cal, fo);
  if (!fitted.ok()) die(fitted.error().message());
  const eldr::fit_result& fr = *fitted;
  json report;
  std::printf("signature quality rho (all layers, %u pairs, %zu distinct):\n", input.pairs,
              fr.rho_pairs_distinct);
  for (std::size_t i = 0; i < std::size(eldr::all_transforms); ++i) {
    const std::string name(eldr::to_string(eldr::all_transforms[i]));
    report["rho"][name] = fr.rho[i];
    std::printf("  %-10s %.4f\n", name.c_str(), fr.rho[i]);
  }
  if (const std::string w = eldr::rho_pairs_warning(fr); !w.empty())
    std::fprintf(stderr, "eldr-fit: warning: %s\n", w.c_str());
  const eldr::signature_transform chosen = fr.transform;
  std::size_t chosen_index = 0;
  while (eldr::all_transforms[chosen_index] != chosen)
    ++chosen_index;
  std::printf("transform: %s%s\n", std::string(eldr::to_string(chosen)).c_str(),
              forced ? " (forced)" : " (best rho)");
  const eldr::layer_curve& curve = fr.curve;
  std::printf("layer selection: N* = %u of %u layers, rho %.4f (all layers %.4f) [%.1f s]\n",
              curve.n_star, g.layers, curve.rho[curve.n_star - 1], fr.rho[chosen_index],
              fr.layer_seconds);
  const eldr::signature_spec& spec = *fr.spec;
  const std::size_t width = spec.width();
  const std::size_t zero_rows = fr.zero_signatures, fit_n = fr.fit_points;
  json kjson;
  for (bool primary : {true, false}) {
    const eldr::kmeans_result& k = primary ? fr.kmeans : *fr.other;
    const bool balanced = (variant == eldr::kmeans_variant::balanced) == primary;
    const char* name = balanced ? "balanced" : "vanilla";
    const double secs = primary ? fr.kmeans_seconds : fr.other_seconds;
    kjson[name] = kmeans_json(k, secs);
    uint32_t largest = 0;
    for (uint32_t s : k.cluster_sizes)
      largest = std::max(largest, s);
    std::printf(
        "k-means %-8s K=%u: objective %.4f, largest cluster %u of %zu, %u iterations [%.2f s]\n",
        name, o.workers, k.objective, largest, fit_n, k.iterations, secs);
  }
  const eldr::kmeans_result* fit = &fr.kmeans;

  // 6. The centroid file.
  eldr::centroid_file f;
  // The node refuses a set fitted for another model name unless forced: the name must be the
  // [[models]] name routes use, which a trace does not know (it records a description).
  if (o.model.empty()) {
    f.model_name = tr.model_name;
    std::fprintf(stderr,
                 "eldr-fit: warning: no --model: the centroid file names the model \"%s\", the "
                 "trace's description; eldrctl centroids import refuses it for a model of another "
                 "name (pass --model NAME, the node's [[models]] name)\n",
                 f.model_name.c_str());
  } else {
    f.model_name = o.model;
  }
  f.spec = spec;
  f.epoch = o.epoch;
  f.workers = o.workers;
  f.centroids = fit->centroids;
  f.worker_weights.assign(o.weights.begin(), o.weights.end());
  f.provenance = {source,        "eldr-fit " + std::string(eldr::version),
                  input.seed,    static_cast<uint32_t>(n),
                  fr.rho_masked, fit->objective,
                  o.variant};
  if (status s = eldr::write_centroid_file(f, o.out); !s.ok()) die(s.to_string());
  std::printf("wrote %s: epoch %llu, %u centroids of width %zu\n", o.out.c_str(),
              static_cast<unsigned long long>(o.epoch), o.workers, width);

  if (!o.report.empty()) {
    report["format"] = "eldr-fit-report";
    report["version"] = 1;
    report["source"] = source;
    report["model"] = {{"name", f.model_name},
                       {"trace_name", tr.model_name},
                       {"layers", g.layers},
                       {"experts", g.experts},
                       {"top_k", g.top_k}};
    report["requests"] = n;
    report["zero_signature_requests"] = zero_rows;
    report["workers"] = o.workers;
    report["seed"] = input.seed;
    report["pairs"] = input.pairs;
    report["pairs_distinct"] = fr.rho_pairs_distinct;
    report["pairs_possible"] = fr.rho_pairs_possible;
    report["rho_requests"] = fr.rho_requests;
    if (const std::string w = eldr::rho_pairs_warning(fr); !w.empty())
      report["warnings"] = json::array({w});
    report["transform"] = std::string(eldr::to_string(chosen));
    report["transform_chosen_by"] = forced ? "flag" : "best_rho";
    report["layer_curve"] = {{"order", curve.order}, {"rho", curve.rho}};
    report["n_star"] = curve.n_star;
    report["mask"] = spec.layer_mask();
    report["rho_masked"] = curve.rho[curve.n_star - 1];
    report["width"] = width;
    report["kmeans"] = kjson;
    report["kmeans_variant"] = o.variant;
    report["epoch"] = o.epoch;
    report["centroids"] = o.out;
    report["seconds"] = seconds_since(t_start);
    std::ofstream out(o.report);
    out << report.dump(2) << "\n";
    if (!out) die("cannot write the report to " + o.report);
    std::printf("wrote %s\n", o.report.c_str());
  }
  return 0;
}
