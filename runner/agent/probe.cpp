// What `mltrain doctor` learns about a host.
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "knobs/gpu_library.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/agent/preflight.h"
#include "runner/agent/protocol.h"

namespace mltrain::agent::detail {
namespace {

std::string cudart_library_for() {
  const char* own = ::getenv("MLTRAIN_CUDART_LIBRARY");
  return own ? own : "";
}

}  // namespace

namespace {

// First line a command prints, or "" (for doctor's version checks; bounded by `timeout`).
std::string first_line(const std::string& cmd) {
  FILE* p = ::popen(("timeout 20 " + cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return {};
  char buf[512] = {};
  std::string out;
  if (std::fgets(buf, sizeof buf, p)) out = buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// `s` as one word for /bin/sh.
std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

// What `mltrain doctor` reports about this host.
void Agent::on(uint32_t id, const msg::Probe& m) {
  int port = int(m.port);
  std::vector<std::string> facts;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);  // first, before the slow checks below
  facts.push_back("time_ms=" + std::to_string(int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000));
  utsname u{};
  ::uname(&u);
  facts.push_back(std::string("arch=") + u.machine);
  facts.push_back(std::string("kernel=") + u.release);
  facts.push_back(std::string("glibc=") + gnu_get_libc_version());
  // GPUs as a run's preflight would find them (the job's NVML library, the ranks' PATH).
  GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), effective_path(m.path, ::getenv("PATH")));
  facts.push_back("gpus=" + std::to_string(inv.gpus.size()));
  facts.push_back("gpu_source=" + inv.source);
  if (!inv.driver_version.empty()) facts.push_back("gpu_driver=" + inv.driver_version);
  if (!inv.note.empty()) facts.push_back("gpu_note=" + inv.note);
  if (auto visible = cuda_visible_devices_for(m.has_cuda_visible_devices, m.cuda_visible_devices)) {
    facts.push_back("cuda_visible_devices=" + *visible);
    facts.push_back("gpus_usable=" + std::to_string(visible_gpus(inv, visible).size()));
  }
  if (!inv.library.empty()) facts.push_back("nvml_library=" + inv.library);
  // The interpreter the job would run: the spec's python program, else python3, looked up in the
  // PATH the ranks get (as the agent's preflight does), not the agent's own.
  std::string path = effective_path(m.path, ::getenv("PATH"));
  std::string want = m.python.empty() ? std::string("python3") : m.python;
  std::string python = python_for(want, path);
  // NCCL and cudart where a rank of the job would find them (knobs/gpu_library.h), and which file.
  std::string nccl = "not found";
  knobs::LoadedLibrary found =
      knobs::load_library(knobs::GpuLibrary::nccl, nccl_library_for(""), python, RTLD_LAZY | RTLD_LOCAL);
  if (void* h = found.handle) {
    using GetVersion = int (*)(int*);
    int v = 0;
    if (auto fn = reinterpret_cast<GetVersion>(::dlsym(h, "ncclGetVersion")); fn && fn(&v) == 0)
      nccl = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
    else
      nccl = "found";
    ::dlclose(h);
    facts.push_back("nccl_library=" + found.found_text());
  }
  facts.push_back("nccl=" + nccl);
  knobs::LoadedLibrary cudart =
      knobs::load_library(knobs::GpuLibrary::cudart, cudart_library_for(), python, RTLD_LAZY | RTLD_LOCAL);
  if (cudart.handle) {
    facts.push_back("cudart_library=" + cudart.found_text());
    ::dlclose(cudart.handle);
  }
  facts.push_back("python=" + (python.empty() ? want + " (not found in PATH " + path + ")" : python));
  std::string py = python.empty() ? std::string() : first_line(quote(python) + " --version");
  facts.push_back("python3=" + (py.rfind("Python ", 0) == 0 ? py.substr(7) : std::string("not found")));
  std::string torch = python.empty()
                          ? std::string()
                          : first_line(quote(python) + " -c 'import torch; print(torch.__version__)'");
  facts.push_back("torch=" + (torch.empty() ? std::string("not found") : torch));
  if (port > 0) facts.push_back(std::string("port_free=") + (tcp_port_free(uint32_t(port)) ? "yes" : "no"));
  send(msg::Probed{facts, std::move(inv.gpus)}, id);
}

}  // namespace mltrain::agent::detail
