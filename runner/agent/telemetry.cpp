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
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
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

constexpr uint32_t kStatsRefusalsNamed = 16;  // past this many, refused blocks go unnamed

// True when process `pid` is `rank_pid` or one of its processes: in its process group (every rank
// leads its own), or below it within 64 parents (a descendant that made a group of its own).
bool belongs_to_rank(int32_t pid, int32_t rank_pid) {
  if (pid <= 0 || rank_pid <= 0) return false;
  if (pid == rank_pid || ::getpgid(pid) == rank_pid) return true;
  std::string stat;
  int32_t at = pid;
  for (int depth = 0; depth < 64 && at > 1; ++depth) {
    if (!telemetry::read_small_file(("/proc/" + std::to_string(at) + "/stat").c_str(), stat)) return false;
    const size_t close = stat.rfind(')');  // the name may hold anything, even ") "
    if (close == std::string::npos || close + 4 >= stat.size()) return false;
    at = int32_t(std::strtol(stat.c_str() + close + 4, nullptr, 10));  // ") S PPID"
    if (at == rank_pid) return true;
  }
  return false;
}

// True when process `pid` runs as this agent's user (watch: any rank of this user's).
bool process_is_mine(int32_t pid) {
  struct stat st {};
  return pid > 0 && ::stat(("/proc/" + std::to_string(pid)).c_str(), &st) == 0 && st.st_uid == ::geteuid();
}

uint64_t load(const uint64_t& field) { return __atomic_load_n(&field, __ATOMIC_RELAXED); }

}  // namespace

// A rank's counter block name: the job's prefix, as comm/src/communicator.cpp and the warden make
// it, then 16 random hex digits, so another user cannot take the name before the rank does.
std::string comm_stats_name(const std::string& run_id, uint32_t rank) {
  std::string run;
  for (char c : run_id.substr(0, 100)) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                c == '_' || c == '.';
    run += keep ? c : '_';
  }
  unsigned char random[8] = {};
  if (::getrandom(random, sizeof random, 0) != ssize_t(sizeof random)) {
    // No entropy source: the time and pid still differ per rank and run.
    const uint64_t mix = (monotonic_ns() * 0x9e3779b97f4a7c15ull) ^ (uint64_t(::getpid()) << 32) ^ rank;
    std::memcpy(random, &mix, sizeof random);
  }
  std::string hex;
  for (unsigned char b : random) {
    hex += "0123456789abcdef"[b >> 4];
    hex += "0123456789abcdef"[b & 15];
  }
  return "/mltrain-" + run + "-stats-" + std::to_string(rank) + "-" + hex;
}

void Agent::on(uint32_t, const msg::TelemetryStart& m) {
  telemetry_interval_ms_ = m.interval_ms;
  watch_ = m.watch != 0;
  if (m.interval_ms == 0 || sampler_) return;
  telemetry::GpuSamplerOptions gpu;
  gpu.nvml_library = nvml_library_for(m.nvml_library);
  if (auto path = env_.get("PATH")) gpu.path = *path;
  gpu.nvidia_smi_timeout_ms = kSmiTimeoutMs;
  sampler_ = std::make_unique<telemetry::Sampler>(gpu);
  next_sample_ms_ = clock_.now_ms();  // the first sample now: rates need two readings
}

// Maps (once) the counter block `name` (a /dev/shm name with its leading '/'); null when it is
// missing, still being made, or not to be trusted. /dev/shm is everyone's, so a block is read only
// when it is a regular file of this agent's user that no one else may write, its fields are in
// range and its pid is the rank's (rank_pid; 0 in watch: a live process of this user). One that
// fails is named once (AgentError) and not opened again while the same file sits at the name. A
// block that was replaced (same name, new file) is looked at afresh.
const mltrain_comm_stats* Agent::map_comm_stats(const std::string& name, int32_t rank_pid) {
  CommStatsMapping& m = comm_stats_[name];
  const std::string path = "/dev/shm" + name;
  struct stat st {};
  const bool exists = ::lstat(path.c_str(), &st) == 0;
  if ((m.block || m.refused) && (!exists || uint64_t(st.st_dev) != m.dev || uint64_t(st.st_ino) != m.ino)) {
    if (m.block) ::munmap(const_cast<mltrain_comm_stats*>(m.block), sizeof(mltrain_comm_stats));
    m = {};
  }
  if (!exists || m.refused) return nullptr;
  auto refuse = [&](const std::string& why) {
    if (m.block) ::munmap(const_cast<mltrain_comm_stats*>(m.block), sizeof(mltrain_comm_stats));
    m = {};
    m.refused = true, m.dev = uint64_t(st.st_dev), m.ino = uint64_t(st.st_ino);
    if (stats_refusals_said_ < kStatsRefusalsNamed) {
      const std::string line =
          "ignoring " + path + ": " + why +
          " (not a comm counter block of this job's; mltrain top shows no comm time for it)" +
          (stats_refusals_said_ + 1 == kStatsRefusalsNamed ? "; more such files go unnamed" : "");
      // A run names it to the launcher; top, which takes an agent's error for a host it cannot
      // watch, gets it on the agent's stderr.
      if (watch_)
        log_err("%s", line.c_str());
      else
        send(msg::AgentError{line});
    }
    ++stats_refusals_said_;
    return nullptr;
  };
  if (!m.block) {
    // O_NONBLOCK: a FIFO planted at the name must not hold the agent; O_NOFOLLOW: nor a link.
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return nullptr;  // gone meanwhile
      if (S_ISLNK(st.st_mode)) return refuse("a symbolic link");
      if (st.st_uid != ::geteuid())
        return refuse("owned by uid " + std::to_string(st.st_uid) + ", not this agent's user (uid " +
                      std::to_string(::geteuid()) + ")");
      return refuse(std::string("cannot be opened: ") + std::strerror(errno));
    }
    struct stat fst {};
    std::string why;
    if (::fstat(fd, &fst) != 0)
      why = std::string("fstat: ") + std::strerror(errno);
    else if (!S_ISREG(fst.st_mode))
      why = "not a regular file";
    else if (fst.st_uid != ::geteuid())
      why = "owned by uid " + std::to_string(fst.st_uid) + ", not this agent's user (uid " +
            std::to_string(::geteuid()) + ")";
    else if ((fst.st_mode & (S_IWGRP | S_IWOTH)) != 0)
      why = "writable by other users (mode " + std::to_string((fst.st_mode >> 6) & 7) +
            std::to_string((fst.st_mode >> 3) & 7) + std::to_string(fst.st_mode & 7) + ")";
    if (!why.empty()) {
      ::close(fd);
      return refuse(why);
    }
    // The size is set before the magic is written: a shorter file is still being made.
    if (fst.st_size >= off_t(sizeof(mltrain_comm_stats))) {
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
  const mltrain_comm_stats* b = m.block;
  if (__atomic_load_n(&b->magic, __ATOMIC_ACQUIRE) != MLTRAIN_COMM_STATS_MAGIC) return nullptr;  // being made
  if (!m.checked) {
    // Written once at init, before the magic: checked once.
    const uint32_t version = __atomic_load_n(&b->version, __ATOMIC_RELAXED);
    const int32_t rank = __atomic_load_n(&b->rank, __ATOMIC_RELAXED);
    const int32_t world = __atomic_load_n(&b->world_size, __ATOMIC_RELAXED);
    const int32_t pid = __atomic_load_n(&b->pid, __ATOMIC_RELAXED);
    if (version != MLTRAIN_COMM_STATS_VERSION)
      return refuse("version " + std::to_string(version) + ", not " +
                    std::to_string(MLTRAIN_COMM_STATS_VERSION) + " (a rank of another mltrain version?)");
    if (world <= 0 || world > (1 << 24) || rank < 0 || rank >= world)
      return refuse("rank " + std::to_string(rank) + " of " + std::to_string(world) + " is out of range");
    if (rank_pid > 0 && !belongs_to_rank(pid, rank_pid))
      return refuse("its pid " + std::to_string(pid) + " is not this agent's rank (pid " +
                    std::to_string(rank_pid) + ") nor one of its processes");
    if (rank_pid <= 0) {
      if (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH))
        return nullptr;  // a block its rank left behind
      if (!process_is_mine(pid))
        return refuse("its pid " + std::to_string(pid) + " is not a process of this agent's user");
    }
    m.checked = true;
  }
  return b;
}

// Reads the rank's counter block; a missing, refused or half-written one, or a clock that gives no
// consistent copy within a bounded number of tries, leaves the comm fields of this sample empty.
void Agent::read_comm_stats(telemetry::RankSample& r, const std::string& name, int32_t rank_pid) {
  if (name.empty()) return;
  const mltrain_comm_stats* b = map_comm_stats(name, rank_pid);
  if (!b) return;
  // Times are in the block's ticks: CLOCK_MONOTONIC ns through its clock (comm_stats.h).
  mltrain_comm_stats_clock clock{};
  if (!mltrain_comm_stats_try_read_clock(b, &clock)) return;
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
      const mltrain_comm_stats* b = map_comm_stats(name, 0);
      seen[name] = comm_stats_[name];
      comm_stats_.erase(name);
      if (!b) continue;
      const int32_t pid = __atomic_load_n(&b->pid, __ATOMIC_RELAXED);
      const int32_t rank = __atomic_load_n(&b->rank, __ATOMIC_RELAXED);
      if (::kill(pid, 0) != 0 && errno == ESRCH) continue;  // a block its rank left behind
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
  next_sample_ms_ = clock_.now_ms() + telemetry_interval_ms_;
  if (!watch_ && ranks_.empty()) return;  // TelemetryStart came before the ranks: nothing to say yet
  if (!watch_ && !any_alive()) {
    telemetry_interval_ms_ = 0;  // the gang is over here; a restart sends TelemetryStart again
    return;
  }
  // A launcher that does not read (stopped, slow) gets its rank output first; samples wait.
  if (outbox_.size() - outbox_pos_ > kOutboxHighWater / 2) return;
  const int64_t start = clock_.now_ms();
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
        // Only the block each rank was told to make (MLTRAIN_COMM_STATS_NAME), by the rank's pid.
        if (auto it = ranks_.find(uint32_t(r.rank)); r.rank >= 0 && it != ranks_.end())
          read_comm_stats(r, it->second.stats_name, int32_t(it->second.pid));
      } else if (auto it = stats_of_pid_.find(r.pid); it != stats_of_pid_.end()) {
        read_comm_stats(r, it->second, 0);
      }
    }
    if (!watch_)  // the blocks of ranks gone by (a restarted gang's) are let go
      for (auto it = comm_stats_.begin(); it != comm_stats_.end();) {
        bool current = false;
        for (const auto& [id, rank] : ranks_)
          current = current || (!rank.reaped && rank.stats_name == it->first);
        if (current) {
          ++it;
          continue;
        }
        if (it->second.block)
          ::munmap(const_cast<mltrain_comm_stats*>(it->second.block), sizeof(mltrain_comm_stats));
        it = comm_stats_.erase(it);
      }
    telemetry::encode(sample_, telemetry_msg_.sample);
    send(telemetry_msg_);
  } catch (const std::exception& e) {
    // Telemetry is a bystander: out of memory or worse here must not touch the ranks.
    log_err("telemetry stopped: %s", e.what());
    telemetry_interval_ms_ = 0;
  }
  // Time spent here (a slow nvidia-smi) is the agent's own, not the launcher's silence.
  last_heard_ms_ += clock_.now_ms() - start;
}

}  // namespace mltrain::agent::detail
