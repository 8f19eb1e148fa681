// Preflight on this host, answered before any rank starts: the route to the master, free ports,
// the workdir, the program. The checks themselves live in preflight.cpp.
#include <cstdlib>
#include <utility>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/preflight.h"
#include "runner/agent/protocol.h"

namespace mltrain::agent::detail {

void Agent::prepare(const Frame& f) {
  Reader rd(f.payload);
  std::string master = rd.str();
  uint32_t nports = rd.u32();
  std::string workdir = rd.str();
  std::string argv0 = rd.str();
  std::string path = rd.str();
  std::vector<std::string> problems;
  std::string ifname, local_ip;
  if (!master.empty()) {
    Route route = route_to(master);
    ifname = route.ifname;
    local_ip = route.local_ip;
    if (ifname.empty()) problems.push_back("no route to the master address " + master);
  }
  std::vector<std::string> ports = reserve_free_ports(nports, problems);
  for (auto& p : check_workdir_and_program(workdir, argv0, effective_path(path, ::getenv("PATH")),
                                           real_file_system()))
    problems.push_back(std::move(p));
  send(Type::prepared, f.id, Writer().str(ifname).str(local_ip).strings(ports).strings(problems).take());
}

}  // namespace mltrain::agent::detail
