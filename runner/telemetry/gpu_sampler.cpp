// GpuSampler: NVML loaded with dlopen, else nvidia-smi's CSV queries, else nothing with a reason.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstring>

#include "knobs/gpu_library.h"
#include "runner/telemetry/detail/reuse.h"
#include "runner/telemetry/detail/text.h"
#include "runner/telemetry/sampler.h"

extern char** environ;

namespace mltrain::telemetry {
namespace {

// The NVML ABI (nvml.h, NVML API reference), declared here: no NVML header is needed to build.
using nvmlReturn_t = int;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // used includes what the driver reserves
};
// nvmlMemory_v2_t (R510 and later): used no longer counts the reserved part, as nvidia-smi shows it.
struct nvmlMemory_v2_t {
  unsigned int version;  // nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2)
  unsigned long long total, reserved, free, used;
};
constexpr unsigned kNvmlMemoryV2 = unsigned(sizeof(nvmlMemory_v2_t)) | (2u << 24);
// nvmlProcessInfo_v1_t: what nvmlDeviceGetComputeRunningProcesses (v1) fills.
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
// nvmlProcessInfo_v2_t, also nvmlProcessInfo_t: what the _v2 and _v3 functions fill.
struct nvmlProcessInfo_v2_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
static_assert(sizeof(nvmlProcessInfo_v1_t) == 16 && sizeof(nvmlProcessInfo_v2_t) == 24, "NVML layouts");

constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
constexpr nvmlReturn_t NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25;
constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr int NVML_CLOCK_SM = 1;
constexpr unsigned long long NVML_VALUE_NOT_AVAILABLE = ~0ULL;  // usedGpuMemory unknown
constexpr unsigned kNvmlUuidSize = 96;                          // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kMaxGpus = 1024;

constexpr size_t kMaxSmiOutput = 256 * 1024;

struct Nvml {
  void* lib = nullptr;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  const char* (*error)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*memory_v2)(nvmlDevice_t, nvmlMemory_v2_t*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*power_limit)(nvmlDevice_t, unsigned*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned*) = nullptr;
  nvmlReturn_t (*event_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*throttle_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*procs_v2)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v2_t*) = nullptr;  // _v3, else _v2
  nvmlReturn_t (*procs_v1)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*) = nullptr;

  std::string what(nvmlReturn_t r) const {
    const char* s = error ? error(r) : nullptr;
    return s ? std::string(s) : "NVML error " + std::to_string(r);
  }
};

template <class F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
}

// `program` looked up in `path` as execvp would ("" = /usr/bin:/bin); "" when not found.
std::string find_in_path(const char* program, const std::string& path) {
  std::string_view rest = path.empty() ? std::string_view("/usr/bin:/bin") : std::string_view(path);
  bool done = false;
  std::string_view dir;
  while (detail::next_cell(rest, ':', dir, done)) {
    std::string candidate = dir.empty() ? std::string(".") : std::string(dir);
    candidate += '/';
    candidate += program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return {};
}

int64_t now_ms() { return monotonic_us() / 1000; }

// Runs argv (argv[0] a path) with stdout and stderr into `out` (replaced, capped), stdin from
// /dev/null, for at most timeout_ms. Returns the wait status; -1: could not start, -2: timed out.
int run_capture(const char* const* argv, int timeout_ms, std::string& out) {
  out.clear();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  ::posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  ::posix_spawnattr_init(&attr);
  // The agent blocks signals for its signalfd and may ignore SIGPIPE: the child gets neither.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, sig);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setsigdefault(&attr, &defaults);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, const_cast<char* const*>(argv), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    errno = rc;
    return -1;
  }
  const int64_t deadline = now_ms() + timeout_ms;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    int64_t left = deadline - now_ms();
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
    if (out.size() < kMaxSmiOutput) out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return timed_out ? -2 : status;
}

std::string first_line(std::string_view text) {
  std::string_view line = detail::trim(text.substr(0, text.find('\n')));
  return line.size() > 200 ? std::string(line.substr(0, 200)) + "..." : std::string(line);
}

}  // namespace

struct GpuSampler::Impl {
  GpuSamplerOptions opt;
  bool probed = false;
  std::string source;
  std::string note;
  std::string probe_note;  // what the per-sample note starts from

  Nvml nvml;
  std::vector<nvmlDevice_t> devices;
  std::vector<std::string> uuids;
  std::vector<nvmlProcessInfo_v2_t> procs_v2;
  std::vector<nvmlProcessInfo_v1_t> procs_v1;

  std::string smi;         // nvidia-smi's path once it answered
  std::string gpu_fields;  // kNvidiaSmiGpuFields plus the reasons field this driver knows
  std::string gpu_query;   // --query-gpu=<gpu_fields>
  std::string apps_query;  // --query-compute-apps=<kNvidiaSmiAppFields>
  std::string out;

  ~Impl() {
    if (nvml.lib) {
      nvml.shutdown();
      ::dlclose(nvml.lib);
    }
  }

  // True when NVML initialised; otherwise `why` says what happened.
  bool open_nvml(std::string& why) {
    const bool named = !opt.nvml_library.empty();
    knobs::LoadedLibrary found = knobs::load_library(knobs::GpuLibrary::nvml, opt.nvml_library);
    const std::string name = named ? opt.nvml_library : found.file;
    void* lib = found.handle;
    if (!lib) {
      why = named ? found.error
                  : std::string(knobs::library_default_name(knobs::GpuLibrary::nvml)) + " not found";
      return false;
    }
    Nvml n;
    n.lib = lib;
    bind(lib, n.init, "nvmlInit_v2");
    bind(lib, n.shutdown, "nvmlShutdown");
    bind(lib, n.count, "nvmlDeviceGetCount_v2");
    bind(lib, n.handle, "nvmlDeviceGetHandleByIndex_v2");
    bind(lib, n.error, "nvmlErrorString");
    if (!n.init || !n.shutdown || !n.count || !n.handle) {
      why = name + " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 or nvmlDeviceGetHandleByIndex_v2";
      ::dlclose(lib);
      return false;
    }
    if (nvmlReturn_t r = n.init(); r != NVML_SUCCESS) {
      why = "nvmlInit: " + n.what(r);
      ::dlclose(lib);
      return false;
    }
    bind(lib, n.uuid, "nvmlDeviceGetUUID");
    bind(lib, n.utilization, "nvmlDeviceGetUtilizationRates");
    bind(lib, n.memory, "nvmlDeviceGetMemoryInfo");
    bind(lib, n.memory_v2, "nvmlDeviceGetMemoryInfo_v2");
    bind(lib, n.power, "nvmlDeviceGetPowerUsage");
    bind(lib, n.power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    bind(lib, n.temperature, "nvmlDeviceGetTemperature");
    bind(lib, n.clock, "nvmlDeviceGetClockInfo");
    bind(lib, n.event_reasons, "nvmlDeviceGetCurrentClocksEventReasons");        // R535 and later
    bind(lib, n.throttle_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // deprecated name
    bind(lib, n.procs_v2, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!n.procs_v2) bind(lib, n.procs_v2, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!n.procs_v2) bind(lib, n.procs_v1, "nvmlDeviceGetComputeRunningProcesses");
    unsigned count = 0;
    if (nvmlReturn_t r = n.count(&count); r != NVML_SUCCESS) {
      why = "nvmlDeviceGetCount: " + n.what(r);
      n.shutdown();
      ::dlclose(lib);
      return false;
    }
    nvml = n;
    std::string errors;
    for (unsigned i = 0; i < count && i < kMaxGpus; ++i) {
      nvmlDevice_t dev = nullptr;
      if (nvmlReturn_t r = nvml.handle(i, &dev); r != NVML_SUCCESS) {
        errors += (errors.empty() ? "GPU " : "; GPU ") + std::to_string(i) + ": " + nvml.what(r);
        dev = nullptr;
      }
      char buf[kNvmlUuidSize] = {};
      if (dev && nvml.uuid && nvml.uuid(dev, buf, sizeof buf) != NVML_SUCCESS) buf[0] = 0;
      devices.push_back(dev);
      uuids.emplace_back(buf);
    }
    probe_note = count == 0 ? "NVML lists no GPU" : errors;
    procs_v2.resize(64);
    procs_v1.resize(64);
    return true;
  }

  void sample_nvml(std::vector<GpuSample>& gpus) {
    note.assign(probe_note);
    size_t n = 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      nvmlDevice_t dev = devices[i];
      if (!dev) continue;
      GpuSample& g = detail::row_at(gpus, n++);
      g.index = int32_t(i);
      g.uuid.assign(uuids[i]);
      unsigned v = 0;
      // Any error (NOT_SUPPORTED on a MIG-enabled GPU's utilization, NO_PERMISSION, ...) leaves
      // the field empty; a lost GPU is also named in the note.
      nvmlUtilization_t u{};
      if (nvml.utilization && nvml.utilization(dev, &u) == NVML_SUCCESS) g.util_percent = u.gpu;
      if (nvml.memory_v2 || nvml.memory) {
        nvmlReturn_t r = NVML_ERROR_NOT_SUPPORTED;
        if (nvml.memory_v2) {
          nvmlMemory_v2_t m{};
          m.version = kNvmlMemoryV2;
          r = nvml.memory_v2(dev, &m);
          if (r == NVML_SUCCESS) {
            g.mem_used_mib = m.used >> 20;
            g.mem_total_mib = m.total >> 20;
          } else if (r == NVML_ERROR_FUNCTION_NOT_FOUND || r == NVML_ERROR_ARGUMENT_VERSION_MISMATCH) {
            nvml.memory_v2 = nullptr;  // the driver predates the library: v1 from now on
          }
        }
        if (!nvml.memory_v2 && nvml.memory) {
          nvmlMemory_t m{};
          r = nvml.memory(dev, &m);
          if (r == NVML_SUCCESS) {
            g.mem_used_mib = m.used >> 20;
            g.mem_total_mib = m.total >> 20;
          }
        }
        if (r != NVML_SUCCESS && r != NVML_ERROR_NOT_SUPPORTED) {
          note += note.empty() ? "GPU " : "; GPU ";
          char num[12];
          note.append(num, std::to_chars(num, num + sizeof num, i).ptr);
          note += ": ";
          note += nvml.what(r);
        }
      }
      if (nvml.power && nvml.power(dev, &v) == NVML_SUCCESS) g.power_mw = v;
      if (nvml.power_limit && nvml.power_limit(dev, &v) == NVML_SUCCESS) g.power_limit_mw = v;
      if (nvml.temperature && nvml.temperature(dev, NVML_TEMPERATURE_GPU, &v) == NVML_SUCCESS)
        g.temperature_c = v;
      if (nvml.clock && nvml.clock(dev, NVML_CLOCK_SM, &v) == NVML_SUCCESS) g.sm_clock_mhz = v;
      unsigned long long reasons = 0;
      if (nvml.event_reasons) {
        nvmlReturn_t r = nvml.event_reasons(dev, &reasons);
        if (r == NVML_SUCCESS) g.throttle_reasons = reasons;
        if (r == NVML_ERROR_FUNCTION_NOT_FOUND)
          nvml.event_reasons = nullptr;  // a driver older than its library
      }
      if (!nvml.event_reasons && nvml.throttle_reasons &&
          nvml.throttle_reasons(dev, &reasons) == NVML_SUCCESS)
        g.throttle_reasons = reasons;
      sample_processes(dev, g);
    }
    gpus.resize(n);
  }

  // nvmlDeviceGetComputeRunningProcesses_v3/_v2 (v1 on old drivers) into g.processes; the buffer
  // grows once when more processes run than it holds.
  void sample_processes(nvmlDevice_t dev, GpuSample& g) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      unsigned count = 0;
      nvmlReturn_t r = NVML_ERROR_NOT_SUPPORTED;
      if (nvml.procs_v2) {
        count = unsigned(procs_v2.size());
        r = nvml.procs_v2(dev, &count, procs_v2.data());
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
          procs_v2.resize(size_t(count) + 16);
          continue;
        }
      } else if (nvml.procs_v1) {
        count = unsigned(procs_v1.size());
        r = nvml.procs_v1(dev, &count, procs_v1.data());
        if (r == NVML_ERROR_INSUFFICIENT_SIZE) {
          procs_v1.resize(size_t(count) + 16);
          continue;
        }
      }
      if (r != NVML_SUCCESS) return;
      for (unsigned j = 0; j < count; ++j) {
        unsigned long long used = nvml.procs_v2 ? procs_v2[j].usedGpuMemory : procs_v1[j].usedGpuMemory;
        GpuProcess p;
        p.pid = nvml.procs_v2 ? procs_v2[j].pid : procs_v1[j].pid;
        if (used != NVML_VALUE_NOT_AVAILABLE) p.used_mib = used >> 20;
        g.processes.push_back(p);
      }
      return;
    }
  }

  // Runs nvidia-smi with one --query argument. The exit status as run_capture returns it.
  int run_smi(const std::string& query) {
    const char* argv[] = {smi.c_str(), query.c_str(), "--format=csv,noheader,nounits", nullptr};
    return run_capture(argv, opt.nvidia_smi_timeout_ms, out);
  }

  static int exit_code(int status) {
    return status < 0 ? status : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  std::string failure(int status) const {
    if (status == -1) return "cannot run " + smi + ": " + std::strerror(errno);
    if (status == -2)
      return smi + " did not answer within " + std::to_string(opt.nvidia_smi_timeout_ms) + " ms";
    std::string said = first_line(out);
    return smi + " exit " + std::to_string(exit_code(status)) + (said.empty() ? "" : " (" + said + ")");
  }

  void set_reasons_field(const char* field) {
    gpu_fields.assign(kNvidiaSmiGpuFields);
    gpu_fields += ',';
    gpu_fields += field;
    gpu_query.assign("--query-gpu=");
    gpu_query += gpu_fields;
  }

  // True when nvidia-smi answered the query (the reasons field retried under its older name).
  bool open_smi(std::string& why) {
    smi = find_in_path("nvidia-smi", opt.path);
    if (smi.empty()) {
      why = "nvidia-smi not in PATH";
      return false;
    }
    set_reasons_field(kNvidiaSmiReasonsField);
    apps_query.assign("--query-compute-apps=");
    apps_query += kNvidiaSmiAppFields;
    int status = run_smi(gpu_query);
    if (exit_code(status) != 0 && out.find(kNvidiaSmiReasonsField) != std::string::npos &&
        out.find("not a valid field") != std::string::npos) {
      set_reasons_field(kNvidiaSmiOldReasonsField);  // a driver before R535
      status = run_smi(gpu_query);
    }
    if (exit_code(status) != 0) {
      why = failure(status);
      return false;
    }
    return true;
  }

  void sample_smi(std::vector<GpuSample>& gpus) {
    int status = run_smi(gpu_query);
    if (exit_code(status) != 0) {
      gpus.clear();
      note = failure(status);
      return;
    }
    parse_nvidia_smi_gpus(out, gpu_fields, gpus);
    note.assign(probe_note);
    status = run_smi(apps_query);
    if (exit_code(status) == 0)
      parse_nvidia_smi_apps(out, kNvidiaSmiAppFields, gpus);
    else
      note += (note.empty() ? "" : "; ") + failure(status);
  }

  void probe() {
    probed = true;
    std::string nvml_why, smi_why;
    if (opt.use_nvml && open_nvml(nvml_why)) {
      source = "nvml";
      return;
    }
    if (!opt.use_nvml) nvml_why = "NVML not used";
    if (opt.use_nvidia_smi && open_smi(smi_why)) {
      source = "nvidia-smi";
      probe_note = nvml_why;  // why the costlier fallback is in use
      return;
    }
    if (!opt.use_nvidia_smi) smi_why = "nvidia-smi not used";
    probe_note = "no GPU telemetry: " + nvml_why + ", " + smi_why;
  }
};

GpuSampler::GpuSampler(GpuSamplerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  if (impl_->opt.nvidia_smi_timeout_ms <= 0) impl_->opt.nvidia_smi_timeout_ms = 5000;
}

GpuSampler::~GpuSampler() = default;

void GpuSampler::sample(std::vector<GpuSample>& gpus) {
  Impl& m = *impl_;
  if (!m.probed) m.probe();
  if (m.source == "nvml") {
    m.sample_nvml(gpus);
  } else if (m.source == "nvidia-smi") {
    m.sample_smi(gpus);
  } else {
    gpus.clear();
    m.note.assign(m.probe_note);
  }
}

const std::string& GpuSampler::source() const { return impl_->source; }
const std::string& GpuSampler::note() const { return impl_->note; }

}  // namespace mltrain::telemetry
