// What `mltrain top`, `mltrain show` and the run's status line make of telemetry samples: the
// latest state of every host, GPU and rank with rates from two samples (a Snapshot), or a whole
// run's summary (a Summary); in both, the rank the others wait for. The standard library only.
//
// Comm share: the part of an interval a rank spent inside collectives, from its comm counters
// (comm/include/mltrain/comm_stats.h): Δ(comm_ns + time in the open collective) / Δmonotonic_ns.
// Every rank of a collective leaves it together, so ranks that arrive early spend the difference
// inside it and the rank that arrives last has the lowest share: the straggler. It is named only
// when the others clearly wait (straggler_of below), never from one rank or a quiet job.
//
// Without counters (stock DDP: no rank uses the comm library, so no collective is timed) the
// straggler is estimated from CPU time instead, and says so: a rank blocked in a gloo collective
// sleeps while the rank it waits for still computes, so the others' CPU time is a small part of
// its own (cpu_straggler_of). A GPU rank waiting in NCCL may spin its CPU: then no one is named.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runner/telemetry/sample.h"

namespace mltrain::telemetry {

// The others' median share must be at least this, and this much above the lowest one.
inline constexpr double kStragglerMinPeerShare = 0.20;
inline constexpr double kStragglerMinGap = 0.15;
// A GPU is idle when under this utilization while some other GPU of the job is over kBusyGpu.
inline constexpr uint32_t kIdleGpu = 10;
inline constexpr uint32_t kBusyGpu = 50;

// The estimate from CPU time: the busiest rank must use this much of one CPU (%), and the others'
// median at most 1 - kEstimateMinPeerIdle of its CPU time; summaries name a rank so found in at
// least kEstimateMinSamples samples and in most of those where one was found.
inline constexpr double kEstimateMinCpu = 10.0;
inline constexpr double kEstimateMinPeerIdle = 0.40;
inline constexpr size_t kEstimateMinSamples = 3;

// The index into `shares` of the rank the others wait for, or none: fewer than two known shares,
// peers that do not wait (median under min_peer), or no clear gap (under min_gap).
std::optional<size_t> straggler_of(const std::vector<std::optional<double>>& shares,
                                   double min_peer = kStragglerMinPeerShare,
                                   double min_gap = kStragglerMinGap);
// The index into `cpu` (% of one CPU, per rank) of the rank busy while the others idle, or none.
std::optional<size_t> cpu_straggler_of(const std::vector<std::optional<double>>& cpu);

// A rank's time inside collectives up to the sample (finished ones plus the open one so far).
std::optional<uint64_t> comm_time_ns(const RankSample& r, std::optional<uint64_t> monotonic_ns);

struct HostRow {
  std::string host;
  int64_t time_ms = 0;  // the sample's
  HostSample sample;
  std::string gpu_source, gpu_note;
  size_t gpus = 0;
  std::optional<double> gpu_util_mean;  // over its GPUs that report one
};

struct GpuRow {
  std::string host;
  GpuSample sample;
  std::vector<int32_t> ranks;  // the job's ranks among its processes, ascending
  bool idle = false;           // under kIdleGpu while another GPU is over kBusyGpu
};

struct RankRow {
  std::string host;
  RankSample sample;
  std::optional<double> comm_share;   // over the last interval (0..1)
  std::optional<double> calls_per_s;  // collectives finished per second, same interval
  std::vector<int32_t> gpus;          // indexes of the host's GPUs it has a process on
  std::optional<uint32_t> gpu_util;   // mean of those GPUs' utilization
  bool straggler = false;
};

struct Snapshot {
  std::vector<HostRow> hosts;  // in the order hosts were first added
  std::vector<GpuRow> gpus;    // by host, then index
  std::vector<RankRow> ranks;  // by rank
  std::optional<int32_t> straggler;
  std::string straggler_why;         // "rank 3: its peers spend 62% of their time waiting for it, it 4%"
  bool straggler_estimated = false;  // named from CPU time (collectives_timed is false)
  bool collectives_timed = false;    // some rank has comm counters
};

// The latest two samples of each host; snapshot() compares them.
class Board {
 public:
  // Hosts in this order (the plan's), whatever order their samples come in; others after them.
  void order(const std::vector<std::string>& hosts);
  void add(const std::string& host, Sample sample);
  void forget(const std::string& host);  // a host that left the job: its last sample goes with it
  bool empty() const { return latest_.empty(); }
  size_t hosts() const { return latest_.size(); }
  // Hosts that sent at least two samples (so their rates and shares are known).
  size_t hosts_with_rates() const;
  Snapshot snapshot() const;

 private:
  struct Latest {
    std::optional<Sample> previous;
    Sample current;
  };
  std::vector<std::string> order_;  // may name hosts with no sample yet
  std::map<std::string, Latest> latest_;
};

// A run's telemetry over its whole length.
struct Stat {
  double sum = 0, max = 0;
  size_t n = 0;
  void add(double v);
  std::optional<double> mean() const;
};

struct GpuSummary {
  std::string host;
  int32_t index = -1;
  std::string uuid;
  Stat util;  // utilization.gpu, %
  std::optional<uint64_t> mem_peak_mib, mem_total_mib;
  std::vector<int32_t> ranks;
};

struct RankSummary {
  std::string host;
  int32_t rank = -1;
  Stat cpu;  // % of one CPU
  std::optional<uint64_t> rss_peak;
  std::optional<double> comm_share;  // over the run: first to last sample with counters
  std::optional<uint64_t> calls;
  bool straggler = false;
};

struct Summary {
  size_t samples = 0;
  int64_t first_ms = 0, last_ms = 0;
  std::vector<std::string> hosts;
  std::vector<GpuSummary> gpus;    // by host, then index
  std::vector<RankSummary> ranks;  // by rank
  Stat host_cpu;                   // hosts' busy share of all CPUs, %
  // Mean GPU utilization (or, with no GPU rows, mean host CPU %) in equal slices of the run, 0..100.
  std::vector<std::optional<double>> timeline;
  bool timeline_is_gpu = false;
  std::optional<int32_t> straggler;
  std::string straggler_why;
  bool straggler_estimated = false;
  bool collectives_timed = false;  // some rank had comm counters in some sample
};

// What top and show say when no rank's collectives are timed (stock DDP), in one line.
inline constexpr const char* kNotTimedNote =
    "collectives not timed: only mltrain's comm library and its DDP hook time them (stock DDP: add the "
    "hook, docs/python.md)";

// `samples` as (host, sample) in any order; `slices`: how many points the timeline has.
Summary summarize(const std::vector<std::pair<std::string, Sample>>& samples, size_t slices = 40);

// "▁▂▃▅▇" for values 0..100 (a space for a missing one).
std::string sparkline(const std::vector<std::optional<double>>& values);

}  // namespace mltrain::telemetry
