// The host fleet: links, decoders, outboxes, heartbeats and the poll loop under every play.
#include "runner/supervise/detail/fleet.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/host_text.h"

namespace mltrain::supervise::detail {

using std::chrono::milliseconds;
namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;

namespace {
constexpr auto kGoodbyeWait = milliseconds(3000);  // for the agents' goodbyes
}  // namespace

// ---- connection threads ----

Connects::Connects() {
  if (::pipe2(pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("pipe2: ") + std::strerror(errno), {}, exit_code::internal);
}

Connects::~Connects() {
  ::close(pipe[0]);
  ::close(pipe[1]);
}

void Connects::put(Result r) {
  {
    std::lock_guard<std::mutex> lock(m);
    if (!abandoned) ready.push_back(std::move(r));
  }
  // Outside the lock: an abandoned link closes here, which tells its agent to exit.
  r.link.reset();
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(pipe[1], &b, 1);
}

std::vector<Connects::Result> Connects::take() {
  char buf[64];
  while (::read(pipe[0], buf, sizeof buf) > 0) {
  }
  std::lock_guard<std::mutex> lock(m);
  return std::exchange(ready, {});
}

void Connects::abandon() {
  std::vector<Result> dropped;
  std::lock_guard<std::mutex> lock(m);
  abandoned = true;
  dropped.swap(ready);
}

// ---- the fleet ----

void Play::on_bye(size_t i) { fleet_.advance(i, HostState::closed); }

void Play::on_agent_error(size_t i, const std::string& message) {
  before_message();
  std::fprintf(stderr, "mltrain: %s: agent: %s\n", fleet_.describe(i).c_str(), message.c_str());
}

Fleet::Fleet(plan::Plan& p, const Options& o, const TransportFor& tf)
    : plan_(p),
      opts_(o),
      transport_for_(tf),
      clock_(o.clock ? *o.clock : steady_clock()),
      signals_(o.signals ? *o.signals : process_signals()) {
  hosts_.resize(plan_.hosts.size());
  for (size_t i = 0; i < hosts_.size(); ++i) hosts_[i].plan = &plan_.hosts[i];
}

Fleet::~Fleet() {
  if (connects_) connects_->abandon();
}

void Fleet::drive(Play& play) {
  play_ = &play;
  auto last_turn = std::chrono::steady_clock::now();
  while (!play.finished()) {
    // The loop turns at least once a second; a longer gap in real time means this process was
    // stopped (kill -STOP, a debugger): the hosts' silence meanwhile was ours, not theirs.
    auto real = std::chrono::steady_clock::now();
    if (real - last_turn > std::chrono::seconds(3)) heard_from_all();
    last_turn = real;
    auto now = clock_.now();
    play.on_timers(now);
    if (play.finished()) break;
    auto until = play.next_deadline();
    wait(until ? *until : now + milliseconds(1000));
  }
  if (connects_) connects_->abandon();
}

void Fleet::connect_all(bool pings) {
  if (pings) next_ping_ = clock_.now() + opts_.heartbeat_interval;
  connect_deadline_ = clock_.now() + opts_.preflight_timeout;
  // In parallel: a slow or dead host costs its timeout once, not once per host.
  connects_ = std::make_shared<Connects>();
  // SSH handshakes take seconds: say so, rather than sit silent. Local-only jobs stay quiet.
  std::vector<std::string> remote;
  for (const auto& h : plan_.hosts)
    if (!h.local) remote.push_back(h.host.name);
  if (!remote.empty()) {
    std::string names = remote.size() <= 8 ? " (" + text::join(remote, ", ") + ")" : "";
    std::fprintf(stderr, "mltrain: connecting to %zu host%s%s...\n", remote.size(),
                 remote.size() == 1 ? "" : "s", names.c_str());
  }
  for (size_t i = 0; i < plan_.hosts.size(); ++i) {
    transport::Transport& t = transport_for_(plan_.hosts[i]);
    std::thread([c = connects_, &t, host = plan_.hosts[i], i] {
      Connects::Result r;
      r.host = i;
      try {
        r.link = t.connect(host);
      } catch (const Error& e) {
        // Each host's own advice stays with it in the report.
        r.problem = e.hint().empty() ? e.what() : std::string(e.what()) + "\n      (" + e.hint() + ")";
      } catch (const std::exception& e) {
        r.problem = e.what();
      }
      c->put(std::move(r));
    }).detach();
  }
}

void Fleet::take_connected() {
  for (auto& r : connects_->take()) {
    FleetHost& h = hosts_[r.host];
    if (!r.problem.empty()) {
      fail(r.host, r.problem);
      continue;
    }
    if (h.state() != HostState::connecting) continue;  // it failed meanwhile (timed out): the link closes
    h.link = std::move(r.link);
    advance(r.host, HostState::greeting);
    h.last_heard = clock_.now();
    msg::Hello hello;
    hello.grace_ms = uint32_t(opts_.grace.count());
    // A local agent sees the launcher go by EOF on its pipe; a heartbeat would only kill the job
    // while the launcher is suspended (Ctrl-Z).
    hello.heartbeat_timeout_ms = h.plan->local ? 0u : uint32_t(opts_.heartbeat_timeout.count());
    send(r.host, hello);
  }
  play_->on_progress();
}

void Fleet::greeted(size_t i, const msg::HelloAck& m) {
  if (hosts_[i].state() != HostState::greeting) return;
  if (m.magic != proto::kMagic || m.version != proto::kVersion) {
    fail(i, "the agent speaks protocol version " + std::to_string(m.version) + ", this mltrain " +
                std::to_string(proto::kVersion));
  } else {
    advance(i, HostState::greeted);
    play_->on_greeted(i);
  }
  play_->on_progress();
}

bool Fleet::connecting_timers(Clock::time_point now) {
  if (now >= connect_deadline_) {
    const std::string why =
        "the agent did not answer within " +
        text::format_duration(std::chrono::duration_cast<milliseconds>(opts_.preflight_timeout));
    for (size_t i = 0; i < hosts_.size(); ++i)
      if (hosts_[i].state() < HostState::greeted) fail(i, why);
    return true;
  }
  // Agents that answered wait for the slowest host (an SSH login, a GPU probe): a ping keeps
  // their launcher-silence window open.
  ping(now);
  return false;
}

void Fleet::fail(size_t i, const std::string& problem) {
  FleetHost& h = hosts_[i];
  if (h.status.ended()) return;  // a host that ended keeps its end (and its first problem)
  advance(i, HostState::failed);
  h.problem = problem;
  play_->on_failed(i);
}

void Fleet::lose(size_t i) {
  advance(i, HostState::lost);
  hosts_[i].link->kill();
}

void Fleet::fail_link(size_t i, const std::string& problem) {
  fail(i, problem);
  hosts_[i].link->kill();
  play_->on_progress();
}

bool Fleet::all(HostState s) const {
  return std::all_of(hosts_.begin(), hosts_.end(),
                     [&](const FleetHost& h) { return h.state() == s || h.status.ended(); });
}

bool Fleet::any_open() const {
  return std::any_of(hosts_.begin(), hosts_.end(), [](const FleetHost& h) { return h.open(); });
}

void Fleet::unexpected(size_t i, agent::Type t) const {
  if (uint16_t(t) < uint16_t(agent::Type::hello_ack))
    log::warn("supervise", describe(i) + ": unexpected frame " + proto::type_name(t));
}

// ---- heartbeats ----

void Fleet::start_pings() {
  if (!next_ping_) next_ping_ = clock_.now() + opts_.heartbeat_interval;
}

void Fleet::ping(Clock::time_point now) {
  if (!next_ping_ || now < *next_ping_) return;
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].state() >= HostState::greeted) send(i, msg::Ping{});
  next_ping_ = now + opts_.heartbeat_interval;
}

// Pings every heartbeat interval; a host silent past the timeout is lost.
void Fleet::heartbeats(Clock::time_point now) {
  ping(now);
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (silent(i, now))
      play_->on_lost(
          i, "stopped answering heartbeats for " +
                 text::format_duration(std::chrono::duration_cast<milliseconds>(opts_.heartbeat_timeout)));
}

std::optional<Clock::time_point> Fleet::heartbeat_deadline() const {
  std::optional<Clock::time_point> t = next_ping_;
  for (const auto& h : hosts_)
    if (h.open() && (!t || h.last_heard + opts_.heartbeat_timeout < *t))
      t = h.last_heard + opts_.heartbeat_timeout;
  return t;
}

void Fleet::heard_from_all() {
  const auto now = clock_.now();
  for (auto& h : hosts_) h.last_heard = now;
  if (play_) play_->on_resumed(now);
}

void Fleet::say_goodbye() {
  goodbye_deadline_ = clock_.now() + kGoodbyeWait;
  send_all(msg::Shutdown{});
}

bool Fleet::goodbyes_done(Clock::time_point now) const { return now >= goodbye_deadline_ || !any_open(); }

// The ranks keep running; their output waits for `fg`.
void Fleet::pause() {
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].state() != HostState::connecting) send(i, msg::Pause{});
  const auto until = std::chrono::steady_clock::now() + milliseconds(500);
  for (size_t i = 0; i < hosts_.size(); ++i)
    while (hosts_[i].open() && !hosts_[i].outbox.empty() && std::chrono::steady_clock::now() < until) {
      pollfd p{hosts_[i].link->write_fd(), POLLOUT, 0};
      ::poll(&p, 1, 50);
      write_host(i);
    }
  play_->flush();
  play_->before_message();
  std::fprintf(stderr, "\nmltrain: paused; the ranks keep running (fg resumes)\n");
  std::fflush(stderr);
  std::this_thread::sleep_for(milliseconds(100));  // an SSH link's pump forwards the Pause
  signals_.stop_self();
  heard_from_all();
  send_all(msg::Ping{});  // any frame ends an agent's pause
}

// ---- the loop's wait, reads and writes ----

void Fleet::wait(Clock::time_point until) {
  enum { kSignals, kClock, kConnects, kExtra, kFixed };
  std::vector<pollfd> fds(kFixed);
  fds[kSignals] = {signals_.fd(), POLLIN, 0};
  fds[kClock] = {clock_.wake_fd(), POLLIN, 0};
  fds[kConnects] = {connects_ ? connects_->ready_fd() : -1, POLLIN, 0};
  fds[kExtra] = {play_->extra_fd(), POLLIN, 0};
  std::vector<std::pair<size_t, bool>> owner;  // host, is_write
  // A console that drains slowly: take no rank output until it catches up (agents then stop
  // reading their ranks' pipes, and the ranks wait). Heartbeats go on: pings are still sent, and an
  // agent whose bytes wait unread is alive.
  const bool held = play_->hold_reads();
  for (size_t i = 0; i < hosts_.size(); ++i) {
    FleetHost& h = hosts_[i];
    if (!h.open()) continue;
    if (held) {
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
  auto ms = std::chrono::duration_cast<milliseconds>(until - clock_.now()).count();
  // A fake clock wakes the loop through its descriptor; a real one only needs the timeout.
  int timeout = int(std::clamp<long long>(ms, 0, held ? 20 : 1000));
  timeout = std::min(timeout, int(play_->max_wait().count()));  // a partial line, a progress redraw
  int rc = ::poll(fds.data(), fds.size(), timeout);
  if (rc < 0 && errno != EINTR)
    throw Error(std::string("poll: ") + std::strerror(errno), {}, exit_code::internal);
  if (rc <= 0) return;
  if (fds[kSignals].revents & POLLIN)
    for (int sig : signals_.take()) {
      if (sig == SIGTSTP)
        pause();
      else
        play_->on_signal(sig);
    }
  if (fds[kClock].revents & POLLIN) clock_.drain_wake();
  if (fds[kConnects].revents & POLLIN) take_connected();
  if (fds[kExtra].revents) play_->on_extra(fds[kExtra].revents);
  for (size_t k = kFixed; k < fds.size(); ++k) {
    auto [i, is_write] = owner[k - kFixed];
    if (!hosts_[i].open() || play_->finished()) continue;
    if (is_write && (fds[k].revents & (POLLOUT | POLLERR | POLLHUP)))
      write_host(i);
    else if (!is_write && (fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
      read_host(i);
  }
}

void Fleet::write_host(size_t i) {
  FleetHost& h = hosts_[i];
  ssize_t n = ::write(h.link->write_fd(), h.outbox.data(), h.outbox.size());
  if (n > 0) {
    h.outbox.erase(0, size_t(n));
    play_->on_sent(i);
  } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
    // What the agent said before it closed (LauncherSilent, Bye) is the better reason: read it first.
    const std::string why = std::string("connection lost: ") + std::strerror(errno);
    read_host(i);
    if (h.open()) play_->on_lost(i, why);
  }
}

void Fleet::read_host(size_t i) {
  FleetHost& h = hosts_[i];
  // Read until the pipe is empty (bounded), then let the other hosts have a turn.
  char buf[256 * 1024];
  for (int rounds = 0; rounds < 8 && h.open(); ++rounds) {
    ssize_t n = ::read(h.link->read_fd(), buf, sizeof buf);
    if (n > 0) {
      h.decoder.feed(buf, size_t(n));
      proto::Frame f;
      while (h.open() && h.decoder.next(f)) on_frame(i, std::move(f));
      if (h.decoder.corrupt() && h.open())
        play_->on_lost(i, "corrupt stream from the agent (a frame longer than the protocol allows)");
      if (size_t(n) < sizeof buf) break;
    } else if (n == 0) {
      play_->on_lost(i, "the agent died or its connection closed; the ranks there die with it");
      break;
    } else {
      if (errno != EAGAIN && errno != EINTR)
        play_->on_lost(i, std::string("connection lost: ") + std::strerror(errno));
      break;
    }
  }
}

// Every display field of every message through one sanitiser, then the play's handler.
void Fleet::on_frame(size_t i, proto::Frame&& f) {
  hosts_[i].last_heard = clock_.now();
  uint32_t id = f.id;
  std::string error;
  auto m = proto::decode(std::move(f), error);
  if (!m) return play_->on_lost(i, "corrupt stream from the agent: " + text::host_text(error));
  sanitise_host_text(*m);
  if (auto* ack = std::get_if<msg::HelloAck>(&*m))
    greeted(i, *ack);
  else if (std::holds_alternative<msg::Bye>(*m))
    play_->on_bye(i);
  else if (auto* e = std::get_if<msg::AgentError>(&*m))
    play_->on_agent_error(i, e->message);
  else
    play_->on_frame(i, id, *m);
}

}  // namespace mltrain::supervise::detail
