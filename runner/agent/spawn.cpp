// Starting ranks, forwarding their output and reporting their exits.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/oom.h"
#include "runner/protocol/protocol.h"

extern char** environ;

namespace mltrain::agent::detail {

void Agent::read_rank_fd(Rank& r, int which) {
  int& fd = r.fds[which];
  if (fd < 0) return;
  char buf[kReadChunk];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    send_output(r.id, which + 1, std::string_view(buf, size_t(n)));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    ::close(fd);
    fd = -1;
  }
}

void Agent::write_rank_stdin(Rank& r) {
  while (r.stdin_fd >= 0 && !r.stdin_buf.empty()) {
    ssize_t n = ::write(r.stdin_fd, r.stdin_buf.data(), r.stdin_buf.size());
    if (n > 0) {
      r.stdin_buf.erase(0, size_t(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      return;  // the pipe is full: the loop polls for room
    } else {
      r.stdin_buf.clear();  // the rank closed its stdin (EPIPE): nobody reads the rest
      r.stdin_closing = true;
    }
  }
  if (r.stdin_fd >= 0 && r.stdin_closing && r.stdin_buf.empty()) {
    ::close(r.stdin_fd);
    r.stdin_fd = -1;
  }
}

void Agent::on(uint32_t id, msg::Stdin& m) {
  auto it = ranks_.find(id);
  if (it == ranks_.end() || it->second.stdin_fd < 0) return;  // the rank is gone or closed its stdin
  Rank& r = it->second;
  if (r.stdin_buf.size() + m.bytes.size() > kStdinBacklog) {
    // The rank does not read its stdin: bound the agent's memory, and say so once.
    if (!r.stdin_dropped)
      send(msg::AgentError{"rank " + std::to_string(id) + " is not reading its stdin: input beyond " +
                           std::to_string(kStdinBacklog >> 20) + " MiB not yet read is dropped"});
    r.stdin_dropped = true;
    return;
  }
  r.stdin_buf += m.bytes;
  write_rank_stdin(it->second);
}

void Agent::on(uint32_t id, const msg::StdinClose&) {
  auto it = ranks_.find(id);
  if (it == ranks_.end()) return;
  it->second.stdin_closing = true;
  write_rank_stdin(it->second);
}

namespace {

constexpr size_t kMaxErrorFile = 64 << 10;

// What a rank wrote to its TORCHELASTIC_ERROR_FILE (torch's @record), for the launcher's failure
// summary, wherever the rank ran. Only a regular file of this user's is read (never through a
// link, at most kMaxErrorFile bytes); one in the agent's private folder is removed once read, one
// in the run's folder stays with the run.
std::string take_error_file(const std::string& path, bool failed, const std::string& private_dir) {
  if (path.empty()) return {};
  std::string got;
  if (failed) {
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) {
      char buf[4096];
      ssize_t n;
      while (got.size() < kMaxErrorFile && (n = ::read(fd, buf, sizeof buf)) > 0) got.append(buf, size_t(n));
      if (got.size() > kMaxErrorFile) got.resize(kMaxErrorFile);
    }
    if (fd >= 0) ::close(fd);
  }
  if (!private_dir.empty() && path.size() > private_dir.size() &&
      path.compare(0, private_dir.size(), private_dir) == 0 && path[private_dir.size()] == '/' &&
      path.find('/', private_dir.size() + 1) == std::string::npos)
    ::unlink(path.c_str());
  return got;
}

}  // namespace

// The agent's private folder for its ranks' files (TORCHELASTIC_ERROR_FILE): made on first use by
// mkdtemp (mode 0700, a random name, so nothing another user made can sit there), owned by the
// job's user, removed when the agent ends (and by the warden when the agent is killed). "" with
// `why` when it cannot be made.
const std::string& Agent::private_dir(std::string& why) {
  if (!private_dir_.empty() || private_dir_tried_) return private_dir_;
  private_dir_tried_ = true;
  const char* tmp = ::getenv("TMPDIR");
  std::string base = tmp && *tmp == '/' ? tmp : "/tmp";
  std::string run;
  for (char c : run_id_.substr(0, 60))
    run += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.'
               ? c
               : '_';
  std::string templ = base + "/mltrain-" + run + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) {
    why = "mkdtemp(" + templ + "): " + std::strerror(errno);
    return private_dir_;
  }
  struct stat st {};
  if (::lstat(templ.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
      (st.st_mode & 077) != 0) {
    why = templ + " is not a private folder of this user's";
    return private_dir_;
  }
  private_dir_ = templ;
  return private_dir_;
}

// Forwards everything already in the pipes, so a rank's output always precedes its exit frame.
void Agent::drain_rank(Rank& r) {
  for (int which = 0; which < 2; ++which) {
    char buf[kReadChunk];
    while (r.fds[which] >= 0) {
      ssize_t n = ::read(r.fds[which], buf, sizeof buf);
      if (n > 0) {
        send_output(r.id, which + 1, std::string_view(buf, size_t(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0 || errno != EAGAIN) {
        ::close(r.fds[which]);
        r.fds[which] = -1;
      }
      break;
    }
  }
}

void Agent::reap() {
  while (true) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (auto& [id, r] : ranks_) {
      if (r.pid != pid || r.reaped) continue;
      r.reaped = true;
      if (r.stdin_fd >= 0) ::close(r.stdin_fd);
      r.stdin_fd = -1;
      r.stdin_buf.clear();
      drain_rank(r);
      if (r.id == kSetupId)
        setup_exited(status);
      else
        send(msg::Exited{status, take_error_file(r.error_file, status != 0, private_dir_),
                         WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL &&
                                 oom_killed(pid, r.started_us, r.oom_kills_at_start)
                             ? 1u
                             : 0u},
             r.id);
    }
  }
}

// The comm runtime for every rank: MLTRAIN_RUNTIME, MLTRAIN_COMM_LIB (the library by absolute
// path: no LD_LIBRARY_PATH), the Python package first on PYTHONPATH unless the spec opted out.
// What the job's own env sets (the Spawn's env) wins over the runtime's.
void Agent::add_runtime_env(std::map<std::string, std::string>& merged, const msg::Spawn& m) {
  if (!runtime_tried_) {
    runtime_tried_ = true;
    std::string why;
    runtime_dir_ = unpack_runtime(why);
    if (runtime_dir_.empty())
      send(msg::AgentError{
          "cannot unpack the mltrain runtime (" + why +
          "): `import mltrain` and `mltrain bench` will not work on this host; free some space "
          "in the agent's folder or set HOME"});
  }
  if (runtime_dir_.empty()) return;
  auto set_by_job = [&](const std::string& key) {
    for (const auto& kv : m.env)
      if (kv.compare(0, key.size() + 1, key + "=") == 0) return true;
    return false;
  };
  auto set = [&](const std::string& key, const std::string& value) {
    if (!set_by_job(key)) merged[key] = key + "=" + value;
  };
  set("MLTRAIN_RUNTIME", runtime_dir_);
  set("MLTRAIN_COMM_LIB", runtime_dir_ + "/lib/libmltrain-comm.so.0");
  if (m.python_path) {
    std::string py = runtime_dir_ + "/python";
    auto it = merged.find("PYTHONPATH");
    if (it != merged.end() && it->second.size() > sizeof "PYTHONPATH")
      py += ":" + it->second.substr(sizeof "PYTHONPATH");
    merged["PYTHONPATH"] = "PYTHONPATH=" + py;
  }
}

void Agent::on(uint32_t id, msg::Spawn& m) {
  std::string cwd = expand_home(m.cwd);
  std::vector<std::string>& argv = m.argv;
  std::vector<std::string>& env = m.env;
  if (argv.empty()) {
    send(msg::SpawnFailed{"nothing to run (empty argv)"}, id);
    return;
  }
  if (ranks_.count(id) && !ranks_[id].reaped) {
    send(msg::SpawnFailed{"rank is already running"}, id);
    return;
  }

  // Environment: the agent's own, with the launcher's variables set over it.
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv;
  }
  for (const auto& kv : env) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv;
  }
  add_runtime_env(merged, m);
  if (auto run = merged.find("MLTRAIN_RUN_ID"); run != merged.end() && run_id_.empty())
    run_id_ = run->second.substr(sizeof "MLTRAIN_RUN_ID");  // after "MLTRAIN_RUN_ID="
  // A bare TORCHELASTIC_ERROR_FILE name (a remote rank's: runner/plan/plan.cpp) goes into this
  // agent's private folder; without one the rank writes none (torch then just prints the error).
  if (auto e = merged.find("TORCHELASTIC_ERROR_FILE"); e != merged.end()) {
    const std::string v = e->second.substr(sizeof "TORCHELASTIC_ERROR_FILE");
    if (!v.empty() && v[0] != '/') {
      std::string why;
      const std::string& dir =
          v.find('/') == std::string::npos && v != "." && v != ".." ? private_dir(why) : "";
      if (dir.empty()) {
        if (!why.empty())
          send(
              msg::AgentError{"cannot make a private folder for the ranks' error files (" + why +
                              "): a failed rank's TORCHELASTIC_ERROR_FILE is not collected; free /tmp or set "
                              "TMPDIR on this host"});
        merged.erase(e);
      } else {
        e->second = "TORCHELASTIC_ERROR_FILE=" + dir + "/" + v;
      }
    }
  }
  // The rank's comm counter block: a name only this agent and the rank know (comm_stats.h).
  std::string stats_name;
  if (auto run = merged.find("MLTRAIN_RUN_ID"); run != merged.end() && id != kSetupId) {
    auto& given = merged["MLTRAIN_COMM_STATS_NAME"];
    bool set_by_job = false;  // the job's own value stands; one the agent inherited does not
    for (const auto& kv : env) set_by_job = set_by_job || kv.rfind("MLTRAIN_COMM_STATS_NAME=", 0) == 0;
    if (!set_by_job)
      given = "MLTRAIN_COMM_STATS_NAME=" + comm_stats_name(run->second.substr(sizeof "MLTRAIN_RUN_ID"), id);
    stats_name = given.substr(sizeof "MLTRAIN_COMM_STATS_NAME");
  }
  std::vector<char*> envp, args;
  for (auto& [k, kv] : merged) envp.push_back(kv.data());
  envp.push_back(nullptr);
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  // One pipe for stdout and stderr when asked (Spawn::one_stream): the kernel keeps the order of
  // the rank's writes, which two pipes read in turns cannot.
  int out[2], err[2] = {-1, -1}, status_pipe[2], in[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) || (!m.one_stream && ::pipe2(err, O_CLOEXEC)) ||
      ::pipe2(status_pipe, O_CLOEXEC) || (m.stdin_pipe && ::pipe2(in, O_CLOEXEC))) {
    send(msg::SpawnFailed{std::string("pipe: ") + std::strerror(errno)}, id);
    return;
  }
  auto close_all = [&] {
    for (int fd : {out[0], out[1], err[0], err[1], status_pipe[0], status_pipe[1], in[0], in[1]})
      if (fd >= 0) ::close(fd);
  };
  // The agent's ends only (the ranks' ends stay blocking); they are not inherited (O_CLOEXEC).
  if (!set_nonblocking(out[0]) || (err[0] >= 0 && !set_nonblocking(err[0])) ||
      (in[1] >= 0 && !set_nonblocking(in[1]))) {
    send(msg::SpawnFailed{std::string("fcntl: ") + std::strerror(errno)}, id);
    close_all();
    return;
  }
  if (warden_fd_ == -1) {  // once, before the first rank; -2: it could not start (said once)
    auto run_id = merged.find("MLTRAIN_RUN_ID");
    if (run_id != merged.end() && (warden_fd_ = start_warden(run_id->second, private_dir_, warden_)) < 0) {
      log_err("cannot start the warden (%s); if this agent is killed, its ranks' descendants may survive",
              std::strerror(errno));
      warden_fd_ = -2;
    }
  }
  const pid_t agent_pid = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    send(msg::SpawnFailed{std::string("fork: ") + std::strerror(errno)}, id);
    close_all();
    return;
  }
  if (pid == 0) {
    // Child: own process group, clean signal state, pipes as stdout/stderr, /dev/null (or the
    // launcher's forwarded stdin) as stdin.
    // A step that fails is reported like a failed exec: through the status pipe, exit 127.
    const char* failed = nullptr;
    // The rank dies with its agent, even one killed with SIGKILL (its descendants: the sweep in
    // kill_orphans while the agent lives). Checked after: the agent may have died before it.
    (void)::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != agent_pid) ::_exit(127);
    sigset_t none;
    sigemptyset(&none);
    int input = in[0];
    if (::setpgid(0, 0) != 0)
      failed = "setpgid";
    else if (::sigprocmask(SIG_SETMASK, &none, nullptr) != 0)
      failed = "sigprocmask";
    else if (input < 0 && (input = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
      failed = "open of /dev/null";
    else if (::dup2(input, 0) < 0)
      failed = "dup2 of stdin";
    else if (::dup2(out[1], 1) < 0)
      failed = "dup2 of stdout";
    else if (::dup2(err[1] >= 0 ? err[1] : out[1], 2) < 0)
      failed = "dup2 of stderr";
    if (failed) {
      char msg[256];
      int len = std::snprintf(msg, sizeof msg, "%s: %s", failed, std::strerror(errno));
      if (::write(status_pipe[1], msg, size_t(len)) < 0) {
      }
      ::_exit(127);
    }
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(s, SIG_DFL);
    const char* stage = "chdir";
    int e = 0;
    if (cwd.empty() || ::chdir(cwd.c_str()) == 0) {
      stage = "exec";
      environ = envp.data();  // so PATH set by the job also steers the program lookup
      ::execvp(args[0], args.data());
    }
    e = errno;
    char msg[512];
    int len = std::snprintf(msg, sizeof msg, "%s%s'%s': %s", stage,
                            std::strcmp(stage, "chdir") == 0 ? " to " : " of ",
                            std::strcmp(stage, "chdir") == 0 ? cwd.c_str() : args[0], std::strerror(e));
    if (::write(status_pipe[1], msg, size_t(len)) < 0) {
    }
    ::_exit(127);
  }
  // Also here, so a signal sent right away finds the group. It fails (EACCES) only when the
  // child has already exec'd, by which time the child's own setpgid has done it.
  (void)::setpgid(pid, pid);
  ::close(out[1]);
  if (err[1] >= 0) ::close(err[1]);
  ::close(status_pipe[1]);
  if (in[0] >= 0) ::close(in[0]);
  char msg[512];
  ssize_t n;
  do n = ::read(status_pipe[0], msg, sizeof msg);
  while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n > 0) {
    // exec failed: the child exits 127 on its own; report why and let reap() collect it.
    ::close(out[0]);
    if (err[0] >= 0) ::close(err[0]);
    if (in[1] >= 0) ::close(in[1]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    send(msg::SpawnFailed{std::string(msg, size_t(n))}, id);
    return;
  }
  Rank r;
  r.id = id;
  r.pid = pid;
  r.fds[0] = out[0];
  r.fds[1] = err[0];
  r.stdin_fd = in[1];
  if (auto e = merged.find("TORCHELASTIC_ERROR_FILE"); e != merged.end())
    r.error_file = e->second.substr(e->second.find('=') + 1);
  r.stats_name = std::move(stats_name);
  r.started_us = monotonic_us();  // for the kernel's OOM record of it, if it dies of SIGKILL
  r.oom_kills_at_start = cgroup_oom_kills(::getpid());  // its cgroup is the agent's
  ranks_[id] = r;
  send(msg::Started{pid}, id);
}

}  // namespace mltrain::agent::detail
