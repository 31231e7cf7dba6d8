// metrics: registration (validation, find-or-create under one mutex) and the text exposition.
#include "core/base/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <system_error>

#include "core/base/utf8.hpp"

namespace eldr {
namespace {

bool name_start(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}

bool name_char(char c, bool colon) {
  return name_start(c, colon) || (c >= '0' && c <= '9');
}

bool valid_identifier(std::string_view name, bool colon) {
  if (name.empty() || !name_start(name.front(), colon)) return false;
  return std::all_of(name.begin(), name.end(), [colon](char c) { return name_char(c, colon); });
}

// HELP text escapes backslash and newline; label values also escape the double quote. Both are
// UTF-8 in the format: anything else is replaced, so that no client-chosen byte breaks a scrape.
void append_escaped(std::string& out, std::string_view text, bool quote) {
  const std::string s = utf8_replacing(text);
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

// {a="x",b="y"} plus an optional extra label (a histogram's le) last; nothing when both are empty.
void append_labels(std::string& out, const std::vector<std::pair<std::string, std::string>>& labels,
                   std::string_view extra_name = {}, std::string_view extra_value = {}) {
  if (labels.empty() && extra_name.empty()) return;
  out += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    append_escaped(out, v, true);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

void append_u64(std::string& out, uint64_t v) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  (void)ec;  // 24 bytes hold any uint64
  out.append(buf, end);
}

const char* type_name(int type) {
  switch (type) {
    case 0:
      return "counter";
    case 1:
      return "gauge";
    default:
      return "histogram";
  }
}

}  // namespace

bool valid_metric_name(std::string_view name) {
  return valid_identifier(name, true);
}

bool valid_label_name(std::string_view name) {
  return valid_identifier(name, false) && name.substr(0, 2) != "__";
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  if (ec != std::errc()) return "NaN";  // unreachable: 32 bytes hold any shortest double
  return std::string(buf, end);
}

histogram_metric::histogram_metric(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void histogram_metric::observe(double v) {
  // First bound >= v; NaN compares false everywhere and lands past the end, in +Inf.
  const auto it = std::lower_bound(bounds_.begin(), bounds_.end(), v);
  const std::size_t i =
      std::isnan(v) ? bounds_.size() : static_cast<std::size_t>(it - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

uint64_t histogram_metric::count() const {
  uint64_t n = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i)
    n += bucket_count(i);
  return n;
}

metric_registry::label_key metric_registry::key_of(const metric_labels& labels) {
  label_key key(labels.begin(), labels.end());
  std::sort(key.begin(), key.end());
  return key;
}

result<metric_registry::family*> metric_registry::find_or_add_family(
    std::string_view name, std::string_view help, kind type, const std::vector<double>* bounds) {
  const std::string where = "metrics: \"" + std::string(name) + "\": ";
  if (!valid_metric_name(name))
    return status::invalid_argument(where + "invalid metric name (want [a-zA-Z_:][a-zA-Z0-9_:]*)");
  if (bounds != nullptr) {
    if (bounds->empty()) return status::invalid_argument(where + "histogram without buckets");
    for (std::size_t i = 0; i < bounds->size(); ++i) {
      if (!std::isfinite((*bounds)[i]))
        return status::invalid_argument(where + "histogram bucket bound is not finite");
      if (i > 0 && !((*bounds)[i - 1] < (*bounds)[i]))
        return status::invalid_argument(where + "histogram bucket bounds not strictly increasing");
    }
  }

  auto found = families_.find(name);
  if (found == families_.end()) {
    family f;
    f.type = type;
    f.help = std::string(help);
    if (bounds != nullptr) f.bounds = *bounds;
    found = families_.emplace(std::string(name), std::move(f)).first;
  } else {
    const family& f = found->second;
    if (f.type != type)
      return status::invalid_argument(where + "already registered as a " +
                                      type_name(static_cast<int>(f.type)));
    if (f.help != help)
      return status::invalid_argument(where + "already registered with another help text");
    if (bounds != nullptr && f.bounds != *bounds)
      return status::invalid_argument(where + "already registered with other bucket bounds");
  }
  return &found->second;
}

result<metric_registry::child*> metric_registry::find_or_add(std::string_view name,
                                                             std::string_view help, kind type,
                                                             const metric_labels& labels,
                                                             const std::vector<double>* bounds) {
  const std::string where = "metrics: \"" + std::string(name) + "\": ";
  label_key key = key_of(labels);
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (!valid_label_name(key[i].first))
      return status::invalid_argument(where + "invalid label name \"" + key[i].first + "\"");
    if (i > 0 && key[i].first == key[i - 1].first)
      return status::invalid_argument(where + "duplicate label \"" + key[i].first + "\"");
    if (type == kind::histogram && key[i].first == "le")
      return status::invalid_argument(where + "label \"le\" is reserved for histogram buckets");
  }
  auto f = find_or_add_family(name, help, type, bounds);
  if (!f.ok()) return f.error();
  return &(*f)->children[std::move(key)];
}

result<counter_metric*> metric_registry::counter(std::string_view name, std::string_view help,
                                                 const metric_labels& labels) {
  std::lock_guard lock(mutex_);
  auto c = find_or_add(name, help, kind::counter, labels, nullptr);
  if (!c.ok()) return c.error();
  if ((*c)->read)
    return status::invalid_argument("metrics: \"" + std::string(name) +
                                    "\": these labels are a callback counter");
  if (!(*c)->c) (*c)->c = std::make_unique<counter_metric>();
  return (*c)->c.get();
}

result<gauge_metric*> metric_registry::gauge(std::string_view name, std::string_view help,
                                             const metric_labels& labels) {
  std::lock_guard lock(mutex_);
  auto c = find_or_add(name, help, kind::gauge, labels, nullptr);
  if (!c.ok()) return c.error();
  if ((*c)->read)
    return status::invalid_argument("metrics: \"" + std::string(name) +
                                    "\": these labels are a callback gauge");
  if (!(*c)->g) (*c)->g = std::make_unique<gauge_metric>();
  return (*c)->g.get();
}

result<histogram_metric*> metric_registry::histogram(std::string_view name, std::string_view help,
                                                     std::vector<double> upper_bounds,
                                                     const metric_labels& labels) {
  std::lock_guard lock(mutex_);
  auto c = find_or_add(name, help, kind::histogram, labels, &upper_bounds);
  if (!c.ok()) return c.error();
  if (!(*c)->h) (*c)->h = std::make_unique<histogram_metric>(std::move(upper_bounds));
  return (*c)->h.get();
}

status metric_registry::callback_gauge(std::string_view name, std::string_view help,
                                       const metric_labels& labels, std::function<double()> read) {
  return add_callback(name, help, kind::gauge, labels, std::move(read));
}

status metric_registry::callback_counter(std::string_view name, std::string_view help,
                                         const metric_labels& labels,
                                         std::function<double()> read) {
  return add_callback(name, help, kind::counter, labels, std::move(read));
}

status metric_registry::add_callback(std::string_view name, std::string_view help, kind type,
                                     const metric_labels& labels, std::function<double()> read) {
  const std::string what(type == kind::counter ? "counter" : "gauge");
  if (!read)
    return status::invalid_argument("metrics: \"" + std::string(name) + "\": callback " + what +
                                    " without a function");
  std::lock_guard lock(mutex_);
  auto c = find_or_add(name, help, type, labels, nullptr);
  if (!c.ok()) return c.error();
  if ((*c)->g || (*c)->c)
    return status::invalid_argument("metrics: \"" + std::string(name) +
                                    "\": these labels are a plain " + what);
  (*c)->read = std::move(read);
  return {};
}

status metric_registry::declare(std::string_view name, std::string_view help, metric_type type) {
  if (type == kind::histogram)
    return status::invalid_argument("metrics: \"" + std::string(name) +
                                    "\": a histogram is declared by registering a child");
  std::lock_guard lock(mutex_);
  auto f = find_or_add_family(name, help, type, nullptr);
  if (!f.ok()) return f.error();
  return {};
}

bool metric_registry::remove(std::string_view name, const metric_labels& labels) {
  std::lock_guard lock(mutex_);
  auto f = families_.find(name);
  return f != families_.end() && f->second.children.erase(key_of(labels)) > 0;
}

uint64_t metric_registry::counter_value(std::string_view name, const metric_labels& labels) const {
  std::lock_guard lock(mutex_);
  auto f = families_.find(name);
  if (f == families_.end()) return 0;
  auto c = f->second.children.find(key_of(labels));
  if (c == f->second.children.end()) return 0;
  if (c->second.read) return static_cast<uint64_t>(c->second.read());
  return c->second.c ? c->second.c->value() : 0;
}

std::string metric_registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP ";
    out += name;
    out += ' ';
    append_escaped(out, f.help, false);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += type_name(static_cast<int>(f.type));
    out += '\n';
    for (const auto& [labels, c] : f.children) {
      switch (f.type) {
        case kind::counter:
          out += name;
          append_labels(out, labels);
          out += ' ';
          if (c.read)
            out += format_metric_value(c.read());
          else
            append_u64(out, c.c ? c.c->value() : 0);
          out += '\n';
          break;
        case kind::gauge:
          out += name;
          append_labels(out, labels);
          out += ' ';
          out += format_metric_value(c.read ? c.read() : (c.g ? c.g->value() : 0.0));
          out += '\n';
          break;
        case kind::histogram: {
          if (!c.h) break;
          const histogram_metric& h = *c.h;
          // Read every bucket once, so that the cumulative lines and _count agree.
          uint64_t cumulative = 0;
          const std::size_t n = h.upper_bounds().size();
          for (std::size_t i = 0; i <= n; ++i) {
            cumulative += h.bucket_count(i);
            out += name;
            out += "_bucket";
            append_labels(out, labels, "le",
                          i < n ? format_metric_value(h.upper_bounds()[i]) : "+Inf");
            out += ' ';
            append_u64(out, cumulative);
            out += '\n';
          }
          out += name;
          out += "_sum";
          append_labels(out, labels);
          out += ' ';
          out += format_metric_value(h.sum());
          out += '\n';
          out += name;
          out += "_count";
          append_labels(out, labels);
          out += ' ';
          append_u64(out, cumulative);
          out += '\n';
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace eldr
