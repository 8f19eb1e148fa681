// `mltrain top` on hosts without a run of its own (a hostfile, a job's hosts): the gang's
// connecting phase, then every agent samples its host, its GPUs and whatever mltrain ranks it
// finds there (their comm counters in /dev/shm, GPU processes that carry a RANK) every interval.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>

#include "runner/supervise/supervisor.h"

namespace mltrain::supervise {

struct WatchOptions {
  std::chrono::milliseconds interval{1000};
  std::string nvml_library;  // the agents' MLTRAIN_NVML_LIBRARY ("": their own, else the default)
  // Each sample as its agent encoded it (runner/telemetry/sample.h); return false to stop.
  std::function<bool(const std::string& host, std::string_view sample)> on_sample;
  // A host that cannot be watched (did not connect, was lost), once per host.
  std::function<void(const std::string& host, const std::string& problem)> on_problem;
  int stop_fd = -1;  // readable: stop (another thread asks); -1: none
};

// Connects to every host of `plan` in parallel, watches until on_sample says stop, stop_fd turns
// readable, a signal (SIGINT, SIGTERM, SIGHUP) comes or no host is left, then says goodbye to the
// agents. Returns 0, or 128 + the signal.
int run_watch(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
              const WatchOptions& w);

}  // namespace mltrain::supervise
