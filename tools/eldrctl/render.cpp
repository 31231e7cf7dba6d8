// render: eldrctl's generic output for people (render.hpp).
#include "tools/eldrctl/render.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace eldr::ctl {

std::string number_text(const json& v) {
  if (v.is_number_float()) {
    std::ostringstream s;
    s << v.get<double>();  // 6 significant digits: a float32 tau prints as 0.1, not 0.100000001
    return s.str();
  }
  return v.dump();
}

namespace {

bool is_scalar(const json& v) {
  return !v.is_object() && !v.is_array();
}

}  // namespace

// One cell or value: strings unquoted, null as "-", arrays of scalars joined, binary by size,
// anything else as compact JSON.
std::string text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "-";
  if (v.is_number()) return number_text(v);
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_binary()) return "<" + std::to_string(v.get_binary().size()) + " bytes>";
  if (v.is_array() && std::all_of(v.begin(), v.end(), is_scalar)) {
    std::string s;
    for (const json& e : v)
      s += (s.empty() ? "" : ",") + text(e);
    return s.empty() ? "-" : s;
  }
  return v.dump();
}

namespace {

std::string upper(std::string s) {
  for (char& c : s)
    c = (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : (c == '.' ? '_' : c);
  return s;
}

// Nested objects become dotted keys ("workers.active") so that they fit table columns.
void flatten(const json& v, const std::string& prefix,
             std::vector<std::pair<std::string, json>>& out) {
  for (const auto& [k, e] : v.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (e.is_object() && !e.empty())
      flatten(e, key, out);
    else
      out.emplace_back(key, e);
  }
}

}  // namespace

// An aligned table of objects: the preferred columns first (shown even when a row lacks them),
// then every other key any row has, so fields a newer node adds are shown, not lost. Numeric
// columns are right-aligned.
// With all_columns false only `cols` are shown (the compact views of `status`).
void print_table(std::ostream& out, const json& rows, std::vector<column> cols, int indent,
                 bool all_columns) {
  std::vector<std::map<std::string, json>> flat;
  for (const json& row : rows) {
    std::vector<std::pair<std::string, json>> kv;
    if (row.is_object())
      flatten(row, "", kv);
    else
      kv.emplace_back("value", row);
    std::map<std::string, json> m;
    for (auto& entry : kv) {
      // Not a structured binding: clang 14 cannot capture one in a lambda (C++20 P1091).
      const std::string& k = entry.first;
      if (all_columns &&
          std::none_of(cols.begin(), cols.end(), [&](const column& c) { return c.key == k; }))
        cols.push_back({k, upper(k)});
      m[k] = std::move(entry.second);
    }
    flat.push_back(std::move(m));
  }
  std::vector<std::vector<std::string>> cells;
  std::vector<size_t> width(cols.size());
  std::vector<bool> numeric(cols.size(), true);
  for (size_t c = 0; c < cols.size(); ++c)
    width[c] = cols[c].header.size();
  for (const auto& m : flat) {
    std::vector<std::string> line;
    for (size_t c = 0; c < cols.size(); ++c) {
      auto it = m.find(cols[c].key);
      const json v = it == m.end() ? json() : it->second;
      if (!v.is_number() && !v.is_null()) numeric[c] = false;
      line.push_back(text(v));
      width[c] = std::max(width[c], line.back().size());
    }
    cells.push_back(std::move(line));
  }
  auto print_line = [&](const std::vector<std::string>& line) {
    std::string s(static_cast<size_t>(indent), ' ');
    for (size_t c = 0; c < line.size(); ++c) {
      const std::string pad(width[c] - line[c].size(), ' ');
      const bool last = c + 1 == line.size();
      s += numeric[c] ? pad + line[c] : line[c] + (last ? "" : pad);
      if (!last) s += "  ";
    }
    out << s << "\n";
  };
  std::vector<std::string> headers;
  for (const column& c : cols)
    headers.push_back(c.header);
  print_line(headers);
  for (const auto& line : cells)
    print_line(line);
}

// key  value lines, the preferred keys first; nested objects indented below their key, arrays of
// objects as tables.
void print_object(std::ostream& out, const json& obj, const std::vector<std::string>& preferred,
                  int indent) {
  if (!obj.is_object()) {
    out << std::string(static_cast<size_t>(indent), ' ') << (obj.is_null() ? "ok" : text(obj))
        << "\n";
    return;
  }
  std::vector<std::string> keys;
  for (const std::string& k : preferred)
    if (obj.contains(k)) keys.push_back(k);
  for (const auto& [k, v] : obj.items())
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
  size_t w = 0;
  for (const std::string& k : keys)
    w = std::max(w, k.size());
  const std::string pad(static_cast<size_t>(indent), ' ');
  for (const std::string& k : keys) {
    const json& v = obj[k];
    if (v.is_object() && !v.empty()) {
      out << pad << k << "\n";
      print_object(out, v, {}, indent + 2);
    } else if (v.is_array() && !v.empty() &&
               std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_object(); })) {
      out << pad << k << "\n";
      print_table(out, v, {}, indent + 2);
    } else {
      out << pad << k << std::string(w - k.size() + 2, ' ') << text(v) << "\n";
    }
  }
}

}  // namespace eldr::ctl
