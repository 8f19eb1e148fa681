// One telemetry sample of a host: the host itself (CPU, load, memory, network), its GPUs, and the
// job's rank processes on it, as the agent takes it every interval (runner/telemetry/sampler.h).
// A value the system did not give ("[N/A]", NOT_SUPPORTED, no GPU, no previous reading for a
// rate) stays std::nullopt: it is never reported as zero. Rates and fractions are integers in
// fixed units so a sample encodes and decodes exactly. libc and the standard library only: this
// code runs inside the agent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::telemetry {

inline constexpr int64_t kDefaultIntervalMs = 1000;

struct HostSample {
  std::optional<uint32_t> cpus;              // CPUs /proc/stat lists
  std::optional<uint32_t> cpu_percent_x100;  // busy share of all CPUs, 10000 = every CPU busy
  std::optional<uint32_t> load1_x100, load5_x100, load15_x100;  // /proc/loadavg times 100
  std::optional<uint64_t> mem_total_bytes, mem_available_bytes;
  std::optional<uint64_t> net_rx_bytes_per_s, net_tx_bytes_per_s;  // every interface but lo

  bool operator==(const HostSample&) const = default;
};

struct GpuProcess {
  uint32_t pid = 0;                  // as the driver sees it (the host's pid namespace)
  std::optional<uint64_t> used_mib;  // unknown under MIG without privileges, WDDM, ...

  bool operator==(const GpuProcess&) const = default;
};

struct GpuSample {
  int32_t index = -1;
  std::string uuid;
  std::optional<uint32_t> util_percent;  // utilization.gpu; none on a MIG-enabled GPU
  std::optional<uint64_t> mem_used_mib, mem_total_mib;
  std::optional<uint32_t> power_mw, power_limit_mw;
  std::optional<uint32_t> temperature_c;
  std::optional<uint32_t> sm_clock_mhz;
  std::optional<uint64_t> throttle_reasons;  // NVML's clocks event reasons bitmask
  std::vector<GpuProcess> processes;

  bool operator==(const GpuSample&) const = default;
};

struct RankPid {
  int32_t rank = -1;
  int32_t pid = 0;

  bool operator==(const RankPid&) const = default;
};

struct RankSample {
  int32_t rank = -1;
  int32_t pid = 0;
  std::optional<char> state;                 // /proc/PID/stat's letter (R, S, D, Z, ...); none: gone
  std::optional<uint32_t> cpu_percent_x100;  // of one CPU, so 20000 = two CPUs busy
  std::optional<uint64_t> rss_bytes;
  // The rank's comm counters (comm/include/mltrain/comm_stats.h), CLOCK_MONOTONIC ns where a
  // time; all missing while the rank has no counter block (not initialised, or no comm library).
  std::optional<uint64_t> comm_ns;       // time inside finished collectives
  std::optional<uint64_t> calls;         // collectives finished
  std::optional<uint64_t> entered_ns;    // when the open collective began; 0: none open
  std::optional<uint64_t> last_exit_ns;  // when the last one ended
  std::optional<uint64_t> started_ns;    // when its communicator was ready

  bool operator==(const RankSample&) const = default;
};

struct Sample {
  int64_t time_ms = 0;  // wall clock, Unix epoch
  // CLOCK_MONOTONIC ns when taken: the clock of the comm counters, so shares can be computed
  std::optional<uint64_t> monotonic_ns;
  HostSample host;
  std::string gpu_source;  // "nvml", "nvidia-smi", or "" when no GPU could be read
  std::string gpu_note;    // why there are no GPU rows, or what failed on the way
  std::vector<GpuSample> gpus;
  std::vector<RankSample> ranks;

  bool operator==(const Sample&) const = default;
};

// NVML's clocks event (formerly "throttle") reasons, nvmlClocksEventReason* in nvml.h.
inline constexpr uint64_t kReasonGpuIdle = 0x1;
inline constexpr uint64_t kReasonApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kReasonSwPowerCap = 0x4;
inline constexpr uint64_t kReasonHwSlowdown = 0x8;
inline constexpr uint64_t kReasonSyncBoost = 0x10;
inline constexpr uint64_t kReasonSwThermalSlowdown = 0x20;
inline constexpr uint64_t kReasonHwThermalSlowdown = 0x40;
inline constexpr uint64_t kReasonHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kReasonDisplayClockSetting = 0x100;

// The names of the bits set in `mask`, lowest bit first ("gpu_idle", "sw_power_cap", ...); a bit
// NVML does not define shows as "0x<bit>".
std::vector<std::string> throttle_reason_names(uint64_t mask);
// The mask of those names (the inverse; a name it does not know adds nothing).
uint64_t throttle_reason_mask(const std::vector<std::string>& names);

// The sample as one compact text (version 1; see sample.cpp for the grammar): lines of
// space-separated key=value fields, a missing value is a missing key, so 0 and "unknown" differ.
// `out` is replaced (its capacity is reused).
void encode(const Sample& sample, std::string& out);
std::string encode(const Sample& sample);

// Reads what encode() wrote. False with `error` set when the text is not a version-1 sample;
// unknown line kinds and keys are skipped (later writers may add them).
bool decode(std::string_view text, Sample& out, std::string& error);

}  // namespace mltrain::telemetry
