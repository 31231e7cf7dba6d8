// setup: the steps before the runs that need no socket of their own -- the options checked, the
// node's status read, the workload built (the same requests eldr-sim draws for the same options)
// and the centroid set to import made. Each returns a status; none prints.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base/status.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// The options' checks beyond the command line's (exit code 2 when they fail).
status check_options(const loadgen_options& o);

// Parses the node's status: its route and worker endpoints (reachable from here), the model
// (--model, or the first served), K against --decode-workers, the epoch the import will get.
status read_status(session& s, const nlohmann::json& st);

// The workload: the same requests eldr-sim draws for the same options.
status build_workload(session& s);

// The centroid file to import: --centroids, or a fit on the workload's calibration requests (the
// fit eldr-sim's plain "eldr" uses); recorded in s.imported.
result<std::vector<uint8_t>> centroid_bytes(session& s);

}  // namespace eldr::loadgen
