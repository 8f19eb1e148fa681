// The agent's state, shared by the files that serve it: agent.cpp (the event loop and frame
// dispatch), spawn.cpp (starting ranks, forwarding their output, reaping them), prepare.cpp
// (preflight), probe.cpp (doctor's facts), sync.cpp, ps.cpp and telemetry.cpp. Internal to
// agent_core; the clock, the processes and the environment come from its AgentWorld.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runner/agent/agent_core.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/lease/claim.h"
#include "runner/protocol/protocol.h"
#include "runner/telemetry/sample.h"
#include "runner/telemetry/sampler.h"
#include "runner/tree/beneath.h"

struct mltrain_comm_stats;

namespace mltrain::agent::detail {

inline constexpr size_t kReadChunk = 64 * 1024;
inline constexpr int64_t kLostLauncherGraceMs = 2000;
inline constexpr size_t kOutboxHighWater = 8u << 20;  // stop reading ranks' pipes above this backlog
inline constexpr size_t kStdinBacklog = 64u << 20;    // a rank's unread forwarded stdin, at most

bool set_nonblocking(int fd);  // false with errno set when fcntl fails
void log_err(const char* fmt, const char* arg);
// Forks the warden (warden.cpp), which kills this user's processes whose environment holds
// `marker` once the agent is gone, then removes the job's segments and `private_dir` ("" none).
// Returns the end of its pipe the agent keeps open (-1 on failure) and sets `warden` to its pid.
int start_warden(const std::string& marker, const std::string& private_dir, pid_t& warden);
// Removes the agent's private folder (Agent::private_dir) and what this user has in it, one
// level, never through a link; a folder not this user's is left alone.
void remove_private_dir(const std::string& dir);
// Where GPUs are looked for (prepare.cpp): the job's MLTRAIN_NVML_LIBRARY, else the agent's own
// ("" = the default name); the job's CUDA_VISIBLE_DEVICES when it sets one, else the agent's own
// (`own`, nullopt: unset).
std::string nvml_library_for(const std::string& job_value);
// The job's MLTRAIN_NCCL_LIBRARY, else the agent's own ("" = search, knobs/gpu_library.h).
std::string nccl_library_for(const std::string& job_value);
// The interpreter a job would run: `want` ("" = python3) as the ranks' PATH finds it; "" if none.
// Its wheels' nvidia/*/lib folders are where NCCL and cudart are looked for last.
std::string python_for(const std::string& want, const std::string& path);
// "/opt/venv/bin/python3" -> "python3".
std::string basename_of(const std::string& p);
std::optional<std::string> cuda_visible_devices_for(uint32_t job_sets_it, const std::string& job_value,
                                                    const std::optional<std::string>& own);

// Runs using a synced folder (in_use.cpp): `run`'s shared flock on <state>/in-use/<run>, held by
// the fd returned (-1: not held); the oldest other run holding one there, "" when none does (files
// no one holds are removed on the way).
int hold_in_use(int state, const std::string& run);
std::string used_by_older(int state, const std::string& run);
// The oldest run other than `run` holding the folder (older than `run` only, with older_only); "".
std::string held_by(int state, const std::string& run, bool older_only);

// A rank's comm counter block name (telemetry.cpp): /mltrain-<run>-stats-<rank>-<16 random hex>.
std::string comm_stats_name(const std::string& run_id, uint32_t rank);

// What the last sync wrote (sync.cpp): kind 'f' file, 'd' folder, 'l' link.
struct SyncIndexEntry {
  char kind = 0;
  std::string hash;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint64_t ino = 0;
};
// A synced folder's own bookkeeping, inside it (sync.cpp); a pull never sends it.
inline constexpr const char* kState = ".mltrain-sync";

// "WHAT PATH: strerror(errno)".
inline std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// mkdir -p of a path the launcher named (its own setting: links on the way are followed); the
// folders it makes are private. `made`: whether the last part was made now (sync.cpp).
bool mkdirs(const std::string& path, mode_t mode, bool* made = nullptr);

struct SyncOpen {  // a file being received
  int fd = -1;
  std::string tmp;       // its name in the sync's own work folder
  void* hash = nullptr;  // XXH3_state_t
  uint64_t written = 0;
};
struct SyncState {
  bool receiving = false;  // manifest frames are arriving
  bool failed = false;     // the folder could not be made: the data is ignored
  std::string dir;
  // The synced folder, its .mltrain-sync, and this sync's own work folder in there (tmp-<random>,
  // locked through its `lock` file while the sync runs, so a concurrent sync of the same folder,
  // from this host or another sharing the home, never takes or removes its temporary files).
  sync::Fd root, state;
  sync::WorkFolder work;
  std::vector<SyncEntry> entries;
  std::map<std::string, SyncIndexEntry> index;
  // When the folder asked for was in use by an older run: that folder and what its last sync
  // wrote, whose unchanged files are linked in rather than sent (in_use.cpp).
  uint32_t copy = 0;  // 0: the folder asked for; N: "<it>@N"
  sync::Fd base_root;
  std::map<std::string, SyncIndexEntry> base_index;
  std::map<uint32_t, SyncOpen> open;
  std::set<uint32_t> broken;  // files that could not be written (said once)
  uint32_t pending = 0, files = 0;
  uint64_t bytes = 0;
  uint64_t handled = 0, said = 0;  // raw bytes of SyncData taken in; how many of them SyncWritten told
  std::vector<std::string> problems;
};
struct PullState {
  bool active = false;
  std::string dir;
  std::vector<std::string> files;
  size_t next = 0;
  int fd = -1;
  uint64_t left = 0, bytes = 0, max_bytes = 0;
  uint32_t id = 0, sent = 0;
  bool single_file = false;  // the Pull named a file, not a folder
  std::vector<std::string> problems;
};

struct PsHost;  // ps.cpp: this host's parameter servers

struct Rank {
  uint32_t id = 0;
  pid_t pid = -1;
  int fds[3] = {-1, -1, -1};   // stdout, stderr, metrics read ends (stream fds[i] is i + 1)
  int stdin_fd = -1;           // write end of the rank's stdin pipe (spawned with stdin_pipe)
  std::string stdin_buf;       // bytes from Stdin frames not yet taken by the rank
  bool stdin_closing = false;  // StdinClose came: close once stdin_buf is written
  bool stdin_dropped = false;  // input beyond kStdinBacklog was dropped (said once)
  std::string error_file;      // its TORCHELASTIC_ERROR_FILE, read when it fails
  std::string stats_name;      // its comm counter block (MLTRAIN_COMM_STATS_NAME), unguessable
  OomMark oom_mark;            // for the kernel's record of it, if it dies of SIGKILL
  bool reaped = false;
};

// A rank's comm counter block (comm/include/mltrain/comm_stats.h), mapped read-only once and kept;
// remapped when the file at its name is another one (a restarted gang's rank replaces it).
struct CommStatsMapping {
  const mltrain_comm_stats* block = nullptr;
  uint64_t dev = 0, ino = 0;
  bool refused = false;  // the file at dev/ino failed the checks (named once; not opened again)
  bool checked = false;  // its fields passed the checks (done once, when its magic shows)
};

class Agent {
 public:
  Agent(AgentStream stream, AgentWorld world);
  ~Agent();
  std::optional<int> step(int max_wait_ms);  // AgentCore::step

 private:
  std::optional<int> act_on_time(int64_t now);  // the deadlines; the exit code once Bye is said
  int poll_timeout(int64_t now, int max_wait_ms) const;
  void read_stream();
  void handle_frame(Frame&& f);
  void on(uint32_t id, const msg::Hello& m);
  void on(uint32_t id, msg::Spawn& m);
  // A rank's environment (spawn.cpp): the agent's own, the job's over it, then what the agent adds.
  std::map<std::string, std::string> rank_env(uint32_t id, const msg::Spawn& m, std::string& stats_name);
  void add_runtime_env(std::map<std::string, std::string>& merged, const msg::Spawn& m);
  void place_error_file(std::map<std::string, std::string>& merged);
  void place_checkpoint_dir(std::map<std::string, std::string>& merged);
  void start_warden_once(const std::map<std::string, std::string>& merged);
  // `~` or `~/...`: below this user's home (HOME, else the password database).
  std::string expand_home(const std::string& path) const;
  // The PATH a job's ranks look programs up in: the job's own, else the agent's.
  std::string ranks_path(const std::string& job_path) const;
  void on(uint32_t id, const msg::Prepare& m);
  // What the run records of this host (host_facts.cpp); `gpus`: the inventory when one was taken,
  // `nccl_version`: NCCL's when it was loaded (0: not).
  std::vector<std::string> host_facts(const msg::Prepare& m, const GpuInventory* gpus, int nccl_version);
  void python_facts(const std::string& python, std::vector<std::string>& facts);
  void on(uint32_t id, const msg::Probe& m);
  void on(uint32_t id, msg::Stdin& m);
  void on(uint32_t id, const msg::StdinClose& m);
  void on(uint32_t id, const msg::Signal& m);
  void on(uint32_t id, const msg::Terminate& m);
  void on(uint32_t id, const msg::Ping& m);
  void on(uint32_t id, const msg::Shutdown& m);
  void on(uint32_t id, const msg::Pause& m);
  void on(uint32_t id, const msg::TelemetryStart& m);
  // Sync, setup and pull (sync.cpp).
  void on(uint32_t id, msg::SyncManifest& m);
  bool open_sync_folder(const std::string& asked, msg::SyncWant& out);  // false: said why
  // The folder to sync into: the one asked for, unless an older run uses it (in_use.cpp).
  bool choose_sync_folder(const std::string& asked, const std::string& run, msg::SyncWant& out);
  bool link_from_base(size_t i, int parent, const std::string& leaf);
  void remove_gone_entries(msg::SyncWant& out);
  void place_entry(size_t i, msg::SyncWant& out);
  void on(uint32_t id, msg::SyncData& m);
  void write_sync_data(uint32_t id, msg::SyncData& m);
  void on(uint32_t id, const msg::SyncEnd& m);
  void on(uint32_t id, msg::Setup& m);
  void on(uint32_t id, const msg::Pull& m);
  void load_sync_index();
  bool save_sync_index();
  void finish_file(uint32_t index, SyncOpen& f);
  void close_sync_files();  // the files being received, dropped
  void setup_exited(int status);
  void pump_pull();
  // The job's claim on this host (claim.cpp): made once preflight passed, and again while the job
  // waits; its leases held until the agent ends. Unclaim gives back a grant (another host said
  // no); the first Spawn leaves the queue.
  void on(uint32_t id, const msg::Claim& m);
  void on(uint32_t id, const msg::Unclaim& m);
  void on(uint32_t id, const msg::LeaseQuery& m);
  void on(uint32_t id, const msg::GcWork& m);  // gc.cpp
  void answer_lease_readers(size_t first_slot);
  // PS servers (ps.cpp): started at preflight when Prepare asks, stopped before Bye.
  void start_ps(const msg::Prepare& m, msg::Prepared& out);
  int ps_fd() const;  // readable when a server has a line to say (-1: no servers)
  void pump_ps();
  void send_ps_stats();
  void stop_ps();
  template <class M>
  void on(uint32_t id, const M& m);  // an agent->launcher message: unexpected here
  template <class M>
  void send(const M& m, uint32_t id = 0) {
    if (stdout_open_) encode(outbox_, m, id);
  }
  // Rank output, the hot path: straight into the outbox, no message struct in between.
  void send_output(uint32_t id, int stream, std::string_view bytes) {
    if (stdout_open_) encode(outbox_, Type::output, id, bytes, uint16_t(stream));
  }
  void flush_outbox(bool block);
  void read_rank_fd(Rank& r, int which);
  void write_rank_stdin(Rank& r);
  void drain_rank(Rank& r);
  void reap();
  const std::string& private_dir(std::string& why);  // spawn.cpp; "" with why when it cannot be made
  void signal_groups(int sig, uint32_t id);
  void kill_orphans();
  void start_terminate(int64_t grace_ms);
  bool any_alive() const;
  void teardown_and_exit_soon(const char* why);
  // Telemetry (telemetry.cpp): one Telemetry frame of the host, its GPUs and its ranks.
  void take_sample();
  // rank_pid: the rank (process group) the block must belong to; 0 (watch): any live process of
  // this user.
  const mltrain_comm_stats* map_comm_stats(const std::string& name, int32_t rank_pid);
  void read_comm_stats(telemetry::RankSample& r, const std::string& name, int32_t rank_pid);
  void discover_ranks(std::vector<telemetry::RankPid>& pids);  // watch: the host's mltrain ranks
  void ranks_among_gpu_processes(const std::vector<telemetry::GpuSample>& gpus,
                                 std::vector<telemetry::RankPid>& pids);

  Clock& clock_;
  ProcessTable& procs_;
  Environment& env_;
  std::function<std::string(std::string& why)> unpack_runtime_;
  int in_fd_, out_fd_, sigfd_;
  std::vector<pollfd> fds_;  // one turn's wait: signals, stream in, stream out, then owners_'
  std::vector<std::pair<Rank*, int>> owners_;  // the rank and pipe of each fds_[3...]: 0-2 out, 3 in
  std::map<uint32_t, Rank> ranks_;
  std::string outbox_;
  size_t outbox_pos_ = 0;
  Decoder decoder_;
  bool stdin_open_ = true;
  bool stdout_open_ = true;
  bool greeted_ = false;
  int64_t grace_ms_ = 5000;
  int64_t heartbeat_timeout_ms_ = 0;  // 0: no heartbeat check
  int64_t last_heard_ms_ = 0;
  bool paused_ = false;            // the launcher said it is being stopped: no heartbeat until its next frame
  int64_t kill_deadline_ms_ = -1;  // when TERMed groups get KILL
  bool exiting_ = false;           // launcher gone or shutdown: leave once every rank is gone
  int64_t exit_deadline_ms_ = -1;
  int warden_fd_ = -1;  // held open for the warden's sake, never written (-2: no warden)
  pid_t warden_ = -1;
  bool runtime_tried_ = false;
  std::string runtime_dir_;  // the unpacked comm runtime ("" when it could not be unpacked)
  std::string private_dir_;  // this run's private folder (error files), "" until made
  bool private_dir_tried_ = false;
  // The run's MLTRAIN_CHECKPOINT_DIR when this agent made it: removed at the end if left empty.
  std::string checkpoint_made_;
  std::string run_id_;                 // the job's MLTRAIN_RUN_ID (names its comm counter blocks)
  int64_t telemetry_interval_ms_ = 0;  // 0: not sampling
  int64_t next_sample_ms_ = 0;
  std::unique_ptr<telemetry::Sampler> sampler_;
  std::vector<telemetry::RankPid> sample_pids_;
  telemetry::Sample sample_;
  msg::Telemetry telemetry_msg_;
  std::map<std::string, CommStatsMapping> comm_stats_;  // by shared-memory name
  uint32_t stats_refusals_said_ = 0;                    // counter blocks refused and named so far
  bool watch_ = false;                                  // top on this host: no ranks of our own
  std::map<int32_t, std::string> stats_of_pid_;         // watch: each found rank's counter block
  std::map<int32_t, int32_t> env_rank_;                 // watch: a GPU process's RANK (-1: none)
  std::string environ_;
  SyncState sync_;
  std::string setup_stamp_, setup_key_;  // where the setup's last success is kept, and what it was
  bool setup_running_ = false;
  PullState pull_;
  sync::Fd in_use_;             // this run's hold on the folder it synced (released when the agent ends)
  std::shared_ptr<PsHost> ps_;  // shared_ptr: PsHost is complete only in ps.cpp
  std::optional<lease::Claim> claim_;
  std::vector<lease::Gpu> claimable_gpus_;  // the usable GPUs Prepare found
  std::vector<lease::Lease*> lease_slots_;  // the leases polled this turn, in fds_ order
};

}  // namespace mltrain::agent::detail
