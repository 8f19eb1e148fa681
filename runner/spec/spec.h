// The job spec: what `mltrain run` is asked to do, as loaded from TOML (docs/spec.md), merged
// over its profile and overridden by command-line flags. Its keys are one table, the schema
// (detail/schema.h), which loading (spec_load.cpp), check() and to_toml() read.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mltrain::spec {

using Duration = std::chrono::milliseconds;

// The most ranks and hosts one job may have (a clear error past them, not minutes of planning).
inline constexpr int kMaxRanks = 16384;
inline constexpr int kMaxHosts = 4096;

struct RunSection {
  std::optional<std::string> command;                    // run by /bin/sh -c
  std::vector<std::string> argv;                         // or run directly
  std::string workdir;                                   // empty: the launcher's current directory
  std::vector<std::pair<std::string, std::string>> env;  // profile's first, then the spec's
  std::vector<std::string> forward_env;                  // globs over the launcher's environment
  int max_restarts = 0;
  Duration timeout{0};  // 0: none
  Duration grace_period{std::chrono::seconds(5)};
  bool python_path = true;  // the delivered `mltrain` Python package first on the ranks' PYTHONPATH
};

struct ClusterSection {
  std::vector<std::string> hosts;  // host-list items, as in `-H`
  std::string hostfile;            // resolved relative to the spec file
  int procs_per_host = 0;          // 0: from slots (or 1)
  int nprocs = 0;                  // total ranks (`-n`); 0: every slot
  bool oversubscribe = false;      // allow more ranks than slots (a host without a count has 1)
  std::string include, exclude;    // DeepSpeed-style filters
  // How agents start: "ssh" (local child for this machine), "slurm" (one srun step per host), or
  // "auto": slurm inside an allocation (SLURM_JOB_ID set), else ssh.
  std::string launcher = "auto";
  // Sharing hosts (docs/sharing.md): the hosts to this job alone (no other mltrain job on them
  // while it runs), and waiting in the hosts' queue for free GPUs (or hosts) instead of failing.
  bool exclusive = false;
  bool queue = false;
  // How long a job may wait in the queue before it gives up its place (0: as long as it takes).
  std::chrono::milliseconds queue_timeout{0};
  // Elastic restarts (docs/elastic.md): a restart goes on without a lost host while at least
  // min_hosts remain (0: every host is needed), and a spare takes a lost host's place.
  int min_hosts = 0;
  std::vector<std::string> spares;  // host-list items, as hosts
};

struct CommSection {
  std::string mode = "allreduce";  // allreduce | ps
  std::string backend = "auto";    // auto | tcp | nccl
  int master_port = 0;             // 0: auto (a free port)
  int num_servers = 0;             // ps mode: servers in all, spread over the server hosts (0: see [ps])
};

// [ps]: parameter-server mode (docs/spec.md). A [ps] table makes the job PS mode (comm.mode "ps");
// `[comm] mode = "ps"` alone keeps these defaults.
struct PsSection {
  bool present = false;  // the spec (or its profile) has a [ps] table
  // Server hosts, host-list items as in [cluster] hosts. Empty: the hostfile's role=server/both
  // hosts, else every worker host.
  std::vector<std::string> hosts;
  int servers_per_host = 0;  // 0: not given (1 each, or [comm] num_servers spread over the hosts)
  bool sync = true;          // false: each push is applied at once by the server's optimizer
  uint64_t partition_bytes = uint64_t{4} << 20;  // tensors above this are split across servers
  // [ps.optimizer], async only. name "": none (a push is added to the value).
  struct Optimizer {
    std::string name;
    double lr = 0.01, momentum = 0, weight_decay = 0;
  } optimizer;
};
inline constexpr uint64_t kMaxPartitionBytes = uint64_t{1} << 30;
inline constexpr int kMaxServersPerHost = 256;

struct GpuSection {
  int per_proc = 0;
  int procs_per_gpu = 0;
};

struct SshSection {
  std::string config, user, identity_file, known_hosts;
  int port = 0;
  std::string strict_host_keys = "yes";  // yes | accept-new | no
  Duration connect_timeout{std::chrono::seconds(10)};
};

struct LogsSection {
  std::string ranks;            // console filter, e.g. "0,3-5"; empty: all
  std::string prefix = "auto";  // "auto", "" (none) or a template with {rank} {host} {local_rank} {node}
  bool timestamps = false;
};

// [sync]: the local folder mirrored to every host before the ranks start (docs/sync.md).
struct SyncSection {
  bool enabled = false;              // [sync] present (unless enabled = false), or --sync
  bool reuse = false;                // --no-sync over a [sync]: ranks run in the folder synced last
  std::string src;                   // the local folder; "": the spec's folder (or the current one)
  std::string remote_dir;            // on the hosts; "": ~/.cache/mltrain/work/<folder>-<key>
  std::vector<std::string> exclude;  // patterns, as in .gitignore
  struct File {
    std::string src, dst, origin;  // src resolved from the spec's folder; dst relative to remote_dir
  };
  std::vector<File> files;
  std::vector<std::string> pull;  // patterns brought back into the run's folder when the job ends
  std::string pull_from = "all";  // all | rank0
};

// [record]: what a run's record keeps besides its spec and logs (docs/records.md).
struct RecordSection {
  bool code = true;                       // the synced tree: its manifest and contents in the code store
  uint64_t code_max = uint64_t{1} << 30;  // a tree larger than this keeps its manifest only
};

// [metrics]: scalars read from rank 0's output (docs/metrics.md).
struct MetricsSection {
  // Regular expressions whose named groups are metrics ("loss=(?P<loss>[-0-9.e+]+)"); a group
  // named `step` is the step. Matched against each line of rank 0's stdout and stderr.
  std::vector<std::string> patterns;
};

// A [metrics] pattern in RE2's grammar (runner/common/regex.h): each named group, Python's
// `(?P<name>...)` or `(?<name>...)`, is a metric. `groups` gets the name of every capturing group
// in order ("" for an unnamed one). "" with `error` set when the pattern does not compile (RE2
// has no back-reference or look-around), is over regex.h's bounds, or names no metric.
std::string metric_regex(const std::string& pattern, std::vector<std::string>& groups, std::string& error);

// [sweep]: a job run once per trial, each with its parameters substituted as {name} into
// run.command, run.argv and [run.env] (docs/sweep.md). `mltrain sweep` runs it; `mltrain run`
// refuses a spec with [sweep].
struct SweepRange {
  std::string name;
  double min = 0, max = 1;
  bool log = false;      // log-uniform (min > 0)
  bool integer = false;  // rounded to an integer
};
struct SweepSection {
  bool present = false;
  int max_parallel = 1;
  std::string metric;               // what ranks report (docs/metrics.md): the trials' table sorts by it
  std::string goal = "min";         // min | max
  std::string early_stop = "none";  // none | median
  // The rule's warm-up (Optuna's n_warmup_steps, n_startup_trials): no trial is stopped before
  // this step (-1: a tenth of the longest finished trial's steps) or before this many finished.
  int min_steps = -1;
  int min_trials = 2;
  int trials = 0;  // with [sweep.random]: how many draws (with a grid: per grid point)
  int seed = 0;
  std::vector<std::pair<std::string, std::vector<std::string>>> grid;  // each value as TOML wrote it
  std::vector<SweepRange> random;
  std::vector<std::vector<std::pair<std::string, std::string>>> list;  // [[sweep.list]]
};

// [setup]: a command run once per host before any rank (docs/sync.md).
struct SetupSection {
  std::string command;        // "": none
  std::string mode = "auto";  // auto (when it or the synced files changed) | always | never
  // With auto: the synced files it depends on (.gitignore patterns, from the synced folder); when
  // given, only these (and the command) decide whether it runs again. Empty: every synced file.
  std::vector<std::string> inputs;
};

// [k8s]: what `mltrain export` needs to write a Kubernetes manifest (docs/k8s.md). `mltrain run`
// reads and checks it but uses none of it.
struct K8sSection {
  bool present = false;        // the spec (or its profile) has a [k8s] table
  std::string image;           // the container image; required for export
  std::string namespace_name;  // metadata.namespace; "": kubectl's current namespace
  int nodes = 0;               // pods; 0: the hosts the spec plans (1 without hosts)
  int gpus_per_pod = -1;       // nvidia.com/gpu per pod; -1: from [gpus] and the ranks per pod
  std::string cpu, memory;     // resource quantities ("8", "500m", "64Gi"); "": none asked
  std::string service_account;
  std::vector<std::pair<std::string, std::string>> node_selector;  // label -> value
  std::vector<std::pair<std::string, std::string>> env;            // over [run] env, in every container
};

struct JobSpec {
  // Where each setting came from: "run.timeout" -> "job.toml:7:11", or the flag ("--timeout").
  std::map<std::string, std::string> origins;
  std::string origin(const std::string& key, const std::string& fallback) const {
    auto it = origins.find(key);
    return it == origins.end() ? fallback : it->second;
  }
  std::string name;
  std::string profile;
  std::string source;  // the spec file path, or "" for an ad-hoc run
  RunSection run;
  ClusterSection cluster;
  CommSection comm;
  PsSection ps;
  GpuSection gpus;
  SshSection ssh;
  LogsSection logs;
  SyncSection sync;
  SetupSection setup;
  RecordSection record;
  MetricsSection metrics;
  SweepSection sweep;
  K8sSection k8s;
};

// A valid job name made from a file's stem or a command's program (what the user did not choose
// as a name): each run of other characters becomes one '-'; "job" when nothing is left.
std::string derived_name(const std::string& from);

// Loads a job spec file, merging it over its profile (see docs/spec.md, "Profiles").
// Throws mltrain::Error (exit code 2) with "file:line:col: message" on any problem.
JobSpec load_file(const std::string& path);

// A spec for an ad-hoc `mltrain run -n N -- CMD...` with an optional profile.
JobSpec from_command(std::vector<std::string> argv, const std::string& profile);

// The spec as TOML text (for run records and `validate --print`).
std::string to_toml(const JobSpec& s);

// Final checks after command-line overrides; throws mltrain::Error.
void check(const JobSpec& s);

// Every key of the spec as a Markdown table, from the schema (docs/spec.md, "Every key", holds it).
std::string keys_markdown();

// The placeholders a [logs] prefix template may use.
const std::vector<std::string>& prefix_placeholders();

// Throws mltrain::Error (naming `origin`) unless `name` may be set in a rank's environment:
// a valid name, and not one of the variables mltrain sets itself.
void check_env_name(const std::string& name, const std::string& origin);

}  // namespace mltrain::spec
