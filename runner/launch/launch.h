// The job API the CLI calls: a JobRequest (a spec file or an ad-hoc command, plus the flags that
// override it) becomes a spec, a plan, and then a validation, a dry run, a run or a doctor report.
// Handlers in cli/ only parse flags into a JobRequest, call one function here and print.
// Every function throws mltrain::Error (exit code 2 unless it says otherwise) on bad input.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/records/records.h"
#include "runner/spec/spec.h"
#include "runner/supervise/doctor.h"
#include "runner/supervise/gc_hosts.h"
#include "runner/supervise/queue.h"

namespace mltrain::launch {

// The run flags of the command line, as given (unset: 0, -1 or empty). They override the spec.
struct Overrides {
  int nprocs = 0;
  int procs_per_host = 0;
  bool oversubscribe = false;        // allow more ranks than the hosts have slots
  bool queue = false;                // wait for free GPUs in the hosts' queue ([cluster] queue)
  std::string hostfile;              // replaces the spec's hosts and hostfile
  std::optional<std::string> hosts;  // -H as given (even empty); replaces the spec's hosts and hostfile
  std::string include, exclude;
  std::vector<std::string> env;      // "K=V" each; replaces the spec's value of K
  std::vector<std::string> forward;  // -x: "K" (the launcher's value of K) or "K=V"
  int master_port = 0;               // 0: the spec's
  int max_restarts = -1;
  std::string timeout, grace;  // durations as written ("90s", "1h30m")
  std::string queue_timeout;   // --queue-timeout, as written
  std::string profile;         // ad-hoc runs only
  std::string name, workdir, ranks, ssh_config;
  bool no_prefix = false, timestamps = false;
  bool accept_new_host_keys = false;
  int stdin_rank = -1;       // run: --stdin (0) or --stdin-rank N; -1: every rank reads /dev/null
  std::optional<bool> sync;  // --sync / --no-sync: over [sync]'s presence
  std::string launcher;      // --launcher auto|ssh|slurm
  std::string setup;         // --setup auto|always|never: over [setup] when
  bool ps = false;           // bench --mode ps: PS mode (a server on every host unless the spec has [ps])
};

struct JobRequest {
  // Job spec paths as given (the positional words before '--'): at most one.
  std::vector<std::string> specs;
  // The words after '--': the ad-hoc command, or the one replacing the spec's.
  std::optional<std::vector<std::string>> command;
  Overrides overrides;
  bool json = false;    // run: the summary as JSON on stdout, rank output on stderr
  bool color = false;   // colour the console's rank prefixes
  bool detach = false;  // run: leave the job running in the background
  // `mltrain exec`: the command once on every host (one rank per host, whatever the spec says),
  // output prefixed by host, every host run to its end (no fail-fast; the exit code is the first
  // failure's), in the login directory unless a workdir is given. Recorded like a run.
  bool exec = false;
  // The launcher's side of the plan; unset: this process's environment and working directory.
  std::optional<std::map<std::string, std::string>> environ;
  std::optional<std::string> cwd;
  // `mltrain rerun`: the recorded run this one repeats, its code restored from the code store.
  struct Rerun {
    std::string of;          // the run's id
    std::string tree;        // its code, restored: synced in place of the project's folder
    std::string root;        // the folder it was synced from
    std::string git_commit;  // what it recorded
  };
  std::optional<Rerun> rerun;
  // `mltrain sweep`'s trial ("SWEEP/N"): the run says so in its record and writes its id to
  // <state home>/sweeps/SWEEP/trial-N.run.
  std::string sweep_trial;
};

// `mltrain sweep SPEC` (docs/sweep.md): a trial per parameter combination of [sweep], each an
// ordinary run, at most max_parallel at once; or `--resume SWEEP`: the trials that did not finish.
struct SweepRequest {
  std::string spec;      // the spec path ("" with resume)
  std::string resume;    // a sweep id ("" for a new sweep)
  int max_parallel = 0;  // over [sweep] max_parallel (0: the spec's)
  bool color = false;
};
// Returns the exit code: 0 when a trial succeeded and every trial finished, 1 when none succeeded,
// 130 when interrupted (--resume goes on from there).
int sweep(const SweepRequest& req);

// A request for `mltrain rerun RUN`: the run's code restored from the code store (once, under
// <state home>/reruns/<run>) and its recorded spec, with `req`'s flags over them. Secrets are
// taken from this environment again (resolve_spec refuses a missing one). Throws mltrain::Error
// when the run kept no code.
JobRequest rerun_request(const std::string& run_query, JobRequest req);

// The spec a request asks for: loaded (or made from the command) and overridden by its flags;
// each flag that replaces a key is recorded in the spec's origins.
spec::JobSpec resolve_spec(const JobRequest& req);

struct Validation {
  plan::Plan plan;      // with placeholder run id, token and ports
  std::string summary;  // "job.toml: ok: 4 ranks on a(2), b(2)"
};

// Checks the spec and plans its ranks without touching any host or the run records.
Validation validate(const JobRequest& req);

// The plan a run would use (run id "dry-run", a fresh token, free ports); starts nothing.
plan::Plan dry_run(const JobRequest& req);

// The plan for people: hosts, ranks and each rank's environment (the token hidden); in PS mode
// each host's servers and describe_ps's line.
std::string describe_plan(const plan::Plan& p);
// PS mode, one line: "4 servers on h3, h4 (2 each), sync, partition 4 MiB".
std::string describe_ps(const plan::Plan& p);
// What a run would sync, set up and pull back ("" when nothing): lists the tree, starts nothing.
std::string describe_sync(const JobRequest& req);

struct RunResult {
  int exit_code = 0;  // mltrain's exit code (docs/exit-codes.md); 0 for a detached start
  std::string run_id;
  records::RunRecord record;  // as last saved (detached: what the background launcher starts from)
  bool detached = false;
  int launcher_pid = 0;  // the detached launcher's pid, else this process's
  std::string queued;    // detached: the job waits in the hosts' queue, and this is what it waits for
};

// Creates the run record, connects to every host and supervises the job to its end. With
// req.detach the launcher forks: the child (its own session, its console in the run's
// console.log) connects, runs preflight on every host and runs the job, then _exits with its
// code, never returning to the caller; the parent waits until preflight passed and the ranks were
// started (or the job took its place in the hosts' queue: `queued` says what it waits for), then
// returns with the run id and the child's pid. When the run fails before that
// (host unreachable, program missing), the parent throws the child's error with its exit code
// (with req.json, after printing the run's record). mltrain's own error for a recorded run is
// kept in its folder (records::launcher_error), detached or not.
RunResult run(const JobRequest& req);

struct DoctorResult {
  std::vector<supervise::HostReport> reports;
  int exit_code = 0;  // 0 when every host is ready, else exit_code::host_failure
};

// Checks every host of the request (its command defaults to `true`: doctor runs no program).
DoctorResult doctor(const JobRequest& req);

struct QueueResult {
  std::vector<supervise::HostLeases> hosts;
  int exit_code = 0;  // 0 when every host answered, else exit_code::host_failure (or 128 + a signal)
};

// `mltrain queue`: every lease on the request's hosts, all users' (docs/sharing.md).
QueueResult queue(const JobRequest& req);

struct GcHostsResult {
  std::vector<supervise::HostGc> hosts;
  int exit_code = 0;  // 0 when every host answered, else exit_code::host_failure (or 128 + a signal)
};

// `mltrain gc --hosts`: the synced folders on the request's hosts that no run uses any more and
// none synced within `older_than` are removed (listed only, with `dry_run`); docs/sync.md.
GcHostsResult gc_hosts(const JobRequest& req, std::chrono::seconds older_than, bool dry_run);

struct TopRequest {
  // A run (id, prefix or name), or a job spec whose hosts to watch; "": the newest running run,
  // else the hosts of job.overrides (hostfile, -H), else this host.
  std::string target;
  JobRequest job;                   // its host flags and ssh config, when hosts are watched
  bool once = false, json = false;  // one snapshot (json implies once)
  bool color = false;
  std::chrono::milliseconds interval{1000};
};

// `mltrain top`: a running run's live telemetry (what its launcher receives), or hosts watched
// through agents this process starts there. Full screen on a terminal, a snapshot per interval on
// a pipe, one snapshot with `once`. Returns the exit code: 0, or exit_code::host_failure when a
// host could not be watched. Throws Error for a run that is not running or nothing to show.
int top(const TopRequest& req);

struct ShellRequest {
  std::string run;  // id, prefix or name ("" or "latest": the newest)
  int rank = 0;
  std::vector<std::string> command;  // empty: the user's login shell
  Overrides overrides;               // ssh_config, accept_new_host_keys
};

// `mltrain ssh`: a shell (or `command`) on the rank's host, in the run's working directory, with
// the rank's environment as recorded (secret values left out). Returns its exit code; throws Error
// for a run or rank that does not exist or a host that cannot be reached.
int shell(const ShellRequest& req);
struct SbatchRequest {
  JobRequest job;  // one spec; its flags
  int nodes = 0;   // 0: as many as the spec's hosts
  std::string time, partition, account;
  std::vector<std::string> extra;  // more sbatch options, as written ("--gres=gpu:4")
};
struct SbatchScript {
  std::string text, path, output;  // output: sbatch's --output pattern (with %j)
};
// `mltrain sbatch`: the batch script that runs `mltrain run --launcher slurm` over the allocation.
SbatchScript sbatch_script(const SbatchRequest& req);
// Writes it under the state home and submits it with sbatch; returns the Slurm job id.
std::string sbatch(const SbatchRequest& req);

struct CopyRequest {
  std::string from;     // RUN:PATH or RUN:RANK:PATH (PATH relative to the run's working directory)
  std::string to;       // a local path
  bool force = false;   // merge into a destination that exists (else it is an error)
  Overrides overrides;  // ssh_config, accept_new_host_keys
};

// `mltrain cp`: a file or folder from the host of a run's rank (rank 0 unless named) to `to`,
// through the agent, as `cp -r` would place it. Returns the number of files copied; throws Error
// (exit 2 for a bad argument, 255 for a host that cannot be reached, 1 for what cannot be read).
uint64_t copy(const CopyRequest& req);

// The /bin/sh script that does it (for tests). `agent` is the host's agent as a shell word ("":
// none): asked for its runtime folder, it gives the shell the MLTRAIN_RUNTIME, MLTRAIN_COMM_LIB
// and PYTHONPATH the agent gives ranks.
std::string shell_script(const records::RunRecord& r, int rank, const std::vector<std::string>& command,
                         const std::string& agent = {});

// `mltrain export`: the request's job spec as a Kubernetes manifest, YAML for `kubectl apply`:
// `to` is "volcano" (a Volcano Job) or "pytorchjob" (a Kubeflow PyTorchJob), any case. One pod per
// node, procs_per_host ranks each; [k8s] (docs/k8s.md) gives the image and the pods' resources.
// Throws Error (exit 2, located at the spec's line where there is one) for a spec it cannot export:
// no [k8s] or no image, GPUs that do not fit, uneven ranks per pod, a name Kubernetes refuses, an
// unknown target. Secret values are never in the text: they are read from the Secret <name>-env.
// `warnings` (when given) gets what the manifest may get wrong, each also a "# Warning:" line in it.
std::string export_manifest(const JobRequest& req, const std::string& to,
                            std::vector<std::string>* warnings = nullptr);

}  // namespace mltrain::launch
