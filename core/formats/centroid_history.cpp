// centroid_history: see centroid_history.hpp.
#include "core/formats/centroid_history.hpp"

#include <charconv>
#include <cstdio>

namespace eldr {
namespace {

constexpr std::string_view header = "eldr-centroid-history 1";

// A cause is one word of letters, digits and '-' (it is written unquoted on its line).
bool valid_cause(std::string_view c) {
  if (c.empty() || c.size() > 32) return false;
  for (char ch : c)
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-')) return false;
  return true;
}

template <class T>
bool parse_number(std::string_view s, T& out, int base = 10) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

}  // namespace

uint64_t content_digest(const centroid_file& file) {
  centroid_file unnumbered = file;
  unnumbered.epoch = 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a, 64-bit
  for (uint8_t b : encode_centroid_file(unnumbered)) {
    h ^= b;
    h *= 1099511628211ull;
  }
  return h;
}

centroid_history::centroid_history(size_t capacity) : capacity_(capacity < 2 ? 2 : capacity) {}

bool centroid_history::record(centroid_change change) {
  if (!valid_cause(change.cause)) change.cause = "other";
  if (!changes_.empty() && changes_.back().epoch == change.epoch &&
      changes_.back().digest == change.digest)
    return false;
  if (change.cause == "rollback" && changes_.size() >= 2 &&
      changes_[changes_.size() - 2].digest == change.digest) {
    // Back to the set the newest change replaced: that change is undone. The entry below takes
    // the epoch the set now has (a cluster renumbers it) and keeps its own cause and time.
    changes_.pop_back();
    changes_.back().epoch = change.epoch;
    return true;
  }
  changes_.push_back(std::move(change));
  while (changes_.size() > capacity_)
    changes_.pop_front();
  return false;
}

result<centroid_change> centroid_history::previous() const {
  if (changes_.empty())
    return status::not_found("no centroid set has been installed, so none to go back to");
  if (changes_.size() == 1)
    return status::not_found(
        "nothing to undo: epoch " + std::to_string(changes_.back().epoch) +
        " is the only set this router has made current (or the older changes were forgotten "
        "beyond the last " +
        std::to_string(capacity_) + "); 'centroids swap' makes any stored epoch current");
  return changes_[changes_.size() - 2];
}

std::string centroid_history::encode() const {
  std::string out(header);
  out += '\n';
  char digest[17];
  for (const auto& c : changes_) {
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(c.digest));
    out += std::to_string(c.epoch) + ' ' + digest + ' ' + std::to_string(c.at_ms) + ' ' + c.cause +
           '\n';
  }
  return out;
}

result<centroid_history> centroid_history::parse(std::string_view text, size_t capacity) {
  centroid_history h(capacity);
  size_t line_no = 0;
  bool have_header = false;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    const std::string where = "centroid history line " + std::to_string(line_no) + ": ";
    if (!have_header) {
      if (line != header)
        return status::invalid_argument(where + "expected '" + std::string(header) + "'");
      have_header = true;
      continue;
    }
    if (line.empty()) continue;
    std::string_view fields[4];
    size_t n = 0;
    while (n < 4 && !line.empty()) {
      const size_t sp = line.find(' ');
      fields[n++] = line.substr(0, sp);
      line = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
    }
    if (n != 4 || !line.empty())
      return status::invalid_argument(where + "expected '<epoch> <digest> <at_ms> <cause>'");
    centroid_change c;
    if (!parse_number(fields[0], c.epoch) || c.epoch == 0)
      return status::invalid_argument(where + "epoch is not a positive integer");
    if (fields[1].size() != 16 || !parse_number(fields[1], c.digest, 16))
      return status::invalid_argument(where + "digest is not 16 hex digits");
    if (!parse_number(fields[2], c.at_ms))
      return status::invalid_argument(where + "at_ms is not an integer");
    if (!valid_cause(fields[3]))
      return status::invalid_argument(where + "cause is not a word of [a-z0-9-]");
    c.cause = std::string(fields[3]);
    h.changes_.push_back(std::move(c));
    if (h.changes_.size() > h.capacity_) h.changes_.pop_front();
  }
  if (!have_header) return status::invalid_argument("centroid history: empty");
  return h;
}

}  // namespace eldr
