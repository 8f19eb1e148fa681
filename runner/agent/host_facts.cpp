// What a run records of each host (docs/records.md, "Environment"): the OS, kernel, C library, the
// GPUs' driver and CUDA when the job has GPUs, NCCL when it was loaded, the job's Python and torch,
// and this agent's own version. Cheap: files and uname, and the Python's versions from a cache
// kept in the user's ~/.cache/mltrain, asked of the interpreter again only when it or a folder on
// its sys.path changed (a pip install changes the folder).
#include <fcntl.h>
#include <gnu/libc-version.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "config.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/gpu/run_tool.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/beneath.h"

namespace mltrain::agent::detail {

namespace {

constexpr int kPythonTimeoutMs = 5000;
constexpr size_t kMaxFact = 200;

// Prints its version, torch's (from its dist-info or egg-info folder: nothing is imported), then
// the folders on its sys.path.
const char* const kPythonScript = R"(import os, sys
print(sys.version.split()[0])
t = ""
for d in sys.path:
    try:
        names = [] if t else os.listdir(d or ".")
    except OSError:
        continue
    for n in names:
        if n.startswith("torch-") and n.endswith((".dist-info", ".egg-info")):
            t = n[6:].rsplit(".", 1)[0].split("-py")[0]
            break
print(t)
for d in sys.path:
    if d and os.path.isdir(d):
        print(d)
)";

// A file's first `max` bytes, never through a link ("" when it cannot be read).
std::string read_small(const std::string& path, size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return {};
  std::string out(max, '\0');
  ssize_t n = ::read(fd, out.data(), max);
  ::close(fd);
  out.resize(n > 0 ? size_t(n) : 0);
  return out;
}

std::string os_name() {
  // /etc/os-release is usually a link to /usr/lib/os-release: read the target.
  std::string text = read_small("/usr/lib/os-release", 16384);
  if (text.empty()) text = read_small("/etc/os-release", 16384);
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.rfind("PRETTY_NAME=", 0) != 0) continue;
    std::string v = line.substr(12);
    if (v.size() >= 2 && (v[0] == '"' || v[0] == '\'') && v.back() == v[0]) v = v.substr(1, v.size() - 2);
    return v;
  }
  return {};
}

std::string stamp_of(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "-";
  return std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
         std::to_string(int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// The cache: "python <stamp>", then "dir <stamp> <path>" per sys.path folder, then "version V"
// and "torch T". Valid while every stamp is what it was.
bool from_cache(const std::string& text, const std::string& python, std::string& version,
                std::string& torch) {
  bool python_seen = false;
  for (const auto& l : lines_of(text)) {
    const size_t sp = l.find(' ');
    if (sp == std::string::npos) continue;
    const std::string key = l.substr(0, sp), rest = l.substr(sp + 1);
    if (key == "python") {
      if (rest != stamp_of(python)) return false;
      python_seen = true;
    } else if (key == "dir") {
      const size_t sp2 = rest.find(' ');
      if (sp2 == std::string::npos || rest.substr(0, sp2) != stamp_of(rest.substr(sp2 + 1))) return false;
    } else if (key == "version") {
      version = rest;
    } else if (key == "torch") {
      torch = rest;
    }
  }
  return python_seen && !version.empty();
}

// Writes through a temporary name in `dir` (made 0700 when missing); best effort.
void write_cache(const std::string& dir, const std::string& name, const std::string& text) {
  ::mkdir(dir.c_str(), 0700);
  std::string error;
  (void)sync::write_atomically(AT_FDCWD, dir + "/" + name, text, 0600, false, error);
}

std::string hex16(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: a file name, not a secret
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)h);
  return buf;
}

}  // namespace

void Agent::python_facts(const std::string& python, std::vector<std::string>& facts) {
  std::string version, torch;
  const std::optional<std::string> home = env_.get("HOME");
  const std::string dir = home && !home->empty() ? *home + "/.cache/mltrain/python-facts" : std::string();
  const std::string name = hex16(python);
  if (dir.empty() || !from_cache(read_small(dir + "/" + name, 65536), python, version, torch)) {
    const char* argv[] = {python.c_str(), "-c", kPythonScript, nullptr};
    std::string out;
    const int status = gpu::run_tool(argv, kPythonTimeoutMs, 65536, out);
    if (gpu::tool_exit_code(status) != 0) {
      facts.push_back("python=" + python + " (did not answer)");
      return;
    }
    const std::vector<std::string> lines = lines_of(out);
    if (lines.size() < 2 || lines[0].empty()) return;
    version = lines[0], torch = lines[1];
    std::string cache = "python " + stamp_of(python) + "\n";
    for (size_t i = 2; i < lines.size(); ++i)
      if (!lines[i].empty() && lines[i][0] == '/')
        cache += "dir " + stamp_of(lines[i]) + " " + lines[i] + "\n";
    cache += "version " + version + "\ntorch " + torch + "\n";
    if (!dir.empty()) {
      ::mkdir((*home + "/.cache").c_str(), 0700);
      ::mkdir((*home + "/.cache/mltrain").c_str(), 0700);
      write_cache(dir, name, cache);
    }
  }
  facts.push_back("python=" + version + " (" + python + ")");
  facts.push_back("torch=" + (torch.empty() ? std::string("-") : torch));
}

std::vector<std::string> Agent::host_facts(const msg::Prepare& m, const GpuInventory* gpus,
                                           int nccl_version) {
  std::vector<std::string> facts;
  if (std::string os = os_name(); !os.empty()) facts.push_back("os=" + os);
  struct utsname u;
  if (::uname(&u) == 0) {
    facts.push_back(std::string("kernel=") + u.release);
    facts.push_back(std::string("arch=") + u.machine);
  }
  facts.push_back(std::string("glibc=") + gnu_get_libc_version());
  facts.push_back("cpus=" + std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)));
  if (gpus && !gpus->gpus.empty()) {
    // "8 x NVIDIA H100 80GB HBM3", or each model with its count when they differ.
    std::vector<std::pair<std::string, int>> models;
    for (const auto& g : gpus->gpus) {
      auto it = std::find_if(models.begin(), models.end(), [&](const auto& p) { return p.first == g.name; });
      if (it == models.end())
        models.emplace_back(g.name, 1);
      else
        ++it->second;
    }
    std::string text;
    for (const auto& [model, n] : models)
      text += (text.empty() ? "" : ", ") + std::to_string(n) + " x " + model;
    facts.push_back("gpus=" + text);
    if (!gpus->driver_version.empty()) facts.push_back("gpu_driver=" + gpus->driver_version);
    if (!gpus->cuda_version.empty()) facts.push_back("cuda=" + gpus->cuda_version);
  }
  if (nccl_version > 0)
    facts.push_back("nccl=" + std::to_string(nccl_version / 10000) + "." +
                    std::to_string(nccl_version / 100 % 100) + "." + std::to_string(nccl_version % 100));
  const std::string program = basename_of(m.argv0).rfind("python", 0) == 0 ? m.argv0 : std::string();
  if (!m.argv0.empty()) {
    const std::string python = python_for(program, ranks_path(m.path));
    if (!python.empty()) python_facts(python, facts);
  }
  facts.push_back(std::string("mltrain=") + MLTRAIN_VERSION + " (" + MLTRAIN_GIT_COMMIT + ")");
  for (auto& f : facts)
    if (f.size() > kMaxFact) f.resize(kMaxFact);
  return facts;
}

}  // namespace mltrain::agent::detail
