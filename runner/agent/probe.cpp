// What `mltrain doctor` learns about a host.
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "knobs/gpu_library.h"
#include "knobs/registry.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/agent/preflight.h"
#include "runner/protocol/protocol.h"

namespace mltrain::agent::detail {
namespace {

std::string cudart_library_for() { return knobs::get_string("MLTRAIN_CUDART_LIBRARY"); }

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

// The file a rank in `workdir` would run for `name` (a path, or a name in `path`), or "".
std::string find_program(const std::string& name, const std::string& workdir, const std::string& path) {
  auto fs = real_file_system();
  for (const auto& candidate : program_candidates(name, workdir, path))
    if (fs.is_executable_file(candidate)) return candidate;
  return {};
}

// Why `name` is not found as find_program looks for it.
std::string not_found(const std::string& name, const std::string& workdir, const std::string& path) {
  if (name.find('/') == std::string::npos) return "not found in PATH (" + path + ")";
  std::string file = program_candidates(name, workdir, path).at(0);
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    return file + (::lstat(file.c_str(), &st) == 0 ? " is a link to nothing" : " does not exist");
  return file + (S_ISREG(st.st_mode) ? " is not executable" : " is not a file");
}

// The interpreter a script's "#!" line names when it is a python ("#!/opt/venv/bin/python3",
// "#!/usr/bin/env python3"), else "": for a job that runs torchrun or accelerate.
std::string python_of_script(const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) return {};
  char buf[256] = {};
  bool got = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string line = got ? buf : "";
  if (line.rfind("#!", 0) != 0) return {};
  std::vector<std::string> words;
  size_t i = 2;
  while (i < line.size()) {
    size_t j = line.find_first_of(" \t\r\n", i);
    if (j == std::string::npos) j = line.size();
    if (j > i) words.push_back(line.substr(i, j - i));
    i = j + 1;
  }
  if (words.size() >= 2 && basename_of(words[0]) == "env") words.erase(words.begin());
  while (!words.empty() && words[0].rfind('-', 0) == 0) words.erase(words.begin());  // env -S
  if (words.empty() || basename_of(words[0]).rfind("python", 0) != 0) return {};
  return words[0];
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
  GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), ranks_path(m.path));
  facts.push_back("gpus=" + std::to_string(inv.gpus.size()));
  facts.push_back("gpu_source=" + inv.source);
  if (!inv.driver_version.empty()) facts.push_back("gpu_driver=" + inv.driver_version);
  if (!inv.note.empty()) facts.push_back("gpu_note=" + inv.note);
  if (auto visible = cuda_visible_devices_for(m.has_cuda_visible_devices, m.cuda_visible_devices,
                                              env_.get("CUDA_VISIBLE_DEVICES"))) {
    facts.push_back("cuda_visible_devices=" + *visible);
    facts.push_back("gpus_usable=" + std::to_string(visible_gpus(inv, visible).size()));
  }
  if (!inv.library.empty()) facts.push_back("nvml_library=" + inv.library);
  // The interpreter the job would run, as its ranks would find it: its program when that is a
  // python, or the python a script's #! line names, looked up from the ranks' folder in the PATH
  // the ranks get (as the agent's preflight does), not the agent's own; else python3 in that PATH.
  std::string path = ranks_path(m.path);
  std::string workdir = expand_home(m.workdir);
  std::string want = m.python, from = "the job's program", python;
  if (want.empty() && !m.program.empty())
    if (std::string script = find_program(expand_home(m.program), workdir, path); !script.empty())
      if (want = python_of_script(script); !want.empty()) from = "the #! line of " + script;
  if (!want.empty()) {
    python = find_program(expand_home(want), workdir, path);
    facts.push_back("python_from=" + from);
    if (python.empty())
      facts.push_back("python_missing=" + want + ": " + not_found(expand_home(want), workdir, path));
  } else {
    want = "python3";
    python = python_for(want, path);
    facts.push_back("python_from=python3 in the ranks' PATH (the job's program is not a python)");
  }
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
  facts.push_back("python=" + (python.empty()
                                   ? want + " (" + not_found(expand_home(want), workdir, path) + ")"
                                   : python));
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
