// Rank planning: which ranks run on which host, the facts their environment is made of, and
// rank_env(), the exact environment of each rank (DESIGN.md, Contracts: Rank environment).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hostfile/hostfile.h"
#include "runner/spec/spec.h"

namespace mltrain::plan {

using Env = std::vector<std::pair<std::string, std::string>>;

struct HostPlan {
  hostfile::Host host;
  bool local = false;      // runs on this machine without SSH
  bool via_slurm = false;  // its agent starts as an srun step (inside a Slurm allocation)
  int node_rank = 0;
  std::vector<int> ranks;    // global ranks placed here, in local-rank order
  std::vector<int> gpu_ids;  // slot ids used as device ids (hostfile filters), may be empty
  // How many usable GPUs this host's ranks need ([gpus]); 0: none asked, its agent probes none.
  int gpu_slots_needed = 0;
  // PS mode: how many parameter servers this host's agent runs. A host with servers and no
  // ranks (a server-only host: [ps] hosts, or role=server in the hostfile) comes after every
  // host with ranks, so hosts[0] is always rank 0's.
  int ps_servers = 0;
  // [cluster] spares: connected, synced and set up with the job's hosts, it runs no rank until an
  // elastic restart puts it in a lost host's place (regroup). Spares come after every other host.
  bool spare = false;
  // Runs the job's program: has ranks now, or may have after a restart.
  bool runs_program() const { return !ranks.empty() || spare; }
};

struct RankPlan {
  int rank = 0;
  int host = 0;  // index into Plan::hosts
  int local_rank = 0;
  // [gpus]: the rank's GPU slots, indices into its host's usable GPUs (or, where the host has
  // gpu_ids, into those). assign_gpus() turns them into physical GPUs at preflight.
  std::vector<int> gpu_slots;
};

// What the launcher learns after planning, at preflight and on restarts (the setters below fill
// it); rank_env() reads it.
struct Runtime {
  std::vector<std::string> ifnames;       // per host: the interface its agent routes to the master ("": none)
  std::optional<std::string> ps_servers;  // PS mode: MLTRAIN_PS_SERVERS, once the servers listen
  std::map<int, std::vector<int>> gpus;   // rank -> its physical GPUs, from its host's inventory
  int restart_count = 0;
};

// Parameter-server mode ([ps], or [comm] mode = "ps"); servers run inside the agents.
struct PsPlan {
  bool sync = true;
  uint64_t partition_bytes = 4u << 20;
  std::string optimizer;  // async only: "" (a push is added to the value) or "sgd"
  double lr = 0.01, momentum = 0, weight_decay = 0;
  int servers = 0;  // over every host (the sum of HostPlan::ps_servers)
};

struct Plan {
  std::string run_id;
  std::string name;
  std::vector<HostPlan> hosts;
  std::vector<RankPlan> ranks;
  std::vector<std::string> argv;  // the program each rank runs
  std::string workdir;
  bool python_path = true;  // [run] python_path: the delivered Python package first on PYTHONPATH
  std::string master_addr;
  int master_port = 0;
  std::string store_addr;
  std::string token;
  bool multi_host = false;
  bool auto_master_port = true;  // the ports are chosen on rank 0's host at preflight
  bool ps_mode = false;
  PsPlan ps;              // meaningful when ps_mode
  bool slurm = false;     // every host's agent starts through srun ([cluster] launcher)
  int gpus_per_proc = 0;  // [gpus] per_proc
  int procs_per_gpu = 0;  // [gpus] procs_per_gpu
  // The job's own CUDA_VISIBLE_DEVICES ([run.env], --env, forward_env): it restricts every host's
  // GPUs. nullopt: each host's own environment's applies.
  std::optional<std::string> user_cuda_visible_devices;
  std::string nvml_library;    // the job's MLTRAIN_NVML_LIBRARY ("": each agent's own, else the default)
  bool nccl_required = false;  // [comm] backend = "nccl": every host's preflight checks NCCL loads
  std::string nccl_library;    // the job's MLTRAIN_NCCL_LIBRARY ("": the default names)
  // PS mode: what each host's servers may hold together (MLTRAIN_PS_MEMORY, from the job's env,
  // else the launcher's): "N" bytes or "P%" of the host's memory (the smaller of MemTotal and the
  // agent's cgroup limit).
  std::string ps_memory = "50%";
  int ps_port = 0;  // PS mode: DMLC_PS_ROOT_PORT, a free port on rank 0's host
  int max_restarts = 0;
  // Elastic restarts ([cluster] min_hosts, spares): a restart goes on without lost hosts while at
  // least min_hosts run ranks. 0: every host is needed (a lost host ends the run).
  int min_hosts = 0;
  bool elastic() const { return min_hosts > 0; }
  std::string comm_backend = "auto";
  std::string error_dir;  // Inputs::error_dir
  // The ranks' own variables, lowest precedence first: forward_env matches, then [run] env (with
  // the flags'). mltrain's variables go over them (rank_env).
  Env user_env;
  // Which of the defaults mltrain fills (OMP_NUM_THREADS, PYTHONUNBUFFERED, CUDA_DEVICE_ORDER) the
  // launcher's own environment sets: ranks on this machine inherit it, so theirs stands.
  std::set<std::string> launcher_defaults;
  Runtime runtime;  // filled at preflight; make_plan sets only Inputs::restart_count
};

// The exact environment mltrain sets for `rank` (DESIGN.md, Contracts: Rank environment), over
// the host's own: the user's variables, then the torchrun contract, the comm library's, PS mode's
// DMLC_* and the defaults, from the plan's facts and what preflight learnt. Pure: called at spawn.
Env rank_env(const Plan& p, const Runtime& rt, int rank);

// Where ranks meet, as learnt from rank 0's host at preflight: sets the plan's addresses and ports.
struct Rendezvous {
  std::string master_addr;
  int master_port = 0;
  int store_port = 0;
  int ps_port = 0;  // 0 when not in PS mode
};
void set_rendezvous(Plan& p, const Rendezvous& r);
// PS mode: where the servers listen, in server order ("host=addr:port", as the ranks' comm library
// reads MLTRAIN_PS_SERVERS), learnt from the server hosts' agents at preflight (p.runtime).
void set_ps_servers(Plan& p, const std::vector<std::string>& servers);
// The interface host `host`'s agent routes to the master through (p.runtime): NCCL_SOCKET_IFNAME
// and GLOO_SOCKET_IFNAME of the ranks there, unless the user set them.
void set_interface(Plan& p, int host, const std::string& ifname);

// What a host's agent found at preflight: its GPUs (physical index and name, in NVML order), those
// the ranks may use (in CUDA_VISIBLE_DEVICES order), the agent's note (why none), and the
// CUDA_VISIBLE_DEVICES that restricted them.
struct HostGpus {
  std::vector<int> indices;
  std::vector<std::string> names;
  std::vector<int> usable;
  std::string note;
  std::optional<std::string> cuda_visible_devices;
};
// Gives host `host`'s ranks the physical GPUs of their slots (p.runtime: their CUDA_VISIBLE_DEVICES).
// Returns "" or, when the host cannot give every rank its GPUs, one line naming the host, what
// [gpus] asked and what the host has (nothing is then assigned).
std::string assign_gpus(Plan& p, int host, const HostGpus& gpus);
// "GPU 0-3: NVIDIA H100 80GB HBM3" ("GPU 0,1: A; GPU 2: B" when names differ).
std::string describe_gpus(const std::vector<int>& indices, const std::vector<std::string>& names);

// Side effects the planner needs, behind a seam so tests can fix them.
struct Inputs {
  std::string run_id;
  std::string token;
  std::map<std::string, std::string> environ;  // the launcher's environment
  std::function<int()> free_port;              // a free TCP port on rank 0's host
  std::string cwd;                             // the launcher's working directory
  // Where ranks on this machine write TORCHELASTIC_ERROR_FILE (the run's folder); remote ranks
  // and an empty value get the bare name rank-N.error.json, which their agent places in a private
  // folder of its own (runner/agent/spawn.cpp).
  std::string error_dir;
  int restart_count = 0;
};

// Resolves hosts (spec hosts, hostfile, or SLURM_JOB_NODELIST, else localhost), applies the
// include/exclude filters and places ranks. Throws mltrain::Error (exit 2) on a bad spec.
Plan make_plan(const spec::JobSpec& s, const Inputs& in);

// The hosts a spec names, before rank placement (for `doctor` and `validate`).
std::vector<hostfile::Host> resolve_hosts(const spec::JobSpec& s,
                                          const std::map<std::string, std::string>& environ);

// MLTRAIN_CHECKPOINT_DIR as mltrain gives it (docs/elastic.md): below each host user's home.
std::string checkpoint_dir(const std::string& run_id);

// An elastic restart's new gang: host gang[k] (an index into p.hosts) becomes node k and runs
// seats[k].size() ranks, local rank l with the GPU slots seats[k][l]. Ranks are numbered again
// from 0 in that order; every other host runs none. The ranks' GPUs (p.runtime.gpus) are cleared:
// assign_gpus gives them again.
void regroup(Plan& p, const std::vector<int>& gang, const std::vector<std::vector<std::vector<int>>>& seats);

// The gang's restart count (p.runtime: TORCHELASTIC_RESTART_COUNT), on a gang restart.
void set_restart_count(Plan& p, int restart_count);

bool is_local_host(const std::string& name);

// The launcher's environment as a map (from `environ`).
std::map<std::string, std::string> current_environ();

// Binds port 0 on the loopback interface to find a free port.
int find_free_port();

}  // namespace mltrain::plan
