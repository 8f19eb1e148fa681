#include "runner/agent/gpu_inventory.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "knobs/gpu_library.h"
#include "runner/agent/preflight.h"

namespace mltrain::agent {
namespace {

constexpr int kNvidiaSmiTimeoutMs = 10000;
constexpr size_t kNvidiaSmiMaxOutput = 64 * 1024;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string trim(std::string s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// The NVML ABI mltrain uses (nvml.h; declared here so the agent builds without it).
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_DRIVER_NOT_LOADED = 9;
constexpr unsigned kNvmlNameSize = 96;    // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlUuidSize = 96;    // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kNvmlDriverSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

struct Nvml {
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*mig)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
  const char* (*error)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driver)(char*, unsigned) = nullptr;

  std::string what(nvmlReturn_t r) const {
    const char* s = error ? error(r) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(r);
  }
};

template <class F>
bool bind(void* lib, F& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (!fn && missing.empty()) missing = name;
  return fn != nullptr;
}

// True when NVML answered (whatever it counted); else `why` and `no_driver` say what happened.
bool probe_nvml(const std::string& library, GpuInventory& inv, std::vector<std::string>& why,
                bool& no_driver) {
  const bool named = !library.empty();
  knobs::LoadedLibrary found = knobs::load_library(knobs::GpuLibrary::nvml, library);
  const std::string lib_name = named ? library : found.handle ? found.file : std::string(kDefaultNvmlLibrary);
  void* lib = found.handle;
  if (!lib) {
    std::string err = found.error.empty() ? "unknown error" : found.error;
    if (!named) {
      why.push_back(lib_name + " not found");
    } else {
      // dlerror() starts with the path; say where the path came from instead.
      if (err.compare(0, lib_name.size() + 2, lib_name + ": ") == 0) err.erase(0, lib_name.size() + 2);
      why.push_back("MLTRAIN_NVML_LIBRARY=" + lib_name + ": " + err);
      no_driver = false;
    }
    return false;
  }
  inv.library = found.found_text();
  Nvml n;
  std::string missing;
  bind(lib, n.error, "nvmlErrorString", missing);
  bool ok = bind(lib, n.init, "nvmlInit_v2", missing) && bind(lib, n.shutdown, "nvmlShutdown", missing) &&
            bind(lib, n.count, "nvmlDeviceGetCount_v2", missing) &&
            bind(lib, n.handle, "nvmlDeviceGetHandleByIndex_v2", missing);
  bind(lib, n.name, "nvmlDeviceGetName", missing);
  bind(lib, n.uuid, "nvmlDeviceGetUUID", missing);
  bind(lib, n.memory, "nvmlDeviceGetMemoryInfo", missing);
  bind(lib, n.mig, "nvmlDeviceGetMigMode", missing);
  bind(lib, n.driver, "nvmlSystemGetDriverVersion", missing);
  if (!ok) {
    why.push_back(lib_name + " lacks " + missing);
    no_driver = false;
    ::dlclose(lib);
    return false;
  }
  if (nvmlReturn_t r = n.init(); r != NVML_SUCCESS) {
    why.push_back("nvmlInit: " + n.what(r));
    if (r != NVML_ERROR_DRIVER_NOT_LOADED) no_driver = false;
    ::dlclose(lib);
    return false;
  }
  inv.source = "nvml";
  std::vector<std::string> errors;
  if (n.driver) {
    char buf[kNvmlDriverSize] = {};
    if (n.driver(buf, sizeof buf) == NVML_SUCCESS) inv.driver_version = buf;
  }
  unsigned count = 0;
  if (nvmlReturn_t r = n.count(&count); r != NVML_SUCCESS) {
    errors.push_back("nvmlDeviceGetCount: " + n.what(r));
    count = 0;
  }
  for (unsigned i = 0; i < count && i < 1024; ++i) {
    nvmlDevice_t dev = nullptr;
    if (nvmlReturn_t r = n.handle(i, &dev); r != NVML_SUCCESS) {
      errors.push_back("GPU " + std::to_string(i) + ": " + n.what(r));
      continue;
    }
    Gpu g;
    g.index = int32_t(i);
    char buf[kNvmlNameSize > kNvmlUuidSize ? kNvmlNameSize : kNvmlUuidSize] = {};
    if (n.name && n.name(dev, buf, kNvmlNameSize) == NVML_SUCCESS) g.name = buf;
    buf[0] = 0;
    if (n.uuid && n.uuid(dev, buf, kNvmlUuidSize) == NVML_SUCCESS) g.uuid = buf;
    nvmlMemory_t mem{};
    if (n.memory && n.memory(dev, &mem) == NVML_SUCCESS) g.memory_mib = mem.total >> 20;
    unsigned current = 0, pending = 0;
    if (n.mig) {
      nvmlReturn_t r = n.mig(dev, &current, &pending);
      g.mig = r == NVML_SUCCESS ? (current ? 1 : 0) : r == NVML_ERROR_NOT_SUPPORTED ? 0 : -1;
    }
    inv.gpus.push_back(std::move(g));
  }
  if (count == 0 && errors.empty()) errors.push_back("NVML lists no GPU");
  inv.note = join(errors, "; ");
  n.shutdown();
  ::dlclose(lib);
  return true;
}

int64_t monotonic_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Runs `program -L` with stdout and stderr into one pipe, for at most kNvidiaSmiTimeoutMs.
// Returns the wait status (-1: could not run, -2: timed out) and fills `out`.
int run_list(const std::string& program, std::string& out) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  const char* argv[] = {program.c_str(), "-L", nullptr};
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return -1;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);  // the agent blocks some for its signalfd
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::execv(argv[0], const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(fds[1]);
  int64_t deadline = monotonic_ms() + kNvidiaSmiTimeoutMs;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    int64_t left = deadline - monotonic_ms();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = ::poll(&p, 1, int(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      timed_out = r == 0;
      break;
    }
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (out.size() < kNvidiaSmiMaxOutput) out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return timed_out ? -2 : status;
}

std::string first_line(const std::string& text) {
  std::string line = trim(text.substr(0, text.find('\n')));
  return line.size() > 200 ? line.substr(0, 200) + "..." : line;
}

bool probe_nvidia_smi(const std::string& path, GpuInventory& inv, std::vector<std::string>& why,
                      bool& no_driver) {
  std::string program;
  auto fs = real_file_system();
  for (const auto& candidate : program_candidates("nvidia-smi", "", path))
    if (fs.is_executable_file(candidate)) {
      program = candidate;
      break;
    }
  if (program.empty()) {
    why.push_back("nvidia-smi not in PATH");
    return false;
  }
  std::string out;
  int status = run_list(program, out);
  if (status == -1) {
    why.push_back("cannot run " + program + ": " + std::strerror(errno));
    no_driver = false;
    return false;
  }
  if (status == -2) {
    why.push_back(program + " -L did not answer within " + std::to_string(kNvidiaSmiTimeoutMs / 1000) + " s");
    no_driver = false;
    return false;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::vector<Gpu> gpus = code == 0 ? parse_nvidia_smi_list(out) : std::vector<Gpu>{};
  if (gpus.empty()) {
    std::string said = first_line(out);
    // Exit 9 is nvidia-smi's "couldn't communicate with the NVIDIA driver".
    if (code != 9) no_driver = false;
    why.push_back("nvidia-smi -L " +
                  (code == 0 ? std::string("lists no GPU") : "exit " + std::to_string(code)) +
                  (said.empty() ? "" : " (" + said + ")"));
    return false;
  }
  inv.source = "nvidia-smi";
  inv.gpus = std::move(gpus);
  return true;
}

}  // namespace

std::vector<Gpu> parse_nvidia_smi_list(const std::string& text) {
  std::vector<Gpu> gpus;
  size_t start = 0;
  bool in_gpu = false;  // the lines after a GPU line belong to it
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string line = trim(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (line.compare(0, 4, "MIG ") == 0 || line.compare(0, 4, "MIG\t") == 0) {
      if (in_gpu && line.find("Device") != std::string::npos) gpus.back().mig = 1;
      continue;
    }
    // "GPU <index>: <name> (UUID: <uuid>)", spaces around each part tolerated.
    if (line.compare(0, 3, "GPU") != 0 || line.size() < 5 || !is_space(line[3])) {
      in_gpu = false;
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) {
      in_gpu = false;
      continue;
    }
    std::string index = trim(line.substr(3, colon - 3));
    if (!all_digits(index)) {
      in_gpu = false;
      continue;
    }
    Gpu g;
    g.index = std::stoi(index);
    std::string rest = trim(line.substr(colon + 1));
    // The last "(" opening "UUID:" (a name may hold parentheses of its own).
    for (size_t open = rest.rfind('('); open != std::string::npos;
         open = open ? rest.rfind('(', open - 1) : std::string::npos) {
      std::string inside = trim(rest.substr(open + 1));
      if (inside.compare(0, 4, "UUID") != 0) continue;
      inside = trim(inside.substr(4));
      if (inside.empty() || inside[0] != ':') continue;
      size_t close = inside.rfind(')');
      g.uuid = trim(inside.substr(1, close == std::string::npos ? std::string::npos : close - 1));
      rest = trim(rest.substr(0, open));
      break;
    }
    g.name = rest;
    g.memory_mib = 0;
    g.mig = -1;
    gpus.push_back(std::move(g));
    in_gpu = true;
  }
  return gpus;
}

std::vector<int> visible_gpus(const GpuInventory& inventory,
                              const std::optional<std::string>& cuda_visible_devices) {
  std::vector<int> out;
  if (!cuda_visible_devices) {
    for (const auto& g : inventory.gpus) out.push_back(g.index);
    return out;
  }
  const std::string& list = *cuda_visible_devices;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string entry =
        trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? list.size() + 1 : comma + 1;
    int found = -1;
    if (all_digits(entry)) {
      int want = std::stoi(entry);
      for (const auto& g : inventory.gpus)
        if (g.index == want) found = want;
    } else if (lower(entry).compare(0, 4, "gpu-") == 0) {
      int matches = 0;
      for (const auto& g : inventory.gpus)
        if (lower(g.uuid).compare(0, entry.size(), lower(entry)) == 0) {
          found = g.index;
          ++matches;
        }
      if (matches != 1) found = -1;  // unknown, or a prefix of several
    }
    bool repeated = false;
    for (int i : out) repeated = repeated || i == found;
    if (found < 0 || repeated) break;  // CUDA ignores this entry and every one after it
    out.push_back(found);
  }
  return out;
}

GpuInventory probe_gpus(const std::string& nvml_library, const std::string& path) {
  GpuInventory inv;
  std::vector<std::string> why;
  bool no_driver = true;  // every way failed for want of the driver itself
  if (probe_nvml(nvml_library, inv, why, no_driver)) return inv;
  if (probe_nvidia_smi(path, inv, why, no_driver)) {
    inv.note = join(why, ", ");  // why NVML was not used
    return inv;
  }
  inv.source.clear();
  inv.note = std::string(no_driver ? "no NVIDIA driver: " : "no GPU found: ") + join(why, ", ");
  return inv;
}

}  // namespace mltrain::agent
