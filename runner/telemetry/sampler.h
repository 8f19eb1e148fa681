// The samplers the agent runs every interval (kDefaultIntervalMs): HostSampler reads /proc and
// turns two readings into rates, GpuSampler reads NVML (dlopen) or, without it, nvidia-smi. Both
// keep their buffers between samples and allocate nothing once warm (the budget is well under 1%
// of one core per host). Neither is thread-safe: one thread samples. They throw nothing of their
// own; a file that cannot be read or a GPU call that fails leaves its fields empty.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runner/telemetry/parse.h"
#include "runner/telemetry/sample.h"

namespace mltrain::telemetry {

// Reads the whole file at `path` into `out` (replaced; its capacity reused). False when the file
// cannot be opened or read (a rank that exited).
using FileReader = std::function<bool(const char* path, std::string& out)>;
// open(2) and read(2) into `out`, no stdio.
bool read_small_file(const char* path, std::string& out);
int64_t monotonic_us();
int64_t wall_clock_ms();

struct HostSamplerOptions {
  std::string proc_root = "/proc";
  FileReader read_file;                   // default read_small_file
  std::function<int64_t()> monotonic_us;  // default telemetry::monotonic_us
  long ticks_per_second = 0;              // 0: sysconf(_SC_CLK_TCK)
  long page_size = 0;                     // 0: sysconf(_SC_PAGESIZE)
};

// Host and rank processes. Rates need two readings: the first sample leaves CPU % and network
// rates empty, as it does for a rank whose pid is new or was reused by another process.
class HostSampler {
 public:
  explicit HostSampler(HostSamplerOptions options = {});
  // Fills `host` and replaces `ranks` with one RankSample per entry of `pids`, in that order.
  void sample(const std::vector<RankPid>& pids, HostSample& host, std::vector<RankSample>& ranks);

 private:
  struct PidReading {
    int32_t pid = 0;
    uint64_t start_ticks = 0;
    uint64_t cpu_ticks = 0;
    int64_t time_us = 0;
  };
  bool read_tree(int32_t root, PidStat& sum);

  HostSamplerOptions opt_;
  std::string buf_;
  std::string path_;
  std::vector<int32_t> tree_;  // read_tree's pids, kept between samples
  std::vector<NetInterface> net_;
  bool have_cpu_ = false;
  CpuTimes cpu_;
  bool have_net_ = false;
  NetTotals net_totals_;
  int64_t net_time_us_ = 0;
  std::vector<PidReading> pids_, next_pids_;
};

struct GpuSamplerOptions {
  std::string nvml_library;    // "" = libnvidia-ml.so.1 from the loader's search path
  std::string path;            // PATH to find nvidia-smi in ("" = /usr/bin:/bin)
  bool use_nvml = true;        // false: go straight to nvidia-smi (tests)
  bool use_nvidia_smi = true;  // the fallback: a process per sample, so it costs far more
  int nvidia_smi_timeout_ms = 5000;
};

// A host's GPUs. The first sample() chooses the source: NVML when it loads and initialises,
// else nvidia-smi when it is in PATH and answers, else none (no rows, note() says why); the
// choice holds for the sampler's life.
class GpuSampler {
 public:
  explicit GpuSampler(GpuSamplerOptions options = {});
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  // Replaces `gpus` (capacity, strings and process lists reused).
  void sample(std::vector<GpuSample>& gpus);
  const std::string& source() const;  // "nvml", "nvidia-smi" or ""
  const std::string& note() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Host, GPUs and ranks together: what the agent sends each interval.
class Sampler {
 public:
  explicit Sampler(GpuSamplerOptions gpu = {}, HostSamplerOptions host = {});
  // Replaces `out` (its buffers reused) with a sample taken now.
  void sample(const std::vector<RankPid>& pids, Sample& out);
  // The same, GPUs first: `add_pids` sees them and may add ranks to `pids` before the host and
  // ranks are read (`mltrain top` on a host finds ranks among the GPUs' processes).
  using AddPids = std::function<void(const std::vector<GpuSample>& gpus, std::vector<RankPid>& pids)>;
  void sample(std::vector<RankPid>& pids, Sample& out, const AddPids& add_pids);

 private:
  HostSampler host_;
  GpuSampler gpu_;
};

}  // namespace mltrain::telemetry
