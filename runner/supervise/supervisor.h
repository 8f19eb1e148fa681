// The supervisor: gang semantics over every host's agent. Connects and prepares every host before
// any rank starts; starts ranks; streams their output; on the first failure stops every rank on
// every host; restarts the gang while max_restarts allows; records the run.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runner/plan/plan.h"
#include "runner/records/records.h"
#include "runner/supervise/events.h"
#include "runner/supervise/output.h"
#include "runner/sync/manifest.h"
#include "runner/transport/transport.h"

namespace mltrain::supervise {

// `[sync]`: the tree mirrored into `dir` on every host before preflight (the ranks' workdir).
struct SyncJob {
  const sync::Tree* tree = nullptr;
  std::string dir;                     // as the hosts see it; "~/" is each host's home
  std::string shown;                   // the local folder, as the summary line names it
  uint64_t warn_bytes = 100ull << 20;  // a file this big that travels is named with a hint
  // The run syncing, as a key that sorts runs by when they started (lease::order_key): a host
  // whose folder an earlier run still uses syncs into "<dir>@N" beside it (docs/sync.md), and the
  // ranks, the setup and the pull there use that one.
  std::string run_key;
};

// `[setup]`: a command run once per host, after the sync and before preflight, again only when
// `key` (the command and the synced tree) changed since its last success there, or `force`.
struct SetupJob {
  std::string command, cwd;
  std::vector<std::string> env;  // "K=V"
  std::string key;
  bool force = false;
};

// `[sync] pull` and `mltrain cp`: files brought back into `dest` when the ranks have ended,
// into `dest/<host>/` from each host named in `hosts` (indices into the plan's hosts).
struct PullJob {
  std::string dir;                     // on the hosts
  std::vector<std::string> host_dirs;  // per host (index), when set: its own copy of `dir`
  std::vector<std::string> patterns;   // as in .gitignore; empty with a file `dir`: that file
  std::vector<size_t> hosts;
  std::string dest;  // a folder of the launcher's: nothing is written outside it, nor through a link
  bool per_host_folders = true;
  // Bounds on what each host may send (the launcher's own: a hostile host ignores what it is
  // asked): bytes written, and how long it may send nothing while it still answers heartbeats.
  uint64_t max_bytes = 64ull << 30;
  std::chrono::milliseconds stall_timeout{60000};
};

// Sharing hosts (docs/sharing.md): once preflight passed on every host, the job claims each one
// (its GPUs, the host alone when `exclusive`, runner/lease/claim.h). When something is held by
// another job it waits in the hosts' queue with `queue`, else it fails at once naming the holder.
struct ClaimJob {
  bool queue = false, exclusive = false;
  std::string space;              // MLTRAIN_LEASE_SPACE ("" the hosts' own)
  std::string order_key;          // the job's place in the queue (lease::order_key)
  std::vector<std::string> info;  // "key=value" what the job says of itself: run, user, launcher, since
  std::chrono::milliseconds retry{500};        // how often a waiting job asks again
  std::chrono::milliseconds queue_timeout{0};  // a job waiting longer leaves the queue (0: never)
};

struct Options {
  std::chrono::milliseconds grace{5000};
  std::chrono::milliseconds timeout{0};  // 0: none
  std::chrono::milliseconds heartbeat_interval{2000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds preflight_timeout{30000};  // for each of: agents answer, preflight done
  // How often agents sample their host, GPUs and ranks into telemetry.jsonl while ranks run
  // (MLTRAIN_TELEMETRY_INTERVAL); 0: no telemetry.
  std::chrono::milliseconds telemetry_interval{0};
  int max_restarts = 0;
  // false (`mltrain exec`): a failed rank is recorded as the first failure, the others run on.
  bool fail_fast = true;
  ConsoleOptions console;
  bool json_summary = false;  // print the summary as JSON on stdout
  int console_fd = 1;         // where ranks' stdout lines go
  int stdin_rank = -1;        // the rank whose stdin is fed from stdin_fd (--stdin); -1: none
  int stdin_fd = 0;
  // Where time and signals come from; null: the steady clock and this process's SIGINT, SIGTERM
  // and SIGHUP. Tests inject fakes to drive time and deliver signals.
  Clock* clock = nullptr;
  SignalSource* signals = nullptr;
  // Called once, when every host passed preflight and the ranks were sent to start (a detached
  // launcher tells the command waiting for it that the run started).
  std::function<void()> on_running;
  // Called once, when the job first waits in the hosts' queue, with the waiting line ("waiting for
  // 2 GPUs on h1; 1 job ahead"): a detached run's command returns then.
  std::function<void(const std::string& status)> on_queued;
  std::optional<SyncJob> sync;
  std::optional<SetupJob> setup;
  std::optional<PullJob> pull;
  std::optional<ClaimJob> claims;  // none: no claim (`exec`)
  // The hint when preflight finds the workdir missing or unreadable on a host ("" : the generic
  // one): the launcher knows whether the code was meant to be synced there.
  std::string workdir_hint;
  // [metrics] patterns, matched on rank 0's output into metrics.jsonl (mltrain.log's lines go
  // there with or without them).
  std::vector<std::string> metric_patterns;
};

// Chooses the transport for a host (local child or SSH).
using TransportFor = std::function<transport::Transport&(const plan::HostPlan&)>;

// Runs the job to its end and returns mltrain's exit code (docs/exit-codes.md). The record is
// saved as the run goes (started, each restart, the end). Throws mltrain::Error when preflight
// fails on a host (exit code 127 when the program or workdir is missing there, else 255); nothing
// was started then, and the record says so (with json_summary, it was printed first).
//
// Connections open on threads of their own. One still opening when the run ends (Ctrl-C while a
// host times out) is abandoned, not waited for: the transports must outlive it, so keep them
// until the process exits.
int run_job(plan::Plan& plan, records::RunRecord& record, const Options& opts,
            const TransportFor& transport_for);

// `mltrain cp`: connect to the plan's hosts and bring back what opts.pull asks for, then leave.
// Returns the files that came (`single_file`: what was asked for is a file, not a folder); throws
// mltrain::Error (exit 255) when a host cannot be reached, and (exit 1) when something could not be
// read or written.
uint64_t pull_files(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
                    bool* single_file = nullptr);

}  // namespace mltrain::supervise
