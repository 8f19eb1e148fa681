// Starting ranks, forwarding their output and reporting their exits.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/preflight.h"
#include "runner/protocol/protocol.h"

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
  const std::string tmp = env_.get("TMPDIR").value_or("");
  std::string base = !tmp.empty() && tmp[0] == '/' ? tmp : "/tmp";
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
  for (int which = 0; which < 3; ++which) {
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
    pid_t pid = procs_.reap(status);
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
                                 procs_.oom_killed(pid, r.oom_mark)
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
    if (unpack_runtime_)
      runtime_dir_ = unpack_runtime_(why);
    else
      why = "the agent carries no runtime";
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

// `~` or `~/...`: below this user's home.
std::string Agent::expand_home(const std::string& path) const {
  if (path.empty() || path[0] != '~' || (path.size() > 1 && path[1] != '/')) return path;
  std::string h = env_.get("HOME").value_or("");
  if (h.empty())
    if (passwd* pw = ::getpwuid(::getuid())) h = pw->pw_dir;
  return h + path.substr(1);
}

std::string Agent::ranks_path(const std::string& job_path) const {
  const std::optional<std::string> own = env_.get("PATH");
  return effective_path(job_path, own ? own->c_str() : nullptr);
}

// A bare TORCHELASTIC_ERROR_FILE name (a remote rank's: runner/plan/plan.cpp) goes into this
// agent's private folder; without one the rank writes none (torch then just prints the error).
void Agent::place_error_file(std::map<std::string, std::string>& merged) {
  auto e = merged.find("TORCHELASTIC_ERROR_FILE");
  if (e == merged.end()) return;
  const std::string v = e->second.substr(sizeof "TORCHELASTIC_ERROR_FILE");
  if (v.empty() || v[0] == '/') return;
  std::string why;
  const std::string& dir = v.find('/') == std::string::npos && v != "." && v != ".." ? private_dir(why) : "";
  if (dir.empty()) {
    if (!why.empty())
      send(msg::AgentError{"cannot make a private folder for the ranks' error files (" + why +
                           "): a failed rank's TORCHELASTIC_ERROR_FILE is not collected; free /tmp or set "
                           "TMPDIR on this host"});
    merged.erase(e);
  } else {
    e->second = "TORCHELASTIC_ERROR_FILE=" + dir + "/" + v;
  }
}

// MLTRAIN_CHECKPOINT_DIR as mltrain sets it ("~/.cache/mltrain/checkpoints/RUN_ID", plan.cpp):
// below this user's home, made private (0700) before the rank starts, kept across the run's
// restarts (docs/elastic.md). Folders that exist are left as they are; the one it made goes at the
// agent's end if no rank wrote into it (rmdir: only an empty folder).
void Agent::place_checkpoint_dir(std::map<std::string, std::string>& merged) {
  auto e = merged.find("MLTRAIN_CHECKPOINT_DIR");
  if (e == merged.end()) return;
  const std::string given = e->second.substr(sizeof "MLTRAIN_CHECKPOINT_DIR");
  auto run = merged.find("MLTRAIN_RUN_ID");
  if (run == merged.end() ||
      given != "~/.cache/mltrain/checkpoints/" + run->second.substr(sizeof "MLTRAIN_RUN_ID"))
    return;  // the job's own folder: the job's to make
  const std::string dir = expand_home(given);
  e->second = "MLTRAIN_CHECKPOINT_DIR=" + dir;
  const std::string home = expand_home("~");
  for (size_t at = home.size() + 1; at <= dir.size(); ++at) {
    if (at < dir.size() && dir[at] != '/') continue;
    const std::string part = dir.substr(0, at);
    if (::mkdir(part.c_str(), 0700) == 0) {
      if (at == dir.size()) checkpoint_made_ = dir;
    } else if (errno != EEXIST) {
      send(msg::AgentError{"cannot make " + part + " for MLTRAIN_CHECKPOINT_DIR: " + std::strerror(errno) +
                           "; free space in the home folder on this host"});
      return;
    }
  }
}

std::map<std::string, std::string> Agent::rank_env(uint32_t id, const msg::Spawn& m,
                                                   std::string& stats_name) {
  // The agent's own, with the launcher's variables set over it.
  std::map<std::string, std::string> merged;
  const std::vector<std::string> own = env_.entries();
  for (const std::vector<std::string>* list : {&own, &m.env})
    for (const auto& kv : *list) {
      auto eq = kv.find('=');
      if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv;
    }
  add_runtime_env(merged, m);
  if (auto run = merged.find("MLTRAIN_RUN_ID"); run != merged.end() && run_id_.empty())
    run_id_ = run->second.substr(sizeof "MLTRAIN_RUN_ID");  // after "MLTRAIN_RUN_ID="
  place_error_file(merged);
  if (id != kSetupId) place_checkpoint_dir(merged);
  // The rank's comm counter block: a name only this agent and the rank know (comm_stats.h).
  if (auto run = merged.find("MLTRAIN_RUN_ID"); run != merged.end() && id != kSetupId) {
    auto& given = merged["MLTRAIN_COMM_STATS_NAME"];
    bool set_by_job = false;  // the job's own value stands; one the agent inherited does not
    for (const auto& kv : m.env) set_by_job = set_by_job || kv.rfind("MLTRAIN_COMM_STATS_NAME=", 0) == 0;
    if (!set_by_job)
      given = "MLTRAIN_COMM_STATS_NAME=" + comm_stats_name(run->second.substr(sizeof "MLTRAIN_RUN_ID"), id);
    stats_name = given.substr(sizeof "MLTRAIN_COMM_STATS_NAME");
  }
  // Where mltrain.log writes (python/mltrain/metrics.py); the setup command gets no pipe.
  if (id != kSetupId)
    merged["MLTRAIN_METRICS_FD"] = "MLTRAIN_METRICS_FD=" + std::to_string(kMetricsFd);
  else
    merged.erase("MLTRAIN_METRICS_FD");
  return merged;
}

// Once, before the first rank; -2: it could not start (said once).
void Agent::start_warden_once(const std::map<std::string, std::string>& merged) {
  if (warden_fd_ != -1) return;
  auto run_id = merged.find("MLTRAIN_RUN_ID");
  if (run_id != merged.end() &&
      (warden_fd_ = procs_.start_warden(run_id->second, private_dir_, warden_)) < 0) {
    log_err("cannot start the warden (%s); if this agent is killed, its ranks' descendants may survive",
            std::strerror(errno));
    warden_fd_ = -2;
  }
}

namespace {

// A `command = "…"` rank runs as /bin/sh -c COMMAND. When COMMAND is one plain command (no
// operator, redirection, substitution or compound word, not a builtin or an assignment first),
// the shell is told to exec it: the rank's process is then the program itself, so its CPU and
// memory (telemetry, top, show) and its signals are the program's, not an idle shell's.
bool plain_shell_command(std::string_view cmd) {
  if (cmd.empty() || cmd.find_first_of(";&|<>()`\n\\") != std::string_view::npos) return false;
  size_t b = cmd.find_first_not_of(" \t");
  if (b == std::string_view::npos) return false;
  std::string_view first = cmd.substr(b, cmd.find_first_of(" \t", b) - b);
  if (first.find_first_of("=$'\"{}*?[~") != std::string_view::npos) return false;
  static constexpr std::string_view kNotPrograms[] = {
      "!",    "{",      "}",       "if",     "then",     "else",  "elif",     "fi",      "do",   "done",
      "case", "esac",   "while",   "until",  "for",      "in",    "function", "select",  "time", "cd",
      ".",    "source", "exit",    "export", "set",      "unset", "alias",    "return",  "eval", "exec",
      "trap", "wait",   "read",    "shift",  "ulimit",   "umask", "type",     "command", "hash", "jobs",
      "fg",   "bg",     "getopts", "local",  "readonly", "break", "continue", ":"};
  for (auto w : kNotPrograms)
    if (first == w) return false;
  return true;
}

}  // namespace

void Agent::on(uint32_t id, msg::Spawn& m) {
  if (claim_) claim_->leave_queue();  // the job runs: its leases hold what it has, not its place
  // A restart: the stop before it is over once every rank it stopped was reaped. What is left
  // below goes now, and its KILL deadline with it: it must not reach the new ranks.
  if (kill_deadline_ms_ >= 0 && !any_alive()) {
    kill_orphans();
    kill_deadline_ms_ = -1;
  }
  if (m.argv.empty()) {
    send(msg::SpawnFailed{"nothing to run (empty argv)"}, id);
    return;
  }
  if (ranks_.count(id) && !ranks_[id].reaped) {
    send(msg::SpawnFailed{"rank is already running"}, id);
    return;
  }
  std::string stats_name;
  const std::map<std::string, std::string> merged = rank_env(id, m, stats_name);
  ProcessSpec spec;
  spec.argv = std::move(m.argv);
  if (spec.argv.size() == 3 && spec.argv[0] == "/bin/sh" && spec.argv[1] == "-c" &&
      plain_shell_command(spec.argv[2]))
    spec.argv[2] = "exec " + spec.argv[2];
  for (const auto& [k, kv] : merged) spec.env.push_back(kv);
  spec.cwd = expand_home(m.cwd);
  spec.one_stream = m.one_stream != 0;
  spec.stdin_pipe = m.stdin_pipe != 0;
  spec.metrics_pipe = id != kSetupId;
  start_warden_once(merged);
  ProcessPipes pipes;
  std::string error;
  const pid_t pid = procs_.spawn(spec, pipes, error);
  if (pid < 0) {
    send(msg::SpawnFailed{error}, id);
    return;
  }
  Rank r;
  r.id = id;
  r.pid = pid;
  r.fds[0] = pipes.out;
  r.fds[1] = pipes.err;
  r.fds[2] = pipes.metrics;
  r.stdin_fd = pipes.in;
  if (auto e = merged.find("TORCHELASTIC_ERROR_FILE"); e != merged.end())
    r.error_file = e->second.substr(e->second.find('=') + 1);
  r.stats_name = std::move(stats_name);
  r.oom_mark = procs_.oom_mark();  // for the kernel's record of it, if it dies of SIGKILL
  ranks_[id] = r;
  send(msg::Started{pid}, id);
}

}  // namespace mltrain::agent::detail
