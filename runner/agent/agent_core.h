// The agent's logic as a library: the loop that serves the protocol, starting and stopping ranks,
// preflight, sync, PS hosting and telemetry. What it touches besides its stream is behind the three
// interfaces below (the clock, the processes, the environment), each with one real implementation
// here and fakes in tests/unit/test_agent_core.cpp, so the agent's timing is tested on a fake
// clock. The agent executable (agent_main.cpp) links it with the real ones.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::agent {

// Milliseconds on a clock that never goes back (CLOCK_MONOTONIC for the real one).
class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t now_ms() const = 0;
  // Waits (a fake advances itself): the pause between two sweeps of a dying process tree.
  virtual void sleep_ms(int64_t ms) = 0;
};

// What a rank (or the setup command) is started with.
struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is looked up in the PATH of `env`
  std::vector<std::string> env;   // "NAME=value", the whole environment
  std::string cwd;                // "" = the agent's own
  bool one_stream = false;        // stderr into the stdout pipe: the order of the writes kept
  bool stdin_pipe = false;        // a pipe for stdin (else /dev/null)
  // A pipe for the rank's metrics (mltrain.log), its write end fd kMetricsFd in the process.
  bool metrics_pipe = false;
};
// The descriptor a rank's metrics pipe has in it (MLTRAIN_METRICS_FD), as systemd passes sockets.
inline constexpr int kMetricsFd = 3;

// The agent's ends of a started process's pipes, non-blocking; -1 where there is none.
struct ProcessPipes {
  int out = -1, err = -1, in = -1, metrics = -1;
};

// When a rank started (CLOCK_MONOTONIC microseconds, as the kernel log stamps records) and its
// cgroup's OOM kills then (nullopt: unreadable).
struct OomMark {
  uint64_t started_us = 0;
  std::optional<uint64_t> kills;
};

// The processes the agent starts, signals and reaps.
class ProcessTable {
 public:
  virtual ~ProcessTable() = default;
  // Starts `spec` as the leader of a process group of its own, dying with the agent. Its pid and
  // pipes, or -1 with `error` saying which step failed ("exec of 'x': No such file or directory").
  virtual pid_t spawn(const ProcessSpec& spec, ProcessPipes& pipes, std::string& error) = 0;
  // killpg: a group already gone is no error.
  virtual void signal_group(pid_t group, int sig) = 0;
  // A child that has ended, without waiting: its pid, with its wait status; 0 when none has.
  virtual pid_t reap(int& status) = 0;
  // SIGKILL to every process below the agent but `spare` (one sweep; the agent reaps between
  // sweeps, inheriting orphans as a subreaper). False when there was none.
  virtual bool kill_descendants(pid_t spare) = 0;
  // Forks the warden (warden.cpp): once the agent is gone, it kills this user's processes whose
  // environment holds `marker`, removes the job's segments and `private_dir`. The end of its pipe
  // the agent keeps (-1 with errno on failure); `warden` gets its pid.
  virtual int start_warden(const std::string& marker, const std::string& private_dir, pid_t& warden) = 0;
  // The OOM evidence for a rank that died of SIGKILL (oom.h): a mark taken when it starts, and
  // the verdict for it from the mark.
  virtual OomMark oom_mark() = 0;
  virtual bool oom_killed(pid_t pid, const OomMark& at_start) = 0;
};

// The agent's own environment: what it reads for itself and what its ranks inherit.
class Environment {
 public:
  virtual ~Environment() = default;
  // The value as set (empty included: CUDA_VISIBLE_DEVICES="" hides every GPU); nullopt when unset.
  // Every name is declared in knobs/src/registry.cpp.
  virtual std::optional<std::string> get(std::string_view name) const = 0;
  // Every "NAME=value", for the ranks to inherit.
  virtual std::vector<std::string> entries() const = 0;
};

// The real ones: CLOCK_MONOTONIC, fork/exec/killpg/waitpid, the process environment (read
// through knobs/).
Clock& system_clock();
ProcessTable& system_processes();
Environment& process_environment();

// The byte stream to the launcher (both ends non-blocking) and the signals to watch.
struct AgentStream {
  int in = 0;        // frames from the launcher
  int out = 1;       // frames to the launcher
  int signals = -1;  // a signalfd (SIGCHLD, SIGTERM, ...), -1: none
};

// Everything the core uses besides its stream.
struct AgentWorld {
  Clock& clock;
  ProcessTable& processes;
  Environment& env;
  // Unpacks the comm runtime the agent carries and returns its folder ("" with `why` when it
  // cannot); the ranks get it as MLTRAIN_RUNTIME. Empty: the agent carries none.
  std::function<std::string(std::string& why)> unpack_runtime;
};

namespace detail {
class Agent;
}

class AgentCore {
 public:
  // The launcher's silence is counted from now.
  AgentCore(AgentStream stream, AgentWorld world);
  ~AgentCore();
  AgentCore(const AgentCore&) = delete;
  AgentCore& operator=(const AgentCore&) = delete;
  // One turn of the loop: what is due by the clock (KILL after a grace, the silence window,
  // telemetry), then a wait of at most `max_wait_ms` (0: none) for the stream, the ranks' pipes and
  // the signals, and what came. The exit code once the agent has said Bye, else nullopt.
  std::optional<int> step(int max_wait_ms);

 private:
  std::unique_ptr<detail::Agent> agent_;
  std::optional<int> exit_code_;
};

// The whole agent process (agent_main.cpp): out of the terminal's group, a child subreaper,
// signals through a signalfd, the protocol on fds 0 and 1 until Bye. The process exit code.
int run_agent(std::function<std::string(std::string& why)> unpack_runtime);

}  // namespace mltrain::agent
