// Pieces the launch functions share: the plan's side-effect inputs and the transport per host.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "runner/launch/launch.h"
#include "runner/supervise/supervisor.h"
#include "runner/transport/transport.h"
#include "runner/tree/beneath.h"

namespace mltrain::launch::detail {

// How the planner's ports are found: bound on this machine, or counted up from 29500 (for
// validate and doctor, which start nothing).
enum class Ports { free, placeholder };

// The one place plan::Inputs are set up: the request's (or this process's) environment and
// working directory, with the given run id and token.
plan::Inputs plan_inputs(const JobRequest& req, std::string run_id, std::string token, Ports ports);

// A fresh job secret (MLTRAIN_TOKEN): 128 random bits in hex.
std::string random_token();

// The local transport for this machine, SSH (configured from the spec) for every other host.
class HostTransports {
 public:
  explicit HostTransports(const spec::JobSpec& s);
  const supervise::TransportFor& for_host() const { return for_host_; }

 private:
  std::unique_ptr<transport::Transport> local_, ssh_, slurm_;
  supervise::TransportFor for_host_;
};

// Transports for the gang, never freed: a connection the gang abandoned (Ctrl-C while a host
// times out) may still be inside one until the process exits (see supervise::run_job).
HostTransports& lasting_transports(const spec::JobSpec& s);

// [sync] of a request: the local folder, the hosts' folder and the listed tree (nullopt when the
// run does not sync: no [sync], --no-sync, or exec without --sync). Throws Error for a tree that
// cannot be read.
struct SyncPlan {
  std::string src, remote;
  sync::Tree tree;
};
std::optional<SyncPlan> plan_sync(const spec::JobSpec& s, const JobRequest& req);
// The hosts' folder when [sync] names none: ~/.cache/mltrain/work/<folder>-<8 hex>, the hex a
// hash of user@machine:<src>, so each project (and each user's copy of it) has its own.
std::string project_work_dir(const std::string& src);

// `rerun`: the recorded spec made to sync the restored tree into the project's folder on the
// hosts, each secret of [run.env] ("<secret>" in the record) taken from `environ`.
void adapt_for_rerun(spec::JobSpec& s, const JobRequest::Rerun& r,
                     const std::map<std::string, std::string>& environ);
// `mltrain sweep`'s trial "SWEEP/N": its parameters (from the sweep's sweep.json) substituted as
// {name} into the command, argv and [run.env]; [sweep] dropped. Throws mltrain::Error.
void apply_sweep_trial(spec::JobSpec& s, const std::string& trial);
// The number of trials of `s`'s [sweep], every check of `mltrain sweep` made (errors name their
// place in `file`, the spec). Throws mltrain::Error.
size_t check_sweep(const spec::JobSpec& s, const std::string& file);
// The local and the hosts' folder of the spec's [sync], without listing the tree (for --no-sync,
// whose ranks run in the folder the last sync made).
SyncPlan sync_folders(const spec::JobSpec& s, const JobRequest& req);
// The ranks' folder on the hosts: the synced one, or a folder inside it that the spec names.
std::string synced_workdir(const spec::JobSpec& s, const SyncPlan& sp);

// A pull's bounds from MLTRAIN_PULL_MAX_BYTES and MLTRAIN_PULL_STALL_TIMEOUT (Error on a bad value).
void pull_limits(supervise::PullJob& job);
// supervise::Options with the protocol's timers from MLTRAIN_HEARTBEAT_INTERVAL and
// MLTRAIN_HEARTBEAT_TIMEOUT (Error on a bad value): every command that talks to agents starts here.
supervise::Options supervise_defaults();

// `mltrain cp`'s work folder: .mltrain-cp-<random> in the destination's folder (a
// sync::WorkFolder: private, locked while the cp runs, removed when it goes), what arrives in its
// data/. Making one first removes the ones of this user that no cp holds (left by a cp that was
// killed), and says so.
class CopyWork {
 public:
  explicit CopyWork(const std::string& parent);
  // Where the pull writes.
  const std::string& path() const { return path_; }
  // Moves what arrived (its entry `name`, or "" for all it holds) to `dest`: by a rename when dest
  // is new; with `merge`, into the existing dest: files of the same name replaced, nothing else
  // touched, no link followed. Throws Error naming what could not be placed.
  void place(const std::string& name, const std::string& dest, bool merge);

 private:
  sync::WorkFolder work_;
  sync::Fd data_;
  std::string path_;
};

}  // namespace mltrain::launch::detail
