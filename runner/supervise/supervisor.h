// The supervisor: gang semantics over every host's agent. Connects and prepares every host before
// any rank starts; starts ranks; streams their output; on the first failure stops every rank on
// every host; restarts the gang while max_restarts allows; records the run.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/records/records.h"
#include "runner/supervise/output.h"
#include "runner/transport/transport.h"

namespace mltrain::supervise {

struct Options {
  std::chrono::milliseconds grace{5000};
  std::chrono::milliseconds timeout{0};  // 0: none
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  int max_restarts = 0;
  ConsoleOptions console;
  bool json_summary = false;  // print the summary as JSON on stdout
  int console_fd = 1;         // where ranks' stdout lines go
};

// Chooses the transport for a host (local child or SSH).
using TransportFor = std::function<transport::Transport&(const plan::HostPlan&)>;

// Runs the job to its end and returns mltrain's exit code (docs/exit-codes.md). The record is
// saved as the run goes (started, each restart, the end).
int run_job(plan::Plan& plan, records::RunRecord& record, const Options& opts, const TransportFor& transport_for);

}  // namespace mltrain::supervise
