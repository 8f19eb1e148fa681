// Preflight on this host, answered before any rank starts: the route to the master, free ports
// (and a fixed master port free), the workdir, the program. The checks themselves live in preflight.cpp.
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/preflight.h"
#include "runner/agent/protocol.h"

namespace mltrain::agent::detail {

void Agent::on(uint32_t id, const msg::Prepare& m) {
  const std::string& master = m.master_addr;
  msg::Prepared out;
  std::vector<std::string>& problems = out.problems;
  if (!master.empty()) {
    Route route = route_to(master);
    out.ifname = route.ifname;
    out.local_ip = route.local_ip;
    if (out.ifname.empty()) problems.push_back("no route to the master address " + master);
  }
  if (m.fixed_port && !tcp_port_free(m.fixed_port))
    problems.push_back("master_port " + std::to_string(m.fixed_port) +
                       " is already in use here (rank 0's host): set [comm] master_port to a free port, "
                       "or to \"auto\", or stop what listens on it");
  out.ports = reserve_free_ports(m.nports, problems);
  auto missing = check_workdir_and_program(m.workdir, m.argv0, effective_path(m.path, ::getenv("PATH")),
                                           real_file_system());
  out.cannot_start = missing.empty() ? 0 : 1;
  for (auto& p : missing) problems.push_back(std::move(p));
  send(out, id);
}

}  // namespace mltrain::agent::detail
