// run_policy: one policy's run over the session's workload, start to finish: the route socket,
// preparation, the decode loop's and the hot swap's threads, the generator on the caller's
// thread, then the run's figures. The node must already be set to the policy.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/base/status.hpp"
#include "tools/eldr-loadgen/loadgen.hpp"
#include "tools/eldr-loadgen/session.hpp"

namespace eldr::loadgen {

// Run run_index's requests are named "r<run_index>.<nonce>-<i>". `stop` ends the run cleanly
// (result marked interrupted); errors that end it early are returned. Updates s.current_epoch
// after a --swap-at import and s.report_seq.
result<policy_result> run_policy(session& s, const std::string& policy, uint32_t run_index,
                                 const std::atomic<bool>& stop);

}  // namespace eldr::loadgen
