// Rank planning: which ranks run on which host, and the exact environment of each rank
// (DESIGN.md, Contracts: Rank environment).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hostfile/hostfile.h"
#include "runner/spec/spec.h"

namespace mltrain::plan {

using Env = std::vector<std::pair<std::string, std::string>>;

struct HostPlan {
  hostfile::Host host;
  bool local = false;  // runs on this machine without SSH
  int node_rank = 0;
  std::vector<int> ranks;    // global ranks placed here, in local-rank order
  std::vector<int> gpu_ids;  // slot ids used as device ids (hostfile filters), may be empty
};

struct RankPlan {
  int rank = 0;
  int host = 0;  // index into Plan::hosts
  int local_rank = 0;
  Env env;  // the variables mltrain sets; the agent sets them over the host's environment
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
  bool user_nccl_ifname = false;  // the user chose the interfaces; mltrain leaves them alone
  bool user_gloo_ifname = false;
};

// Where ranks meet, as learnt from rank 0's host at preflight.
struct Rendezvous {
  std::string master_addr;
  int master_port = 0;
  int store_port = 0;
  int ps_port = 0;  // 0 when not in PS mode
};
void set_rendezvous(Plan& p, const Rendezvous& r);
// Sets NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME for the ranks of one host, unless the user set them.
void set_interface(Plan& p, int host, const std::string& ifname);

// Side effects the planner needs, behind a seam so tests can fix them.
struct Inputs {
  std::string run_id;
  std::string token;
  std::map<std::string, std::string> environ;  // the launcher's environment
  std::function<int()> free_port;              // a free TCP port on rank 0's host
  std::string cwd;                             // the launcher's working directory
  // Where ranks on this machine write TORCHELASTIC_ERROR_FILE (the run's folder); remote ranks
  // and an empty value get /tmp/mltrain-RUN_ID-rank-N.error.json on their host.
  std::string error_dir;
  int restart_count = 0;
};

// Resolves hosts (spec hosts, hostfile, or SLURM_JOB_NODELIST, else localhost), applies the
// include/exclude filters and places ranks. Throws mltrain::Error (exit 2) on a bad spec.
Plan make_plan(const spec::JobSpec& s, const Inputs& in);

// The hosts a spec names, before rank placement (for `doctor` and `validate`).
std::vector<hostfile::Host> resolve_hosts(const spec::JobSpec& s,
                                          const std::map<std::string, std::string>& environ);

// Sets TORCHELASTIC_RESTART_COUNT in every rank's env (on a gang restart).
void set_restart_count(Plan& p, int restart_count);

bool is_local_host(const std::string& name);

// The launcher's environment as a map (from `environ`).
std::map<std::string, std::string> current_environ();

// Binds port 0 on the loopback interface to find a free port.
int find_free_port();

}  // namespace mltrain::plan
