// The gang: one event loop over every host's agent, in explicit phases. Internal to supervise/.
//
//   connecting ──► preflight ──► running ──► stopping ──► [pulling] ──► closing ──► done
//        │             │            ▲  │         │
//        └─────────────┴──► done    └──┴ restarting (after a failure, while max_restarts allows)
//
// preflight per host: [syncing ──► setting_up ──►] preparing ──► ready ([sync], [setup]: sync.cpp);
// pulling only with [sync] pull, once the ranks ran. `mltrain cp`: connecting ──► pulling ──► closing.
//
// `mltrain doctor` runs the same loop for another purpose: connecting ──► probing ──► closing;
// `mltrain top` on hosts: connecting ──► watching ──► closing (watch.cpp).
//
// connecting: transports open every host's agent (threads) and each agent answers hello;
// preflight: every agent checks its host (prepare); running: ranks run; stopping: ranks were
// told to stop and are awaited; closing: agents say goodbye. A signal before running ends the
// run at once: nothing starts. Phase changes happen in enter() alone.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runner/protocol/protocol.h"
#include "runner/records/telemetry_log.h"
#include "runner/supervise/doctor.h"
#include "runner/supervise/supervisor.h"
#include "runner/supervise/watch.h"
#include "runner/telemetry/analysis.h"
#include "runner/tree/beneath.h"

namespace mltrain::supervise::detail {

enum class Phase {
  connecting,
  preflight,
  probing,
  watching,
  running,
  stopping,
  restarting,
  pulling,
  closing,
  done
};
const char* phase_name(Phase p);

// Per host: connecting -> greeting (hello sent) -> greeted -> preparing (prepare, or doctor's
// ping and probe, sent) -> ready; or failed (a problem before running), lost (after), closed
// (said bye).
// Between greeted and preparing, with [sync] and [setup]: syncing, setting_up.
enum class HostState {
  connecting,
  greeting,
  greeted,
  syncing,
  setting_up,
  preparing,
  ready,
  failed,
  lost,
  closed
};

// Doctor's view of one host while probing: the ping's round trip, then the probe's facts.
struct Probing {
  Clock::time_point ping_sent{};
  double rtt_ms = 0;
  int64_t probe_sent_wall_ms = 0;
};

// How the run ends; the first reason wins.
enum class Ending { none, failure, host_failure, interrupted, stopped, timeout, preflight_failed };

// One host's sync: the files it wants, how far their bytes went, what it said at the end.
struct HostSync {
  std::vector<int32_t> want;
  size_t next = 0;      // into want
  uint64_t offset = 0;  // within want[next]
  uint64_t raw_bytes = 0, wire_bytes = 0;
  uint64_t want_bytes = 0;  // of the files it wants
  uint32_t deleted = 0;
  bool data_sent = false;  // SyncEnd is on its way
  bool done = false;
  std::string dir;  // as the agent resolved it
};

struct HostSetup {
  std::string partial;            // the output's last unfinished line
  std::vector<std::string> tail;  // its last lines, for a failure
  int log_fd = -1;
  bool skipped = false;
};

// What went wrong, kept up to a bound: a host may send any number of problems.
struct Problems {
  static constexpr size_t kKept = 20, kTextBytes = 512;
  std::vector<std::string> items;
  uint64_t more = 0;  // past kKept: counted only
  void add(std::string text);
  bool empty() const { return items.empty(); }
  std::vector<std::string> lines() const;  // the items, then "... and N more"
};

struct HostPull {
  bool active = false, done = false;
  bool single_file = false;  // what was asked for is one file
  sync::Fd root;             // where this host's files land: the pull's folder, or its <host>/ in there
  sync::Fd parent;           // the folder of the file arriving
  int fd = -1;               // that file, under a temporary name in `parent`
  std::string tmp, leaf, rel;
  int64_t mtime_ns = 0;
  uint64_t size = 0, left = 0;    // the file arriving
  uint64_t files = 0, bytes = 0;  // placed whole
  uint64_t received = 0;          // every byte written (and each entry's block), for the bounds
  uint64_t entries = 0;           // files offered
  uint64_t next_tmp = 0, next_space_check = 0;
  Clock::time_point last_progress{};
  Problems problems;
};

struct Host {
  const plan::HostPlan* plan = nullptr;
  HostState state = HostState::connecting;
  std::unique_ptr<transport::AgentLink> link;
  agent::Decoder decoder{agent::kMaxHostPayload};
  std::string outbox;
  std::string problem;        // why preflight failed here
  bool cannot_start = false;  // ... because the program or workdir is missing (exit 127)
  agent::msg::Prepared prepared;
  Probing probing;
  std::optional<agent::msg::Probed> probed;
  Clock::time_point last_heard{};
  std::optional<Clock::time_point> prepare_deadline;  // preflight must answer by then
  bool synced = false, set_up = false;
  HostSync sync;
  HostSetup setup;
  HostPull pull;
  int ps_log_fd = -1;  // the run's ps-<host>.log, once a server said something
  bool open() const {
    return link && (state != HostState::failed && state != HostState::lost && state != HostState::closed);
  }
};

struct RankState {
  bool exited = false;
  int status = 0;
  Clock::time_point started_at{};
  std::string error_file;   // what it wrote to TORCHELASTIC_ERROR_FILE when it failed (from its agent)
  bool oom_killed = false;  // its host's kernel recorded killing it for memory (its agent's evidence)
};

// What the connection threads hand back. Shared with them, so a gang that ends while a host is
// still connecting need not wait: the thread finds `abandoned` and drops its link.
struct Connects {
  struct Result {
    size_t host = 0;
    std::unique_ptr<transport::AgentLink> link;
    std::string problem;
  };
  Connects();
  ~Connects();
  int ready_fd() const { return pipe[0]; }
  void put(Result r);          // from a connection thread
  std::vector<Result> take();  // on the loop
  void abandon();
  int pipe[2] = {-1, -1};
  std::mutex m;
  std::vector<Result> ready;
  bool abandoned = false;
};

class Gang {
 public:
  Gang(plan::Plan& p, records::RunRecord& rec, const Options& o, const TransportFor& tf);
  ~Gang();
  int run();
  // Doctor: connect, probe every host (master_port tested free on the first), say goodbye.
  // Returns 0, or 128 + the signal that cut it short; `reports` has one entry per host.
  int run_doctor(int master_port, std::vector<HostReport>& reports);
  // Top: connect, then hand every agent's samples to `w` until it or a signal says stop.
  int run_watch(const WatchOptions& w);
  // cp: connect, pull (opts.pull), say goodbye. Returns the files that came; `unreachable` gets
  // the hosts that could not be reached, `problems` what could not be copied.
  uint64_t run_pull(std::vector<std::string>& unreachable, std::vector<std::string>& problems,
                    bool& single_file);

 private:
  // The loop.
  void loop();
  bool before_running() const {
    return phase_ == Phase::connecting || phase_ == Phase::preflight || phase_ == Phase::probing ||
           phase_ == Phase::watching;
  }
  void wait(Clock::time_point until);
  void on_timers(Clock::time_point now);
  void heartbeats(Clock::time_point now);  // running, stopping, watching
  std::optional<Clock::time_point> next_deadline() const;
  void enter(Phase p);

  // Connecting and preflight (preflight.cpp).
  void start_connects();
  void take_connected();
  void host_failed(size_t i, const std::string& problem);
  void check_progress();  // moves on once every host answered (or failed) in this phase
  void begin_preflight();
  void next_step(size_t i);  // sync, then setup, then prepare
  void send_prepare(size_t i);
  void settle_gpus();  // every ready host's Prepared against [gpus]: CUDA_VISIBLE_DEVICES, or a failure
  void settle_rendezvous();

  // Frames.
  void send_to(Host& h, const auto& m, uint32_t id = 0) {
    if (h.open()) agent::encode(h.outbox, m, id);
  }
  void read_host(size_t i);
  void write_host(size_t i);
  void on_frame(size_t i, agent::Frame&& f);
  void on(size_t i, uint32_t id, agent::msg::HelloAck& m);
  void on(size_t i, uint32_t id, agent::msg::Prepared& m);
  void on(size_t i, uint32_t id, agent::msg::Started& m);
  void on(size_t i, uint32_t id, agent::msg::SpawnFailed& m);
  void on(size_t i, uint32_t id, agent::msg::Output& m);
  void on(size_t i, uint32_t id, agent::msg::Exited& m);
  void on(size_t i, uint32_t id, agent::msg::Pong& m);
  void on(size_t i, uint32_t id, agent::msg::AgentError& m);
  void on(size_t i, uint32_t id, agent::msg::LauncherSilent& m);
  void on(size_t i, uint32_t id, agent::msg::Bye& m);
  void on(size_t i, uint32_t id, agent::msg::Probed& m);
  void on(size_t i, uint32_t id, agent::msg::Telemetry& m);
  void on(size_t i, uint32_t id, agent::msg::SyncWant& m);
  void on(size_t i, uint32_t id, agent::msg::SyncDone& m);
  void on(size_t i, uint32_t id, agent::msg::SetupDone& m);
  void on(size_t i, uint32_t id, agent::msg::PullFile& m);
  void on(size_t i, uint32_t id, agent::msg::PullData& m);
  void on(size_t i, uint32_t id, agent::msg::PullDone& m);
  void on(size_t i, uint32_t id, agent::msg::PsLog& m);
  void on(size_t i, uint32_t id, agent::msg::PsStats& m);
  template <class M>
  void on(size_t i, uint32_t id, M& m);  // a launcher->agent message: unexpected here

  // Sync, setup and pull (sync.cpp).
  void start_sync_all();  // the tree's manifest and chunks, once for every host
  void start_sync(size_t i);
  void pump_sync(size_t i);  // more file bytes while the host's outbox has room
  void sync_progress(Clock::time_point now);
  void start_setup(size_t i);
  void setup_output(size_t i, std::string_view bytes, bool end);
  void start_pull();
  void end_pull(size_t i);
  void stop_pull(size_t i, std::string why);
  void pull_stalls(Clock::time_point now);
  bool charge(size_t i, uint64_t n);
  void pull_finished();

  // PS servers (ps.cpp).
  void number_ps_servers();
  void ps_prepare(size_t i, agent::msg::Prepare& m) const;
  std::string reach_address(size_t i) const;
  void settle_ps();                     // every server's address into the ranks' env and the record
  std::string ps_note(size_t i) const;  // " (PS servers 0, 2 ran there)" or ""

  // Running.
  void spawn_all();
  void forward_stdin();  // --stdin: the launcher's stdin to one rank, while it runs
  void terminate_all(std::chrono::milliseconds grace);
  void fail_first(int rank, const std::string& host, int code, int sig, const std::string& message,
                  const char* reason);
  void host_lost(size_t i, const std::string& why);
  void lost_before_failure(size_t i, const std::string& why);  // stopping: was it lost first?
  bool ranks_gone(size_t i);  // host i's unreported ranks count as ended (lost); true if any were
  void on_signal(int sig);
  void pause();           // SIGTSTP
  void heard_from_all();  // this process was stopped: start every host's heartbeat window again
  void all_ranks_ended();
  void update_status(Clock::time_point now);  // the console's status line (a terminal only)
  int ranks_running() const;
  std::vector<int> running_ranks() const;
  // "ranks 0,2-3 (on h1, h3)", "all 4 ranks (on h[1-4])": those still running, for messages.
  std::string running_ranks_text() const;

  // Doctor (doctor.cpp).
  void send_probes();
  void on_probe_pong(size_t i);
  // doctor: the program the ranks run first (a command line's first word), "" when unknown.
  std::string job_program() const;
  std::vector<HostReport> doctor_reports() const;

  // Top on hosts (watch.cpp).
  void start_watching(size_t i);
  void watch_problem(size_t i, const std::string& problem);

  // The end (summary.cpp).
  int finish();
  void print_summary(int code);

  plan::Plan& plan_;
  records::RunRecord& rec_;
  const Options& opts_;
  const TransportFor& transport_for_;
  Clock& clock_;
  SignalSource& signals_;
  Phase phase_ = Phase::connecting;
  Clock::time_point phase_start_{};
  std::vector<Host> hosts_;
  std::vector<RankState> ranks_;
  std::unique_ptr<Output> out_;
  std::unique_ptr<records::TelemetryLog> telemetry_;  // telemetry.jsonl, from the first sample
  telemetry::Board board_;                            // the latest samples, for the status line
  std::optional<Clock::time_point> next_status_;      // on a terminal: redraw the status line then
  std::shared_ptr<Connects> connects_;
  Ending ending_ = Ending::none;
  Clock::time_point failed_at_{};  // when the first failure came (a host silent since before it came first)
  int ending_code_ = 0;
  int stop_signal_ = 0;  // the signal that stopped the run (exit 128 + it)
  int interrupts_ = 0;
  int restart_ = 0;
  bool stdin_eof_ = false;
  std::string master_;
  bool doctor_ = false;
  int doctor_port_ = 0;
  const WatchOptions* watch_ = nullptr;
  std::string preflight_error_;
  bool record_unsaved_ = false;  // a records::save failed (a full disk): run.json is behind
  Clock::time_point job_start_{};
  std::optional<Clock::time_point> job_deadline_;
  std::optional<Clock::time_point> escalate_at_;    // after an interrupt: TERM at this time
  std::optional<Clock::time_point> stop_deadline_;  // stopping: unreported ranks count as lost
  std::optional<Clock::time_point> next_ping_;
  agent::msg::Prepare prepare_;           // what every host is asked (per host: ports, GPUs)
  std::string manifest_frames_;           // [sync]: the tree's manifest, encoded once
  std::unique_ptr<sync::Chunks> chunks_;  // ... and its files' bytes
  Clock::time_point sync_start_{};
  std::optional<Clock::time_point> next_sync_status_;
  bool sync_reported_ = false;
  std::set<size_t> sync_warned_;  // big files named already
  bool pulled_ = false;           // the pull ran (or was not asked for): closing may go on
  bool ranks_started_ = false;
  bool pull_only_ = false;  // cp
  uint64_t pulled_files_ = 0;
  std::vector<std::string> pull_problems_;
  std::vector<std::vector<int32_t>> ps_numbers_;  // per host: the PS servers its agent runs
};

}  // namespace mltrain::supervise::detail
