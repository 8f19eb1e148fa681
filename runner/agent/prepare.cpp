// Preflight on this host, answered before any rank starts: the route to the master, free ports
// (and a fixed master port free), the workdir, the program, and the GPUs when [gpus] asks for some.
// The checks themselves live in preflight.cpp and gpu_inventory.cpp.
#include <cstdlib>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/agent/preflight.h"
#include "runner/agent/protocol.h"

namespace mltrain::agent::detail {

std::string nvml_library_for(const std::string& job_value) {
  if (!job_value.empty()) return job_value;
  const char* own = ::getenv("MLTRAIN_NVML_LIBRARY");
  return own ? own : "";
}

std::optional<std::string> cuda_visible_devices_for(uint32_t job_sets_it, const std::string& job_value) {
  if (job_sets_it) return job_value;
  const char* own = ::getenv("CUDA_VISIBLE_DEVICES");
  return own ? std::optional<std::string>(own) : std::nullopt;
}

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
  // GPUs only when the job asks for some: a CPU job pays nothing. Whether there are enough is the
  // launcher's call, which knows what [gpus] asked.
  if (m.gpu_slots_needed > 0) {
    GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), effective_path(m.path, ::getenv("PATH")));
    std::optional<std::string> visible =
        cuda_visible_devices_for(m.has_cuda_visible_devices, m.cuda_visible_devices);
    for (int i : visible_gpus(inv, visible)) out.gpu_usable.push_back(i);
    out.gpus = std::move(inv.gpus);
    out.gpu_source = inv.source;
    out.gpu_note = inv.note;
    out.has_cuda_visible_devices = visible ? 1 : 0;
    out.cuda_visible_devices = visible.value_or("");
  }
  send(out, id);
}

}  // namespace mltrain::agent::detail
