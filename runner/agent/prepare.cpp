// Preflight on this host, answered before any rank starts: the route to the master, free ports
// (and a fixed master port free), the workdir, the program, and the GPUs when [gpus] asks for some.
// The checks themselves live in preflight.cpp and gpu_inventory.cpp.
#include <dlfcn.h>

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/nccl_probe.h"
#include "knobs/gpu_library.h"
#include "knobs/registry.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/agent/preflight.h"
#include "runner/protocol/protocol.h"

namespace mltrain::agent::detail {

std::string nvml_library_for(const std::string& job_value) {
  if (!job_value.empty()) return job_value;
  return knobs::get_string("MLTRAIN_NVML_LIBRARY");
}

std::optional<std::string> cuda_visible_devices_for(uint32_t job_sets_it, const std::string& job_value,
                                                    const std::optional<std::string>& own) {
  if (job_sets_it) return job_value;
  return own;
}

std::string nccl_library_for(const std::string& job_value) {
  if (!job_value.empty()) return job_value;
  return knobs::get_string("MLTRAIN_NCCL_LIBRARY");
}

std::string basename_of(const std::string& p) {
  auto slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string python_for(const std::string& want, const std::string& path) {
  auto fs = real_file_system();
  for (const auto& candidate : program_candidates(want.empty() ? std::string("python3") : want, "", path))
    if (fs.is_executable_file(candidate)) return candidate;
  return {};
}

// Why NCCL cannot serve a job that requires it here, or "" when it loads and is new enough: the
// comm library's own probe (comm/src/core/nccl_probe.h), so the names and the oldest version agree.
std::string nccl_problem(const std::string& job_value, const std::string& python, int& version) {
  const comm::detail::NcclProbe probe = comm::detail::probe_nccl(nccl_library_for(job_value), python);
  version = probe.version_known ? probe.version : 0;
  if (probe.handle == nullptr)
    return "[comm] backend = \"nccl\", but NCCL does not load here (" + probe.error +
           (probe.searched.empty() ? "" : "; looked in " + probe.searched) +
           "): install NCCL or set MLTRAIN_NCCL_LIBRARY in the job's env, or use backend = \"auto\" to fall "
           "back "
           "to the CPU backend";
  ::dlclose(probe.handle);
  if (!probe.version_known)
    return "[comm] backend = \"nccl\", but " + probe.file + " has no working ncclGetVersion";
  if (!probe.new_enough())
    return "[comm] backend = \"nccl\", but " + comm::detail::nccl_too_old(probe.version, probe.file);
  return {};
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
  auto missing =
      check_workdir_and_program(expand_home(m.workdir), m.argv0, ranks_path(m.path), real_file_system());
  out.cannot_start = missing.empty() ? 0 : 1;
  for (auto& p : missing) problems.push_back(std::move(p));
  int nccl_version = 0;
  if (m.nccl_required)
    if (std::string why =
            nccl_problem(m.nccl_library,
                         python_for(basename_of(m.argv0).rfind("python", 0) == 0 ? m.argv0 : std::string(),
                                    ranks_path(m.path)),
                         nccl_version);
        !why.empty())
      problems.push_back(std::move(why));
  // Forced NCCL without [gpus] asks for no GPU slots, but NCCL needs a GPU per rank: a host with
  // the library and no driver fails here, not in every rank's traceback.
  if (m.nccl_required && m.gpu_slots_needed == 0) {
    GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), ranks_path(m.path));
    if (inv.gpus.empty())
      problems.push_back("[comm] backend = \"nccl\" needs a GPU per rank, and this host has none (" +
                         inv.note +
                         "); use backend = \"auto\" to fall back to the CPU backend, or run on GPU hosts");
  }
  // GPUs only when the job asks for some: a CPU job pays nothing. Whether there are enough is the
  // launcher's call, which knows what [gpus] asked.
  std::set<int> busy_gpus;
  std::optional<GpuInventory> taken;
  if (m.gpu_slots_needed > 0) {
    GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), ranks_path(m.path));
    taken = inv;
    busy_gpus.insert(inv.busy.begin(), inv.busy.end());
    std::optional<std::string> visible = cuda_visible_devices_for(
        m.has_cuda_visible_devices, m.cuda_visible_devices, env_.get("CUDA_VISIBLE_DEVICES"));
    for (int i : visible_gpus(inv, visible)) out.gpu_usable.push_back(i);
    out.gpus = std::move(inv.gpus);
    out.gpu_source = inv.source;
    out.gpu_note = inv.note;
    out.has_cuda_visible_devices = visible ? 1 : 0;
    out.cuda_visible_devices = visible.value_or("");
  }
  // What a claim may take of them (Claim, claim.cpp): the usable ones, and whether a process
  // computed on each when they were listed (NVML is not asked again: on a slow driver its start
  // alone may outlast the launcher's patience).
  claimable_gpus_.clear();
  for (int i : out.gpu_usable)
    for (const auto& g : out.gpus)
      if (g.index == i) claimable_gpus_.push_back({i, g.uuid, busy_gpus.count(i) > 0});
  if (m.facts) out.facts = host_facts(m, taken ? &*taken : nullptr, nccl_version);
  // Servers last, and only when every check passed: a host that fails preflight serves nothing.
  if (problems.empty()) start_ps(m, out);
  send(out, id);
}

}  // namespace mltrain::agent::detail
