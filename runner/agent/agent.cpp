// The agent's loop: one turn waits on the launcher's stream, the ranks' pipes and the signals,
// then acts on what came and on what the clock says is due (KILL after a grace, the launcher's
// silence, the exit).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "runner/agent/agent_core.h"
#include "runner/agent/detail/agent_impl.h"
#include "runner/protocol/protocol.h"

namespace mltrain::agent::detail {

bool set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void log_err(const char* fmt, const char* arg) {
  // stderr is the only place besides the frame stream; keep it to real trouble.
  std::fprintf(stderr, "mltrain-agent: ");
  std::fprintf(stderr, fmt, arg);
  std::fprintf(stderr, "\n");
}

Agent::Agent(AgentStream stream, AgentWorld world)
    : clock_(world.clock),
      procs_(world.processes),
      env_(world.env),
      unpack_runtime_(std::move(world.unpack_runtime)),
      in_fd_(stream.in),
      out_fd_(stream.out),
      sigfd_(stream.signals) {
  last_heard_ms_ = clock_.now_ms();
}

// What the process's exit releases for the agent executable, for an agent that lives on in a larger
// process (its unit tests).
Agent::~Agent() {
  close_sync_files();
  for (auto& [id, r] : ranks_)
    for (int fd : {r.fds[0], r.fds[1], r.fds[2], r.stdin_fd})
      if (fd >= 0) ::close(fd);
  if (pull_.fd >= 0) ::close(pull_.fd);
}

void Agent::flush_outbox(bool block) {
  while (stdout_open_ && outbox_pos_ < outbox_.size()) {
    ssize_t n = ::write(out_fd_, outbox_.data() + outbox_pos_, outbox_.size() - outbox_pos_);
    if (n > 0) {
      outbox_pos_ += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      if (!block) break;
      pollfd p{out_fd_, POLLOUT, 0};
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
  exit_deadline_ms_ = clock_.now_ms() + grace + 2000;
}

bool Agent::any_alive() const {
  for (const auto& [id, r] : ranks_)
    if (!r.reaped) return true;
  return false;
}

void Agent::signal_groups(int sig, uint32_t id) {
  for (auto& [rid, r] : ranks_) {
    if (id != kAllRanks && rid != id) continue;
    if (r.pid > 0) procs_.signal_group(r.pid, sig);  // the group outlives its leader
  }
}

// Everything below the agent dies: every descendant (not only the ranks' groups: a descendant may
// have left its group with setsid, re-fork while it dies, or make itself a subreaper), killed and
// reaped sweep after sweep until a sweep finds none. As a child subreaper the agent inherits
// whatever is orphaned on the way, so the next sweep sees it.
void Agent::kill_orphans() {
  for (int sweep = 0; sweep < 1000; ++sweep) {
    if (!procs_.kill_descendants(warden_)) return;
    reap();  // our own children, ranks among them, and the orphans handed to us
    if (sweep > 0) clock_.sleep_ms(1);
  }
  log_err("%s", "processes below the agent keep appearing after 1000 sweeps; some may survive");
}

void Agent::start_terminate(int64_t grace_ms) {
  signal_groups(SIGCONT, kAllRanks);  // a stopped group would never see TERM
  signal_groups(grace_ms > 0 ? SIGTERM : SIGKILL, kAllRanks);
  int64_t deadline = clock_.now_ms() + grace_ms;
  if (kill_deadline_ms_ < 0 || deadline < kill_deadline_ms_) kill_deadline_ms_ = deadline;
}

void Agent::handle_frame(Frame&& f) {
  last_heard_ms_ = clock_.now_ms();
  paused_ = false;  // any frame: the launcher runs again
  if (!greeted_ && f.type != Type::hello) {
    log_err("protocol error: expected hello, got %s", type_name(f.type));
    teardown_and_exit_soon("protocol error");
    return;
  }
  uint32_t id = f.id;
  std::string error;
  auto m = decode(std::move(f), error);
  if (!m) {
    // Both sides build their frames from the same structs: a bad one means a corrupt stream.
    send(msg::AgentError{error});
    log_err("protocol error: %s", error.c_str());
    teardown_and_exit_soon("protocol error");
    return;
  }
  std::visit([&](auto& message) { on(id, message); }, *m);
  // Time spent here (a slow GPU probe at prepare) is the agent's own, not the launcher's silence:
  // frames that came meanwhile wait unread in the pipe.
  last_heard_ms_ = clock_.now_ms();
}

void Agent::on(uint32_t, const msg::Hello& m) {
  if (m.magic != kMagic || m.version != kVersion) {
    send(msg::AgentError{"agent speaks protocol version " + std::to_string(kVersion) + ", launcher sent " +
                         std::to_string(m.version)});
    teardown_and_exit_soon("protocol version mismatch");
    return;
  }
  greeted_ = true;
  grace_ms_ = m.grace_ms;
  heartbeat_timeout_ms_ = m.heartbeat_timeout_ms;
  utsname u{};
  ::uname(&u);
  msg::HelloAck ack;
  ack.pid = ::getpid();
  ack.hostname = u.nodename;
  ack.arch = u.machine;
  send(ack);
}

void Agent::on(uint32_t id, const msg::Signal& m) {
  if (m.signo > 0 && m.signo < 65) signal_groups(m.signo, id);
}

void Agent::on(uint32_t, const msg::Terminate& m) { start_terminate(int64_t(m.grace_ms)); }

void Agent::on(uint32_t id, const msg::Ping& m) { send(msg::Pong{m.seq}, id); }

// Ranks keep running while the launcher is stopped; their output waits (the outbox, then their
// pipes). A launcher killed meanwhile closes the stream, which ends the job as ever.
void Agent::on(uint32_t, const msg::Pause&) { paused_ = true; }

void Agent::on(uint32_t, const msg::Shutdown&) {
  exiting_ = true;
  start_terminate(0);
  kill_orphans();
  exit_deadline_ms_ = clock_.now_ms() + 2000;
}

template <class M>
void Agent::on(uint32_t id, const M&) {
  send(msg::AgentError{std::string("unexpected frame ") + type_name(M::kType)}, id);
}

std::optional<int> Agent::act_on_time(int64_t now) {
  if (kill_deadline_ms_ >= 0 && now >= kill_deadline_ms_) {
    signal_groups(SIGKILL, kAllRanks);
    kill_orphans();
    kill_deadline_ms_ = -1;
  }
  if (heartbeat_timeout_ms_ > 0 && !exiting_ && !paused_ && now - last_heard_ms_ > heartbeat_timeout_ms_) {
    // Said first, so a launcher that was only stopped learns why its ranks end when it resumes.
    send(msg::LauncherSilent{uint32_t(now - last_heard_ms_)});
    teardown_and_exit_soon("no heartbeat from the launcher");
  }
  if (exiting_ && (!any_alive() || (exit_deadline_ms_ >= 0 && now >= exit_deadline_ms_))) {
    signal_groups(SIGKILL, kAllRanks);
    kill_orphans();
    stop_ps();
    remove_private_dir(private_dir_);
    if (!checkpoint_made_.empty()) (void)::rmdir(checkpoint_made_.c_str());  // an unused one
    send(msg::Bye{});
    flush_outbox(true);
    return 0;
  }
  return std::nullopt;
}

int Agent::poll_timeout(int64_t now, int max_wait_ms) const {
  int64_t timeout = max_wait_ms;
  if (telemetry_interval_ms_ > 0 && !exiting_) timeout = std::min(timeout, next_sample_ms_ - now);
  if (kill_deadline_ms_ >= 0) timeout = std::min(timeout, kill_deadline_ms_ - now);
  return int(std::max<int64_t>(0, timeout));
}

void Agent::read_stream() {
  char buf[kReadChunk];
  ssize_t n = ::read(in_fd_, buf, sizeof buf);
  if (n > 0) {
    decoder_.feed(buf, size_t(n));
    Frame f;
    while (decoder_.next(f)) handle_frame(std::move(f));
    if (decoder_.corrupt()) {
      stdin_open_ = false;
      teardown_and_exit_soon("corrupt command stream");
    }
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    stdin_open_ = false;
    teardown_and_exit_soon("launcher connection closed");
  }
}

std::optional<int> Agent::step(int max_wait_ms) {
  int64_t now = clock_.now_ms();
  if (auto code = act_on_time(now)) return code;

  if (pull_.active) pump_pull();
  fds_.clear();
  owners_.clear();
  fds_.push_back({sigfd_, POLLIN, 0});
  fds_.push_back({stdin_open_ ? in_fd_ : -1, POLLIN, 0});
  bool backlog = outbox_.size() - outbox_pos_ > 0;
  fds_.push_back({backlog && stdout_open_ ? out_fd_ : -1, POLLOUT, 0});
  if (outbox_.size() - outbox_pos_ < kOutboxHighWater) {
    for (auto& [id, r] : ranks_)
      for (int w = 0; w < 3; ++w)
        if (r.fds[w] >= 0) {
          fds_.push_back({r.fds[w], POLLIN, 0});
          owners_.emplace_back(&r, w);
        }
  }
  for (auto& [id, r] : ranks_)
    if (r.stdin_fd >= 0 && !r.stdin_buf.empty()) {
      fds_.push_back({r.stdin_fd, POLLOUT, 0});
      owners_.emplace_back(&r, 3);
    }
  if (telemetry_interval_ms_ > 0 && !exiting_ && now >= next_sample_ms_) {
    take_sample();
    send_ps_stats();
    now = clock_.now_ms();
  }
  const size_t ps_slot = fds_.size();
  fds_.push_back({ps_fd(), POLLIN, 0});
  lease_slots_ = claim_ ? claim_->leases() : std::vector<lease::Lease*>{};
  for (auto* l : lease_slots_) fds_.push_back({l->fd(), POLLIN, 0});
  int rc = ::poll(fds_.data(), fds_.size(), poll_timeout(now, max_wait_ms));
  if (rc < 0 && errno != EINTR) return 1;
  answer_lease_readers(ps_slot + 1);  // before a frame (Unclaim) can change the leases

  if (fds_[0].revents & POLLIN) {
    signalfd_siginfo si;
    while (::read(sigfd_, &si, sizeof si) == ssize_t(sizeof si)) {
      if (si.ssi_signo != SIGCHLD) teardown_and_exit_soon("agent received a termination signal");
    }
    reap();
  }
  if (fds_[1].revents & (POLLIN | POLLHUP | POLLERR)) read_stream();
  if (fds_[ps_slot].revents & POLLIN) pump_ps();
  for (size_t i = 3; i < ps_slot; ++i) {
    auto [rank, which] = owners_[i - 3];
    if (which == 3 && (fds_[i].revents & (POLLOUT | POLLHUP | POLLERR)))
      write_rank_stdin(*rank);
    else if (which < 3 && (fds_[i].revents & (POLLIN | POLLHUP | POLLERR)))
      read_rank_fd(*rank, which);
  }
  reap();
  flush_outbox(false);
  return std::nullopt;
}

}  // namespace mltrain::agent::detail

namespace mltrain::agent {

AgentCore::AgentCore(AgentStream stream, AgentWorld world)
    : agent_(std::make_unique<detail::Agent>(stream, std::move(world))) {}

AgentCore::~AgentCore() = default;

std::optional<int> AgentCore::step(int max_wait_ms) {
  if (!exit_code_) exit_code_ = agent_->step(max_wait_ms);
  return exit_code_;
}

int run_agent(std::function<std::string(std::string& why)> unpack_runtime) {
  using detail::log_err;
  // Out of the terminal's foreground group: Ctrl-C reaches the launcher only. Over SSH the agent
  // leads its own session already, and setpgid fails (EPERM) with nothing left to do.
  (void)::setpgid(0, 0);
  // Without it, descendants that leave their rank's group would outlive the job: say so.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    log_err("cannot become a child subreaper (prctl: %s); orphans of ranks may survive a stop",
            std::strerror(errno));
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&mask, s);
  // The launcher sees the agent exit before hello_ack and reports this host, with this line.
  int sigfd = -1;
  if (::sigprocmask(SIG_BLOCK, &mask, nullptr) != 0 ||
      (sigfd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK)) < 0) {
    log_err("cannot watch signals (signalfd: %s)", std::strerror(errno));
    return 1;
  }
  if (!detail::set_nonblocking(0) || !detail::set_nonblocking(1)) {
    log_err("cannot make the launcher stream non-blocking (fcntl: %s)", std::strerror(errno));
    return 1;
  }
  AgentCore core(AgentStream{0, 1, sigfd}, AgentWorld{system_clock(), system_processes(),
                                                      process_environment(), std::move(unpack_runtime)});
  while (true)
    if (auto code = core.step(1000)) return *code;
}

}  // namespace mltrain::agent
