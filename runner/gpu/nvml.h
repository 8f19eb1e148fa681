// NVML, bound once: loaded with dlopen in the one search order (knobs/gpu_library.h), with the
// calls the agent's GPU inventory (runner/agent/gpu_inventory.cpp) and the telemetry sampler
// (runner/telemetry/gpu_sampler.cpp) make. Every call answers NVML's own return code, a value, not
// an exception; a call the loaded library lacks answers kFunctionNotFound. No NVML header is needed
// to build: the ABI is declared in nvml.cpp. libc and the standard library only: the agent compiles it.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace mltrain::gpu {

class Nvml {
 public:
  // nvmlReturn_t values that callers tell apart.
  static constexpr int kSuccess = 0;
  static constexpr int kNotSupported = 3;
  static constexpr int kInsufficientSize = 7;
  static constexpr int kDriverNotLoaded = 9;
  static constexpr int kFunctionNotFound = 13;
  static constexpr int kArgumentVersionMismatch = 25;
  // A process's used memory NVML cannot tell (NVML_VALUE_NOT_AVAILABLE).
  static constexpr unsigned long long kValueNotAvailable = ~0ULL;

  using Device = struct nvmlDevice_st*;
  struct Memory {
    unsigned long long total = 0, used = 0;  // bytes; used as nvidia-smi shows it where the driver can
  };
  struct Process {
    unsigned pid = 0;
    unsigned long long used_bytes = kValueNotAvailable;
  };

  // Why open() gave no NVML.
  struct Failure {
    enum class Step { load, symbols, init } step = Step::load;
    bool named = false;      // a library was given (the job's or this process's MLTRAIN_NVML_LIBRARY)
    std::string file;        // the library given, else the file the loader opened ("" when none loaded)
    std::string error;       // load: the loader's message ("" when nothing was found by the search)
    std::string missing;     // symbols: the first required call the library lacks
    int code = 0;            // init: nvmlInit's return code
    std::string init_error;  // init: its text
  };

  // Loads `library` ("": the search of knobs/gpu_library.h) and initialises NVML; nullptr with
  // `failure` filled when either fails.
  static std::unique_ptr<Nvml> open(const std::string& library, Failure& failure);
  ~Nvml();  // nvmlShutdown, then the library is closed
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 (loader path)": the file and the step that found it.
  const std::string& found_text() const;
  // nvmlErrorString, else "NVML error N".
  std::string what(int code) const;

  int device_count(unsigned& count) const;
  int device(unsigned index, Device& dev) const;
  int driver_version(std::string& out) const;
  // The newest CUDA the driver supports (12040 for 12.4): nvmlSystemGetCudaDriverVersion(_v2).
  int cuda_driver_version(int& out) const;
  int name(Device dev, std::string& out) const;
  int uuid(Device dev, std::string& out) const;
  int mig_mode(Device dev, unsigned& current, unsigned& pending) const;
  int utilization(Device dev, unsigned& gpu_percent) const;
  int power_mw(Device dev, unsigned& out) const;
  int power_limit_mw(Device dev, unsigned& out) const;
  int temperature_c(Device dev, unsigned& out) const;
  int sm_clock_mhz(Device dev, unsigned& out) const;
  // nvmlDeviceGetMemoryInfo_v2 (used without the driver's reserve), else v1 once v2 proves missing.
  int memory(Device dev, Memory& out);
  // The current clocks event reasons (R535 and later), else the older throttle reasons call.
  int clock_reasons(Device dev, unsigned long long& out);
  // The compute processes (_v3, else _v2, else v1): `out` replaced, its capacity reused; the
  // buffer grows once when more processes run than it holds.
  int compute_processes(Device dev, std::vector<Process>& out);

  struct Api;

 private:
  Nvml() = default;
  std::unique_ptr<Api> api_;
};

}  // namespace mltrain::gpu
