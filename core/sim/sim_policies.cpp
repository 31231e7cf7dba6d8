// sim_policies: policy names to sim_policy objects, with cached calibration fits.
#include "core/sim/sim_policies.hpp"

#include <charconv>
#include <cmath>

namespace eldr {
namespace {

constexpr std::string_view valid_names =
    "rr, random, jsq, p2c, domain, eldr, eldr-online, eldr-adaptive, eldr-adaptive-online, "
    "clairvoyant, clairvoyant-adaptive; the eldr ones take /tau=X, "
    "/transform=count|sqrt|count_idf|binary, /kmeans=balanced|vanilla, /layers=selected|all, "
    "the adaptive ones also /slack=X and /min-load=N";

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

result<std::shared_ptr<const centroid_set>> make_set(const kmeans_result& k, uint32_t workers,
                                                     std::size_t width, uint64_t epoch) {
  auto set = centroid_set::make(workers, static_cast<uint32_t>(width), k.centroids, epoch);
  if (!set.ok()) return set.error();
  return std::make_shared<const centroid_set>(std::move(set).value());
}

// A fit for the factory's workers with its seed, threads and pairs; the caller picks the rest.
fit_options fit_for(const policy_factory_options& o) {
  fit_options fo;
  fo.workers = o.workers;
  fo.pairs = o.pairs;
  fo.seed = o.seed;
  fo.threads = o.threads;
  return fo;
}

// Makes the policy for router 0 and sets the maker of the other routers' instances (the same
// name and configuration; random and p2c get a seed of their own per router, spread by the
// golden-ratio increment so that neighbouring seeds do not walk in step).
status make_for_routers(sim_policy& p, std::string_view policy, const policy_config& pc) {
  auto made = make_policy(policy, pc);
  if (!made.ok()) return made.error();
  p.policy = std::move(made).value();
  p.more_routers = [policy = std::string(policy), pc](uint32_t router) {
    policy_config mine = pc;
    mine.seed = pc.seed + 0x9E3779B97F4A7C15ull * router;
    return make_policy(policy, mine);
  };
  return {};
}

}  // namespace

result<policy_factory> policy_factory::make(const workload& w, policy_factory_options o,
                                            factory_log log) {
  if (o.workers == 0) return status::invalid_argument("policies: workers must be >= 1");
  if (o.centroids) {
    const centroid_file& f = *o.centroids;
    if (f.spec.geometry() != w.geometry())
      return status::invalid_argument("centroid file is for a model of " +
                                      f.spec.geometry().to_string() + " but the trace is " +
                                      w.geometry().to_string());
    if (f.workers != o.workers)
      return status::invalid_argument("centroid file has " + std::to_string(f.workers) +
                                      " centroids but " + std::to_string(o.workers) +
                                      " decode workers are simulated");
  }
  return policy_factory(w, std::move(o), std::move(log));
}

const calibration_counts& policy_factory::calibration() {
  if (!cal_) {
    if (log_) log_("counting " + std::to_string(w_->calibration.size()) + " calibration requests");
    cal_ = count_calibration(*w_, o_.threads);
  }
  return *cal_;
}

result<const fit_result*> policy_factory::fit(const eldr_options& e) {
  std::string key = e.transform ? std::string(to_string(*e.transform)) : "auto";
  key += e.variant == kmeans_variant::vanilla ? "/vanilla" : "/balanced";
  key += e.all_layers ? "/all" : "/selected";
  if (auto it = fits_.find(key); it != fits_.end()) return &it->second;
  const calibration_counts& cal = calibration();
  if (log_)
    log_("fitting centroids (" + key + ") on " + std::to_string(cal.size()) +
         " calibration requests");
  fit_options fo = fit_for(o_);
  fo.transform = e.transform;
  fo.all_layers = e.all_layers;
  fo.skip_layer_selection = e.all_layers;
  fo.variant = e.variant;
  auto r = fit_centroids(cal, fo);
  if (!r.ok()) return r.error();
  return &fits_.emplace(key, std::move(r).value()).first->second;
}

result<const fit_result*> policy_factory::default_fit() {
  if (o_.centroids) return static_cast<const fit_result*>(nullptr);
  eldr_options e;
  e.tau = o_.tau;
  return fit(e);
}

result<sim_policy> policy_factory::build(std::string_view name) {
  sim_policy p;
  p.name = std::string(name);
  policy_config pc;
  pc.workers = o_.workers;
  pc.seed = o_.seed;
  pc.tau = o_.tau;
  const std::vector<std::string_view> parts = split(name, '/');
  const std::string_view base = parts.front();
  auto unknown = [&](std::string_view what) {
    return status::invalid_argument("unknown policy \"" + std::string(name) + "\" (" +
                                    std::string(what) + "); valid: " + std::string(valid_names));
  };

  if (base == "rr" || base == "random" || base == "jsq" || base == "p2c" || base == "domain") {
    if (parts.size() > 1) return unknown("only eldr and eldr-online take options");
    if (base == "domain") {
      if (w_->domain_counts.empty())
        return status::invalid_argument(
            "policy domain needs labelled calibration requests, and this workload has none");
      pc.domain_counts = w_->domain_counts;
    }
    if (status s = make_for_routers(p, base, pc); !s.ok()) return s;
    return p;
  }

  if (base == "clairvoyant" || base == "clairvoyant-adaptive") {
    if (parts.size() > 1) return unknown("clairvoyant takes no options");
    auto it = fits_.find("clairvoyant");
    if (it == fits_.end()) {
      // Fit on the calibration requests' decode profiles: the decode counts play the prefill.
      const calibration_counts& cal = calibration();
      calibration_counts dec;
      dec.geometry = cal.geometry;
      dec.prefill = cal.decode;
      dec.decode = cal.decode;
      if (log_) log_("fitting the clairvoyant centroids on decode profiles");
      fit_options fo = fit_for(o_);
      fo.transform = signature_transform::count;
      fo.all_layers = true;
      fo.skip_layer_selection = true;
      fo.pairs = 2;  // rho of a profile against itself says nothing; keep it cheap
      auto r = fit_centroids(dec, fo);
      if (!r.ok()) return r.error();
      it = fits_.emplace("clairvoyant", std::move(r).value()).first;
    }
    auto set = make_set(it->second.kmeans, o_.workers, it->second.spec->width(), 1);
    if (!set.ok()) return set.error();
    pc.centroids = *set;
    if (status s = make_for_routers(p, base == "clairvoyant" ? "eldr" : "eldr-adaptive", pc);
        !s.ok())
      return s;
    p.signatures = signature_source::decode_profile;
    p.spec = it->second.spec;
    return p;
  }

  const bool adaptive = base == "eldr-adaptive" || base == "eldr-adaptive-online";
  if (base != "eldr" && base != "eldr-online" && !adaptive) return unknown("no such policy");
  eldr_options e;
  e.tau = o_.tau;
  pc.load_slack = o_.load_slack;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::string_view opt = parts[i];
    const std::size_t eq = opt.find('=');
    if (eq == std::string_view::npos) return unknown("option without =");
    const std::string_view key = opt.substr(0, eq), value = opt.substr(eq + 1);
    if (key == "tau") {
      float tau = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), tau);
      if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(tau) || tau < 0)
        return unknown("tau must be a number >= 0");
      e.tau = tau;
    } else if (key == "slack" && adaptive) {
      float slack = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), slack);
      if (ec != std::errc() || ptr != value.data() + value.size() || !std::isfinite(slack) ||
          slack < 0)
        return unknown("slack must be a number >= 0");
      pc.load_slack = slack;
    } else if (key == "min-load" && adaptive) {
      uint32_t min_load = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), min_load);
      if (ec != std::errc() || ptr != value.data() + value.size())
        return unknown("min-load must be a whole number >= 0");
      pc.group_min_load = min_load;
    } else if (key == "transform") {
      auto t = parse_transform(value);
      if (!t.ok()) return unknown(t.error().message());
      e.transform = *t;
      e.plain = false;
    } else if (key == "kmeans") {
      if (value == "vanilla") {
        e.variant = kmeans_variant::vanilla;
      } else if (value != "balanced") {
        return unknown("kmeans must be balanced or vanilla");
      }
      e.plain = e.plain && value == "balanced";
    } else if (key == "layers") {
      if (value == "all") {
        e.all_layers = true;
        e.plain = false;
      } else if (value != "selected") {
        return unknown("layers must be selected or all");
      }
    } else {
      return unknown("unknown option " + std::string(key));
    }
  }
  pc.tau = e.tau;
  if (e.plain && o_.centroids) {
    const centroid_file& f = *o_.centroids;
    auto set = centroid_set::make(f.workers, f.spec.width(), f.centroids, f.epoch);
    if (!set.ok()) return set.error();
    pc.centroids = std::make_shared<const centroid_set>(std::move(set).value());
    p.spec = std::make_shared<const signature_spec>(f.spec);
  } else {
    auto r = fit(e);
    if (!r.ok()) return r.error();
    const fit_result& fr = **r;
    auto set = make_set(fr.kmeans, o_.workers, fr.spec->width(), 1);
    if (!set.ok()) return set.error();
    pc.centroids = *set;
    p.spec = fr.spec;
  }
  if (status s = make_for_routers(p, adaptive ? "eldr-adaptive" : "eldr", pc); !s.ok()) return s;
  p.signatures = signature_source::prefill;
  if (base == "eldr-online" || base == "eldr-adaptive-online") {
    p.refit = o_.refit;
    p.refit.enabled = true;
  }
  return p;
}

}  // namespace eldr
