// report: the --json report of a whole loadgen run (the first policy's figures at the top level,
// every policy's under "policies", the setup, and eldr-sim's command line for the same workload).
// to_json and format_table, per policy, are loadgen.hpp's.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

nlohmann::json run_report(const session& s, const std::vector<policy_result>& results);

}  // namespace eldr::loadgen
