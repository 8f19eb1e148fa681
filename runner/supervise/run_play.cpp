// The run play: its table, what entering each phase does, the running gang (spawn, output,
// fail-fast, restarts, signals, lost hosts).
#include "runner/supervise/detail/run_play.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/records/telemetry_view.h"

namespace mltrain::supervise {

namespace plays::run {

Phase next(Phase p, Event e) {
  static constexpr Transition<Phase, Event> kTable[] = {
      {Phase::connecting, Event::greeted, Phase::preflight},
      {Phase::connecting, Event::signalled, Phase::done},
      {Phase::preflight, Event::signalled, Phase::done},
      {Phase::preflight, Event::preflight_passed, Phase::claiming},
      {Phase::preflight, Event::preflight_failed, Phase::done},
      {Phase::claiming, Event::granted, Phase::running},
      {Phase::claiming, Event::busy, Phase::queued},
      {Phase::claiming, Event::refused, Phase::done},
      {Phase::claiming, Event::preflight_failed, Phase::done},
      {Phase::claiming, Event::signalled, Phase::done},
      {Phase::queued, Event::retry, Phase::claiming},
      {Phase::queued, Event::signalled, Phase::done},
      {Phase::queued, Event::refused, Phase::done},
      {Phase::running, Event::stop, Phase::stopping},
      {Phase::running, Event::restart, Phase::restarting},
      {Phase::stopping, Event::restart, Phase::restarting},
      {Phase::restarting, Event::restarted, Phase::running},
      {Phase::running, Event::ranks_ended, Phase::closing},
      {Phase::stopping, Event::ranks_ended, Phase::closing},
      {Phase::running, Event::results, Phase::pulling},
      {Phase::stopping, Event::results, Phase::pulling},
      {Phase::pulling, Event::pulled, Phase::closing},
      {Phase::closing, Event::closed, Phase::done},
  };
  return lookup(kTable, p, e);
}

}  // namespace plays::run

namespace detail {

using std::chrono::milliseconds;
namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;
using plays::run::phase_name;

RunPlay::RunPlay(Fleet& fleet, plan::Plan& p, records::RunRecord& rec)
    : Play(fleet), plan_(p), rec_(rec), opts_(fleet.opts()), clock_(fleet.clock()), hosts_(fleet.size()) {}

RunPlay::~RunPlay() {
  for (auto& h : hosts_)
    if (h.ps_log_fd >= 0) ::close(h.ps_log_fd);
}

int RunPlay::run() {
  job_start_ = clock_.now();
  rec_.log_prefix = records::prefix_template(opts_.console.prefix, plan_.multi_host);
  out_ = std::make_unique<Output>(rank_infos(), plan_.multi_host, records::run_dir(rec_.id), opts_.console,
                                  opts_.console_fd, 2);
  begin_gang();
  metrics_ = std::make_unique<records::MetricsLog>(records::run_dir(rec_.id), opts_.metric_patterns);
  ranks_.assign(plan_.ranks.size(), RankState{});
  begin(Phase::connecting);
  fleet_.drive(*this);
  return finish();
}

void RunPlay::step(Event e) {
  const Phase from = phase_;
  if (!plays::follow_table(phase_, e, plays::run::next)) return;
  log::debug("supervise", std::string("phase ") + phase_name(from) + " -> " + phase_name(phase_));
  begin(phase_);
}

void RunPlay::begin(Phase p) {
  switch (p) {
    case Phase::connecting:
      fleet_.connect_all(true);
      break;
    case Phase::preflight:
      begin_preflight();
      break;
    case Phase::claiming:
      send_claims();
      break;
    case Phase::queued:
      retry_at_ = clock_.now() + (opts_.claims ? opts_.claims->retry : milliseconds(500));
      if (!queued_since_) {  // the first wait: the record says so, and a detached command returns
        queued_since_ = clock_.now();
        if (opts_.claims && opts_.claims->queue_timeout.count() > 0)
          queue_deadline_ = *queued_since_ + opts_.claims->queue_timeout;
        rec_.status = "queued";
        if (!records::save(rec_)) record_unsaved_ = true;
        if (opts_.on_queued) opts_.on_queued(waiting_status(false));
      }
      break;
    case Phase::restarting:
      restart_gang();
      break;
    case Phase::running:
      start_ranks();
      break;
    case Phase::pulling:
      out_->set_status("");
      out_->flush();
      start_pull();
      break;
    case Phase::closing:
      // Goodbye: agents kill anything left (strays of the ranks) and exit.
      out_->set_status("");
      out_->flush();
      out_->before_message();
      fleet_.say_goodbye();
      break;
    case Phase::stopping:
    case Phase::done:
      break;
  }
}

std::vector<RankInfo> RunPlay::rank_infos() const {
  std::vector<RankInfo> infos;
  for (const auto& r : plan_.ranks)
    infos.push_back(
        {r.rank, r.local_rank, plan_.hosts[size_t(r.host)].node_rank, plan_.hosts[size_t(r.host)].host.name});
  return infos;
}

void RunPlay::restart_gang() {
  out_->before_message();
  const std::string change = gang_change_.empty() ? "" : ": " + gang_change_;
  std::fprintf(stderr, "mltrain: restarting the gang (restart %d of %d)%s\n", restart_ + 1,
               opts_.max_restarts, change.c_str());
  out_->mark_all("==> mltrain: restart " + std::to_string(restart_ + 1) + " of " +
                 std::to_string(opts_.max_restarts) + change + " <==");
  const std::string why = rec_.failure ? rec_.failure->message : "";
  if (!gang_change_.empty()) regroup_gang();
  board_ = telemetry::Board{};  // the samples named the ranks as they were numbered before
  rec_.generations.push_back({restart_ + 1,
                              records::now_iso8601(),
                              {},
                              int(plan_.ranks.size()),
                              why + (gang_change_.empty() ? "" : (why.empty() ? "" : "; ") + gang_change_)});
  for (int h : gang_) rec_.generations.back().hosts.push_back(plan_.hosts[size_t(h)].host.name);
  gang_change_.clear();
  ++restart_;
  metrics_->restarted(restart_);
  plan::set_restart_count(plan_, restart_);
  ending_ = Ending::none;
  stop_deadline_.reset();
  escalate_at_.reset();
  rec_.failure.reset();
  step(Event::restarted);
}

void RunPlay::start_ranks() {
  // The timeout counts from the ranks' first start: a wait in the queue is not the job's time.
  if (opts_.timeout.count() > 0 && !job_deadline_) job_deadline_ = clock_.now() + opts_.timeout;
  if (rec_.status == "queued") {
    rec_.status = "running";
    rec_.queued_s = std::chrono::duration<double>(clock_.now() - *queued_since_).count();
  }
  rec_.restarts = restart_;
  if (rec_.generations.empty()) {
    rec_.generations.push_back({0, records::now_iso8601(), {}, int(plan_.ranks.size()), ""});
    for (int h : gang_) rec_.generations.back().hosts.push_back(plan_.hosts[size_t(h)].host.name);
  }
  if (!records::save(rec_)) record_unsaved_ = true;
  spawn_all();
  if (opts_.telemetry_interval.count() > 0)  // after the Spawns: an agent samples its ranks
    fleet_.send_all(msg::TelemetryStart{
        uint32_t(std::min<int64_t>(opts_.telemetry_interval.count(), UINT32_MAX)), plan_.nvml_library});
  if (restart_ == 0 && opts_.on_running) opts_.on_running();
  fleet_.start_pings();
}

void RunPlay::on_timers(Clock::time_point now) {
  switch (phase_) {
    case Phase::connecting:
      if (fleet_.connecting_timers(now)) on_progress();
      break;
    case Phase::preflight:
      preflight_timers(now);
      break;
    case Phase::claiming:
    case Phase::queued:
      claim_timers(now);
      break;
    case Phase::pulling:
      fleet_.heartbeats(now);
      pulls_->stalls(now);
      if (phase_ == Phase::pulling && pulls_->over()) pull_finished();
      break;
    case Phase::running:
    case Phase::stopping:
      running_timers(now);
      break;
    case Phase::closing:
      if (fleet_.goodbyes_done(now)) step(Event::closed);
      break;
    case Phase::restarting:
    case Phase::done:
      break;
  }
}

void RunPlay::running_timers(Clock::time_point now) {
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
  if (stop_deadline_ && now >= *stop_deadline_) stop_deadline_passed();
  fleet_.heartbeats(now);
  if (phase_ == Phase::running || phase_ == Phase::stopping)
    if (ranks_running() == 0) all_ranks_ended();
  update_status(now);
}

// Agents had their grace and five seconds more: whoever has not reported is unreachable.
void RunPlay::stop_deadline_passed() {
  stop_deadline_.reset();
  for (size_t i = 0; i < fleet_.size(); ++i) {
    bool waiting = false;
    for (int r : fleet_[i].plan->ranks) waiting |= !ranks_[size_t(r)].exited;
    if (!waiting) continue;
    if (fleet_[i].open())
      on_lost(i, "did not report its ranks stopped within the grace period");
    else
      ranks_gone(i);  // its link is gone already: nothing more will come
  }
}

std::optional<Clock::time_point> RunPlay::next_deadline() const {
  Soonest s;
  switch (phase_) {
    case Phase::connecting:
      s.take(fleet_.connect_deadline());
      s.take(fleet_.next_ping());
      break;
    case Phase::preflight:
      s.take(fleet_.next_ping());
      if (syncs_) s.take(syncs_->next_status());
      for (size_t i = 0; i < fleet_.size(); ++i) {
        const HostState st = fleet_[i].state();
        if (st == HostState::preparing) s.take(hosts_[i].prepare_deadline);
        if (st == HostState::syncing || st == HostState::setting_up)
          s.take(fleet_[i].last_heard + opts_.heartbeat_timeout);
      }
      break;
    case Phase::claiming:
    case Phase::queued:
      s.take(fleet_.heartbeat_deadline());
      s.take(retry_at_);
      s.take(next_status_);
      break;
    case Phase::pulling:
      s.take(fleet_.heartbeat_deadline());
      s.take(pulls_->stall_deadline());
      break;
    case Phase::running:
    case Phase::stopping:
      s.take(job_deadline_);
      s.take(next_status_);
      s.take(escalate_at_);
      s.take(stop_deadline_);
      s.take(fleet_.heartbeat_deadline());
      break;
    case Phase::closing:
      s.take(fleet_.goodbye_deadline());
      break;
    case Phase::restarting:
    case Phase::done:
      break;
  }
  return s.t;
}

// ---- the loop's extras: stdin for one rank, the console ----

int RunPlay::extra_fd() const {
  const int in_rank = opts_.stdin_rank;
  // Not while the agent has a backlog to take: stdin waits in the pipe, not in our memory.
  if (in_rank >= 0 && size_t(in_rank) < ranks_.size() && !stdin_eof_ && phase_ == Phase::running &&
      !ranks_[size_t(in_rank)].exited &&
      fleet_[size_t(plan_.ranks[size_t(in_rank)].host)].outbox.size() < (1u << 20))
    return opts_.stdin_fd;
  return -1;
}

void RunPlay::on_extra(short revents) {
  if (revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) forward_stdin();  // NVAL: no stdin at all
}

void RunPlay::forward_stdin() {
  const int rank = opts_.stdin_rank;
  const size_t host = size_t(plan_.ranks[size_t(rank)].host);
  char buf[64 * 1024];
  ssize_t n = ::read(opts_.stdin_fd, buf, sizeof buf);
  if (n > 0) {
    fleet_.send(host, msg::Stdin{std::string(buf, size_t(n))}, uint32_t(rank));
    // A terminal echoed what was typed, newline included: the console's cursor is on a new line.
    if (std::memchr(buf, '\n', size_t(n)) && ::isatty(opts_.stdin_fd) == 1) out_->input_echoed();
  } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
    stdin_eof_ = true;
    fleet_.send(host, msg::StdinClose{}, uint32_t(rank));
  }
}

bool RunPlay::hold_reads() {
  // A console that drains slowly holds the hosts' bytes unread until it catches up.
  const bool backlogged = out_->console_backlog() > Output::kConsoleBacklog;
  out_->hold(backlogged);
  out_->flush();
  metrics_->flush_if_due();
  return backlogged;
}

std::chrono::milliseconds RunPlay::max_wait() { return std::min(out_->due_in(), metrics_->due_in()); }
void RunPlay::flush() {
  out_->flush();
  metrics_->flush();
}
void RunPlay::before_message() { out_->before_message(); }

void RunPlay::on_resumed(Clock::time_point now) {
  if (stop_deadline_ && *stop_deadline_ < now + milliseconds(5000)) stop_deadline_ = now + milliseconds(5000);
}

// ---- frames ----

void RunPlay::on_frame(size_t i, uint32_t id, agent::Message& m) {
  std::visit([&](auto& message) { on(i, id, message); }, m);
}

// Output a host may send: its setup's while that runs, its own ranks'; anything else is dropped.
void RunPlay::on(size_t i, uint32_t id, msg::Output& m) {
  if (id == proto::kSetupId) {
    if (fleet_[i].state() == HostState::setting_up) setup_output(i, m.bytes, false);
    return;
  }
  if (id >= plan_.ranks.size() || size_t(plan_.ranks[id].host) != i) return;
  if (m.stream == 3) return metrics_->channel(int(id), m.bytes);  // mltrain.log's lines
  out_->data(int(id), m.stream, m.bytes);
  metrics_->output(int(id), m.stream, m.bytes);
}

void RunPlay::on(size_t i, uint32_t id, msg::Started& m) {
  if (id >= ranks_.size()) return;  // the setup's
  rec_.ranks[id].pid = m.pid;
  ran_ranks_.insert(i);
}

void RunPlay::on(size_t i, uint32_t id, msg::SpawnFailed& m) {
  if (id == proto::kSetupId) {
    msg::SetupDone d{1, 127 << 8, m.message};
    return on(i, id, d);
  }
  if (id >= ranks_.size() || ranks_[id].exited) return;
  auto& r = ranks_[id];
  r.exited = true;
  r.status = 127 << 8;
  rec_.ranks[id].exit_code = 127;
  spawn_failed_.insert(i);
  if (phase_ == Phase::running)
    fail_first(int(id), fleet_[i].name(), 127, 0,
               fleet_.describe(i) + ": rank " + std::to_string(id) + " could not start: " + m.message,
               "spawn_failed");
}

void RunPlay::on(size_t i, uint32_t id, msg::Exited& m) {
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
    // exec runs one command per host: the host is what the message names.
    std::string who = opts_.fail_fast ? (plan_.multi_host ? fleet_.describe(i) + ": " : std::string()) +
                                            "rank " + std::to_string(id)
                                      : fleet_.describe(i) + ": the command";
    fail_first(int(id), fleet_[i].name(), code, WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0,
               who + " failed with " + describe_status(r.status, r.oom_killed) + " after " + after +
                   (ending_ == Ending::none ? " (first failure)" : ""),
               WIFSIGNALED(r.status) ? "rank_signal" : "rank_exit");
  } else if (phase_ == Phase::stopping && WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL) {
    killed_after_failure(i, int(id));
  }
}

// A rank SIGKILLed by someone else than mltrain (the OOM killer, a user), reported while the gang
// stops for another rank's error exit, within kServerLossWindow of it and before mltrain's own
// KILL (the grace): the other rank most likely failed for it (its collectives lost the killed
// rank: "rank 1 closed the connection"), and only the order the agents' reports came in put it
// first. The killed rank becomes the first failure.
void RunPlay::killed_after_failure(size_t i, int rank) {
  if (ending_ != Ending::failure || !rec_.failure || rec_.failure->rank < 0 || rec_.failure->signal != 0)
    return;
  const auto since = clock_.now() - failed_at_;
  if (since > kServerLossWindow || since >= opts_.grace) return;
  const RankState& r = ranks_[size_t(rank)];
  const records::Failure earlier = *rec_.failure;
  const auto secs = std::chrono::duration<double>(clock_.now() - r.started_at).count();
  char after[32];
  std::snprintf(after, sizeof after, "%.1fs", secs);
  records::Failure f;
  f.rank = rank;
  f.host = fleet_[i].name();
  f.exit_code = exit_code_of(r.status);
  f.signal = SIGKILL;
  f.message = (plan_.multi_host ? fleet_.describe(i) + ": " : std::string()) + "rank " +
              std::to_string(rank) + " failed with " + describe_status(r.status, r.oom_killed) + " after " +
              after + "; rank " + std::to_string(earlier.rank) + " on " + earlier.host +
              " failed just before, most likely for it (its peers lost it)";
  f.reason = "rank_signal";
  f.tail = out_->tail(rank);
  rec_.failure = f;
  ending_code_ = f.exit_code;
  out_->flush();
  out_->before_message();
  std::fprintf(stderr, "mltrain: %s\n", f.message.c_str());
  std::fflush(stderr);
}

void RunPlay::on(size_t i, uint32_t, msg::LauncherSilent& m) {
  if (idle_host(i)) return;  // it has no ranks to stop: the run goes on
  // Its ranks are being stopped now: the host, not their exit statuses, is the first failure.
  const std::string why =
      fleet_.describe(i) + ": heard nothing from mltrain for " +
      text::format_duration(milliseconds(m.silent_ms)) +
      " and stopped its ranks (was mltrain stopped, with kill -STOP or a debugger, or the network cut off?)";
  if (phase_ == Phase::running || phase_ == Phase::stopping)
    fail_first(-1, fleet_[i].name(), exit_code::host_failure, 0, why, "launcher_silent");
}

void RunPlay::on_bye(size_t i) {
  // Before the ranks start, an agent that leaves fails its host: preflight cannot wait for it.
  if (before_running()) return on_lost(i, "the agent left before the ranks started");
  // An agent that leaves on its own (after LauncherSilent) may not have reported every rank, or
  // started them: nothing more will come from it.
  if ((phase_ == Phase::running || phase_ == Phase::stopping) && fleet_[i].open()) {
    bool unreported = false;
    for (int r : fleet_[i].plan->ranks) unreported |= !ranks_[size_t(r)].exited;
    if (unreported || (phase_ == Phase::running && !ps_note(i).empty())) {
      on_lost(i, unreported ? "the agent left before reporting its ranks" : "the agent left while serving");
      return;
    }
  }
  fleet_.advance(i, HostState::closed);
}

void RunPlay::on(size_t i, uint32_t, msg::Telemetry& m) {
  if (!telemetry_) telemetry_ = std::make_unique<records::TelemetryLog>(records::run_dir(rec_.id));
  auto elapsed = std::chrono::duration_cast<milliseconds>(clock_.now() - job_start_).count();
  telemetry_->append(fleet_[i].name(), m.sample, int64_t(elapsed));
  if (out_->terminal()) {
    telemetry::Sample s;
    std::string error;
    // A spare not called in, or a host an elastic gang left, samples no rank of the job's.
    if (!idle_host(i) && telemetry::decode(m.sample, s, error)) board_.add(fleet_[i].name(), std::move(s));
  }
}

void RunPlay::on(size_t i, uint32_t, msg::PullFile& m) { pull_frame(i, m); }
void RunPlay::on(size_t i, uint32_t, msg::PullData& m) { pull_frame(i, m); }
void RunPlay::on(size_t i, uint32_t, msg::PullDone& m) { pull_frame(i, m); }

// ---- [sync] pull, once the ranks ended ----

void RunPlay::start_pull() {
  PullJob job = *opts_.pull;
  if (plan_.elastic()) {  // the gang changed, maybe: the hosts that ran ranks, or rank 0's now
    job.hosts.clear();
    if (job.per_host_folders)
      job.hosts.assign(ran_ranks_.begin(), ran_ranks_.end());
    else
      job.hosts.push_back(size_t(plan_.ranks[0].host));
  }
  if (syncs_)  // from each host's own copy of the folder, where it made one
    for (size_t i = 0; i < fleet_.size(); ++i) job.host_dirs.push_back(syncs_->on_host(i, job.dir));
  pull_job_ = std::move(job);
  pulls_ = std::make_unique<Pulls>(fleet_, *pull_job_);
  if (!pulls_->start()) pull_finished();
}

void RunPlay::pull_finished() {
  if (pulled_) return;
  const PullResult r = pulls_->finish(stop_signal_);
  out_->flush();
  out_->before_message();
  if (checkpoint_job_) {  // the second pull: rank 0's checkpoint folder
    if (r.files > 0)
      std::fprintf(stderr, "mltrain: pulled the checkpoint folder, %s (%s), into %s\n",
                   plural(r.files, "file", "files").c_str(), bytes_text(r.bytes).c_str(),
                   checkpoint_job_->dest.c_str());
    for (const auto& p : r.problems) std::fprintf(stderr, "mltrain: pull: checkpoint: %s\n", p.c_str());
    if (rec_.pull)
      for (const auto& p : r.problems) rec_.pull->problems.push_back("checkpoint: " + p);
  } else {
    rec_.pull = records::PullRecord{r.files, r.bytes, r.problems};
    std::fprintf(stderr, "mltrain: pulled %s (%s) into %s\n", plural(r.files, "file", "files").c_str(),
                 bytes_text(r.bytes).c_str(), opts_.pull->dest.c_str());
    for (const auto& p : r.problems) std::fprintf(stderr, "mltrain: pull: %s\n", p.c_str());
    // The checkpoint next, unless this pull was cut short: a host stopped mid-stream may still
    // send the results' files, which must not land in checkpoint/.
    if (!stop_signal_ && r.problems.empty() && start_checkpoint_pull()) return;
  }
  pulled_ = true;
  step(Event::pulled);
}

// MLTRAIN_CHECKPOINT_DIR of rank 0's host, after the results: into the run's checkpoint/ folder.
bool RunPlay::start_checkpoint_pull() {
  if (plan_.ranks.empty()) return false;
  const plan::Env env = plan::rank_env(plan_, plan_.runtime, 0);
  std::string dir;
  for (const auto& [k, v] : env)
    if (k == "MLTRAIN_CHECKPOINT_DIR") dir = v;
  // mltrain's own folder for the run; one the job set itself (a shared folder, maybe) is the
  // job's to manage and is not copied.
  if (dir != plan::checkpoint_dir(plan_.run_id)) return false;
  PullJob job = *opts_.pull;
  job.dir = dir;
  job.host_dirs.clear();
  job.patterns.clear();  // every file in it
  job.hosts = {size_t(plan_.ranks[0].host)};
  job.per_host_folders = false;
  job.dest = records::run_dir(rec_.id) + "/checkpoint";
  checkpoint_job_ = std::move(job);
  pulls_ = std::make_unique<Pulls>(fleet_, *checkpoint_job_);
  if (pulls_->start()) return true;
  pulls_.reset();
  return false;
}

// ---- running ----

// "3/4 ranks alive (0-1,3) - 3m12s - GPU 87% - straggler: rank 3", once a second while ranks run.
void RunPlay::update_status(Clock::time_point now) {
  // Only where colour is on: --color never and NO_COLOR ask for a terminal without escape codes.
  if (!out_->terminal() || !opts_.console.color) return;
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

// What starts one rank: the one place a rank's environment becomes the agent's Spawn.
msg::Spawn RunPlay::spawn_message(const plan::RankPlan& r) const {
  msg::Spawn m;
  m.cwd = syncs_ ? syncs_->on_host(size_t(r.host), plan_.workdir) : plan_.workdir;
  m.argv = plan_.argv;
  for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, r.rank)) m.env.push_back(k + "=" + v);
  m.stdin_pipe = r.rank == opts_.stdin_rank;
  m.python_path = plan_.python_path;
  m.one_stream = out_->one_stream();
  return m;
}

void RunPlay::spawn_all() {
  for (auto& r : ranks_) r = RankState{};
  for (const auto& r : plan_.ranks) {
    const msg::Spawn m = spawn_message(r);
    fleet_.send(size_t(r.host), m, uint32_t(r.rank));
    // A restarted rank finds the launcher's stdin already at its end.
    if (m.stdin_pipe && stdin_eof_) fleet_.send(size_t(r.host), msg::StdinClose{}, uint32_t(r.rank));
    ranks_[size_t(r.rank)].started_at = clock_.now();
  }
}

void RunPlay::terminate_all(milliseconds grace) {
  auto deadline = clock_.now() + grace + milliseconds(5000);
  if (!stop_deadline_ || deadline < *stop_deadline_) stop_deadline_ = deadline;
  escalate_at_.reset();
  step(Event::stop);
  fleet_.send_all(msg::Terminate{uint32_t(grace.count())}, proto::kAllRanks);
}

void RunPlay::fail_first(int rank, const std::string& host, int code, int sig, const std::string& message,
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

int RunPlay::ranks_running() const {
  return int(std::count_if(ranks_.begin(), ranks_.end(), [](const RankState& r) { return !r.exited; }));
}

std::vector<int> RunPlay::running_ranks() const {
  std::vector<int> out;
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (!ranks_[r].exited) out.push_back(int(r));
  return out;
}

std::string RunPlay::running_ranks_text() const {
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

void RunPlay::on_lost(size_t i, const std::string& why) {
  FleetHost& h = fleet_[i];
  if (!h.open()) return;
  if (before_running()) return fleet_.fail_link(i, why);
  if (idle_host(i)) return idle_lost(i, why);
  fleet_.advance(i, HostState::lost);
  board_.forget(h.name());  // the status line counts what is left
  ranks_gone(i);
  if (phase_ == Phase::running)
    fail_first(-1, h.name(), exit_code::host_failure, 0, fleet_.describe(i) + ": " + why + ps_note(i),
               "host_lost");
  else if (phase_ == Phase::stopping)
    lost_before_failure(i, why);
  h.link->kill();
}

// A host lost while the gang stops after a rank's failure, silent since well before that failure
// (two heartbeat intervals: a host that answers pings is never that quiet): it was lost first, and
// the rank most likely failed for it (its peers vanished). The host becomes the first failure.
// A host that ran PS servers and whose link closed just after a worker failed was lost first too:
// its servers' connections closed with it (the agent killed, the host gone), the worker failed on
// them a moment before the link's end reached mltrain.
void RunPlay::lost_before_failure(size_t i, const std::string& why) {
  const FleetHost& h = fleet_[i];
  if (ending_ != Ending::failure || !rec_.failure || rec_.failure->rank < 0) return;
  const bool silent_before = h.last_heard + 2 * opts_.heartbeat_interval < failed_at_;
  const bool served = !ps_note(i).empty() && clock_.now() - failed_at_ <= kServerLossWindow;
  if (!silent_before && !served) return;
  const records::Failure later = *rec_.failure;
  const auto silent = std::chrono::duration_cast<milliseconds>(failed_at_ - h.last_heard);
  records::Failure f;
  f.host = h.name();
  f.exit_code = exit_code::host_failure;
  f.message = fleet_.describe(i) + ": " + why + ps_note(i) +
              (silent_before ? "; silent for " + text::format_duration(silent) + " before rank "
                             : "; its servers' connections closed with it, and rank ") +
              std::to_string(later.rank) + " on " + later.host + " failed" +
              (silent_before ? ", which most likely followed from it" : " on them just before");
  f.reason = "host_lost";
  rec_.failure = f;
  ending_ = Ending::host_failure;
  ending_code_ = exit_code::host_failure;
  out_->flush();
  out_->before_message();
  std::fprintf(stderr, "mltrain: %s\n", f.message.c_str());
  std::fflush(stderr);
}

bool RunPlay::ranks_gone(size_t i) {
  // Ranks on a lost or closed host cannot be waited for; count them as gone.
  bool any = false;
  for (int r : fleet_[i].plan->ranks)
    if (!ranks_[size_t(r)].exited) {
      ranks_[size_t(r)].exited = true;
      ranks_[size_t(r)].status = -1;
      rec_.ranks[size_t(r)].host_lost = true;
      out_->finish(r);
      any = true;
    }
  return any;
}

void RunPlay::on_signal(int sig) {
  if (before_running()) {
    // Nothing has started: stop here, at once, without waiting for slow hosts.
    ending_ = sig == SIGINT ? Ending::interrupted : Ending::stopped;
    stop_signal_ = sig;
    out_->set_status("");
    if (phase_ == Phase::queued || phase_ == Phase::claiming)  // the agents leave, and the place with them
      std::fprintf(stderr,
                   "\nmltrain: %s while waiting for the hosts; the job left the queue, no rank was started\n",
                   signal_name(sig).c_str());
    else
      std::fprintf(stderr, "\nmltrain: %s during %s; no rank was started\n", signal_name(sig).c_str(),
                   phase_name(phase_));
    step(Event::signalled);
    return;
  }
  if (phase_ == Phase::closing || phase_ == Phase::done) return;
  if (phase_ == Phase::pulling) {  // the results can wait: stop pulling, say goodbye
    std::fprintf(stderr, "\nmltrain: %s while pulling; what came so far is kept\n", signal_name(sig).c_str());
    if (!stop_signal_) stop_signal_ = sig;
    pull_finished();
    step(Event::pulled);
    return;
  }
  interrupt(sig);
}

void RunPlay::interrupt(int sig) {
  out_->before_message();
  if (sig == SIGINT) {
    ++interrupts_;
    if (ending_ == Ending::none) ending_ = Ending::interrupted, stop_signal_ = sig;
    if (interrupts_ == 1) {
      std::fprintf(stderr,
                   "\nmltrain: interrupt: passing SIGINT to every rank (press Ctrl-C again to kill them)\n");
      fleet_.send_all(msg::Signal{SIGINT}, proto::kAllRanks);
      // Ranks that ignore SIGINT still go: TERM after the grace period, then KILL.
      step(Event::stop);
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

void RunPlay::all_ranks_ended() {
  out_->flush();
  log::info("supervise", "every rank has ended");
  step(may_restart() ? Event::restart : opts_.pull ? Event::results : Event::ranks_ended);
}

}  // namespace detail

int run_job(plan::Plan& plan, records::RunRecord& record, const Options& opts,
            const TransportFor& transport_for) {
  detail::Fleet fleet(plan, opts, transport_for);
  detail::RunPlay play(fleet, plan, record);
  return play.run();
}

}  // namespace mltrain::supervise
