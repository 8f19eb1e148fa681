#include "runner/supervise/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <thread>

#include "runner/agent/protocol.h"
#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"

namespace mltrain::supervise {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace proto = mltrain::agent;

namespace {

// Signals reach the event loop through a self-pipe.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (::write(g_signal_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

void install_signal_handlers() {
  if (g_signal_pipe[0] < 0) {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("cannot create the signal pipe: ") + std::strerror(errno), {}, exit_code::internal);
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

enum class Ending { none, failure, interrupted, stopped, timeout, host_failure };

struct Host {
  const plan::HostPlan* plan = nullptr;
  std::unique_ptr<transport::AgentLink> link;
  proto::Decoder decoder;
  std::string outbox;
  bool greeted = false;
  bool prepared = false;
  bool open = false;
  std::string ifname;
  std::vector<std::string> ports;
  std::vector<std::string> problems;
  Clock::time_point last_heard;
  std::string hostname;  // as the agent reports it
};

struct RankState {
  bool started = false;
  bool exited = false;
  int status = 0;
  int pid = 0;
  Clock::time_point started_at;
};

class Gang {
 public:
  Gang(plan::Plan& p, records::RunRecord& rec, const Options& o, const TransportFor& tf)
      : plan_(p), rec_(rec), opts_(o), transport_for_(tf) {}
  int run();

 private:
  void connect_all();
  void send(Host& h, proto::Type t, uint32_t id, const std::string& payload = {});
  bool pump(milliseconds max_wait);  // one poll round; false when nothing is left to wait for
  void on_frame(size_t host_index, const proto::Frame& f);
  void on_host_lost(size_t host_index, const std::string& why);
  void spawn_all();
  void terminate_all(milliseconds grace);
  void fail_first(int rank, const std::string& host, int code, int sig, const std::string& message);
  bool all_exited() const;
  int ranks_running() const;
  void handle_signal(int sig);
  void print_summary(int code);

  plan::Plan& plan_;
  records::RunRecord& rec_;
  const Options& opts_;
  const TransportFor& transport_for_;
  std::vector<Host> hosts_;
  std::vector<RankState> ranks_;
  std::unique_ptr<Output> out_;
  Ending ending_ = Ending::none;
  int ending_code_ = 0;
  bool terminating_ = false;                          // failures from now on are expected
  std::optional<Clock::time_point> terminate_deadline_;  // when unreported ranks count as lost
  std::optional<Clock::time_point> escalate_at_;         // after an interrupt: TERM at this time
  int interrupts_ = 0;
  int restart_ = 0;
  Clock::time_point job_start_;
};

void Gang::send(Host& h, proto::Type t, uint32_t id, const std::string& payload) {
  if (!h.open) return;
  proto::encode(h.outbox, t, id, payload);
}

void Gang::connect_all() {
  // Preflight: every host connected, its agent greeted and prepared before any rank starts.
  hosts_.resize(plan_.hosts.size());
  std::vector<std::string> problems(plan_.hosts.size());
  {
    // Connections open in parallel: a slow or dead host costs its timeout once, not once per host.
    std::vector<std::thread> threads;
    for (size_t i = 0; i < plan_.hosts.size(); ++i) {
      hosts_[i].plan = &plan_.hosts[i];
      threads.emplace_back([&, i] {
        try {
          hosts_[i].link = transport_for_(plan_.hosts[i]).connect(plan_.hosts[i]);
        } catch (const Error& e) {
          // Each host's own advice stays with it in the report.
          problems[i] = e.hint().empty() ? e.what() : std::string(e.what()) + "\n      (" + e.hint() + ")";
        } catch (const std::exception& e) {
          problems[i] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  for (auto& h : hosts_) {
    if (!h.link) continue;
    h.open = true;
    h.last_heard = Clock::now();
    send(h, proto::Type::hello, 0,
         proto::Writer()
             .u32(proto::kMagic)
             .u32(proto::kVersion)
             .u32(uint32_t(opts_.grace.count()))
             // A local agent sees the launcher go by EOF on its pipe; a heartbeat would only
             // kill the job while the launcher is suspended (Ctrl-Z).
             .u32(h.plan->local ? 0u : uint32_t(opts_.heartbeat_timeout.count()))
             .take());
  }
  auto wait_for = [&](auto done, const char* what) {
    auto deadline = Clock::now() + milliseconds(30000);
    while (true) {
      bool waiting = false;
      for (size_t i = 0; i < hosts_.size(); ++i)
        if (problems[i].empty() && !done(hosts_[i])) {
          if (!hosts_[i].open) problems[i] = "the agent exited before answering (see its message above)";
          else waiting = true;
        }
      if (!waiting) break;
      if (Clock::now() >= deadline) {
        for (size_t i = 0; i < hosts_.size(); ++i)
          if (problems[i].empty() && !done(hosts_[i])) problems[i] = std::string("the agent did not ") + what + " within 30s";
        break;
      }
      pump(milliseconds(200));
    }
  };
  log::info("supervise", "connected to " + std::to_string(hosts_.size()) + " host(s)");
  wait_for([](const Host& h) { return h.greeted; }, "answer");
  log::info("supervise", "every agent answered");

  // Where ranks meet: rank 0's host, by an address the other hosts reach.
  std::string master = "127.0.0.1";
  if (plan_.multi_host && hosts_[0].link) {
    master = hosts_[0].link->address();
    if (plan_.hosts[0].local)
      for (auto& h : hosts_)
        if (h.link && !h.plan->local && !h.link->local_address().empty()) {
          master = h.link->local_address();
          break;
        }
  }
  uint32_t nports = plan_.multi_host ? (plan_.auto_master_port ? 1u : 0u) + 1u + (plan_.ps_mode ? 1u : 0u) : 0u;
  std::string path;
  for (const auto& [k, v] : plan_.ranks[0].env)
    if (k == "PATH") path = v;
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (problems[i].empty())
      send(hosts_[i], proto::Type::prepare, 0,
           proto::Writer()
               .str(plan_.multi_host ? master : std::string())
               .u32(i == 0 ? nports : 0)
               .str(plan_.workdir)
               .str(plan_.argv.empty() ? std::string() : plan_.argv[0])
               .str(path)
               .take());
  wait_for([](const Host& h) { return h.prepared; }, "finish its preflight");
  log::info("supervise", "preflight done");
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (problems[i].empty() && !hosts_[i].problems.empty()) problems[i] = text::join(hosts_[i].problems, "; ");

  std::vector<std::string> lines;
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (!problems[i].empty()) {
      const std::string& n = plan_.hosts[i].host.name;
      bool named = problems[i].compare(0, n.size() + 2, n + ": ") == 0;
      lines.push_back("  " + (named ? problems[i] : n + ": " + problems[i]));
    }
  if (!lines.empty()) {
    std::string msg = "preflight failed on " + std::to_string(lines.size()) + " of " + std::to_string(hosts_.size()) +
                      (hosts_.size() == 1 ? " host" : " hosts") + "; no rank was started:\n" + text::join(lines, "\n");
    throw Error(msg, "fix the hosts above, then run again", exit_code::host_failure);
  }

  if (plan_.multi_host) {
    plan::Rendezvous r;
    r.master_addr = master;
    const auto& ports = hosts_[0].ports;
    size_t k = 0;
    auto next = [&](int fallback) { return k < ports.size() ? std::stoi(ports[k++]) : fallback; };
    r.master_port = plan_.auto_master_port ? next(plan_.master_port) : plan_.master_port;
    r.store_port = next(plan_.master_port + 1);
    r.ps_port = plan_.ps_mode ? next(0) : 0;
    plan::set_rendezvous(plan_, r);
    for (size_t i = 0; i < hosts_.size(); ++i) plan::set_interface(plan_, int(i), hosts_[i].ifname);
  }
}

void Gang::spawn_all() {
  ranks_.assign(plan_.ranks.size(), RankState{});
  for (const auto& r : plan_.ranks) {
    std::vector<std::string> env;
    for (const auto& [k, v] : r.env) env.push_back(k + "=" + v);
    Host& h = hosts_[size_t(r.host)];
    send(h, proto::Type::spawn, uint32_t(r.rank),
         proto::Writer().str(plan_.workdir).strings(plan_.argv).strings(env).take());
    ranks_[size_t(r.rank)].started_at = Clock::now();
  }
}

void Gang::terminate_all(milliseconds grace) {
  auto deadline = Clock::now() + grace + milliseconds(5000);
  if (!terminate_deadline_ || deadline < *terminate_deadline_) terminate_deadline_ = deadline;
  terminating_ = true;
  escalate_at_.reset();
  for (auto& h : hosts_) send(h, proto::Type::terminate, proto::kAllRanks, proto::Writer().u32(uint32_t(grace.count())).take());
}

void Gang::fail_first(int rank, const std::string& host, int code, int sig, const std::string& message) {
  if (ending_ != Ending::none) return;
  ending_ = rank >= 0 ? Ending::failure : Ending::host_failure;
  ending_code_ = code;
  records::Failure f;
  f.rank = rank;
  f.host = host;
  f.exit_code = code;
  f.signal = sig;
  f.message = message;
  if (rank >= 0 && out_) {
    out_->finish(rank);
    f.tail = out_->tail(rank);
  }
  rec_.failure = f;
  int others = ranks_running();
  std::string stopping = others > 0 ? "; stopping the other " + std::to_string(others) + " rank" + (others == 1 ? "" : "s") : "";
  out_->flush();
  std::fprintf(stderr, "mltrain: %s%s\n", message.c_str(), stopping.c_str());
  std::fflush(stderr);
  terminate_all(opts_.grace);
}

int Gang::ranks_running() const {
  int n = 0;
  for (const auto& r : ranks_)
    if (!r.exited) ++n;
  return n;
}

bool Gang::all_exited() const { return ranks_running() == 0; }

void Gang::on_host_lost(size_t i, const std::string& why) {
  Host& h = hosts_[i];
  if (!h.open) return;
  h.open = false;
  // Ranks on a lost host cannot be waited for; count them as gone (none exist before spawning).
  for (int r : h.plan->ranks)
    if (size_t(r) < ranks_.size() && !ranks_[size_t(r)].exited) {
      ranks_[size_t(r)].exited = true;
      ranks_[size_t(r)].status = -1;
      out_->finish(r);
    }
  if (!terminating_ || ending_ == Ending::none)
    fail_first(-1, h.plan->host.name, exit_code::host_failure, 0, h.link->describe() + ": " + why);
  h.link->kill();
}

void Gang::on_frame(size_t i, const proto::Frame& f) {
  Host& h = hosts_[i];
  h.last_heard = Clock::now();
  proto::Reader rd(f.payload);
  switch (f.type) {
    case proto::Type::hello_ack: {
      uint32_t magic = rd.u32(), version = rd.u32();
      rd.i32();
      h.hostname = rd.str();
      if (magic != proto::kMagic || version != proto::kVersion) {
        on_host_lost(i, "agent speaks protocol version " + std::to_string(version) + ", expected " +
                            std::to_string(proto::kVersion));
        return;
      }
      h.greeted = true;
      break;
    }
    case proto::Type::output:
      if (out_) out_->data(int(f.id), f.flags, f.payload);
      break;
    case proto::Type::started: {
      if (f.id >= ranks_.size()) break;
      ranks_[f.id].started = true;
      ranks_[f.id].pid = rd.i32();
      rec_.ranks[f.id].pid = ranks_[f.id].pid;
      break;
    }
    case proto::Type::spawn_failed: {
      if (f.id >= ranks_.size()) break;
      auto& r = ranks_[f.id];
      r.exited = true;
      r.status = 127 << 8;
      rec_.ranks[f.id].exit_code = 127;
      std::string why = rd.str();
      if (!terminating_)
        fail_first(int(f.id), h.plan->host.name, 127, 0,
                   h.link->describe() + ": rank " + std::to_string(f.id) + " could not start: " + why);
      break;
    }
    case proto::Type::exited: {
      if (f.id >= ranks_.size()) break;
      auto& r = ranks_[f.id];
      if (r.exited) break;
      r.exited = true;
      r.status = rd.i32();
      if (out_) out_->finish(int(f.id));
      int code = exit_code_of(r.status);
      rec_.ranks[f.id].exit_code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : code;
      rec_.ranks[f.id].signal = WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0;
      log::debug("supervise", "rank " + std::to_string(f.id) + " " + describe_status(r.status));
      if (code != 0 && !terminating_) {
        auto secs = std::chrono::duration<double>(Clock::now() - r.started_at).count();
        char after[32];
        std::snprintf(after, sizeof after, "%.1fs", secs);
        fail_first(int(f.id), h.plan->host.name, code, WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0,
                   (plan_.multi_host ? h.link->describe() + ": " : std::string()) + "rank " + std::to_string(f.id) +
                       " failed with " + describe_status(r.status) + " after " + after + " (first failure)");
      }
      break;
    }
    case proto::Type::prepared:
      h.ifname = rd.str();
      rd.str();  // the host's own address on that route (for doctor)
      h.ports = rd.strings();
      h.problems = rd.strings();
      h.prepared = true;
      break;
    case proto::Type::pong: break;
    case proto::Type::error:
      std::fprintf(stderr, "mltrain: %s: agent: %s\n", h.link->describe().c_str(), rd.str().c_str());
      break;
    case proto::Type::bye: h.open = false; break;
    default:
      log::warn("supervise", h.link->describe() + ": unexpected frame " + proto::type_name(f.type));
  }
}

bool Gang::pump(milliseconds max_wait) {
  std::vector<pollfd> fds;
  fds.push_back({g_signal_pipe[0], POLLIN, 0});
  std::vector<std::pair<size_t, bool>> owner;  // host, is_write
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& h = hosts_[i];
    if (!h.open || !h.link) continue;
    fds.push_back({h.link->read_fd(), POLLIN, 0});
    owner.emplace_back(i, false);
    if (!h.outbox.empty()) {
      fds.push_back({h.link->write_fd(), POLLOUT, 0});
      owner.emplace_back(i, true);
    }
  }
  if (out_) out_->flush();
  int rc = ::poll(fds.data(), fds.size(), int(max_wait.count()));
  if (rc < 0 && errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno), {}, exit_code::internal);
  if (rc <= 0) return true;
  if (fds[0].revents & POLLIN) {
    unsigned char sigs[16];
    ssize_t n = ::read(g_signal_pipe[0], sigs, sizeof sigs);
    for (ssize_t k = 0; k < n; ++k) handle_signal(sigs[k]);
  }
  for (size_t k = 1; k < fds.size(); ++k) {
    auto [i, is_write] = owner[k - 1];
    Host& h = hosts_[i];
    if (!h.open) continue;
    if (is_write && (fds[k].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = ::write(h.link->write_fd(), h.outbox.data(), h.outbox.size());
      if (n > 0) h.outbox.erase(0, size_t(n));
      else if (n < 0 && errno != EAGAIN && errno != EINTR) on_host_lost(i, std::string("connection lost: ") + std::strerror(errno));
    } else if (!is_write && (fds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
      // Read until the pipe is empty (bounded), then let the other hosts have a turn.
      char buf[256 * 1024];
      for (int rounds = 0; rounds < 8 && h.open; ++rounds) {
        ssize_t n = ::read(h.link->read_fd(), buf, sizeof buf);
        if (n > 0) {
          h.decoder.feed(buf, size_t(n));
          proto::Frame f;
          while (h.open && h.decoder.next(f)) on_frame(i, f);
          if (h.decoder.corrupt()) on_host_lost(i, "corrupt stream from the agent");
          if (size_t(n) < sizeof buf) break;
        } else if (n == 0) {
          if (h.open) on_host_lost(i, "the agent's connection closed unexpectedly");
          break;
        } else {
          if (errno != EAGAIN && errno != EINTR) on_host_lost(i, std::string("connection lost: ") + std::strerror(errno));
          break;
        }
      }
    }
  }
  return true;
}

void Gang::handle_signal(int sig) {
  if (sig == SIGINT) {
    ++interrupts_;
    if (interrupts_ == 1) {
      std::fprintf(stderr, "\nmltrain: interrupt: passing SIGINT to every rank (press Ctrl-C again to kill them)\n");
      if (ending_ == Ending::none) ending_ = Ending::interrupted;
      for (auto& h : hosts_) send(h, proto::Type::signal, proto::kAllRanks, proto::Writer().i32(SIGINT).take());
      // Ranks that ignore SIGINT still go: TERM after the grace period, then KILL.
      terminating_ = true;
      escalate_at_ = Clock::now() + opts_.grace;
    } else {
      std::fprintf(stderr, "mltrain: second interrupt: killing every rank\n");
      if (ending_ == Ending::none) ending_ = Ending::interrupted;
      terminate_all(milliseconds(0));
    }
  } else {
    if (ending_ == Ending::none) ending_ = Ending::stopped;
    std::fprintf(stderr, "mltrain: %s: stopping every rank\n", signal_name(sig).c_str());
    terminate_all(opts_.grace);
  }
}

int Gang::run() {
  install_signal_handlers();
  job_start_ = Clock::now();
  std::vector<RankInfo> infos;
  for (const auto& r : plan_.ranks)
    infos.push_back({r.rank, r.local_rank, plan_.hosts[size_t(r.host)].node_rank, plan_.hosts[size_t(r.host)].host.name});
  out_ = std::make_unique<Output>(infos, plan_.multi_host, records::run_dir(rec_.id), opts_.console, opts_.console_fd, 2);

  try {
    connect_all();
  } catch (const Error& e) {
    rec_.status = "host-failure";
    rec_.exit_code = e.code();
    rec_.failure = records::Failure{-1, "", e.code(), 0, e.what(), {}};
    rec_.ended_at = records::now_iso8601();
    records::save(rec_);
    throw;
  }
  // The record shows the rendezvous and environment as preflight settled them.
  records::fill_from_plan(rec_, plan_);
  for (size_t i = 0; i < hosts_.size(); ++i) rec_.hosts[i].address = hosts_[i].link->address();

  // A zero timeout means none: a deadline past any real run.
  auto job_deadline = job_start_ + (opts_.timeout.count() > 0 ? opts_.timeout : milliseconds(std::chrono::hours(24 * 365 * 100)));
  auto next_ping = Clock::now() + opts_.heartbeat_interval;
  for (restart_ = 0;; ++restart_) {
    rec_.restarts = restart_;
    records::save(rec_);
    spawn_all();
    while (!all_exited()) {
      auto now = Clock::now();
      // Wake up in time for the next heartbeat.
      milliseconds wait = std::clamp(std::chrono::duration_cast<milliseconds>(next_ping - now), milliseconds(1),
                                     milliseconds(500));
      if (now >= job_deadline && ending_ == Ending::none) {
        ending_ = Ending::timeout;
        out_->flush();
        std::fprintf(stderr, "mltrain: the job ran past its timeout of %s; stopping every rank\n",
                     text::format_duration(opts_.timeout).c_str());
        terminate_all(opts_.grace);
      }
      if (escalate_at_ && now >= *escalate_at_) terminate_all(opts_.grace);
      if (terminate_deadline_ && now >= *terminate_deadline_) {
        // Agents had their grace and five seconds more: whoever has not reported is unreachable.
        for (size_t i = 0; i < hosts_.size(); ++i) {
          bool waiting = false;
          for (int r : hosts_[i].plan->ranks) waiting |= !ranks_[size_t(r)].exited;
          if (waiting) on_host_lost(i, "did not report its ranks stopped within the grace period");
        }
        break;
      }
      if (now >= next_ping) {
        for (auto& h : hosts_) send(h, proto::Type::ping, 0, proto::Writer().u64(0).take());
        next_ping = now + opts_.heartbeat_interval;
      }
      for (size_t i = 0; i < hosts_.size(); ++i)
        if (hosts_[i].open && now - hosts_[i].last_heard > opts_.heartbeat_timeout)
          on_host_lost(i, "stopped answering heartbeats for " + text::format_duration(
                               std::chrono::duration_cast<milliseconds>(opts_.heartbeat_timeout)));
      pump(wait);
    }
    out_->flush();
    log::info("supervise", "every rank has ended");
    bool failed = ending_ == Ending::failure;
    bool can_restart = failed && restart_ < opts_.max_restarts &&
                       std::all_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.open; });
    if (!can_restart) break;
    std::fprintf(stderr, "mltrain: restarting the gang (restart %d of %d)\n", restart_ + 1, opts_.max_restarts);
    out_->mark_all("==> mltrain: restart " + std::to_string(restart_ + 1) + " of " +
                   std::to_string(opts_.max_restarts) + " <==");
    plan::set_restart_count(plan_, restart_ + 1);
    ending_ = Ending::none;
    terminating_ = false;
    terminate_deadline_.reset();
    rec_.failure.reset();
  }

  // Goodbye: agents kill anything left (strays of the ranks) and exit.
  for (auto& h : hosts_) send(h, proto::Type::shutdown, 0);
  auto bye_deadline = Clock::now() + milliseconds(3000);
  while (Clock::now() < bye_deadline &&
         std::any_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.open; })) {
    pump(milliseconds(100));
  }
  out_->flush();
  log::info("supervise", "agents shut down");

  int code = 0;
  switch (ending_) {
    case Ending::none: code = 0; rec_.status = "succeeded"; break;
    case Ending::failure: code = ending_code_; rec_.status = "failed"; break;
    case Ending::host_failure: code = exit_code::host_failure; rec_.status = "host-failure"; break;
    case Ending::interrupted: code = exit_code::interrupted; rec_.status = "interrupted"; break;
    case Ending::stopped: code = exit_code::stopped; rec_.status = "stopped"; break;
    case Ending::timeout: code = exit_code::timeout; rec_.status = "timeout"; break;
  }
  rec_.exit_code = code;
  rec_.ended_at = records::now_iso8601();
  rec_.duration_s = std::chrono::duration<double>(Clock::now() - job_start_).count();
  records::save(rec_);
  print_summary(code);
  out_.reset();
  hosts_.clear();
  return code;
}

void Gang::print_summary(int code) {
  char dur[32];
  std::snprintf(dur, sizeof dur, "%.1fs", rec_.duration_s);
  if (opts_.json_summary) {
    std::string j = records::to_json(rec_, true);
    std::fprintf(stdout, "%s\n", j.c_str());
    std::fflush(stdout);
  }
  if (code == 0) {
    std::fprintf(stderr, "mltrain: %s: %zu rank%s succeeded in %s%s (logs: mltrain logs %s)\n", rec_.name.c_str(),
                 ranks_.size(), ranks_.size() == 1 ? "" : "s", dur,
                 restart_ > 0 ? (" after " + std::to_string(restart_) + " restart(s)").c_str() : "", rec_.id.c_str());
    return;
  }
  if (rec_.failure) {
    const auto& f = *rec_.failure;
    if (f.rank >= 0) {
      std::fprintf(stderr, "mltrain: first failure: rank %d on %s: %s\n", f.rank, f.host.c_str(),
                   describe_status(f.signal ? f.signal : (f.exit_code << 8)).c_str());
      if (!f.tail.empty()) {
        std::fprintf(stderr, "mltrain: last lines of rank %d (%s):\n", f.rank, out_->log_path(f.rank).c_str());
        for (const auto& l : f.tail) std::fprintf(stderr, "    %s\n", l.c_str());
      }
    } else {
      std::fprintf(stderr, "mltrain: first failure: %s\n", f.message.c_str());
    }
  }
  std::fprintf(stderr, "mltrain: run %s %s after %s; exit code %d (logs: mltrain logs %s)\n", rec_.id.c_str(),
               rec_.status.c_str(), dur, code, rec_.id.c_str());
}

}  // namespace

int run_job(plan::Plan& plan, records::RunRecord& record, const Options& opts, const TransportFor& transport_for) {
  Gang g(plan, record, opts, transport_for);
  return g.run();
}

}  // namespace mltrain::supervise
