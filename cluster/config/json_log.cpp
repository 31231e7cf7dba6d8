// json_log: see json_log.hpp.
#include "cluster/config/json_log.hpp"

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

namespace eldr {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n';
}

// The word after `key ` in `s` (up to a space, comma, parenthesis or the end), "" if none.
std::string word_after(std::string_view s, std::string_view key) {
  for (size_t at = s.find(key); at != std::string_view::npos; at = s.find(key, at + 1)) {
    if (at > 0 && !is_space(s[at - 1])) continue;  // "subrequest " is not "request "
    size_t b = at + key.size();
    size_t e = b;
    while (e < s.size() && !is_space(s[e]) && s[e] != ',' && s[e] != '(' && s[e] != ')')
      ++e;
    while (e > b && (s[e - 1] == ':' || s[e - 1] == '.' || s[e - 1] == ';'))
      --e;
    if (e > b) return std::string(s.substr(b, e - b));
  }
  return "";
}

}  // namespace

log_fields log_fields_of(std::string_view message) {
  log_fields f;
  // The subject: the text before the first ": " (a URL's "tcp://" has no space after its colon),
  // if it is short enough to be one.
  const size_t colon = message.find(": ");
  const std::string_view subject = colon != std::string_view::npos && colon <= 96
                                       ? message.substr(0, colon)
                                       : std::string_view();
  if (subject.empty()) {
    f.component = "node";
  } else {
    const size_t space = subject.find(' ');
    f.component = std::string(subject.substr(0, space));
    const std::string_view rest =
        space == std::string_view::npos ? std::string_view() : subject.substr(space + 1);
    if (f.component == "model") {
      f.model = std::string(rest.substr(0, rest.find(' ')));
    } else if (f.component == "ingest" || f.component == "publisher" || f.component == "replay") {
      const size_t last = rest.rfind(' ');
      f.publisher = std::string(last == std::string_view::npos ? rest : rest.substr(last + 1));
    }
  }
  f.request = word_after(message, "request ");
  return f;
}

std::string json_log_line(std::chrono::system_clock::time_point time, std::string_view level,
                          std::string_view message) {
  using namespace std::chrono;
  const auto ms = duration_cast<milliseconds>(time.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&secs, &utc);
  char stamp[96];  // room for any int in every field, so GCC sees no truncation
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(ms % 1000));
  const log_fields f = log_fields_of(message);
  // Key order as an operator reads a line; nlohmann's ordered_json keeps it.
  nlohmann::ordered_json j;
  j["time"] = stamp;
  j["level"] = std::string(level);
  j["component"] = f.component;
  if (!f.model.empty()) j["model"] = f.model;
  if (!f.publisher.empty()) j["publisher"] = f.publisher;
  if (!f.request.empty()) j["request"] = f.request;
  j["message"] = std::string(message);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void json_log_formatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  const auto level = spdlog::level::to_string_view(msg.level);
  const std::string line = json_log_line(msg.time, std::string_view(level.data(), level.size()),
                                         std::string_view(msg.payload.data(), msg.payload.size()));
  dest.append(line.data(), line.data() + line.size());
  dest.push_back('\n');
}

std::unique_ptr<spdlog::formatter> json_log_formatter::clone() const {
  return std::make_unique<json_log_formatter>();
}

}  // namespace eldr
