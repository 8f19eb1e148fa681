// `mltrain doctor`: checks every host of a job (or hostfile) the way a run would use it.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/supervise/supervisor.h"

namespace mltrain::supervise {

struct HostReport {
  std::string host;
  bool ok = false;
  std::string stage;                         // where it failed: connect, host key, auth, agent ("" when ok)
  std::string problem;                       // one line
  std::map<std::string, std::string> facts;  // arch, glibc, gpus, nccl, python3, torch, port_free
  double clock_offset_ms = 0;
  double rtt_ms = 0;
};

// Connects to every host in parallel and asks its agent for facts. master_port: the port to
// test on the first host (0: none).
std::vector<HostReport> run_doctor(const std::vector<plan::HostPlan>& hosts,
                                   const TransportFor& transport_for, int master_port);

// A table for people, or JSON.
std::string format_doctor(const std::vector<HostReport>& reports, bool json);

}  // namespace mltrain::supervise
