// views: how eldrctl prints the answers of status, workers and explain for people (--json prints
// the node's answer instead).
#pragma once

#include <ostream>

#include "tools/eldrctl/node_call.hpp"

namespace eldr::ctl {

// `eldrctl status --wide`: every section, column and counter of the node's answer.
void print_status_wide(std::ostream& out, const json& r);

// `eldrctl status` for people: the figures an operator scans first, within 100 columns for
// usual names.
void print_status(std::ostream& out, const json& r);

// `eldrctl workers`: one row per decode worker.
void print_workers(std::ostream& out, const json& r);

// `eldrctl explain`: the recorded decision, its band as a table.
void print_explain(std::ostream& out, json r);

}  // namespace eldr::ctl
