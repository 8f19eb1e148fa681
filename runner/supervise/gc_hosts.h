// `mltrain gc --hosts`: the synced folders on a job's hosts that no run uses any more go.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/protocol/protocol.h"
#include "runner/supervise/supervisor.h"

namespace mltrain::supervise {

struct HostGc {
  std::string host;
  bool ok = false;
  std::string problem;  // why it could not be asked
  agent::msg::GcDone done;
};

// Asks every host's agent to remove its synced folders that no run uses and none synced within
// `older_than` (only to list them with `dry_run`). One entry per host; 0, or 128 + a signal.
int run_gc_hosts(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
                 std::chrono::seconds older_than, bool dry_run, std::vector<HostGc>& hosts);

// One line per folder removed (or that would be), per folder kept because a run uses it, and a
// total; a host that could not be asked is named.
std::string format_gc_hosts(const std::vector<HostGc>& hosts, bool dry_run);

}  // namespace mltrain::supervise
