// Pure parsers of what the samplers read: /proc files and nvidia-smi's CSV. No I/O, no
// exceptions; each takes the whole text and fills caller-owned values, so a sampler that keeps
// its buffers across samples allocates nothing once warm.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "runner/telemetry/sample.h"

namespace mltrain::telemetry {

// /proc/stat's aggregate "cpu" line in jiffies. busy counts user, nice, system, irq, softirq and
// steal; total adds idle and iowait (guest time is already inside user and nice).
struct CpuTimes {
  uint64_t busy = 0;
  uint64_t total = 0;
  uint32_t cpus = 0;  // "cpuN" lines
};
bool parse_proc_stat(std::string_view text, CpuTimes& out);

// /proc/loadavg's three averages, times 100 ("0.52" -> 52).
struct LoadAvg {
  uint32_t load1_x100 = 0, load5_x100 = 0, load15_x100 = 0;
};
bool parse_loadavg(std::string_view text, LoadAvg& out);

// /proc/meminfo's MemTotal and MemAvailable, in bytes; a line that is not there stays empty.
struct MemInfo {
  std::optional<uint64_t> total_bytes;
  std::optional<uint64_t> available_bytes;
};
MemInfo parse_meminfo(std::string_view text);

// /proc/net/dev: one row per interface.
struct NetInterface {
  char name[32] = {};  // IFNAMSIZ is 16
  uint64_t rx_bytes = 0;
  uint64_t tx_bytes = 0;
};
// Replaces `out` (capacity reused); false when no interface row parses.
bool parse_net_dev(std::string_view text, std::vector<NetInterface>& out);
// Sums of every interface but "lo".
struct NetTotals {
  uint64_t rx_bytes = 0;
  uint64_t tx_bytes = 0;
};
NetTotals net_totals(const std::vector<NetInterface>& interfaces);

// /proc/PID/stat. The comm field may hold spaces and parentheses, so fields are counted from the
// last ')'.
struct PidStat {
  char state = 0;
  uint64_t cpu_ticks = 0;    // utime + stime, in clock ticks
  uint64_t child_ticks = 0;  // cutime + cstime: of its children it waited for
  uint64_t start_ticks = 0;  // starttime: tells a reused pid from the process sampled before
  uint64_t rss_pages = 0;
};
bool parse_pid_stat(std::string_view text, PidStat& out);

// nvidia-smi --query-gpu fields this parser maps onto GpuSample (others are read and ignored).
// kNvidiaSmiReasonsField is the name drivers since R535 use; older ones reject it ("Field ... is
// not a valid field to query.", exit 2) and know kNvidiaSmiOldReasonsField instead.
inline constexpr const char* kNvidiaSmiReasonsField = "clocks_event_reasons.active";
inline constexpr const char* kNvidiaSmiOldReasonsField = "clocks_throttle_reasons.active";
inline constexpr const char* kNvidiaSmiGpuFields =
    "index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit,temperature.gpu,clocks.sm";
inline constexpr const char* kNvidiaSmiAppFields = "gpu_uuid,pid,used_memory";

// Lines of `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`, `fields` the same
// comma-separated list given to --query-gpu. Replaces `out` (capacity reused; processes cleared).
// A value in brackets ("[N/A]", "[Not Supported]", "[Insufficient Permissions]", "[Unknown
// Error]"), "N/A", or anything that is not a number leaves the field empty; a unit after a number
// ("87 %", "245.10 W", as without nounits) is accepted. Without an index field, a GPU's index is
// its line number. Lines with another number of cells than `fields` are skipped; returns the
// number of GPUs read.
size_t parse_nvidia_smi_gpus(std::string_view text, std::string_view fields, std::vector<GpuSample>& out);

// Lines of `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits`
// (`fields` as given, it must hold gpu_uuid and pid): each process is added to the GpuSample of
// `gpus` with that UUID. Returns the number of lines added; lines naming no known GPU are dropped.
size_t parse_nvidia_smi_apps(std::string_view text, std::string_view fields, std::vector<GpuSample>& gpus);

// "0x0000000000000004" (also without 0x) -> 4; none when it is not hexadecimal.
std::optional<uint64_t> parse_hex_mask(std::string_view text);

}  // namespace mltrain::telemetry
