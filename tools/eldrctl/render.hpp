// render: eldrctl's generic output for people -- a JSON value as text, aligned tables of objects
// and key/value listings.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tools/eldrctl/node_call.hpp"

namespace eldr::ctl {

// A number as printed: floats with 6 significant digits, integers exactly.
std::string number_text(const json& v);

// One cell or value: strings unquoted, null as "-", arrays of scalars joined, binary by size,
// anything else as compact JSON.
std::string text(const json& v);

struct column {
  std::string key;  // dotted
  std::string header;
};

// An aligned table of objects: the preferred columns first (shown even when a row lacks them),
// then every other key any row has, so fields a newer node adds are shown, not lost. Numeric
// columns are right-aligned.
// With all_columns false only `cols` are shown (the compact views of `status`).
void print_table(std::ostream& out, const json& rows, std::vector<column> cols, int indent = 0,
                 bool all_columns = true);

// key  value lines, the preferred keys first; nested objects indented below their key, arrays of
// objects as tables.
void print_object(std::ostream& out, const json& obj, const std::vector<std::string>& preferred,
                  int indent = 0);

}  // namespace eldr::ctl
