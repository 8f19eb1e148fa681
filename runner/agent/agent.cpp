#include "runner/agent/agent.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runner/agent/protocol.h"

extern char** environ;

namespace mltrain::agent {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr int64_t kLostLauncherGraceMs = 2000;
constexpr size_t kOutboxHighWater = 8u << 20;  // stop reading ranks' pipes above this backlog

int64_t now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void log_err(const char* fmt, const char* arg) {
  // stderr is the only place besides the frame stream; keep it to real trouble.
  std::fprintf(stderr, "mltrain-agent: ");
  std::fprintf(stderr, fmt, arg);
  std::fprintf(stderr, "\n");
}

struct Rank {
  uint32_t id = 0;
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr read ends
  bool reaped = false;
};

class Agent {
 public:
  int run();

 private:
  void handle_frame(const Frame& f);
  void spawn(const Frame& f);
  void prepare(const Frame& f);
  void probe(const Frame& f);
  void send(Type t, uint32_t id, std::string_view payload, uint16_t flags = 0);
  void flush_outbox(bool block);
  void read_rank_fd(Rank& r, int which);
  void drain_rank(Rank& r);
  void reap();
  void signal_groups(int sig, uint32_t id);
  void kill_orphans();
  void start_terminate(int64_t grace_ms);
  bool any_alive() const;
  void teardown_and_exit_soon(const char* why);

  std::map<uint32_t, Rank> ranks_;
  std::string outbox_;
  size_t outbox_pos_ = 0;
  Decoder decoder_;
  int sigfd_ = -1;
  bool stdin_open_ = true;
  bool stdout_open_ = true;
  bool greeted_ = false;
  int64_t grace_ms_ = 5000;
  int64_t heartbeat_timeout_ms_ = 0;  // 0: no heartbeat check
  int64_t last_heard_ms_ = 0;
  int64_t kill_deadline_ms_ = -1;  // when TERMed groups get KILL
  bool exiting_ = false;           // launcher gone or shutdown: leave once every rank is gone
  int64_t exit_deadline_ms_ = -1;
};

void Agent::send(Type t, uint32_t id, std::string_view payload, uint16_t flags) {
  if (!stdout_open_) return;
  encode(outbox_, t, id, payload, flags);
}

void Agent::flush_outbox(bool block) {
  while (stdout_open_ && outbox_pos_ < outbox_.size()) {
    ssize_t n = ::write(1, outbox_.data() + outbox_pos_, outbox_.size() - outbox_pos_);
    if (n > 0) {
      outbox_pos_ += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!block) break;
      pollfd p{1, POLLOUT, 0};
      if (::poll(&p, 1, 1000) == 0) break;  // give up after a second; the caller retries
      continue;
    }
    stdout_open_ = false;  // EPIPE: the launcher is gone
    teardown_and_exit_soon("launcher connection closed");
  }
  if (outbox_pos_ == outbox_.size()) {
    outbox_.clear();
    outbox_pos_ = 0;
  } else if (outbox_pos_ > (1u << 20)) {
    outbox_.erase(0, outbox_pos_);
    outbox_pos_ = 0;
  }
}

void Agent::teardown_and_exit_soon(const char* why) {
  if (exiting_) return;
  if (any_alive()) log_err("%s; stopping this host's ranks", why);
  exiting_ = true;
  // Nobody waits on a lost launcher's job: a short grace, so nothing outlives it by long.
  int64_t grace = std::min<int64_t>(grace_ms_, kLostLauncherGraceMs);
  start_terminate(grace);
  exit_deadline_ms_ = now_ms() + grace + 2000;
}

bool Agent::any_alive() const {
  for (const auto& [id, r] : ranks_)
    if (!r.reaped) return true;
  return false;
}

void Agent::signal_groups(int sig, uint32_t id) {
  for (auto& [rid, r] : ranks_) {
    if (id != kAllRanks && rid != id) continue;
    if (r.pid > 0) ::killpg(r.pid, sig);  // the group outlives its leader; ESRCH is fine
  }
}

// As a child subreaper we inherit ranks' orphaned descendants; kill those too (they may have
// left their process group with setsid).
void Agent::kill_orphans() {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/task", int(::getpid()));
  DIR* d = ::opendir(path);
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char cpath[400];
    std::snprintf(cpath, sizeof cpath, "%s/%s/children", path, e->d_name);
    FILE* f = std::fopen(cpath, "r");
    if (!f) continue;
    int pid;
    while (std::fscanf(f, "%d", &pid) == 1) ::kill(pid, SIGKILL);
    std::fclose(f);
  }
  ::closedir(d);
}

void Agent::start_terminate(int64_t grace_ms) {
  signal_groups(SIGCONT, kAllRanks);  // a stopped group would never see TERM
  signal_groups(grace_ms > 0 ? SIGTERM : SIGKILL, kAllRanks);
  int64_t deadline = now_ms() + grace_ms;
  if (kill_deadline_ms_ < 0 || deadline < kill_deadline_ms_) kill_deadline_ms_ = deadline;
}

void Agent::read_rank_fd(Rank& r, int which) {
  int& fd = r.fds[which];
  if (fd < 0) return;
  char buf[kReadChunk];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    send(Type::output, r.id, std::string_view(buf, size_t(n)), uint16_t(which + 1));
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    ::close(fd);
    fd = -1;
  }
}

// Forwards everything already in the pipes, so a rank's output always precedes its exit frame.
void Agent::drain_rank(Rank& r) {
  for (int which = 0; which < 2; ++which) {
    char buf[kReadChunk];
    while (r.fds[which] >= 0) {
      ssize_t n = ::read(r.fds[which], buf, sizeof buf);
      if (n > 0) {
        send(Type::output, r.id, std::string_view(buf, size_t(n)), uint16_t(which + 1));
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
      drain_rank(r);
      send(Type::exited, r.id, Writer().i32(status).take());
    }
  }
}

void Agent::spawn(const Frame& f) {
  Reader rd(f.payload);
  std::string cwd = rd.str();
  std::vector<std::string> argv = rd.strings();
  std::vector<std::string> env = rd.strings();
  if (rd.failed() || argv.empty()) {
    send(Type::spawn_failed, f.id, Writer().str("malformed spawn request").take());
    return;
  }
  if (ranks_.count(f.id) && !ranks_[f.id].reaped) {
    send(Type::spawn_failed, f.id, Writer().str("rank is already running").take());
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
  std::vector<char*> envp, args;
  for (auto& [k, kv] : merged) envp.push_back(kv.data());
  envp.push_back(nullptr);
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);

  int out[2], err[2], status_pipe[2];
  if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(status_pipe, O_CLOEXEC)) {
    send(Type::spawn_failed, f.id, Writer().str(std::string("pipe: ") + std::strerror(errno)).take());
    return;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    send(Type::spawn_failed, f.id, Writer().str(std::string("fork: ") + std::strerror(errno)).take());
    for (int fd : {out[0], out[1], err[0], err[1], status_pipe[0], status_pipe[1]}) ::close(fd);
    return;
  }
  if (pid == 0) {
    // Child: own process group, clean signal state, pipes as stdout/stderr, /dev/null as stdin.
    ::setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(s, SIG_DFL);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    const char* stage = "chdir";
    int e = 0;
    if (cwd.empty() || ::chdir(cwd.c_str()) == 0) {
      stage = "exec";
      environ = envp.data();  // so PATH set by the job also steers the program lookup
      ::execvp(args[0], args.data());
    }
    e = errno;
    char msg[512];
    int len = std::snprintf(msg, sizeof msg, "%s%s'%s': %s", stage, std::strcmp(stage, "chdir") == 0 ? " to " : " of ",
                            std::strcmp(stage, "chdir") == 0 ? cwd.c_str() : args[0], std::strerror(e));
    if (::write(status_pipe[1], msg, size_t(len)) < 0) {}
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so a signal sent right away finds the group
  ::close(out[1]);
  ::close(err[1]);
  ::close(status_pipe[1]);
  char msg[512];
  ssize_t n;
  do n = ::read(status_pipe[0], msg, sizeof msg);
  while (n < 0 && errno == EINTR);
  ::close(status_pipe[0]);
  if (n > 0) {
    // exec failed: the child exits 127 on its own; report why and let reap() collect it.
    ::close(out[0]);
    ::close(err[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    send(Type::spawn_failed, f.id, Writer().str(std::string(msg, size_t(n))).take());
    return;
  }
  set_nonblocking(out[0]);
  set_nonblocking(err[0]);
  Rank r;
  r.id = f.id;
  r.pid = pid;
  r.fds[0] = out[0];
  r.fds[1] = err[0];
  ranks_[f.id] = r;
  send(Type::started, f.id, Writer().i32(pid).take());
}

// The interface and local address this host uses to reach `addr` (no packet is sent).
void route_to(const std::string& addr, std::string& ifname, std::string& local_ip) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(addr.c_str(), "9", &hints, &res) != 0 || !res) return;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (!ok) return;
  char buf[INET6_ADDRSTRLEN] = {};
  const void* a = local.ss_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                                              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
  ::inet_ntop(local.ss_family, a, buf, sizeof buf);
  local_ip = buf;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != local.ss_family) continue;
    char b[INET6_ADDRSTRLEN] = {};
    const void* ia = i->ifa_addr->sa_family == AF_INET
                         ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
                         : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    ::inet_ntop(i->ifa_addr->sa_family, ia, b, sizeof b);
    if (local_ip == b) {
      ifname = i->ifa_name;
      break;
    }
  }
  ::freeifaddrs(ifs);
}

bool is_executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Preflight on this host: the route to the master, free ports, the workdir, the program.
void Agent::prepare(const Frame& f) {
  Reader rd(f.payload);
  std::string master = rd.str();
  uint32_t nports = rd.u32();
  std::string workdir = rd.str();
  std::string argv0 = rd.str();
  std::string path = rd.str();
  std::vector<std::string> problems;
  std::string ifname, local_ip;
  if (!master.empty()) {
    route_to(master, ifname, local_ip);
    if (ifname.empty()) problems.push_back("no route to the master address " + master);
  }
  std::vector<std::string> ports;
  std::vector<int> held;
  for (uint32_t i = 0; i < nports && i < 16; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      ports.push_back(std::to_string(ntohs(a.sin_port)));
      held.push_back(fd);  // held until all are chosen, so they differ
    } else {
      problems.push_back(std::string("cannot find a free TCP port: ") + std::strerror(errno));
      if (fd >= 0) ::close(fd);
    }
  }
  for (int fd : held) ::close(fd);
  struct stat st{};
  if (!workdir.empty() && (::stat(workdir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
    problems.push_back("workdir " + workdir + " does not exist here");
  else if (!argv0.empty()) {
    if (argv0.find('/') != std::string::npos) {
      std::string full = argv0[0] == '/' || workdir.empty() ? argv0 : workdir + "/" + argv0;
      if (!is_executable_file(full)) problems.push_back("program " + argv0 + " is not an executable file here");
    } else {
      if (path.empty()) path = ::getenv("PATH") ? ::getenv("PATH") : "/usr/bin:/bin";
      bool found = false;
      size_t start = 0;
      while (!found) {
        size_t colon = path.find(':', start);
        std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
        if (dir.empty()) dir = ".";
        if (dir[0] != '/' && !workdir.empty()) dir = workdir + "/" + dir;
        found = is_executable_file(dir + "/" + argv0);
        if (colon == std::string::npos) break;
        start = colon + 1;
      }
      if (!found) problems.push_back("program " + argv0 + " not found in PATH (" + path + ")");
    }
  }
  send(Type::prepared, f.id, Writer().str(ifname).str(local_ip).strings(ports).strings(problems).take());
}

// First line a command prints, or "" (for doctor's version checks; bounded by `timeout`).
std::string first_line(const std::string& cmd) {
  FILE* p = ::popen(("timeout 20 " + cmd + " 2>/dev/null").c_str(), "r");
  if (!p) return {};
  char buf[512] = {};
  std::string out;
  if (std::fgets(buf, sizeof buf, p)) out = buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

// What `mltrain doctor` reports about this host.
void Agent::probe(const Frame& f) {
  Reader rd(f.payload);
  int port = int(rd.u32());
  std::vector<std::string> facts;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);  // first, before the slow checks below
  facts.push_back("time_ms=" + std::to_string(int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000));
  utsname u{};
  ::uname(&u);
  facts.push_back(std::string("arch=") + u.machine);
  facts.push_back(std::string("kernel=") + u.release);
  facts.push_back(std::string("glibc=") + gnu_get_libc_version());
  int gpus = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++gpus;
    ::closedir(d);
  }
  facts.push_back("gpus=" + std::to_string(gpus));
  std::string nccl = "not found";
  for (const char* lib : {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2"}) {
    if (void* h = ::dlopen(lib, RTLD_LAZY | RTLD_LOCAL)) {
      using GetVersion = int (*)(int*);
      int v = 0;
      if (auto fn = reinterpret_cast<GetVersion>(::dlsym(h, "ncclGetVersion")); fn && fn(&v) == 0)
        nccl = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
      else
        nccl = "found";
      ::dlclose(h);
      break;
    }
  }
  facts.push_back("nccl=" + nccl);
  std::string py = first_line("python3 --version");
  facts.push_back("python3=" + (py.rfind("Python ", 0) == 0 ? py.substr(7) : std::string("not found")));
  std::string torch = first_line("/usr/bin/python3 -c 'import torch; print(torch.__version__)'");
  if (torch.empty()) torch = first_line("python3 -c 'import torch; print(torch.__version__)'");
  facts.push_back("torch=" + (torch.empty() ? std::string("not found") : torch));
  if (port > 0) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    bool free_port = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    facts.push_back(std::string("port_free=") + (free_port ? "yes" : "no"));
  }
  send(Type::probed, f.id, Writer().strings(facts).take());
}

void Agent::handle_frame(const Frame& f) {
  last_heard_ms_ = now_ms();
  if (!greeted_ && f.type != Type::hello) {
    log_err("protocol error: expected hello, got %s", type_name(f.type));
    teardown_and_exit_soon("protocol error");
    return;
  }
  switch (f.type) {
    case Type::hello: {
      Reader rd(f.payload);
      uint32_t magic = rd.u32(), version = rd.u32();
      uint32_t grace = rd.u32(), heartbeat = rd.u32();
      if (rd.failed() || magic != kMagic || version != kVersion) {
        send(Type::error, 0, Writer().str("agent speaks protocol version " + std::to_string(kVersion) +
                                          ", launcher sent " + std::to_string(version)).take());
        teardown_and_exit_soon("protocol version mismatch");
        return;
      }
      greeted_ = true;
      grace_ms_ = grace;
      heartbeat_timeout_ms_ = heartbeat;
      utsname u{};
      ::uname(&u);
      send(Type::hello_ack, 0,
           Writer().u32(kMagic).u32(kVersion).i32(::getpid()).str(u.nodename).str(u.machine).take());
      break;
    }
    case Type::spawn: spawn(f); break;
    case Type::prepare: prepare(f); break;
    case Type::probe: probe(f); break;
    case Type::signal: {
      Reader rd(f.payload);
      int sig = rd.i32();
      if (!rd.failed() && sig > 0 && sig < 65) signal_groups(sig, f.id);
      break;
    }
    case Type::terminate: {
      Reader rd(f.payload);
      uint32_t grace = rd.u32();
      start_terminate(rd.failed() ? grace_ms_ : int64_t(grace));
      break;
    }
    case Type::ping: send(Type::pong, f.id, f.payload); break;
    case Type::shutdown:
      exiting_ = true;
      start_terminate(0);
      kill_orphans();
      exit_deadline_ms_ = now_ms() + 2000;
      break;
    default:
      send(Type::error, f.id, Writer().str(std::string("unexpected frame ") + type_name(f.type)).take());
  }
}

int Agent::run() {
  ::setpgid(0, 0);  // out of the terminal's foreground group: Ctrl-C reaches the launcher only
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  sigfd_ = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  set_nonblocking(0);
  set_nonblocking(1);
  last_heard_ms_ = now_ms();

  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, int>> owners;
  while (true) {
    int64_t now = now_ms();
    if (kill_deadline_ms_ >= 0 && now >= kill_deadline_ms_) {
      signal_groups(SIGKILL, kAllRanks);
      kill_orphans();
      kill_deadline_ms_ = -1;
    }
    if (heartbeat_timeout_ms_ > 0 && !exiting_ && now - last_heard_ms_ > heartbeat_timeout_ms_)
      teardown_and_exit_soon("no heartbeat from the launcher");
    if (exiting_ && (!any_alive() || (exit_deadline_ms_ >= 0 && now >= exit_deadline_ms_))) {
      signal_groups(SIGKILL, kAllRanks);
      kill_orphans();
      send(Type::bye, 0, {});
      flush_outbox(true);
      return 0;
    }

    fds.clear();
    owners.clear();
    fds.push_back({sigfd_, POLLIN, 0});
    fds.push_back({stdin_open_ ? 0 : -1, POLLIN, 0});
    bool backlog = outbox_.size() - outbox_pos_ > 0;
    fds.push_back({backlog && stdout_open_ ? 1 : -1, POLLOUT, 0});
    if (outbox_.size() - outbox_pos_ < kOutboxHighWater) {
      for (auto& [id, r] : ranks_)
        for (int w = 0; w < 2; ++w)
          if (r.fds[w] >= 0) {
            fds.push_back({r.fds[w], POLLIN, 0});
            owners.emplace_back(&r, w);
          }
    }
    int timeout = 1000;
    if (kill_deadline_ms_ >= 0) timeout = int(std::max<int64_t>(0, std::min<int64_t>(timeout, kill_deadline_ms_ - now)));
    int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno != EINTR) return 1;

    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (::read(sigfd_, &si, sizeof si) == ssize_t(sizeof si)) {
        if (si.ssi_signo != SIGCHLD) teardown_and_exit_soon("agent received a termination signal");
      }
      reap();
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[kReadChunk];
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0) {
        decoder_.feed(buf, size_t(n));
        Frame f;
        while (decoder_.next(f)) handle_frame(f);
        if (decoder_.corrupt()) {
          stdin_open_ = false;
          teardown_and_exit_soon("corrupt command stream");
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        stdin_open_ = false;
        teardown_and_exit_soon("launcher connection closed");
      }
    }
    for (size_t i = 3; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_rank_fd(*owners[i - 3].first, owners[i - 3].second);
    reap();
    flush_outbox(false);
  }
}

}  // namespace

int run_agent() {
  Agent a;
  return a.run();
}

}  // namespace mltrain::agent
