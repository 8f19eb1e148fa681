// NVML through dlopen (runner/gpu/nvml.h).
#include "runner/gpu/nvml.h"

#include <dlfcn.h>

#include "knobs/gpu_library.h"

namespace mltrain::gpu {
namespace {

// The NVML ABI (nvml.h, NVML API reference), declared here: no NVML header is needed to build.
using nvmlReturn_t = int;
using nvmlDevice_t = Nvml::Device;
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

constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr int NVML_CLOCK_SM = 1;
constexpr unsigned kNameSize = 96;    // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidSize = 96;    // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kDriverSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

template <class F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
}

// A call that fills a text buffer, as a string.
template <class F, class... Args>
int text_call(F fn, unsigned size, std::string& out, Args... args) {
  if (!fn) return Nvml::kFunctionNotFound;
  char buf[128] = {};
  const int r = fn(args..., buf, size < sizeof buf ? size : unsigned(sizeof buf));
  if (r == Nvml::kSuccess) out = buf;
  return r;
}

}  // namespace

struct Nvml::Api {
  void* lib = nullptr;
  std::string found_text;
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  nvmlReturn_t (*count)(unsigned*) = nullptr;
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*) = nullptr;
  const char* (*error)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*driver)(char*, unsigned) = nullptr;
  nvmlReturn_t (*cuda_driver)(int*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned) = nullptr;
  nvmlReturn_t (*mig)(nvmlDevice_t, unsigned*, unsigned*) = nullptr;
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
  std::vector<nvmlProcessInfo_v2_t> procs_v2_buffer = std::vector<nvmlProcessInfo_v2_t>(64);
  std::vector<nvmlProcessInfo_v1_t> procs_v1_buffer = std::vector<nvmlProcessInfo_v1_t>(64);

  void bind_all() {
    bind(lib, init, "nvmlInit_v2");
    bind(lib, shutdown, "nvmlShutdown");
    bind(lib, count, "nvmlDeviceGetCount_v2");
    bind(lib, handle, "nvmlDeviceGetHandleByIndex_v2");
    bind(lib, error, "nvmlErrorString");
    bind(lib, driver, "nvmlSystemGetDriverVersion");
    bind(lib, cuda_driver, "nvmlSystemGetCudaDriverVersion_v2");
    if (!cuda_driver) bind(lib, cuda_driver, "nvmlSystemGetCudaDriverVersion");
    bind(lib, name, "nvmlDeviceGetName");
    bind(lib, uuid, "nvmlDeviceGetUUID");
    bind(lib, mig, "nvmlDeviceGetMigMode");
    bind(lib, utilization, "nvmlDeviceGetUtilizationRates");
    bind(lib, memory, "nvmlDeviceGetMemoryInfo");
    bind(lib, memory_v2, "nvmlDeviceGetMemoryInfo_v2");
    bind(lib, power, "nvmlDeviceGetPowerUsage");
    bind(lib, power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    bind(lib, temperature, "nvmlDeviceGetTemperature");
    bind(lib, clock, "nvmlDeviceGetClockInfo");
    bind(lib, event_reasons, "nvmlDeviceGetCurrentClocksEventReasons");        // R535 and later
    bind(lib, throttle_reasons, "nvmlDeviceGetCurrentClocksThrottleReasons");  // deprecated name
    bind(lib, procs_v2, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!procs_v2) bind(lib, procs_v2, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!procs_v2) bind(lib, procs_v1, "nvmlDeviceGetComputeRunningProcesses");
  }

  // The first of the calls nothing works without that the library lacks, or nullptr.
  const char* missing_required() const {
    if (!init) return "nvmlInit_v2";
    if (!shutdown) return "nvmlShutdown";
    if (!count) return "nvmlDeviceGetCount_v2";
    if (!handle) return "nvmlDeviceGetHandleByIndex_v2";
    return nullptr;
  }
};

std::unique_ptr<Nvml> Nvml::open(const std::string& library, Failure& failure) {
  failure = Failure{};
  failure.named = !library.empty();
  knobs::LoadedLibrary found = knobs::load_library(knobs::GpuLibrary::nvml, library);
  failure.file = failure.named ? library : found.file;
  if (!found.handle) {
    failure.error = found.error;
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  api->lib = found.handle;
  api->found_text = found.found_text();
  api->bind_all();
  if (const char* missing = api->missing_required()) {
    failure.step = Failure::Step::symbols;
    failure.missing = missing;
    ::dlclose(api->lib);
    return nullptr;
  }
  if (nvmlReturn_t r = api->init(); r != kSuccess) {
    failure.step = Failure::Step::init;
    failure.code = r;
    const char* text = api->error ? api->error(r) : nullptr;
    failure.init_error = text ? std::string(text) : "NVML error " + std::to_string(r);
    ::dlclose(api->lib);
    return nullptr;
  }
  std::unique_ptr<Nvml> nvml(new Nvml);
  nvml->api_ = std::move(api);
  return nvml;
}

Nvml::~Nvml() {
  api_->shutdown();
  ::dlclose(api_->lib);
}

const std::string& Nvml::found_text() const { return api_->found_text; }

std::string Nvml::what(int code) const {
  const char* s = api_->error ? api_->error(code) : nullptr;
  return s ? std::string(s) : "NVML error " + std::to_string(code);
}

int Nvml::device_count(unsigned& count) const { return api_->count(&count); }

int Nvml::device(unsigned index, Device& dev) const { return api_->handle(index, &dev); }

int Nvml::driver_version(std::string& out) const { return text_call(api_->driver, kDriverSize, out); }

int Nvml::cuda_driver_version(int& out) const {
  return api_->cuda_driver ? int(api_->cuda_driver(&out)) : kFunctionNotFound;
}

int Nvml::name(Device dev, std::string& out) const { return text_call(api_->name, kNameSize, out, dev); }

int Nvml::uuid(Device dev, std::string& out) const { return text_call(api_->uuid, kUuidSize, out, dev); }

int Nvml::mig_mode(Device dev, unsigned& current, unsigned& pending) const {
  return api_->mig ? api_->mig(dev, &current, &pending) : kFunctionNotFound;
}

int Nvml::utilization(Device dev, unsigned& gpu_percent) const {
  if (!api_->utilization) return kFunctionNotFound;
  nvmlUtilization_t u{};
  const int r = api_->utilization(dev, &u);
  if (r == kSuccess) gpu_percent = u.gpu;
  return r;
}

int Nvml::power_mw(Device dev, unsigned& out) const {
  return api_->power ? api_->power(dev, &out) : kFunctionNotFound;
}

int Nvml::power_limit_mw(Device dev, unsigned& out) const {
  return api_->power_limit ? api_->power_limit(dev, &out) : kFunctionNotFound;
}

int Nvml::temperature_c(Device dev, unsigned& out) const {
  return api_->temperature ? api_->temperature(dev, NVML_TEMPERATURE_GPU, &out) : kFunctionNotFound;
}

int Nvml::sm_clock_mhz(Device dev, unsigned& out) const {
  return api_->clock ? api_->clock(dev, NVML_CLOCK_SM, &out) : kFunctionNotFound;
}

int Nvml::memory(Device dev, Memory& out) {
  Api& a = *api_;
  nvmlReturn_t r = kNotSupported;
  if (a.memory_v2) {
    nvmlMemory_v2_t m{};
    m.version = kNvmlMemoryV2;
    r = a.memory_v2(dev, &m);
    if (r == kSuccess) {
      out.total = m.total;
      out.used = m.used;
      return r;
    }
    if (r == kFunctionNotFound || r == kArgumentVersionMismatch)
      a.memory_v2 = nullptr;  // the driver predates the library: v1 from now on
  }
  if (!a.memory_v2 && a.memory) {
    nvmlMemory_t m{};
    r = a.memory(dev, &m);
    if (r == kSuccess) {
      out.total = m.total;
      out.used = m.used;
    }
  }
  return r;
}

int Nvml::clock_reasons(Device dev, unsigned long long& out) {
  Api& a = *api_;
  if (a.event_reasons) {
    const int r = a.event_reasons(dev, &out);
    if (r != kFunctionNotFound) return r;
    a.event_reasons = nullptr;  // a driver older than its library
  }
  return a.throttle_reasons ? a.throttle_reasons(dev, &out) : kFunctionNotFound;
}

int Nvml::compute_processes(Device dev, std::vector<Process>& out) {
  Api& a = *api_;
  out.clear();
  for (int attempt = 0; attempt < 2; ++attempt) {
    unsigned count = 0;
    nvmlReturn_t r = kNotSupported;
    if (a.procs_v2) {
      count = unsigned(a.procs_v2_buffer.size());
      r = a.procs_v2(dev, &count, a.procs_v2_buffer.data());
      if (r == kInsufficientSize) {
        a.procs_v2_buffer.resize(size_t(count) + 16);
        continue;
      }
    } else if (a.procs_v1) {
      count = unsigned(a.procs_v1_buffer.size());
      r = a.procs_v1(dev, &count, a.procs_v1_buffer.data());
      if (r == kInsufficientSize) {
        a.procs_v1_buffer.resize(size_t(count) + 16);
        continue;
      }
    }
    if (r != kSuccess) return r;
    for (unsigned j = 0; j < count; ++j)
      out.push_back(a.procs_v2 ? Process{a.procs_v2_buffer[j].pid, a.procs_v2_buffer[j].usedGpuMemory}
                               : Process{a.procs_v1_buffer[j].pid, a.procs_v1_buffer[j].usedGpuMemory});
    return r;
  }
  return kInsufficientSize;
}

}  // namespace mltrain::gpu
