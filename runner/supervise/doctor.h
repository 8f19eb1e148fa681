// `mltrain doctor`: checks every host of a job (or hostfile) the way a run would use it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/protocol/protocol.h"
#include "runner/supervise/supervisor.h"

namespace mltrain::supervise {

struct HostReport {
  std::string host;
  bool ok = false;
  std::string stage;                         // where it failed: connect, host key, auth, agent ("" when ok)
  std::string problem;                       // one line
  std::map<std::string, std::string> facts;  // arch, glibc, gpus, gpu_source, nccl, python3, torch, port_free
  std::vector<agent::Gpu> gpus;              // the host's GPUs, as its agent found them
  double clock_offset_ms = 0;
  double rtt_ms = 0;
};

// Connects to every host in parallel (the gang's connecting phase) and asks its agent for facts
// (a ping for the round trip, then a probe); master_port: the port to test on the first host (0:
// none). Fills one report per host and returns 0, or 128 + the signal that cut it short.
int run_doctor(plan::Plan& plan, const Options& opts, const TransportFor& transport_for, int master_port,
               std::vector<HostReport>& reports);

// A table for people, or JSON.
std::string format_doctor(const std::vector<HostReport>& reports, bool json);

}  // namespace mltrain::supervise
