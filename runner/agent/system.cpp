// The real clock, process table and environment of the agent (agent_core.h).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "knobs/registry.h"
#include "runner/agent/agent_core.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/oom.h"

extern char** environ;

namespace mltrain::agent {

namespace {

class SystemClock final : public Clock {
 public:
  int64_t now_ms() const override {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
  }
  void sleep_ms(int64_t ms) override { ::usleep(useconds_t(ms * 1000)); }
};

// The children of `pid` (every thread's), from /proc/PID/task/TID/children.
void children_of(pid_t pid, std::vector<pid_t>& out) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", int(pid));
  DIR* d = ::opendir(path);
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char cpath[400];
    std::snprintf(cpath, sizeof cpath, "%s/%s/children", path, e->d_name);
    FILE* f = std::fopen(cpath, "r");
    if (!f) continue;
    int child;
    while (std::fscanf(f, "%d", &child) == 1) out.push_back(pid_t(child));
    std::fclose(f);
  }
  ::closedir(d);
}

// The pipes of one child: [0] read end, [1] write end; -1 where there is none.
struct ChildPipes {
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1}, in[2] = {-1, -1}, metrics[2] = {-1, -1};
  void close_all() {
    for (int* p : {out, err, status, in, metrics})
      for (int i = 0; i < 2; ++i)
        if (p[i] >= 0) ::close(p[i]), p[i] = -1;
  }
};

// In the child: the metrics pipe's write end as descriptor `fd`, inherited by the program; the
// status pipe moved off `fd` first when it is there.
bool metrics_at(ChildPipes& p, int fd) {
  if (p.status[1] == fd && (p.status[1] = ::fcntl(fd, F_DUPFD_CLOEXEC, fd + 1)) < 0) return false;
  if (p.metrics[1] == fd) return ::fcntl(fd, F_SETFD, 0) == 0;  // dup2 to itself keeps O_CLOEXEC
  return ::dup2(p.metrics[1], fd) == fd;
}

// In the child: its own process group, clean signal state, the pipes as stdout/stderr, /dev/null (or
// the launcher's forwarded stdin) as stdin, then exec. A step that fails is reported like a failed
// exec: through the status pipe, exit 127.
[[noreturn]] void exec_child(const ProcessSpec& spec, ChildPipes& p, pid_t agent_pid, char** envp,
                             char** args) {
  const char* failed = nullptr;
  // The rank dies with its agent, even one killed with SIGKILL (its descendants: the sweep in
  // kill_orphans while the agent lives). Checked after: the agent may have died before it.
  (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != agent_pid) ::_exit(127);
  sigset_t none;
  sigemptyset(&none);
  int input = p.in[0];
  if (::setpgid(0, 0) != 0)
    failed = "setpgid";
  else if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0)
    failed = "sigprocmask";
  else if (input < 0 && (input = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
    failed = "open of /dev/null";
  else if (::dup2(input, 0) < 0)
    failed = "dup2 of stdin";
  else if (::dup2(p.out[1], 1) < 0)
    failed = "dup2 of stdout";
  else if (::dup2(p.err[1] >= 0 ? p.err[1] : p.out[1], 2) < 0)
    failed = "dup2 of stderr";
  else if (p.metrics[1] >= 0 && !metrics_at(p, kMetricsFd))
    failed = "dup2 of the metrics pipe";
  char msg[512];
  if (failed) {
    int len = std::snprintf(msg, sizeof msg, "%s: %s", failed, std::strerror(errno));
    if (::write(p.status[1], msg, size_t(len)) < 0) {
    }
    ::_exit(127);
  }
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(s, SIG_DFL);
  const bool chdir_failed = !spec.cwd.empty() && ::chdir(spec.cwd.c_str()) != 0;
  if (!chdir_failed) {
    environ = envp;  // so PATH set by the job also steers the program lookup
    ::execvp(args[0], args);
  }
  const int e = errno;
  int len = std::snprintf(msg, sizeof msg, "%s'%s': %s", chdir_failed ? "chdir to " : "exec of ",
                          chdir_failed ? spec.cwd.c_str() : args[0], std::strerror(e));
  if (::write(p.status[1], msg, size_t(len)) < 0) {
  }
  ::_exit(127);
}

class SystemProcesses final : public ProcessTable {
 public:
  pid_t spawn(const ProcessSpec& spec, ProcessPipes& pipes, std::string& error) override {
    std::vector<std::string> env = spec.env, argv = spec.argv;
    std::vector<char*> envp, args;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    // One pipe for stdout and stderr when asked: the kernel keeps the order of the rank's writes,
    // which two pipes read in turns cannot.
    ChildPipes p;
    if (::pipe2(p.out, O_CLOEXEC) || (!spec.one_stream && ::pipe2(p.err, O_CLOEXEC)) ||
        ::pipe2(p.status, O_CLOEXEC) || (spec.stdin_pipe && ::pipe2(p.in, O_CLOEXEC)) ||
        (spec.metrics_pipe && ::pipe2(p.metrics, O_CLOEXEC))) {
      error = std::string("pipe: ") + std::strerror(errno);
      p.close_all();
      return -1;
    }
    // The agent's ends only (the ranks' ends stay blocking); they are not inherited (O_CLOEXEC).
    if (!detail::set_nonblocking(p.out[0]) || (p.err[0] >= 0 && !detail::set_nonblocking(p.err[0])) ||
        (p.in[1] >= 0 && !detail::set_nonblocking(p.in[1])) ||
        (p.metrics[0] >= 0 && !detail::set_nonblocking(p.metrics[0]))) {
      error = std::string("fcntl: ") + std::strerror(errno);
      p.close_all();
      return -1;
    }
    const pid_t agent_pid = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      error = std::string("fork: ") + std::strerror(errno);
      p.close_all();
      return -1;
    }
    if (pid == 0) exec_child(spec, p, agent_pid, envp.data(), args.data());
    // Also here, so a signal sent right away finds the group. It fails (EACCES) only when the
    // child has already exec'd, by which time the child's own setpgid has done it.
    (void)::setpgid(pid, pid);
    for (int* child_end : {&p.out[1], &p.err[1], &p.status[1], &p.in[0], &p.metrics[1]})
      if (*child_end >= 0) ::close(*child_end), *child_end = -1;
    char msg[512];
    ssize_t n;
    do n = ::read(p.status[0], msg, sizeof msg);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
      // exec failed: the child exits 127 on its own; collected here, so no exit is reported.
      p.close_all();
      int status = 0;
      ::waitpid(pid, &status, 0);
      error.assign(msg, size_t(n));
      return -1;
    }
    ::close(p.status[0]);
    pipes = ProcessPipes{p.out[0], p.err[0], p.in[1], p.metrics[0]};
    return pid;
  }

  void signal_group(pid_t group, int sig) override { ::killpg(group, sig); }

  pid_t reap(int& status) override {
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    return pid > 0 ? pid : 0;
  }

  bool kill_descendants(pid_t spare) override {
    std::vector<pid_t> tree;
    children_of(::getpid(), tree);
    tree.erase(std::remove(tree.begin(), tree.end(), spare), tree.end());
    for (size_t i = 0; i < tree.size() && tree.size() < 100000; ++i) children_of(tree[i], tree);
    for (pid_t p : tree) ::kill(p, SIGKILL);
    return !tree.empty();
  }

  int start_warden(const std::string& marker, const std::string& private_dir, pid_t& warden) override {
    return detail::start_warden(marker, private_dir, warden);
  }

  OomMark oom_mark() override { return OomMark{monotonic_us(), cgroup_oom_kills(::getpid())}; }

  bool oom_killed(pid_t pid, const OomMark& at_start) override {
    return agent::oom_killed(pid, at_start.started_us, at_start.kills);
  }
};

class ProcessEnvironment final : public Environment {
 public:
  std::optional<std::string> get(std::string_view name) const override { return knobs::get_raw(name); }
  std::vector<std::string> entries() const override {
    std::vector<std::string> out;
    for (char** e = environ; *e; ++e) out.emplace_back(*e);
    return out;
  }
};

}  // namespace

Clock& system_clock() {
  static SystemClock clock;
  return clock;
}

ProcessTable& system_processes() {
  static SystemProcesses processes;
  return processes;
}

Environment& process_environment() {
  static ProcessEnvironment env;
  return env;
}

}  // namespace mltrain::agent
