// The agent's telemetry: after TelemetryStart, every interval one sample of the host, its GPUs and
// its ranks (runner/telemetry/), with each rank's comm counters, sent as one Telemetry frame.
//
// Sampling runs on the event loop's own thread, between two turns: NVML answers in microseconds;
// the nvidia-smi fallback may block up to its timeout (kSmiTimeoutMs), which the heartbeat check
// does not count as the launcher's silence. That fallback forks nvidia-smi and reaps it by pid
// before sample() returns, so the loop's waitpid(-1) (Agent::reap, same thread) never sees it.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>

#include "mltrain/comm_stats.h"
#include "runner/agent/detail/agent_impl.h"

namespace mltrain::agent::detail {

namespace {

constexpr int kSmiTimeoutMs = 2000;  // well inside the launcher's 10 s heartbeat window

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

// The block's name, as comm/src/communicator.cpp makes it.
std::string stats_name(const std::string& run_id, uint32_t rank) {
  std::string run;
  for (char c : run_id.substr(0, 100)) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '_' || c == '.';
    run += keep ? c : '_';
  }
  return "/mltrain-" + run + "-stats-" + std::to_string(rank);
}

uint64_t load(const uint64_t& field) { return __atomic_load_n(&field, __ATOMIC_RELAXED); }

}  // namespace

void Agent::on(uint32_t, const msg::TelemetryStart& m) {
  telemetry_interval_ms_ = m.interval_ms;
  watch_ = m.watch != 0;
  if (m.interval_ms == 0 || sampler_) return;
  telemetry::GpuSamplerOptions gpu;
  gpu.nvml_library = nvml_library_for(m.nvml_library);
  if (const char* path = ::getenv("PATH")) gpu.path = path;
  gpu.nvidia_smi_timeout_ms = kSmiTimeoutMs;
  sampler_ = std::make_unique<telemetry::Sampler>(gpu);
  next_sample_ms_ = now_ms();  // the first sample now: rates need two readings
}

// Maps (once) the counter block `name` (a /dev/shm name with its leading '/'); null when it is
// missing, still being made, or foreign. A block that was replaced (same name, new file) is mapped
// again.
const mltrain_comm_stats* Agent::map_comm_stats(const std::string& name) {
  CommStatsMapping& m = comm_stats_[name];
  struct stat st {};
  bool exists = ::stat(("/dev/shm" + name).c_str(), &st) == 0;
  if (m.block && (!exists || uint64_t(st.st_dev) != m.dev || uint64_t(st.st_ino) != m.ino)) {
    ::munmap(const_cast<mltrain_comm_stats*>(m.block), sizeof(mltrain_comm_stats));
    m = {};
  }
  if (!exists) return nullptr;
  if (!m.block) {
    int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return nullptr;
    // The size is set before the magic is written: a shorter file is still being made.
    if (::fstat(fd, &st) == 0 && st.st_size >= off_t(sizeof(mltrain_comm_stats))) {
      void* p = ::mmap(nullptr, sizeof(mltrain_comm_stats), PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        m.block = static_cast<const mltrain_comm_stats*>(p);
        m.dev = uint64_t(st.st_dev);
        m.ino = uint64_t(st.st_ino);
      }
    }
    ::close(fd);
    if (!m.block) return nullptr;
  }
  if (__atomic_load_n(&m.block->magic, __ATOMIC_ACQUIRE) != MLTRAIN_COMM_STATS_MAGIC ||
      m.block->version != MLTRAIN_COMM_STATS_VERSION)
    return nullptr;
  return m.block;
}

// Reads the rank's counter block; a missing, foreign or half-written one leaves the comm fields
// empty.
void Agent::read_comm_stats(telemetry::RankSample& r, const std::string& name) {
  if (name.empty()) return;
  const mltrain_comm_stats* b = map_comm_stats(name);
  if (!b) return;
  // Times are in the block's ticks: CLOCK_MONOTONIC ns through its clock (comm_stats.h).
  const mltrain_comm_stats_clock clock = mltrain_comm_stats_read_clock(b);
  r.comm_ns = mltrain_comm_stats_span_ns(&clock, load(b->comm_ns));
  r.calls = load(b->calls);
  r.entered_ns = mltrain_comm_stats_time_ns(&clock, load(b->entered_ns));
  r.last_exit_ns = mltrain_comm_stats_time_ns(&clock, load(b->last_exit_ns));
  r.started_ns = mltrain_comm_stats_time_ns(&clock, load(b->started_ns));
}

// Watch: every live rank with a counter block in /dev/shm (any run's), by the block's own pid and
// rank. Mappings of blocks gone since the last sample are dropped.
void Agent::discover_ranks(std::vector<telemetry::RankPid>& pids) {
  stats_of_pid_.clear();
  std::map<std::string, CommStatsMapping> seen;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      std::string_view n = e->d_name;
      if (n.rfind("mltrain-", 0) != 0 || n.find("-stats-") == std::string_view::npos) continue;
      if (seen.size() >= 1024) break;
      const std::string name = "/" + std::string(n);
      const mltrain_comm_stats* b = map_comm_stats(name);
      seen[name] = comm_stats_[name];
      comm_stats_.erase(name);
      if (!b) continue;
      const int32_t pid = __atomic_load_n(&b->pid, __ATOMIC_RELAXED);
      const int32_t rank = __atomic_load_n(&b->rank, __ATOMIC_RELAXED);
      if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) continue;  // a block its rank left behind
      pids.push_back({rank, pid});
      stats_of_pid_[pid] = name;
    }
    ::closedir(d);
  }
  for (auto& [name, m] : comm_stats_)
    if (m.block) ::munmap(const_cast<mltrain_comm_stats*>(m.block), sizeof(mltrain_comm_stats));
  comm_stats_ = std::move(seen);
}

// Watch: a GPU process not found yet whose environment names its RANK (torchrun's contract, which
// mltrain's ranks follow) is a rank too. Read once per pid.
void Agent::ranks_among_gpu_processes(const std::vector<telemetry::GpuSample>& gpus,
                                      std::vector<telemetry::RankPid>& pids) {
  std::map<int32_t, int32_t> still;
  for (const auto& g : gpus)
    for (const auto& p : g.processes) {
      const int32_t pid = int32_t(p.pid);
      bool known = false;
      for (const auto& k : pids) known = known || k.pid == pid;
      if (known || still.count(pid)) continue;
      auto it = env_rank_.find(pid);
      int32_t rank = -1;
      if (it != env_rank_.end()) {
        rank = it->second;
      } else if (telemetry::read_small_file(("/proc/" + std::to_string(pid) + "/environ").c_str(),
                                            environ_)) {
        for (size_t at = 0; at < environ_.size();) {
          size_t end = environ_.find('\0', at);
          if (end == std::string::npos) end = environ_.size();
          std::string_view v(environ_.data() + at, end - at);
          if (v.rfind("RANK=", 0) == 0 && v.size() > 5 && v.size() < 16 &&
              v.find_first_not_of("0123456789", 5) == std::string_view::npos)
            rank = int32_t(std::strtol(std::string(v.substr(5)).c_str(), nullptr, 10));
          at = end + 1;
        }
      }
      still[pid] = rank;
      if (rank >= 0) pids.push_back({rank, pid});
    }
  env_rank_ = std::move(still);
}

void Agent::take_sample() {
  next_sample_ms_ = now_ms() + telemetry_interval_ms_;
  if (!watch_ && ranks_.empty()) return;  // TelemetryStart came before the ranks: nothing to say yet
  if (!watch_ && !any_alive()) {
    telemetry_interval_ms_ = 0;  // the gang is over here; a restart sends TelemetryStart again
    return;
  }
  // A launcher that does not read (stopped, slow) gets its rank output first; samples wait.
  if (outbox_.size() - outbox_pos_ > kOutboxHighWater / 2) return;
  const int64_t start = now_ms();
  try {
    sample_pids_.clear();
    if (watch_) {
      discover_ranks(sample_pids_);
      sampler_->sample(sample_pids_, sample_,
                       [this](const auto& gpus, auto& pids) { ranks_among_gpu_processes(gpus, pids); });
    } else {
      for (const auto& [id, r] : ranks_)
        if (!r.reaped && r.pid > 0) sample_pids_.push_back({int32_t(id), int32_t(r.pid)});
      sampler_->sample(sample_pids_, sample_);
    }
    sample_.monotonic_ns = monotonic_ns();
    for (auto& r : sample_.ranks) {
      if (!watch_) {
        if (!run_id_.empty() && r.rank >= 0) read_comm_stats(r, stats_name(run_id_, uint32_t(r.rank)));
      } else if (auto it = stats_of_pid_.find(r.pid); it != stats_of_pid_.end()) {
        read_comm_stats(r, it->second);
      }
    }
    telemetry::encode(sample_, telemetry_msg_.sample);
    send(telemetry_msg_);
  } catch (const std::exception& e) {
    // Telemetry is a bystander: out of memory or worse here must not touch the ranks.
    log_err("telemetry stopped: %s", e.what());
    telemetry_interval_ms_ = 0;
  }
  // Time spent here (a slow nvidia-smi) is the agent's own, not the launcher's silence.
  last_heard_ms_ += now_ms() - start;
}

}  // namespace mltrain::agent::detail
