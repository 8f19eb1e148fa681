// The run play: the gang of `mltrain run` and `exec` over the fleet. Internal to supervise/.
//
//   connecting ──► preflight ──► running ──► stopping ──► [pulling] ──► closing ──► done
//        │             │            ▲  │         │
//        └─────────────┴──► done    └──┴ restarting (after a failure, while max_restarts allows)
//
// preflight per host: [syncing ──► setting_up ──►] preparing ──► ready ([sync], [setup]: sync.cpp);
// pulling only with [sync] pull, once the ranks ran. The table is plays::run::next (run_play.cpp);
// step() is the one place the phase changes, begin() what entering a phase does.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runner/records/metrics.h"
#include "runner/records/telemetry_log.h"
#include "runner/supervise/detail/fleet.h"
#include "runner/supervise/detail/pulls.h"
#include "runner/supervise/detail/syncs.h"
#include "runner/supervise/plays.h"
#include "runner/telemetry/analysis.h"

namespace mltrain::supervise::detail {

// How the run ends; the first reason wins.
enum class Ending { none, failure, host_failure, interrupted, stopped, timeout, preflight_failed, busy };

struct HostSetup {
  std::string partial;            // the output's last unfinished line
  std::vector<std::string> tail;  // its last lines, for a failure
  int log_fd = -1;
  bool skipped = false;
};

// What the run keeps of each host besides its link.
struct RunHost {
  bool cannot_start = false;  // preflight failed because the program or workdir is missing (exit 127)
  agent::msg::Prepared prepared;
  std::optional<Clock::time_point> prepare_deadline;  // preflight must answer by then
  bool set_up = false;
  HostSetup setup;
  int ps_log_fd = -1;                          // the run's ps-<host>.log, once a server said something
  std::optional<agent::msg::Claimed> claimed;  // this round's answer to the claim
  std::vector<std::string> squatters_named;    // lease names whose squatter was said (once each)
};

struct RankState {
  bool exited = false;
  int status = 0;
  Clock::time_point started_at{};
  std::string error_file;   // what it wrote to TORCHELASTIC_ERROR_FILE when it failed (from its agent)
  bool oom_killed = false;  // its host's kernel recorded killing it for memory (its agent's evidence)
};

class RunPlay final : public Play {
 public:
  using Phase = plays::run::Phase;
  using Event = plays::run::Event;
  RunPlay(Fleet& fleet, plan::Plan& p, records::RunRecord& rec);
  ~RunPlay() override;
  int run();

  // Play.
  bool finished() const override { return phase_ == Phase::done; }
  void on_timers(Clock::time_point now) override;
  std::optional<Clock::time_point> next_deadline() const override;
  void on_signal(int sig) override;
  void on_progress() override;
  void on_lost(size_t i, const std::string& why) override;
  void on_frame(size_t i, uint32_t id, agent::Message& m) override;
  void on_bye(size_t i) override;
  void on_sent(size_t i) override;
  void on_resumed(Clock::time_point now) override;
  int extra_fd() const override;
  void on_extra(short revents) override;
  bool hold_reads() override;
  std::chrono::milliseconds max_wait() override;
  void flush() override;
  void before_message() override;

 private:
  void step(Event e);   // the phase the table says, then what entering it does
  void begin(Phase p);  // what entering a phase does
  bool before_running() const {
    return phase_ == Phase::connecting || phase_ == Phase::preflight || phase_ == Phase::claiming ||
           phase_ == Phase::queued;
  }
  void running_timers(Clock::time_point now);
  void stop_deadline_passed();
  void restart_gang();
  void start_ranks();
  std::vector<RankInfo> rank_infos() const;  // each rank's place, for the console's prefixes

  // Elastic restarts (elastic.cpp, docs/elastic.md).
  void begin_gang();  // the first generation: the hosts with ranks, each's seats
  // Whether the gang may restart after the ranks ended, and with which hosts (next_gang_); says
  // why not when an elastic gang is too small.
  bool may_restart();
  void regroup_gang();  // next_gang_ becomes the gang: ranks numbered anew, the rendezvous moved
  // A host that runs nothing now: a spare not yet called in, or a host an elastic gang left. Its
  // loss, or its agent's silence, does not touch the run.
  bool idle_host(size_t i) const { return plan_.hosts[i].ranks.empty() && plan_.hosts[i].ps_servers == 0; }
  void idle_lost(size_t i, const std::string& why);

  // Preflight (preflight.cpp).
  void begin_preflight();
  void preflight_timers(Clock::time_point now);
  void preflight_done();
  std::vector<std::string> failed_hosts() const;                 // "  h2: problem" for each failed host
  void preflight_failed(const std::vector<std::string>& lines);  // nothing starts: the hosts named
  void next_step(size_t i);                                      // sync, then setup, then prepare
  void send_prepare(size_t i);
  // Every ready host's GPUs against [gpus] (those Prepared found usable, or once claimed, those
  // granted): CUDA_VISIBLE_DEVICES, or a failure.
  bool settle_gpus();  // false: a host failed
  void start_job();    // every host passed (and granted): the rendezvous, PS servers, the ranks

  // Claims (claims.cpp): each host's GPUs and place, once preflight passed.
  void send_claims();
  void claims_answered();
  void claim_timers(Clock::time_point now);
  std::string claim_obstacles(size_t i) const;  // "h2: GPUs 0-3 held by run … for 1h02m"
  void name_squatters(size_t i, const std::vector<std::string>& squatters);  // once per host and name
  std::string waiting_status(bool interactive = true) const;  // "waiting for 2 GPUs on h2; 1 job ahead"
  void leave_out_spare(size_t i);                             // a spare not granted: the job goes without it
  void settle_rendezvous();
  void fail_host(size_t i, const std::string& problem);  // and move on if that was the last answer

  // Frames.
  void on(size_t i, uint32_t id, agent::msg::Prepared& m);
  void on(size_t i, uint32_t id, agent::msg::Claimed& m);
  void on(size_t i, uint32_t id, agent::msg::Started& m);
  void on(size_t i, uint32_t id, agent::msg::SpawnFailed& m);
  void on(size_t i, uint32_t id, agent::msg::Output& m);
  void record_facts(size_t i, const std::vector<std::string>& facts);
  void on(size_t i, uint32_t id, agent::msg::Exited& m);
  void on(size_t i, uint32_t id, agent::msg::LauncherSilent& m);
  void on(size_t i, uint32_t id, agent::msg::Telemetry& m);
  void on(size_t i, uint32_t id, agent::msg::SyncWant& m);
  void on(size_t i, uint32_t id, agent::msg::SyncDone& m);
  void on(size_t i, uint32_t id, agent::msg::SyncWritten& m);
  void on(size_t i, uint32_t id, agent::msg::SetupDone& m);
  void on(size_t i, uint32_t id, agent::msg::PullFile& m);
  void on(size_t i, uint32_t id, agent::msg::PullData& m);
  void on(size_t i, uint32_t id, agent::msg::PullDone& m);
  void on(size_t i, uint32_t id, agent::msg::PsLog& m);
  void on(size_t i, uint32_t id, agent::msg::PsStats& m);
  template <class M>
  void on(size_t i, uint32_t, M&) {  // not the run's: dropped (a launcher->agent one is logged)
    fleet_.unexpected(i, M::kType);
  }

  // Sync (the feed: syncs.cpp) and setup (sync.cpp).
  void pump_sync(size_t i);  // more file bytes while the host's outbox has room
  void start_setup(size_t i);
  void setup_output(size_t i, std::string_view bytes, bool end);

  // Pull ([sync] pull, after the ranks).
  void start_pull();
  void pull_finished();
  bool start_checkpoint_pull();  // false: nothing to pull
  template <class M>
  void pull_frame(size_t i, M& m) {
    if (!pulls_) return;  // none asked for yet
    pulls_->on(i, m);
    if (pulls_->over()) pull_finished();
  }

  // PS servers (ps.cpp).
  void number_ps_servers();
  void ps_prepare(size_t i, agent::msg::Prepare& m) const;
  std::string reach_address(size_t i) const;
  void settle_ps();                     // every server's address into the ranks' env and the record
  std::string ps_note(size_t i) const;  // " (PS servers 0, 2 ran there)" or ""

  // Running.
  agent::msg::Spawn spawn_message(const plan::RankPlan& r) const;
  void spawn_all();
  void forward_stdin();  // --stdin: the launcher's stdin to one rank, while it runs
  void terminate_all(std::chrono::milliseconds grace);
  void fail_first(int rank, const std::string& host, int code, int sig, const std::string& message,
                  const char* reason);
  void lost_before_failure(size_t i, const std::string& why);  // stopping: was it lost first?
  void killed_after_failure(size_t i, int rank);               // stopping: was it killed first?
  // How soon after a worker's failure a PS server host's lost link still counts as its cause.
  static constexpr std::chrono::milliseconds kServerLossWindow{2000};
  bool ranks_gone(size_t i);  // host i's unreported ranks count as ended (lost); true if any were
  void interrupt(int sig);
  void all_ranks_ended();
  void update_status(Clock::time_point now);  // the console's status line (a terminal only)
  int ranks_running() const;
  std::vector<int> running_ranks() const;
  // "ranks 0,2-3 (on h1, h3)", "all 4 ranks (on h[1-4])": those still running, for messages.
  std::string running_ranks_text() const;

  // The end (summary.cpp).
  int finish();
  void record_unstarted(const char* status, int code, const char* reason);
  [[noreturn]] void finish_preflight_failed();
  [[noreturn]] void finish_busy();
  void print_summary(int code);

  plan::Plan& plan_;
  records::RunRecord& rec_;
  const Options& opts_;
  Clock& clock_;
  Phase phase_ = Phase::connecting;
  std::vector<RunHost> hosts_;  // beside the fleet's
  std::vector<RankState> ranks_;
  std::unique_ptr<Output> out_;
  std::unique_ptr<records::MetricsLog> metrics_;      // metrics.jsonl
  std::unique_ptr<records::TelemetryLog> telemetry_;  // telemetry.jsonl, from the first sample
  telemetry::Board board_;                            // the latest samples, for the status line
  std::optional<Clock::time_point> next_status_;      // on a terminal: redraw the status line then
  Ending ending_ = Ending::none;
  Clock::time_point failed_at_{};  // when the first failure came (a host silent since before it came first)
  int ending_code_ = 0;
  int stop_signal_ = 0;  // the signal that stopped the run (exit 128 + it)
  int interrupts_ = 0;
  int restart_ = 0;
  // The gang: the hosts running ranks now, in node-rank order, and what each host's ranks need
  // (per local rank, its GPU slots; a spare gets the seats of the host whose place it takes).
  std::vector<int> gang_, next_gang_;
  std::vector<std::vector<std::vector<int>>> seats_;
  std::string gang_change_;        // how next_gang_ differs from gang_ ("" when it does not)
  std::set<size_t> ran_ranks_;     // hosts that ran ranks in some generation: [sync] pull asks them
  std::set<size_t> spawn_failed_;  // hosts where a rank could not start: an elastic gang drops them
  bool stdin_eof_ = false;
  std::string master_;
  std::string preflight_error_;
  bool record_unsaved_ = false;  // a records::save failed (a full disk): run.json is behind
  Clock::time_point job_start_{};
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> escalate_at_;     // after an interrupt: TERM at this time
  std::optional<Clock::time_point> stop_deadline_;   // stopping: unreported ranks count as lost
  agent::msg::Prepare prepare_;                      // what every host is asked (per host: ports, GPUs)
  std::unique_ptr<Syncs> syncs_;                     // [sync], from preflight on
  std::optional<PullJob> pull_job_;                  // [sync] pull as each host has its folder
  std::optional<PullJob> checkpoint_job_;            // ... then MLTRAIN_CHECKPOINT_DIR of rank 0's host
  std::unique_ptr<Pulls> pulls_;                     // [sync] pull, once the ranks ended
  bool pulled_ = false;                              // ... and it is over
  std::vector<std::vector<int32_t>> ps_numbers_;     // per host: the PS servers its agent runs
  std::optional<Clock::time_point> retry_at_;        // queued: ask the hosts again then
  std::optional<Clock::time_point> queue_deadline_;  // queued: leave the queue then (queue_timeout)
  std::optional<Clock::time_point> queued_since_;    // when the job first waited in the queue
  std::string waiting_said_;                         // queued: the status last printed (not a terminal)
};

}  // namespace mltrain::supervise::detail
