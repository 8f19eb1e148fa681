// Run records: one folder per run under runs/ of the state home (runner/common/state_home.h):
// run.json, rank-N.log, output.order (the order rank output arrived in), console.log.
// `logs`, `ls`, `show` and `stop` read these; nothing else is a database.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/records/code.h"
#include "runner/records/metrics.h"

namespace mltrain::plan {
struct Plan;
}

namespace mltrain::records {

struct RankRecord {
  int rank = 0;
  int host = 0;  // index into RunRecord::hosts
  int local_rank = 0;
  int pid = 0;
  int exit_code = -1;                      // -1 while running or never started
  int signal = 0;                          // the signal that killed it, 0 if none
  bool host_lost = false;                  // its host was lost: its own exit is unknown
  std::map<std::string, std::string> env;  // what mltrain set for this rank
  struct Gpu {
    int index = 0;     // NVML's (CUDA_VISIBLE_DEVICES holds these)
    std::string uuid;  // as its host's inventory found it
  };
  std::vector<Gpu> gpus;  // the physical GPUs it was given ([gpus]), in its CUDA_VISIBLE_DEVICES order
};

struct HostRecord {
  std::string name;
  std::string address;
  int node_rank = 0;
  std::string workdir;  // where its ranks ran, when not the run's workdir (its own copy of a synced folder)
  // What its agent said of it at preflight (os, kernel, python, torch, ...: docs/records.md).
  std::vector<std::pair<std::string, std::string>> environment;
};

// One PS server of the run: where it listened and its counters, as its agent last reported them.
struct PsServerRecord {
  int server = 0;
  std::string host;
  std::string address;  // addr:port the workers connected to
  unsigned long long bytes_in = 0, bytes_out = 0, requests = 0, keys = 0;
  unsigned max_queue_depth = 0;
};

struct Failure {
  int rank = -1;  // -1: not a rank (a host or the launcher)
  std::string host;
  int exit_code = 0;
  int signal = 0;
  std::string message;  // one line, as printed
  std::vector<std::string> tail;
  // Why: rank_exit (the rank's own exit code, even 255), rank_signal, spawn_failed, host_lost,
  // preflight (nothing started), launcher (mltrain's own error).
  std::string reason;
};

// What a [sync] pull brought back, once it ran: problems (a host that stalled, a cap reached, a
// file that came short) mean some files were left behind.
struct PullRecord {
  uint64_t files = 0, bytes = 0;
  std::vector<std::string> problems;
};

// One generation of the gang: the ranks as the start, or a restart, made them (docs/elastic.md).
struct Generation {
  int restart = 0;
  std::string started_at;          // ISO 8601, UTC
  std::vector<std::string> hosts;  // the hosts that ran ranks, in node-rank order
  int world_size = 0;
  std::string why;  // what ended the generation before and how the gang changed ("" for the first)
  bool operator==(const Generation&) const = default;
};

struct RunRecord {
  std::string id, name;
  std::string status = "running";  // queued | running | lost (launcher died) | succeeded | failed |
                                   // interrupted | stopped | timeout | host-failure | busy
  int exit_code = -1;
  double queued_s = 0;  // how long it waited in the hosts' queue before its ranks started
  int launcher_pid = 0;
  unsigned long long launcher_start = 0;  // /proc start time, to tell a reused pid apart
  std::string started_at, ended_at;       // ISO 8601, UTC
  double duration_s = 0;
  std::string spec_file, spec_toml, workdir, git_commit, master_addr;
  int master_port = 0;
  std::vector<std::string> argv;
  std::vector<HostRecord> hosts;
  std::vector<RankRecord> ranks;
  int restarts = 0, max_restarts = 0;
  std::vector<Generation> generations;  // one per start of the ranks: the first, then each restart
  bool detached = false;
  std::string slurm_job_id;                // the allocation a Slurm-launched run ran in ("" otherwise)
  std::string kind = "run";                // run | exec (one command on every host)
  std::string ssh_config;                  // the ssh config the run used, absolute ("": ~/.ssh/config)
  std::vector<PsServerRecord> ps_servers;  // PS mode: in server order
  std::optional<Failure> failure;
  std::optional<PullRecord> pull;
  std::string rerun_of;  // `mltrain rerun`: the run this one repeats
  std::string sweep_id;  // `mltrain sweep`: the sweep this run is a trial of, and which
  int sweep_trial = -1;
  CodeSummary code;        // the code it ran (code.json in its folder), when recorded
  MetricsSummary metrics;  // what its ranks reported (metrics.jsonl in its folder)
  // The live console's line prefix template ("[{host}:{rank}]", "[{rank}]", "" for none), so
  // `logs` prefixes lines the same way. Records written before it: "[{rank}]".
  std::string log_prefix = "[{rank}]";
};

// The run's output.order file: one entry per arrival of a rank's output at the launcher, in
// arrival order, written after the bytes it covers. `logs` merges the rank files by it.
struct OrderEntry {
  uint32_t rank;
  uint32_t reserved;
  uint64_t end;  // rank-N.log holds this many bytes once this arrival is in it
};
static_assert(sizeof(OrderEntry) == 16);
std::string order_path_in(const std::string& run_dir);

// The console's prefix template for a rank's lines: "auto" is [{host}:{rank}] for a multi-host
// job, else [{rank}]; "" is none; anything else is the user's template.
std::string prefix_template(const std::string& tmpl, bool multi_host);
// The template with {rank} {local_rank} {node} {host} filled in.
std::string render_prefix(const std::string& tmpl, int rank, int local_rank, int node,
                          const std::string& host);

// Where run folders live; created on first use.
std::string runs_dir();
std::string run_dir(const std::string& id);

// A new, unique, time-sortable id like "20261129-141502-hello-3fa2", with its folder created.
std::string create_run(const std::string& name);

// The hosts' environment (HostRecord::environment) one row per fact in a fixed order: its value
// when every host said the same, else each value with its hosts ("6.1.0 (h1, h2); 6.5.0 (h3)"),
// "-" for a host that said none.
std::vector<std::pair<std::string, std::string>> environment_rows(const RunRecord& r);

// Fills hosts, ranks and addresses from a plan.
void fill_from_plan(RunRecord& r, const plan::Plan& p);
// The ranks, node ranks and rendezvous of the plan's gang now (after an elastic restart's regroup).
void fill_ranks(RunRecord& r, const plan::Plan& p);

// Writes run.json atomically (write then rename).
// The folder host `host` of the run ran its ranks in: its own copy of a synced folder, or the run's.
std::string workdir_of(const RunRecord& r, int host);

// Writes run.json atomically (a temporary file, fsync, rename). On failure (a full disk) it warns,
// keeps the last good run.json and returns false.
[[nodiscard]] bool save(const RunRecord& r);
// Reads one run; throws mltrain::Error naming the file on a missing or corrupt record.
RunRecord load(const std::string& id);
// Every run, oldest first; unreadable folders are skipped with a warning.
std::vector<RunRecord> list();
// Run folders a launcher killed (SIGKILL) between making and naming them left behind: ".ID.new"
// in runs_dir(), holding the run's first run.json, whose launcher is gone; or without one, and over
// a minute old (killed before its record was written). Names, sorted.
std::vector<std::string> half_made_runs();
// The one rule of `show`, `logs`, `stop` and `rm`: "" or "latest" -> the newest run; an exact id
// wins; else the one run whose id starts with `query` (or, when none does, contains it). A query
// that matches several runs throws an Error listing them, newest first.
std::string resolve(const std::string& query);

// The version of every JSON document mltrain prints or writes, in its "schema" field (docs/json.md).
inline constexpr int kJsonSchema = 1;

// run.json, `show --json` and `run --json`: one run (docs/json.md, "run").
std::string to_json(const RunRecord& r, bool pretty);
// `ls --json`: {"schema": 1, "runs": [...]}, runs in the order given, without spec and env.
std::string list_to_json(const std::vector<RunRecord>& runs);
// `run --dry-run --json` and `validate --json`: the plan (docs/json.md, "plan").
std::string plan_to_json(const plan::Plan& p);

// Whether the launcher that owns a "running" record is still alive (pid and start time match).
bool launcher_alive(const RunRecord& r);
// Not ended yet, by its record: running, or waiting in the hosts' queue.
inline bool live_status(const std::string& status) { return status == "running" || status == "queued"; }
// This process's start time as /proc/self/stat reports it.
unsigned long long process_start_time(int pid);

std::string now_iso8601();

// mltrain's own error for a run (what it printed as "mltrain: error: ..."), kept in the run's
// folder as launcher-error.txt so `logs` shows it; "" when there is none.
void save_launcher_error(const std::string& id, const std::string& text);
std::string launcher_error(const std::string& id);

// mltrain itself failed while the run was running (not a rank, not a host): keeps the error as
// above and ends the record as failed with failure.reason "launcher", so `ls` does not show the
// run as running or lost. A record the supervisor already ended is left as it is.
void end_with_launcher_error(const std::string& id, int exit_code, const std::string& message,
                             const std::string& text);

}  // namespace mltrain::records
