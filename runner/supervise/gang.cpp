#include "runner/supervise/detail/gang.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/records/telemetry_view.h"
#include "runner/supervise/detail/host_text.h"

namespace mltrain::supervise::detail {

using std::chrono::milliseconds;
namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::connecting:
      return "connecting";
    case Phase::preflight:
      return "preflight";
    case Phase::probing:
      return "probing";
    case Phase::watching:
      return "watching";
    case Phase::running:
      return "running";
    case Phase::stopping:
      return "stopping";
    case Phase::restarting:
      return "restarting";
    case Phase::pulling:
      return "pulling";
    case Phase::closing:
      return "closing";
    case Phase::done:
      return "done";
  }
  return "?";
}

Gang::Gang(plan::Plan& p, records::RunRecord& rec, const Options& o, const TransportFor& tf)
    : plan_(p),
      rec_(rec),
      opts_(o),
      transport_for_(tf),
      clock_(o.clock ? *o.clock : steady_clock()),
      signals_(o.signals ? *o.signals : process_signals()) {}

void Gang::enter(Phase p) {
  log::debug("supervise", std::string("phase ") + phase_name(phase_) + " -> " + phase_name(p));
  phase_ = p;
  phase_start_ = clock_.now();
  switch (p) {
    case Phase::connecting:
      if (!doctor_) next_ping_ = clock_.now() + opts_.heartbeat_interval;
      start_connects();
      break;
    case Phase::preflight:
      begin_preflight();
      break;
    case Phase::probing:
      send_probes();
      break;
    case Phase::watching:
      break;  // each host started when it greeted (watch.cpp)
    case Phase::restarting:
      out_->before_message();
      std::fprintf(stderr, "mltrain: restarting the gang (restart %d of %d)\n", restart_ + 1,
                   opts_.max_restarts);
      out_->mark_all("==> mltrain: restart " + std::to_string(restart_ + 1) + " of " +
                     std::to_string(opts_.max_restarts) + " <==");
      ++restart_;
      plan::set_restart_count(plan_, restart_);
      ending_ = Ending::none;
      stop_deadline_.reset();
      escalate_at_.reset();
      rec_.failure.reset();
      enter(Phase::running);
      break;
    case Phase::running:
      ranks_started_ = true;
      rec_.restarts = restart_;
      if (!records::save(rec_)) record_unsaved_ = true;
      spawn_all();
      if (opts_.telemetry_interval.count() > 0)  // after the Spawns: an agent samples its ranks
        for (auto& h : hosts_)
          send_to(h, msg::TelemetryStart{
                         uint32_t(std::min<int64_t>(opts_.telemetry_interval.count(), UINT32_MAX)),
                         plan_.nvml_library});
      if (restart_ == 0 && opts_.on_running) opts_.on_running();
      if (!next_ping_) next_ping_ = clock_.now() + opts_.heartbeat_interval;
      break;
    case Phase::stopping:
      break;
    case Phase::pulling:
      if (out_) out_->set_status(""), out_->flush();
      start_pull();
      break;
    case Phase::closing:
      // Results first ([sync] pull), whatever the outcome, once the ranks ran.
      if (opts_.pull && !pulled_ && ranks_started_ && !doctor_ && !watch_) {
        enter(Phase::pulling);
        return;
      }
      // Goodbye: agents kill anything left (strays of the ranks) and exit.
      if (out_) out_->set_status(""), out_->flush(), out_->before_message();
      for (auto& h : hosts_) send_to(h, msg::Shutdown{});
      break;
    case Phase::done:
      break;
  }
}

int Gang::run() {
  job_start_ = clock_.now();
  if (opts_.timeout.count() > 0) job_deadline_ = job_start_ + opts_.timeout;
  std::vector<RankInfo> infos;
  for (const auto& r : plan_.ranks)
    infos.push_back(
        {r.rank, r.local_rank, plan_.hosts[size_t(r.host)].node_rank, plan_.hosts[size_t(r.host)].host.name});
  rec_.log_prefix = records::prefix_template(opts_.console.prefix, plan_.multi_host);
  out_ = std::make_unique<Output>(infos, plan_.multi_host, records::run_dir(rec_.id), opts_.console,
                                  opts_.console_fd, 2);
  ranks_.assign(plan_.ranks.size(), RankState{});
  loop();
  return finish();
}

void Gang::loop() {
  hosts_.resize(plan_.hosts.size());
  for (size_t i = 0; i < hosts_.size(); ++i) hosts_[i].plan = &plan_.hosts[i];
  enter(Phase::connecting);
  auto last_turn = std::chrono::steady_clock::now();
  while (phase_ != Phase::done) {
    // The loop turns at least once a second; a longer gap in real time means this process was
    // stopped (kill -STOP, a debugger): the hosts' silence meanwhile was ours, not theirs.
    auto real = std::chrono::steady_clock::now();
    if (real - last_turn > std::chrono::seconds(3)) heard_from_all();
    last_turn = real;
    auto now = clock_.now();
    on_timers(now);
    if (phase_ == Phase::done) break;
    auto until = next_deadline();
    wait(until ? *until : now + milliseconds(1000));
  }
  if (connects_) connects_->abandon();
}

std::optional<Clock::time_point> Gang::next_deadline() const {
  std::optional<Clock::time_point> t;
  auto take = [&](std::optional<Clock::time_point> d) {
    if (d && (!t || *d < *t)) t = d;
  };
  switch (phase_) {
    case Phase::connecting:
    case Phase::probing:
      take(phase_start_ + opts_.preflight_timeout);
      if (!doctor_) take(next_ping_);
      break;
    case Phase::preflight:
      take(next_ping_);
      take(next_sync_status_);
      for (const auto& h : hosts_) {
        if (h.state == HostState::preparing && h.prepare_deadline) take(h.prepare_deadline);
        if (h.state == HostState::syncing || h.state == HostState::setting_up)
          take(h.last_heard + opts_.heartbeat_timeout);
      }
      break;
    case Phase::pulling:
    case Phase::watching:
      take(next_ping_);
      for (const auto& h : hosts_) {
        if (h.open()) take(h.last_heard + opts_.heartbeat_timeout);
        if (h.open() && h.pull.active) take(h.pull.last_progress + opts_.pull->stall_timeout);
      }
      break;
    case Phase::running:
    case Phase::stopping:
      take(job_deadline_);
      take(next_status_);
      take(escalate_at_);
      take(stop_deadline_);
      take(next_ping_);
      for (const auto& h : hosts_)
        if (h.open()) take(h.last_heard + opts_.heartbeat_timeout);
      break;
    case Phase::closing:
      take(phase_start_ + milliseconds(3000));
      break;
    default:
      break;
  }
  return t;
}

void Gang::on_timers(Clock::time_point now) {
  switch (phase_) {
    case Phase::preflight:
      // Each host's preflight answers within the timeout of being asked; a sync or a setup may
      // take as long as it needs while its agent answers heartbeats.
      for (size_t i = 0; i < hosts_.size(); ++i) {
        Host& h = hosts_[i];
        if (h.state == HostState::preparing && h.prepare_deadline && now >= *h.prepare_deadline)
          host_failed(i, "the agent did not finish its preflight within " +
                             text::format_duration(
                                 std::chrono::duration_cast<milliseconds>(opts_.preflight_timeout)));
        else if ((h.state == HostState::syncing || h.state == HostState::setting_up) && h.open() &&
                 now - h.last_heard >= opts_.heartbeat_timeout)
          host_lost(i, std::string("stopped answering heartbeats while ") +
                           (h.state == HostState::syncing ? "syncing" : "running the setup"));
      }
      if (phase_ != Phase::preflight) break;
      check_progress();
      if (phase_ != Phase::preflight) break;
      sync_progress(now);
      if (next_ping_ && now >= *next_ping_) {
        for (auto& h : hosts_)
          if (h.state == HostState::greeted || h.state == HostState::syncing ||
              h.state == HostState::setting_up || h.state == HostState::preparing ||
              h.state == HostState::ready)
            send_to(h, msg::Ping{});
        next_ping_ = now + opts_.heartbeat_interval;
      }
      break;
    case Phase::connecting:
    case Phase::probing:
      if (now >= phase_start_ + opts_.preflight_timeout) {
        const char* what = phase_ == Phase::connecting  ? "answer"
                           : phase_ == Phase::preflight ? "finish its preflight"
                                                        : "answer the probe";
        const HostState done = phase_ == Phase::connecting ? HostState::greeted : HostState::ready;
        for (size_t i = 0; i < hosts_.size(); ++i)
          if (hosts_[i].state != HostState::failed && hosts_[i].state != done)
            host_failed(i, std::string("the agent did not ") + what + " within " +
                               text::format_duration(
                                   std::chrono::duration_cast<milliseconds>(opts_.preflight_timeout)));
        check_progress();
        break;
      }
      // Agents that answered wait for the slowest host (an SSH login, a GPU probe): a ping keeps
      // their launcher-silence window open. Not for doctor, whose probe times the pong.
      if (!doctor_ && next_ping_ && now >= *next_ping_) {
        for (auto& h : hosts_)
          if (h.state == HostState::greeted || h.state == HostState::preparing || h.state == HostState::ready)
            send_to(h, msg::Ping{});
        next_ping_ = now + opts_.heartbeat_interval;
      }
      break;
    case Phase::watching:
      heartbeats(now);
      break;
    case Phase::pulling:
      heartbeats(now);
      pull_stalls(now);
      if (phase_ == Phase::pulling &&
          std::none_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.pull.active && h.open(); }))
        pull_finished();
      break;
    case Phase::running:
    case Phase::stopping: {
      if (job_deadline_ && now >= *job_deadline_ && ending_ == Ending::none) {
        ending_ = Ending::timeout;
        out_->flush();
        out_->before_message();
        std::fprintf(stderr, "mltrain: the job ran past its timeout of %s; %s still running: stopping %s\n",
                     text::format_duration(opts_.timeout).c_str(), running_ranks_text().c_str(),
                     ranks_running() == 1 ? "it" : "them");
        terminate_all(opts_.grace);
      }
      if (escalate_at_ && now >= *escalate_at_) terminate_all(opts_.grace);
      if (stop_deadline_ && now >= *stop_deadline_) {
        // Agents had their grace and five seconds more: whoever has not reported is unreachable.
        stop_deadline_.reset();
        for (size_t i = 0; i < hosts_.size(); ++i) {
          bool waiting = false;
          for (int r : hosts_[i].plan->ranks) waiting |= !ranks_[size_t(r)].exited;
          if (!waiting) continue;
          if (hosts_[i].open())
            host_lost(i, "did not report its ranks stopped within the grace period");
          else
            ranks_gone(i);  // its link is gone already: nothing more will come
        }
      }
      heartbeats(now);
      if (phase_ == Phase::running || phase_ == Phase::stopping)
        if (ranks_running() == 0) all_ranks_ended();
      update_status(now);
      break;
    }
    case Phase::closing:
      if (now >= phase_start_ + milliseconds(3000) ||
          std::none_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.open(); }))
        enter(Phase::done);
      break;
    default:
      break;
  }
}

// Pings every heartbeat interval; a host silent past the timeout is lost.
void Gang::heartbeats(Clock::time_point now) {
  if (next_ping_ && now >= *next_ping_) {
    for (auto& h : hosts_) send_to(h, msg::Ping{});
    next_ping_ = now + opts_.heartbeat_interval;
  }
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].open() && now - hosts_[i].last_heard >= opts_.heartbeat_timeout)
      host_lost(i,
                "stopped answering heartbeats for " +
                    text::format_duration(std::chrono::duration_cast<milliseconds>(opts_.heartbeat_timeout)));
}

void Gang::wait(Clock::time_point until) {
  std::vector<pollfd> fds;
  fds.push_back({signals_.fd(), POLLIN, 0});
  fds.push_back({clock_.wake_fd(), POLLIN, 0});
  fds.push_back({-1, POLLIN, 0});  // connection threads
  if (connects_) fds.back().fd = connects_->ready_fd();
  fds.push_back({-1, POLLIN, 0});  // the launcher's stdin, forwarded to one running rank
  const int in_rank = opts_.stdin_rank;
  // Not while the agent has a backlog to take: stdin waits in the pipe, not in our memory.
  if (in_rank >= 0 && size_t(in_rank) < ranks_.size() && !stdin_eof_ && phase_ == Phase::running &&
      !ranks_[size_t(in_rank)].exited &&
      hosts_[size_t(plan_.ranks[size_t(in_rank)].host)].outbox.size() < (1u << 20))
    fds.back().fd = opts_.stdin_fd;
  fds.push_back({watch_ ? watch_->stop_fd : -1, POLLIN, 0});  // top's UI wants to stop
  constexpr size_t kFixed = 5;
  std::vector<std::pair<size_t, bool>> owner;  // host, is_write
  // A console that drains slowly: take no rank output until it catches up (agents then stop
  // reading their ranks' pipes, and the ranks wait). Heartbeats go on: pings are still sent, and an
  // agent whose bytes wait unread is alive.
  const bool backlogged = out_ && out_->console_backlog() > Output::kConsoleBacklog;
  if (out_) out_->hold(backlogged);
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& h = hosts_[i];
    if (!h.open()) continue;
    if (backlogged) {
      int unread = 0;
      if (::ioctl(h.link->read_fd(), FIONREAD, &unread) == 0 && unread > 0) h.last_heard = clock_.now();
    } else {
      fds.push_back({h.link->read_fd(), POLLIN, 0});
      owner.emplace_back(i, false);
    }
    if (!h.outbox.empty()) {
      fds.push_back({h.link->write_fd(), POLLOUT, 0});
      owner.emplace_back(i, true);
    }
  }
  if (out_) out_->flush();
  auto ms = std::chrono::duration_cast<milliseconds>(until - clock_.now()).count();
  // A fake clock wakes the loop through its descriptor; a real one only needs the timeout.
  int timeout = int(std::clamp<long long>(ms, 0, backlogged ? 20 : 1000));
  if (out_) timeout = std::min(timeout, int(out_->due_in().count()));  // a partial line, a progress redraw
  int rc = ::poll(fds.data(), fds.size(), timeout);
  if (rc < 0 && errno != EINTR)
    throw Error(std::string("poll: ") + std::strerror(errno), {}, exit_code::internal);
  if (rc <= 0) return;
  if (fds[0].revents & POLLIN)
    for (int sig : signals_.take()) on_signal(sig);
  if (fds[1].revents & POLLIN) clock_.drain_wake();
  if (fds[2].revents & POLLIN) take_connected();
  if (fds[3].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) forward_stdin();  // NVAL: no stdin at all
  if ((fds[4].revents & (POLLIN | POLLHUP)) && phase_ != Phase::closing && phase_ != Phase::done)
    enter(Phase::closing);
  for (size_t k = kFixed; k < fds.size(); ++k) {
    auto [i, is_write] = owner[k - kFixed];
    if (!hosts_[i].open() || phase_ == Phase::done) continue;
    if (is_write && (fds[k].revents & (POLLOUT | POLLERR | POLLHUP)))
      write_host(i);
    else if (!is_write && (fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
      read_host(i);
  }
}

void Gang::forward_stdin() {
  const int rank = opts_.stdin_rank;
  Host& h = hosts_[size_t(plan_.ranks[size_t(rank)].host)];
  char buf[64 * 1024];
  ssize_t n = ::read(opts_.stdin_fd, buf, sizeof buf);
  if (n > 0) {
    send_to(h, msg::Stdin{std::string(buf, size_t(n))}, uint32_t(rank));
    // A terminal echoed what was typed, newline included: the console's cursor is on a new line.
    if (std::memchr(buf, '\n', size_t(n)) && ::isatty(opts_.stdin_fd) == 1) out_->input_echoed();
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    stdin_eof_ = true;
    send_to(h, msg::StdinClose{}, uint32_t(rank));
  }
}

void Gang::write_host(size_t i) {
  Host& h = hosts_[i];
  ssize_t n = ::write(h.link->write_fd(), h.outbox.data(), h.outbox.size());
  if (n > 0) {
    h.outbox.erase(0, size_t(n));
    if (h.state == HostState::syncing) pump_sync(i);
  } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
    // What the agent said before it closed (LauncherSilent, Bye) is the better reason: read it first.
    const std::string why = std::string("connection lost: ") + std::strerror(errno);
    read_host(i);
    host_lost(i, why);
  }
}

void Gang::read_host(size_t i) {
  Host& h = hosts_[i];
  // Read until the pipe is empty (bounded), then let the other hosts have a turn.
  char buf[256 * 1024];
  for (int rounds = 0; rounds < 8 && h.open(); ++rounds) {
    ssize_t n = ::read(h.link->read_fd(), buf, sizeof buf);
    if (n > 0) {
      h.decoder.feed(buf, size_t(n));
      proto::Frame f;
      while (h.open() && h.decoder.next(f)) on_frame(i, std::move(f));
      if (h.decoder.corrupt())
        host_lost(i, "corrupt stream from the agent (a frame longer than the protocol allows)");
      if (size_t(n) < sizeof buf) break;
    } else if (n == 0) {
      host_lost(i, "the agent died or its connection closed; the ranks there die with it");
      break;
    } else {
      if (errno != EAGAIN && errno != EINTR)
        host_lost(i, std::string("connection lost: ") + std::strerror(errno));
      break;
    }
  }
}

void Gang::on_frame(size_t i, proto::Frame&& f) {
  hosts_[i].last_heard = clock_.now();
  uint32_t id = f.id;
  std::string error;
  auto m = proto::decode(std::move(f), error);
  if (!m) return host_lost(i, "corrupt stream from the agent: " + text::host_text(error));
  sanitise_host_text(*m);
  std::visit([&](auto& message) { on(i, id, message); }, *m);
}

template <class M>
void Gang::on(size_t i, uint32_t, M&) {
  log::warn("supervise", hosts_[i].link->describe() + ": unexpected frame " + proto::type_name(M::kType));
}

// Output a host may send: its setup's while that runs, its own ranks' when there is a console
// (cp, doctor and top have none); anything else from a host is dropped.
void Gang::on(size_t i, uint32_t id, msg::Output& m) {
  if (id == proto::kSetupId) {
    if (hosts_[i].state == HostState::setting_up) setup_output(i, m.bytes, false);
    return;
  }
  if (!out_ || id >= plan_.ranks.size() || size_t(plan_.ranks[id].host) != i) return;
  out_->data(int(id), m.stream, m.bytes);
}

void Gang::on(size_t, uint32_t id, msg::Started& m) {
  if (id < ranks_.size()) rec_.ranks[id].pid = m.pid;
}

void Gang::on(size_t i, uint32_t id, msg::SpawnFailed& m) {
  if (id == proto::kSetupId) {
    msg::SetupDone d{1, 127 << 8, m.message};
    return on(i, id, d);
  }
  if (id >= ranks_.size() || ranks_[id].exited) return;
  auto& r = ranks_[id];
  r.exited = true;
  r.status = 127 << 8;
  rec_.ranks[id].exit_code = 127;
  if (phase_ == Phase::running)
    fail_first(int(id), hosts_[i].plan->host.name, 127, 0,
               hosts_[i].link->describe() + ": rank " + std::to_string(id) + " could not start: " + m.message,
               "spawn_failed");
}

void Gang::on(size_t i, uint32_t id, msg::Exited& m) {
  if (id >= ranks_.size() || ranks_[id].exited) return;
  auto& r = ranks_[id];
  r.exited = true;
  r.status = m.status;
  r.error_file = std::move(m.error_file);
  r.oom_killed = m.oom_killed != 0;
  out_->finish(int(id));
  int code = exit_code_of(r.status);
  rec_.ranks[id].exit_code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : code;
  rec_.ranks[id].signal = WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0;
  log::debug("supervise", "rank " + std::to_string(id) + " " + describe_status(r.status));
  if (code != 0 && phase_ == Phase::running) {
    auto secs = std::chrono::duration<double>(clock_.now() - r.started_at).count();
    char after[32];
    std::snprintf(after, sizeof after, "%.1fs", secs);
    const Host& h = hosts_[i];
    // exec runs one command per host: the host is what the message names.
    std::string who = opts_.fail_fast ? (plan_.multi_host ? h.link->describe() + ": " : std::string()) +
                                            "rank " + std::to_string(id)
                                      : h.link->describe() + ": the command";
    fail_first(int(id), h.plan->host.name, code, WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0,
               who + " failed with " + describe_status(r.status, r.oom_killed) + " after " + after +
                   (ending_ == Ending::none ? " (first failure)" : ""),
               WIFSIGNALED(r.status) ? "rank_signal" : "rank_exit");
  }
}

void Gang::on(size_t i, uint32_t, msg::Pong&) {
  if (phase_ == Phase::probing) on_probe_pong(i);
}

void Gang::on(size_t i, uint32_t, msg::AgentError& m) {
  if (watch_) return watch_problem(i, "agent: " + m.message);
  if (out_) out_->before_message();
  std::fprintf(stderr, "mltrain: %s: agent: %s\n", hosts_[i].link->describe().c_str(), m.message.c_str());
}

void Gang::on(size_t i, uint32_t, msg::LauncherSilent& m) {
  // Its ranks are being stopped now: the host, not their exit statuses, is the first failure.
  const std::string why =
      hosts_[i].link->describe() + ": heard nothing from mltrain for " +
      text::format_duration(milliseconds(m.silent_ms)) +
      " and stopped its ranks (was mltrain stopped, with kill -STOP or a debugger, or the network cut off?)";
  if (phase_ == Phase::running || phase_ == Phase::stopping)
    fail_first(-1, hosts_[i].plan->host.name, exit_code::host_failure, 0, why, "launcher_silent");
}

void Gang::on(size_t i, uint32_t, msg::Bye&) {
  // An agent that leaves on its own (after LauncherSilent) may not have reported every rank, or
  // started them: nothing more will come from it.
  if ((phase_ == Phase::running || phase_ == Phase::stopping) && hosts_[i].open()) {
    bool unreported = false;
    for (int r : hosts_[i].plan->ranks) unreported |= !ranks_[size_t(r)].exited;
    if (unreported || (phase_ == Phase::running && !ps_note(i).empty())) {
      host_lost(i, unreported ? "the agent left before reporting its ranks" : "the agent left while serving");
      return;
    }
  }
  hosts_[i].state = HostState::closed;
}

void Gang::on(size_t i, uint32_t, msg::Telemetry& m) {
  if (watch_) {
    if (phase_ != Phase::closing && !watch_->on_sample(hosts_[i].plan->host.name, m.sample))
      enter(Phase::closing);
    return;
  }
  if (!telemetry_) telemetry_ = std::make_unique<records::TelemetryLog>(records::run_dir(rec_.id));
  auto elapsed = std::chrono::duration_cast<milliseconds>(clock_.now() - job_start_).count();
  telemetry_->append(hosts_[i].plan->host.name, m.sample, int64_t(elapsed));
  if (out_ && out_->terminal()) {
    telemetry::Sample s;
    std::string error;
    if (telemetry::decode(m.sample, s, error)) board_.add(hosts_[i].plan->host.name, std::move(s));
  }
}

// "3/4 ranks alive (0-1,3) - 3m12s - GPU 87% - straggler: rank 3", once a second while ranks run.
void Gang::update_status(Clock::time_point now) {
  // Only where colour is on: --color never and NO_COLOR ask for a terminal without escape codes.
  if (!out_ || !out_->terminal() || !opts_.console.color) return;
  if (phase_ != Phase::running) {
    out_->set_status("");
    next_status_.reset();
    return;
  }
  if (next_status_ && now < *next_status_) return;
  next_status_ = now + std::chrono::seconds(1);
  auto elapsed = std::chrono::duration_cast<milliseconds>(now - job_start_).count();
  if (elapsed < 1000) return;  // a job over in a second needs no status line
  out_->set_status(
      records::status_line(board_.snapshot(), running_ranks(), int(ranks_.size()), int64_t(elapsed)));
}

void Gang::spawn_all() {
  for (auto& r : ranks_) r = RankState{};
  for (const auto& r : plan_.ranks) {
    msg::Spawn m;
    m.cwd = plan_.workdir;
    m.argv = plan_.argv;
    for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, r.rank)) m.env.push_back(k + "=" + v);
    m.stdin_pipe = r.rank == opts_.stdin_rank;
    m.python_path = plan_.python_path;
    m.one_stream = out_ && out_->one_stream();
    send_to(hosts_[size_t(r.host)], m, uint32_t(r.rank));
    // A restarted rank finds the launcher's stdin already at its end.
    if (m.stdin_pipe && stdin_eof_) send_to(hosts_[size_t(r.host)], msg::StdinClose{}, uint32_t(r.rank));
    ranks_[size_t(r.rank)].started_at = clock_.now();
  }
}

void Gang::terminate_all(milliseconds grace) {
  auto deadline = clock_.now() + grace + milliseconds(5000);
  if (!stop_deadline_ || deadline < *stop_deadline_) stop_deadline_ = deadline;
  escalate_at_.reset();
  if (phase_ == Phase::running) enter(Phase::stopping);
  for (auto& h : hosts_) send_to(h, msg::Terminate{uint32_t(grace.count())}, proto::kAllRanks);
}

void Gang::fail_first(int rank, const std::string& host, int code, int sig, const std::string& message,
                      const char* reason) {
  if (ending_ != Ending::none) {
    if (!opts_.fail_fast && rank >= 0) {  // exec: later failures are said too, the first stays first
      out_->before_message();
      std::fprintf(stderr, "mltrain: %s\n", message.c_str());
    }
    return;
  }
  ending_ = rank >= 0 ? Ending::failure : Ending::host_failure;
  ending_code_ = code;
  failed_at_ = clock_.now();
  records::Failure f;
  f.rank = rank;
  f.host = host;
  f.exit_code = code;
  f.signal = sig;
  f.message = message;
  f.reason = reason;
  if (rank >= 0) {
    out_->finish(rank);
    f.tail = out_->tail(rank);
  }
  rec_.failure = f;
  if (!opts_.fail_fast && rank >= 0) {  // exec: every host runs to its end
    out_->flush();
    out_->before_message();
    std::fprintf(stderr, "mltrain: %s\n", message.c_str());
    std::fflush(stderr);
    return;
  }
  int others = ranks_running();
  std::string stopping =
      others > 0 ? "; stopping the other " + std::to_string(others) + " rank" + (others == 1 ? "" : "s") : "";
  out_->flush();
  out_->before_message();
  std::fprintf(stderr, "mltrain: %s%s\n", message.c_str(), stopping.c_str());
  std::fflush(stderr);
  terminate_all(opts_.grace);
}

int Gang::ranks_running() const {
  return int(std::count_if(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.exited; }));
}

std::vector<int> Gang::running_ranks() const {
  std::vector<int> out;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (!ranks_[r].exited) out.push_back(int(r));
  return out;
}

std::string Gang::running_ranks_text() const {
  std::vector<int> running = running_ranks();
  std::vector<std::string> hosts;
  for (int r : running)
    if (size_t(r) < plan_.ranks.size())
      hosts.push_back(plan_.hosts[size_t(plan_.ranks[size_t(r)].host)].host.name);
  std::string where = " (on " + text::cut(text::compact_names(hosts), 60) + ")";
  if (running.size() == ranks_.size() && running.size() > 1)
    return "all " + std::to_string(running.size()) + " ranks" + where;
  return (running.size() == 1 ? "rank " : "ranks ") + text::int_ranges(running, 60) + where;
}

void Gang::host_lost(size_t i, const std::string& why) {
  Host& h = hosts_[i];
  if (!h.open()) return;
  if (before_running()) {
    host_failed(i, why);
    h.link->kill();
    check_progress();
    return;
  }
  h.state = HostState::lost;
  ranks_gone(i);
  if (phase_ == Phase::running)
    fail_first(-1, h.plan->host.name, exit_code::host_failure, 0,
               h.link->describe() + ": " + why + ps_note(i), "host_lost");
  else if (phase_ == Phase::stopping)
    lost_before_failure(i, why);
  h.link->kill();
}

// A host lost while the gang stops after a rank's failure, silent since well before that failure
// (two heartbeat intervals: a host that answers pings is never that quiet): it was lost first, and
// the rank most likely failed for it (its peers vanished). The host becomes the first failure.
void Gang::lost_before_failure(size_t i, const std::string& why) {
  const Host& h = hosts_[i];
  if (ending_ != Ending::failure || !rec_.failure || rec_.failure->rank < 0 ||
      h.last_heard + 2 * opts_.heartbeat_interval >= failed_at_)
    return;
  const records::Failure later = *rec_.failure;
  const auto silent = std::chrono::duration_cast<milliseconds>(failed_at_ - h.last_heard);
  records::Failure f;
  f.host = h.plan->host.name;
  f.exit_code = exit_code::host_failure;
  f.message = h.link->describe() + ": " + why + ps_note(i) + "; silent for " + text::format_duration(silent) +
              " before rank " + std::to_string(later.rank) + " on " + later.host +
              " failed, which most likely followed from it";
  f.reason = "host_lost";
  rec_.failure = f;
  ending_ = Ending::host_failure;
  ending_code_ = exit_code::host_failure;
  out_->flush();
  out_->before_message();
  std::fprintf(stderr, "mltrain: %s\n", f.message.c_str());
  std::fflush(stderr);
}

bool Gang::ranks_gone(size_t i) {
  // Ranks on a lost or closed host cannot be waited for; count them as gone.
  bool any = false;
  for (int r : hosts_[i].plan->ranks)
    if (!ranks_[size_t(r)].exited) {
      ranks_[size_t(r)].exited = true;
      ranks_[size_t(r)].status = -1;
      rec_.ranks[size_t(r)].host_lost = true;
      out_->finish(r);
      any = true;
    }
  return any;
}

void Gang::heard_from_all() {
  const auto now = clock_.now();
  for (auto& h : hosts_) h.last_heard = now;
  if (stop_deadline_ && *stop_deadline_ < now + milliseconds(5000)) stop_deadline_ = now + milliseconds(5000);
}

// Ctrl-Z: the agents are told first (they would take the silence for a lost launcher), then this
// process stops as the shell asked. The ranks keep running; their output waits for `fg`.
void Gang::pause() {
  for (auto& h : hosts_)
    if (h.state != HostState::connecting) send_to(h, msg::Pause{});
  const auto until = std::chrono::steady_clock::now() + milliseconds(500);
  for (size_t i = 0; i < hosts_.size(); ++i)
    while (hosts_[i].open() && !hosts_[i].outbox.empty() && std::chrono::steady_clock::now() < until) {
      pollfd p{hosts_[i].link->write_fd(), POLLOUT, 0};
      ::poll(&p, 1, 50);
      write_host(i);
    }
  if (out_) out_->flush(), out_->before_message();
  std::fprintf(stderr, "\nmltrain: paused; the ranks keep running (fg resumes)\n");
  std::fflush(stderr);
  std::this_thread::sleep_for(milliseconds(100));  // an SSH link's pump forwards the Pause
  signals_.stop_self();
  heard_from_all();
  for (auto& h : hosts_) send_to(h, msg::Ping{});  // any frame ends an agent's pause
}

void Gang::on_signal(int sig) {
  if (sig == SIGTSTP) {
    pause();
    return;
  }
  if (watch_) {  // top: nothing of the user's runs here; say goodbye to the agents
    stop_signal_ = sig;
    if (phase_ != Phase::closing && phase_ != Phase::done) enter(Phase::closing);
    return;
  }
  if (before_running()) {
    // Nothing has started: stop here, at once, without waiting for slow hosts.
    ending_ = sig == SIGINT ? Ending::interrupted : Ending::stopped;
    stop_signal_ = sig;
    std::fprintf(stderr, "\nmltrain: %s during %s; %s\n", signal_name(sig).c_str(), phase_name(phase_),
                 doctor_ ? "hosts not yet checked are reported as such" : "no rank was started");
    enter(Phase::done);
    return;
  }
  if (phase_ == Phase::closing || phase_ == Phase::done) return;
  if (phase_ == Phase::pulling) {  // the results can wait: stop pulling, say goodbye
    std::fprintf(stderr, "\nmltrain: %s while pulling; what came so far is kept\n", signal_name(sig).c_str());
    if (!stop_signal_) stop_signal_ = sig;
    pull_finished();
    if (phase_ == Phase::pulling) enter(Phase::closing);
    return;
  }
  if (out_) out_->before_message();
  if (sig == SIGINT) {
    ++interrupts_;
    if (ending_ == Ending::none) ending_ = Ending::interrupted, stop_signal_ = sig;
    if (interrupts_ == 1) {
      std::fprintf(stderr,
                   "\nmltrain: interrupt: passing SIGINT to every rank (press Ctrl-C again to kill them)\n");
      for (auto& h : hosts_) send_to(h, msg::Signal{SIGINT}, proto::kAllRanks);
      // Ranks that ignore SIGINT still go: TERM after the grace period, then KILL.
      if (phase_ == Phase::running) enter(Phase::stopping);
      escalate_at_ = clock_.now() + opts_.grace;
    } else {
      std::fprintf(stderr, "mltrain: second interrupt: killing every rank\n");
      terminate_all(milliseconds(0));
    }
  } else {
    if (ending_ == Ending::none) ending_ = Ending::stopped, stop_signal_ = sig;
    std::fprintf(stderr, "mltrain: %s: stopping every rank\n", signal_name(sig).c_str());
    terminate_all(opts_.grace);
  }
}

void Gang::all_ranks_ended() {
  out_->flush();
  log::info("supervise", "every rank has ended");
  bool can_restart = ending_ == Ending::failure && restart_ < opts_.max_restarts &&
                     std::all_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.open(); });
  enter(can_restart ? Phase::restarting : Phase::closing);
}

}  // namespace mltrain::supervise::detail
