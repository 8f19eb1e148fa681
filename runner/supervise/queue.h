// `mltrain queue`: every lease on a job's hosts (all users'), their GPUs and who waits for them
// (docs/sharing.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/protocol/protocol.h"
#include "runner/supervise/supervisor.h"

namespace mltrain::supervise {

struct HostLeases {
  std::string host;
  bool ok = false;
  std::string problem;  // why it could not be asked (one line)
  agent::msg::LeaseList list;
};

// Connects to every host in parallel and asks its agent for the leases of `space` ("" the hosts'
// own) and its GPUs (through `nvml_library`, "" the host's). Fills one entry per host and returns
// 0, or 128 + the signal that cut it short.
int run_queue(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
              const std::string& space, const std::string& nvml_library, std::vector<HostLeases>& hosts);

// For people: each host's GPUs and who holds them, the jobs without GPUs, then the queue in its
// order; or JSON (docs/json.md). `now_unix`: for "since" (how long each has held or waited).
std::string format_queue(const std::vector<HostLeases>& hosts, bool json, int64_t now_unix);

}  // namespace mltrain::supervise
