#include "runner/plan/plan.h"

#include <fnmatch.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "knobs/knobs.h"
#include "knobs/parse.h"
#include "runner/common/error.h"
#include "runner/common/text.h"

extern char** environ;

namespace mltrain::plan {

namespace {

// Hostfile parse errors are spec errors: same exit code, same one-line form.
// Hostfile parse errors are spec errors. A filter error names the flag; when the filter came
// from the spec, name the spec's line instead.
template <class F>
auto hostfile_call(F&& f, const spec::JobSpec* s = nullptr) {
  try {
    return f();
  } catch (const hostfile::ParseError& e) {
    std::string msg = e.what();
    if (s)
      for (const char* key : {"include", "exclude"}) {
        std::string flag = std::string("--") + key + ":";
        std::string origin = s->origin(std::string("cluster.") + key, "");
        if (msg.rfind(flag, 0) == 0 && !origin.empty() && origin[0] != '-')
          msg = origin + ": " + key + msg.substr(flag.size());
      }
    throw Error(msg, "fix the host list; see docs/hostfile.md");
  }
}

void put(Env& env, const std::string& k, const std::string& v) {
  for (auto& [ek, ev] : env)
    if (ek == k) {
      ev = v;
      return;
    }
  env.emplace_back(k, v);
}

bool has(const Env& env, const std::string& k) {
  return std::any_of(env.begin(), env.end(), [&](const auto& kv) { return kv.first == k; });
}

std::string join_ints(const std::vector<int>& v) {
  std::vector<std::string> s;
  for (int i : v) s.push_back(std::to_string(i));
  return text::join(s, ",");
}

}  // namespace

bool is_local_host(const std::string& name) {
  if (name == "localhost" || name == "::1" || text::starts_with(name, "127.")) return true;
  char buf[256] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 && name == buf;
}

std::map<std::string, std::string> current_environ() {
  std::map<std::string, std::string> m;
  for (char** e = ::environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) m.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return m;
}

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error(std::string("cannot open a socket to find a free port: ") + std::strerror(errno), {},
                exit_code::host_failure);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  if (port == 0) throw Error("cannot find a free TCP port on localhost", {}, exit_code::host_failure);
  return port;
}

namespace {

// The hosts of [cluster] (hostfile, host list or Slurm node list, else localhost), filtered;
// role=server hosts included.
std::vector<hostfile::Host> cluster_hosts(const spec::JobSpec& s,
                                          const std::map<std::string, std::string>& env) {
  std::vector<hostfile::Host> hosts;
  if (!s.cluster.hostfile.empty()) {
    hosts = hostfile_call([&] { return hostfile::load_hostfile(s.cluster.hostfile); });
  } else if (!s.cluster.hosts.empty()) {
    std::string origin = s.origin("cluster.hosts", "-H");
    hosts =
        hostfile_call([&] { return hostfile::parse_host_list(text::join(s.cluster.hosts, ","), origin); });
  } else if (const std::string* nodes = knobs::slurm_job_nodelist.in(env); nodes && !nodes->empty()) {
    auto names = hostfile_call([&] { return hostfile::expand_nodelist(*nodes); });
    // SLURM_TASKS_PER_NODE ("2(x3),1"): each node's slots, in the node list's order.
    std::vector<int> tasks;
    if (const std::string* per_node = knobs::slurm_tasks_per_node.in(env))
      for (const auto& item : text::split(*per_node, ',')) {
        int n = std::atoi(item.c_str()), times = 1;
        if (auto x = item.find("(x"); x != std::string::npos) times = std::atoi(item.c_str() + x + 2);
        for (int k = 0; k < times && n > 0 && tasks.size() < names.size(); ++k) tasks.push_back(n);
      }
    for (size_t i = 0; i < names.size(); ++i) {
      hostfile::Host h;
      h.name = names[i];
      h.origin = "SLURM_JOB_NODELIST";
      if (i < tasks.size()) h.slots = tasks[i];
      hosts.push_back(h);
    }
  }
  // A host list that names no host must not quietly become this machine (a login node, often).
  if (hosts.empty() && !s.cluster.hostfile.empty())
    throw Error("hostfile " + s.cluster.hostfile + " has no hosts (only blank lines or comments)",
                "write one host per line, e.g. 'node1 slots=4'; see docs/hostfile.md", exit_code::usage);
  if (hosts.empty() && s.origins.count("cluster.hosts"))
    throw Error(s.origin("cluster.hosts", "-H") == "-H"
                    ? "-H is empty"
                    : s.origin("cluster.hosts", "") + ": [cluster] hosts is empty",
                "name at least one host (-H a:4,b:4), or leave hosts out to run on this machine");
  if (hosts.empty()) {
    hostfile::Host h;
    h.name = "localhost";
    h.origin = "default";
    hosts.push_back(h);
  }
  if (!s.cluster.include.empty() || !s.cluster.exclude.empty())
    hosts = hostfile_call(
        [&] { return hostfile::apply_filters(hosts, s.cluster.include, s.cluster.exclude); }, &s);
  if (hosts.empty())
    throw Error("no host is left after the include/exclude filters", "loosen [cluster] include/exclude");
  return hosts;
}

bool same_host(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// The hosts that may run ranks (role=worker or both); role=server hosts only run PS servers.
std::vector<hostfile::Host> worker_hosts(const spec::JobSpec& s, const std::vector<hostfile::Host>& all) {
  std::vector<hostfile::Host> out;
  for (const auto& h : all)
    if (h.role != hostfile::Role::server) out.push_back(h);
  if (out.empty())
    throw Error("every host of " +
                    (!s.cluster.hostfile.empty() ? "hostfile " + s.cluster.hostfile
                                                 : s.origin("cluster.hosts", "the host list")) +
                    " is role=server: no host is left for the ranks",
                "mark the hosts that run ranks role=worker (the default) or role=both");
  return out;
}

// PS mode: the server hosts, each with its number of servers (none outside PS mode). They are
// [ps] hosts, else the role=server/both hosts of the hostfile, else every worker host.
std::vector<std::pair<hostfile::Host, int>> server_hosts(const spec::JobSpec& s,
                                                         const std::vector<hostfile::Host>& all,
                                                         const std::vector<hostfile::Host>& workers) {
  std::vector<std::pair<hostfile::Host, int>> out;
  if (s.comm.mode != "ps") return out;
  std::vector<hostfile::Host> hosts;
  if (!s.ps.hosts.empty()) {
    std::string origin = s.origin("ps.hosts", "[ps] hosts");
    hosts = hostfile_call([&] { return hostfile::parse_host_list(text::join(s.ps.hosts, ","), origin); });
  } else {
    for (const auto& h : all)
      if (h.role != hostfile::Role::worker) hosts.push_back(h);
    if (hosts.empty()) hosts = workers;
  }
  // servers_per_host on each; else [comm] num_servers in all, the first hosts taking the extra ones.
  const int n = int(hosts.size());
  for (int i = 0; i < n; ++i) {
    int servers = 1;
    if (s.ps.servers_per_host > 0)
      servers = s.ps.servers_per_host;
    else if (s.comm.num_servers > 0)
      servers = s.comm.num_servers / n + (i < s.comm.num_servers % n ? 1 : 0);
    if (servers > 0) out.emplace_back(hosts[size_t(i)], servers);
  }
  return out;
}

}  // namespace

std::vector<hostfile::Host> resolve_hosts(const spec::JobSpec& s,
                                          const std::map<std::string, std::string>& env) {
  auto all = cluster_hosts(s, env);
  auto hosts = worker_hosts(s, all);
  for (const auto& [h, servers] : server_hosts(s, all, hosts)) {
    const bool here = is_local_host(h.name);
    bool known = std::any_of(hosts.begin(), hosts.end(), [&](const hostfile::Host& w) {
      return same_host(w.name, h.name) || (here && is_local_host(w.name));
    });
    if (!known) hosts.push_back(h);
  }
  if (!s.cluster.spares.empty()) {  // doctor checks them as the job's hosts
    const std::string origin = s.origin("cluster.spares", "[cluster] spares");
    for (auto& h :
         hostfile_call([&] { return hostfile::parse_host_list(text::join(s.cluster.spares, ","), origin); }))
      hosts.push_back(std::move(h));
  }
  return hosts;
}

namespace {
// MLTRAIN_PS_MEMORY as the agents take it: "N" bytes or "P%" (1-100) of each host's memory.
std::string ps_memory_value(const std::string& text) {
  const std::string t = text::trim(text);
  const std::string fix = "set MLTRAIN_PS_MEMORY to a size (8G, 512M) or a share of each host's memory (50%)";
  if (!t.empty() && t.back() == '%') {
    auto pct = knobs::parse_int(std::string_view(t).substr(0, t.size() - 1));
    if (!pct || *pct < 1 || *pct > 100)
      throw Error("MLTRAIN_PS_MEMORY='" + text + "': a share must be 1% to 100%", fix);
    return std::to_string(*pct) + "%";
  }
  auto bytes = knobs::parse_bytes(t);
  if (!bytes || *bytes < (1u << 20))
    throw Error("MLTRAIN_PS_MEMORY='" + text + "' is not a size of at least 1M", fix);
  return std::to_string(*bytes);
}
}  // namespace

namespace {

// How many ranks each host runs. One rule, mpirun's: a host has the slots written for it (a host
// written without a count has 1); more ranks than slots is an error unless oversubscribing.
// Only the implicit localhost (no hosts given) stretches to -n.
std::vector<int> rank_counts(const spec::JobSpec& s, const std::vector<hostfile::Host>& hosts,
                             bool implicit_local) {
  std::vector<int> counts;
  int n = s.cluster.nprocs;
  if (s.cluster.procs_per_host > 0) {
    for (size_t i = 0; i < hosts.size(); ++i) counts.push_back(s.cluster.procs_per_host);
  } else {
    for (const auto& h : hosts) counts.push_back(hostfile::slot_count(h));
  }
  if (n > 0) {
    long long total = 0;
    for (int c : counts) total += c;
    if (n > total && implicit_local && s.cluster.procs_per_host == 0) {
      counts[0] = n;
    } else if (n > total) {
      if (!s.cluster.oversubscribe) {
        std::string where = !s.cluster.hostfile.empty() ? "hostfile " + s.cluster.hostfile
                                                        : s.origin("cluster.hosts", "the host list");
        throw Error("asked for " + std::to_string(n) + " ranks but the hosts have only " +
                        std::to_string(total) + " slot" + (total == 1 ? "" : "s") + " (" + where +
                        "; a host written without a count has 1)",
                    "lower -n, give slot counts (-H a:4,b:4 or 'slots=4'), set --procs-per-host, or allow it "
                    "with --oversubscribe");
      }
      // Oversubscribed: fill every slot, then deal the rest round-robin over the hosts.
      for (int extra = n - total, i = 0; extra > 0; --extra, i = (i + 1) % int(counts.size()))
        ++counts[size_t(i)];
    }
    int left = n;
    for (auto& c : counts) {
      c = std::min(c, left);
      left -= c;
    }
  }
  long long ranks_total = 0;
  for (int c : counts) ranks_total += c;
  if (ranks_total > spec::kMaxRanks)
    throw Error("the job would start " + std::to_string(ranks_total) + " ranks; mltrain runs at most " +
                    std::to_string(spec::kMaxRanks),
                "lower -n or the slot counts");
  return counts;
}

// The hosts with ranks, in order, each with its ranks in local-rank order.
void place_ranks(Plan& p, const std::vector<hostfile::Host>& hosts, const std::vector<int>& counts) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (counts[i] == 0) continue;
    HostPlan hp;
    hp.host = hosts[i];
    hp.via_slurm = p.slurm;
    hp.local = !p.slurm && is_local_host(hosts[i].name);
    hp.node_rank = int(p.hosts.size());
    hp.gpu_ids = hosts[i].slot_ids;
    for (int l = 0; l < counts[i]; ++l) {
      RankPlan r;
      r.rank = int(p.ranks.size());
      r.host = int(p.hosts.size());
      r.local_rank = l;
      hp.ranks.push_back(r.rank);
      p.ranks.push_back(r);
    }
    p.hosts.push_back(hp);
  }
  if (p.ranks.empty())
    throw Error("the plan has no ranks", "set -n or [cluster] procs_per_host to at least 1");
}

void check_console_ranks(const spec::JobSpec& s, const Plan& p) {
  if (s.logs.ranks.empty()) return;
  if (auto shown = text::parse_int_list(s.logs.ranks))
    for (int r : *shown)
      if (r < 0 || size_t(r) >= p.ranks.size()) {
        std::string last = std::to_string(p.ranks.size() - 1);
        throw Error(s.origin("logs.ranks", "--ranks") + ": rank " + std::to_string(r) +
                        " is not in this job, which has " + std::to_string(p.ranks.size()) + " rank" +
                        (p.ranks.size() == 1 ? "" : "s"),
                    "show ranks from 0 to " + last + ", e.g. --ranks 0" + (last == "0" ? "" : "," + last));
      }
}

// PS servers: on a host with ranks, by its agent there; a server-only host comes after every host
// with ranks (node_rank -1: it is no node of the ranks' world), so node ranks and hosts[0] stay.
void place_servers(Plan& p, const std::vector<std::pair<hostfile::Host, int>>& servers) {
  for (const auto& [h, count] : servers) {
    // The same host by name, or this machine under another name: one agent per host.
    const bool here = !p.slurm && is_local_host(h.name);
    auto it = std::find_if(p.hosts.begin(), p.hosts.end(), [&](const HostPlan& hp) {
      return same_host(hp.host.name, h.name) || (here && hp.local);
    });
    if (it != p.hosts.end()) {
      it->ps_servers += count;
      continue;
    }
    HostPlan hp;
    hp.host = h;
    hp.host.role = hostfile::Role::server;
    hp.via_slurm = p.slurm;
    hp.local = here;
    hp.node_rank = -1;
    hp.ps_servers = count;
    p.hosts.push_back(hp);
  }
  p.multi_host = p.hosts.size() > 1 ||
                 std::any_of(p.hosts.begin(), p.hosts.end(), [](const HostPlan& h) { return !h.local; });
}

// [cluster] min_hosts and spares: the spares after every other host, each ready to take the place
// of any host (its GPU slots as many as the most any host needs, once plan_gpu_slots ran).
void plan_elastic(Plan& p, const spec::JobSpec& s) {
  const auto& c = s.cluster;
  if (c.min_hosts == 0 && c.spares.empty()) return;
  const std::string key = c.min_hosts > 0 ? "cluster.min_hosts" : "cluster.spares";
  const std::string where = s.origin(key, "[cluster]");
  if (p.ps_mode || s.comm.mode == "ps")
    throw Error(where + ": elastic restarts are not for PS mode (its servers hold the parameters)",
                "remove min_hosts and spares, or train with allreduce");
  if (s.run.max_restarts == 0)
    throw Error(where + ": an elastic job restarts without a lost host, and [run] max_restarts is 0",
                "set [run] max_restarts (or --max-restarts) to how many restarts the job may take");
  const int hosts = int(p.hosts.size());
  if (c.min_hosts > hosts)
    throw Error(where + ": min_hosts is " + std::to_string(c.min_hosts) + " but the job has " +
                    std::to_string(hosts) + (hosts == 1 ? " host" : " hosts"),
                "lower min_hosts to at most " + std::to_string(hosts));
  p.min_hosts = c.min_hosts > 0 ? c.min_hosts : hosts;  // spares alone: a restart keeps every place
  if (c.spares.empty()) return;
  if (p.slurm)
    throw Error(s.origin("cluster.spares", "[cluster]") + ": spares are for hosts reached over SSH",
                "remove spares, or run with [cluster] launcher = \"ssh\"");
  const std::string origin = s.origin("cluster.spares", "[cluster] spares");
  auto spares = hostfile_call([&] { return hostfile::parse_host_list(text::join(c.spares, ","), origin); });
  for (const auto& h : spares) {
    for (const auto& hp : p.hosts)
      if (same_host(hp.host.name, h.name))
        throw Error(origin + ": " + h.name + " is one of the job's hosts and a spare",
                    "name each host once: in hosts, or in spares");
    HostPlan hp;
    hp.host = h;
    hp.local = is_local_host(h.name);
    hp.node_rank = -1;
    hp.spare = true;
    hp.gpu_ids = h.slot_ids;
    p.hosts.push_back(hp);
  }
  p.multi_host = true;
}

// Rendezvous addresses. All-local jobs use loopback; preflight replaces master_addr with an
// address of rank 0's host that the other hosts reach. PS mode's settings and root port too.
void plan_rendezvous(Plan& p, const spec::JobSpec& s, const Inputs& in) {
  p.master_addr = p.multi_host ? p.hosts[0].host.name : "127.0.0.1";
  p.master_port = s.comm.master_port > 0 ? s.comm.master_port : in.free_port();
  int store_port = in.free_port();
  while (store_port == p.master_port) store_port = in.free_port();
  p.store_addr = p.master_addr + ":" + std::to_string(store_port);
  if (s.comm.mode != "ps") return;
  p.ps.sync = s.ps.sync;
  p.ps.partition_bytes = s.ps.partition_bytes;
  if (!s.ps.sync && !s.ps.optimizer.name.empty()) {
    p.ps.optimizer = s.ps.optimizer.name;
    p.ps.lr = s.ps.optimizer.lr;
    p.ps.momentum = s.ps.optimizer.momentum;
    p.ps.weight_decay = s.ps.optimizer.weight_decay;
  }
  for (const auto& h : p.hosts) p.ps.servers += h.ps_servers;
  p.ps_port = in.free_port();
  while (p.ps_port == p.master_port || p.ps_port == store_port) p.ps_port = in.free_port();
}

// The ranks' own variables and what the launcher reads of them, lowest precedence first:
// forwarded variables, then the spec's env.
void plan_user_env(Plan& p, const spec::JobSpec& s, const Inputs& in) {
  for (const auto& glob : s.run.forward_env)
    for (const auto& [k, v] : in.environ)
      if (::fnmatch(glob.c_str(), k.c_str(), 0) == 0) put(p.user_env, k, v);
  for (const auto& [k, v] : s.run.env) put(p.user_env, k, v);
  for (const char* k : {"OMP_NUM_THREADS", "PYTHONUNBUFFERED", "CUDA_DEVICE_ORDER"})
    if (in.environ.count(k)) p.launcher_defaults.insert(k);
  std::string ps_memory;
  if (const std::string* launchers = knobs::mltrain_ps_memory.in(in.environ)) ps_memory = *launchers;
  for (const auto& [k, v] : p.user_env) {
    if (k == "CUDA_VISIBLE_DEVICES") p.user_cuda_visible_devices = v;
    if (k == "MLTRAIN_NVML_LIBRARY") p.nvml_library = v;
    if (k == "MLTRAIN_NCCL_LIBRARY") p.nccl_library = v;
    if (k == "MLTRAIN_PS_MEMORY") ps_memory = v;  // the job's own wins over the launcher's
  }
  if (p.ps_mode && !ps_memory.empty()) p.ps_memory = ps_memory_value(ps_memory);
}

// GPUs: per_proc gives each rank a block of slots; procs_per_gpu shares one slot. A slot is an
// index into the host's usable GPUs, known at preflight (assign_gpus).
void plan_gpu_slots(Plan& p, const spec::JobSpec& s) {
  for (auto& r : p.ranks) {
    HostPlan& hp = p.hosts[size_t(r.host)];
    if (s.gpus.per_proc > 0)
      for (int g = 0; g < s.gpus.per_proc; ++g) r.gpu_slots.push_back(r.local_rank * s.gpus.per_proc + g);
    else if (s.gpus.procs_per_gpu > 0)
      r.gpu_slots.push_back(r.local_rank / s.gpus.procs_per_gpu);
    if (!hp.gpu_ids.empty())
      for (int d : r.gpu_slots)
        if (size_t(d) >= hp.gpu_ids.size())
          throw Error(hp.host.name + ": rank " + std::to_string(r.rank) + " needs GPU slot " +
                          std::to_string(d) + " but the include/exclude filter leaves " +
                          std::to_string(hp.gpu_ids.size()),
                      "lower [gpus] per_proc or the ranks per host");
  }
  for (const auto& r : p.ranks)
    for (int d : r.gpu_slots) {
      int& needed = p.hosts[size_t(r.host)].gpu_slots_needed;
      needed = std::max(needed, d + 1);
    }
  int most = 0;
  for (const auto& h : p.hosts) most = std::max(most, h.gpu_slots_needed);
  for (auto& h : p.hosts)
    if (h.spare) h.gpu_slots_needed = most;
}

}  // namespace

Plan make_plan(const spec::JobSpec& s, const Inputs& in) {
  Plan p;
  p.run_id = in.run_id;
  p.name = s.name;
  p.token = in.token;
  const auto all_hosts = cluster_hosts(s, in.environ);
  const auto hosts = worker_hosts(s, all_hosts);
  const auto servers = server_hosts(s, all_hosts, hosts);
  if (hosts.size() + servers.size() > size_t(spec::kMaxHosts))
    throw Error("the job lists " + std::to_string(hosts.size() + servers.size()) +
                    " hosts; mltrain runs on at most " + std::to_string(spec::kMaxHosts),
                "narrow the host list (--include, a shorter hostfile or node-list pattern)");
  const bool implicit_local = hosts.size() == 1 && hosts[0].origin == "default";
  const auto counts = rank_counts(s, hosts, implicit_local);
  const std::string& launcher = s.cluster.launcher;
  const std::string* slurm_job = knobs::slurm_job_id.in(in.environ);
  p.slurm =
      launcher == "slurm" || (launcher == "auto" && slurm_job && !slurm_job->empty() && !implicit_local);
  if (launcher == "slurm" && implicit_local)
    throw Error(s.origin("cluster.launcher", "--launcher") +
                    ": launcher \"slurm\" needs hosts, and no "
                    "SLURM_JOB_NODELIST is set here",
                "run it inside an allocation (salloc, sbatch, or mltrain sbatch), or give hosts");
  place_ranks(p, hosts, counts);
  check_console_ranks(s, p);
  place_servers(p, servers);
  plan_elastic(p, s);

  // Program and working directory.
  p.argv = s.run.command ? std::vector<std::string>{"/bin/sh", "-c", *s.run.command} : s.run.argv;
  p.workdir = s.run.workdir.empty() ? in.cwd : s.run.workdir;
  p.python_path = s.run.python_path;
  plan_rendezvous(p, s, in);
  p.auto_master_port = s.comm.master_port == 0;
  p.ps_mode = s.comm.mode == "ps";
  p.nccl_required = s.comm.backend == "nccl";
  p.comm_backend = s.comm.backend;
  p.max_restarts = s.run.max_restarts;
  p.error_dir = in.error_dir;
  p.gpus_per_proc = s.gpus.per_proc;
  p.procs_per_gpu = s.gpus.procs_per_gpu;
  p.runtime.restart_count = in.restart_count;
  plan_user_env(p, s, in);
  plan_gpu_slots(p, s);
  return p;
}

namespace {

// The torchrun contract and the comm library's variables.
void put_contract(Env& env, const Plan& p, const Runtime& rt, const RankPlan& r) {
  const HostPlan& hp = p.hosts[size_t(r.host)];
  const std::string world = std::to_string(p.ranks.size());
  size_t rank_hosts = 0;  // server-only hosts are no nodes of the ranks' world
  for (const auto& h : p.hosts) rank_hosts += h.ranks.empty() ? 0 : 1;
  put(env, "RANK", std::to_string(r.rank));
  put(env, "WORLD_SIZE", world);
  put(env, "LOCAL_RANK", std::to_string(r.local_rank));
  put(env, "LOCAL_WORLD_SIZE", std::to_string(hp.ranks.size()));
  put(env, "NODE_RANK", std::to_string(hp.node_rank));
  put(env, "GROUP_RANK", std::to_string(hp.node_rank));
  put(env, "GROUP_WORLD_SIZE", std::to_string(rank_hosts));
  put(env, "ROLE_NAME", "default");
  put(env, "ROLE_RANK", std::to_string(r.rank));
  put(env, "ROLE_WORLD_SIZE", world);
  put(env, "MASTER_ADDR", p.master_addr);
  put(env, "MASTER_PORT", std::to_string(p.master_port));
  put(env, "TORCHELASTIC_RESTART_COUNT", std::to_string(rt.restart_count));
  put(env, "TORCHELASTIC_MAX_RESTARTS", std::to_string(p.max_restarts));
  put(env, "TORCHELASTIC_RUN_ID", p.run_id);
  put(env, "MLTRAIN_RUN_ID", p.run_id);
  put(env, "MLTRAIN_STORE_ADDR", p.store_addr);
  put(env, "MLTRAIN_TOKEN", p.token);
  put(env, "MLTRAIN_COMM_BACKEND", p.comm_backend);
  // One folder per run on each host, kept across restarts: rank 0 checkpoints there and a
  // restart resumes from it (docs/elastic.md). The job's own value stands.
  if (!has(p.user_env, "MLTRAIN_CHECKPOINT_DIR"))
    put(env, "MLTRAIN_CHECKPOINT_DIR", checkpoint_dir(p.run_id));
  // torchrun's @record writes the failure there; the launcher's summary shows it. Elsewhere a
  // bare name: the host's agent puts it in a private folder of its own (0700, a random name in
  // /tmp, removed at its end), never at a path another user of the host can guess.
  const std::string error_name = "rank-" + std::to_string(r.rank) + ".error.json";
  put(env, "TORCHELASTIC_ERROR_FILE",
      hp.local && !p.error_dir.empty() ? p.error_dir + "/" + error_name : error_name);
}

// A default mltrain fills unless the user set it: in the job's variables or, for ranks on this
// machine, in the launcher's own environment (which they inherit).
bool user_sets(const Plan& p, const HostPlan& hp, const std::string& k) {
  return has(p.user_env, k) || (hp.local && p.launcher_defaults.count(k));
}

void put_gpus(Env& env, const Plan& p, const Runtime& rt, const RankPlan& r) {
  if (r.gpu_slots.empty()) return;
  const HostPlan& hp = p.hosts[size_t(r.host)];
  // Until preflight assigns the host's usable GPUs, the slots as if every GPU were usable (as a
  // dry run prints them), or the include/exclude slot ids.
  std::vector<int> devices = r.gpu_slots;
  if (auto it = rt.gpus.find(r.rank); it != rt.gpus.end())
    devices = it->second;
  else if (!hp.gpu_ids.empty())
    for (auto& d : devices) d = hp.gpu_ids[size_t(d)];
  put(env, "CUDA_VISIBLE_DEVICES", join_ints(devices));
  // So CUDA numbers GPUs as NVML and nvidia-smi do (its default puts the fastest first).
  if (!user_sets(p, hp, "CUDA_DEVICE_ORDER")) put(env, "CUDA_DEVICE_ORDER", "PCI_BUS_ID");
}

void put_ps(Env& env, const Plan& p, const RankPlan& r) {
  put(env, "DMLC_ROLE", "worker");
  put(env, "DMLC_NUM_WORKER", std::to_string(p.ranks.size()));
  put(env, "DMLC_NUM_SERVER", std::to_string(p.ps.servers));
  put(env, "DMLC_PS_ROOT_URI", p.master_addr);
  put(env, "DMLC_PS_ROOT_PORT", std::to_string(p.ps_port));
  put(env, "DMLC_WORKER_ID", std::to_string(r.rank));
  put(env, "MLTRAIN_PS_SYNC", p.ps.sync ? "1" : "0");
  put(env, "MLTRAIN_PS_PARTITION_BYTES", std::to_string(p.ps.partition_bytes));
}

}  // namespace

Env rank_env(const Plan& p, const Runtime& rt, int rank) {
  const RankPlan& r = p.ranks[size_t(rank)];
  const HostPlan& hp = p.hosts[size_t(r.host)];
  Env env = p.user_env;
  put_contract(env, p, rt, r);
  // As torchrun: several ranks on one host would each start a thread per core.
  if (hp.ranks.size() > 1 && !user_sets(p, hp, "OMP_NUM_THREADS")) put(env, "OMP_NUM_THREADS", "1");
  // Python's stdout to a pipe is block-buffered: lines would reach the console in bursts.
  if (!user_sets(p, hp, "PYTHONUNBUFFERED")) put(env, "PYTHONUNBUFFERED", "1");
  const bool user_nccl_ifname = has(p.user_env, "NCCL_SOCKET_IFNAME");
  const bool user_gloo_ifname = has(p.user_env, "GLOO_SOCKET_IFNAME");
  if (!p.multi_host) {
    if (!user_nccl_ifname) put(env, "NCCL_SOCKET_IFNAME", "lo");
    if (!user_gloo_ifname) put(env, "GLOO_SOCKET_IFNAME", "lo");
  }
  put_gpus(env, p, rt, r);
  if (p.ps_mode) put_ps(env, p, r);
  // What preflight learnt after the rest: the interface to the master, where the servers listen.
  const std::string ifname = size_t(r.host) < rt.ifnames.size() ? rt.ifnames[size_t(r.host)] : "";
  if (!ifname.empty()) {
    if (!user_nccl_ifname) put(env, "NCCL_SOCKET_IFNAME", ifname);
    if (!user_gloo_ifname) put(env, "GLOO_SOCKET_IFNAME", ifname);
  }
  if (rt.ps_servers) put(env, "MLTRAIN_PS_SERVERS", *rt.ps_servers);
  return env;
}

void set_rendezvous(Plan& p, const Rendezvous& r) {
  p.master_addr = r.master_addr;
  p.master_port = r.master_port;
  p.store_addr = r.master_addr + ":" + std::to_string(r.store_port);
  if (p.ps_mode && r.ps_port) p.ps_port = r.ps_port;
}

void set_ps_servers(Plan& p, const std::vector<std::string>& servers) {
  p.runtime.ps_servers = text::join(servers, ",");
}

void set_interface(Plan& p, int host, const std::string& ifname) {
  if (ifname.empty()) return;
  p.runtime.ifnames.resize(std::max(p.runtime.ifnames.size(), p.hosts.size()));
  p.runtime.ifnames[size_t(host)] = ifname;
}

std::string describe_gpus(const std::vector<int>& indices, const std::vector<std::string>& names) {
  // Runs of GPUs with one name: consecutive indices as a range, others listed.
  std::vector<std::string> parts;
  for (size_t i = 0; i < indices.size();) {
    const std::string name = i < names.size() ? names[i] : std::string();
    size_t j = i;
    while (j + 1 < indices.size() && (j + 1 < names.size() ? names[j + 1] : std::string()) == name) ++j;
    bool consecutive = true;
    for (size_t k = i + 1; k <= j; ++k) consecutive = consecutive && indices[k] == indices[k - 1] + 1;
    std::string which;
    if (j > i + 1 && consecutive) {
      which = std::to_string(indices[i]) + "-" + std::to_string(indices[j]);
    } else {
      std::vector<int> run(indices.begin() + long(i), indices.begin() + long(j) + 1);
      which = join_ints(run);
    }
    parts.push_back("GPU " + which + ": " + (name.empty() ? std::string("unnamed") : name));
    i = j + 1;
  }
  return text::join(parts, "; ");
}

std::string assign_gpus(Plan& p, int host, const HostGpus& gpus) {
  const HostPlan& hp = p.hosts[size_t(host)];
  if (hp.gpu_slots_needed == 0) return {};
  const std::string& name = hp.host.name;
  const std::string asked = p.gpus_per_proc > 0 ? "[gpus] per_proc = " + std::to_string(p.gpus_per_proc)
                                                : "[gpus] procs_per_gpu = " + std::to_string(p.procs_per_gpu);
  const size_t total = gpus.indices.size();
  const std::string inventory = describe_gpus(gpus.indices, gpus.names);
  const std::string restriction =
      gpus.cuda_visible_devices ? "CUDA_VISIBLE_DEVICES=" + text::shell_quote(*gpus.cuda_visible_devices)
                                : "";
  auto plural = [](size_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  if (total == 0)
    return name + ": " + asked + " but " + name + " has no GPU (" +
           (gpus.note.empty() ? std::string("none found") : gpus.note) + ")";
  if (gpus.usable.empty())
    return name + ": " + asked + " but no GPU of " + name + " is usable (" + restriction + "; " + name +
           " has " + std::to_string(total) + ": " + inventory + ")";
  if (hp.spare && hp.ranks.empty()) {  // no rank yet: ready for the ranks of any host it may replace
    const size_t have = hp.gpu_ids.empty() ? gpus.usable.size() : hp.gpu_ids.size();
    if (have >= size_t(hp.gpu_slots_needed)) return {};
    return name + ": a spare must be ready for any host's ranks, which need up to " +
           plural(size_t(hp.gpu_slots_needed), "GPU") + " (" + asked + "); " + name + " has " +
           std::to_string(have) + " usable";
  }
  // What each rank's slots are on this host: explicit ids (include/exclude), else the usable list.
  std::vector<std::vector<int>> devices;
  for (int r : hp.ranks) {
    std::vector<int> d;
    for (int slot : p.ranks[size_t(r)].gpu_slots) {
      if (!hp.gpu_ids.empty()) {
        int id = hp.gpu_ids[size_t(slot)];
        if (std::find(gpus.usable.begin(), gpus.usable.end(), id) == gpus.usable.end()) {
          bool exists = std::find(gpus.indices.begin(), gpus.indices.end(), id) != gpus.indices.end();
          return name + ": the include/exclude slot ids give rank " + std::to_string(r) + " GPU " +
                 std::to_string(id) + ", which " +
                 (exists ? restriction + " hides on " + name
                         : name + " does not have (it has " + std::to_string(total) + ": " + inventory + ")");
        }
        d.push_back(id);
      } else if (size_t(slot) >= gpus.usable.size()) {
        std::string has = restriction.empty()
                              ? std::to_string(gpus.usable.size()) + " (" + inventory + ")"
                              : std::to_string(gpus.usable.size()) + " usable (" + restriction + ") of " +
                                    std::to_string(total) + " (" + inventory + ")";
        return name + ": " + asked + " for " + plural(hp.ranks.size(), "rank") + " needs " +
               plural(size_t(hp.gpu_slots_needed), "GPU") + "; " + name + " has " + has;
      } else {
        d.push_back(gpus.usable[size_t(slot)]);
      }
    }
    devices.push_back(std::move(d));
  }
  for (size_t i = 0; i < hp.ranks.size(); ++i) p.runtime.gpus[hp.ranks[i]] = std::move(devices[i]);
  return {};
}

std::string checkpoint_dir(const std::string& run_id) { return "~/.cache/mltrain/checkpoints/" + run_id; }

void regroup(Plan& p, const std::vector<int>& gang, const std::vector<std::vector<std::vector<int>>>& seats) {
  for (auto& h : p.hosts) {
    h.ranks.clear();
    h.node_rank = -1;
  }
  p.ranks.clear();
  p.runtime.gpus.clear();
  for (size_t k = 0; k < gang.size(); ++k) {
    HostPlan& hp = p.hosts[size_t(gang[k])];
    hp.node_rank = int(k);
    for (size_t l = 0; l < seats[k].size(); ++l) {
      RankPlan r;
      r.rank = int(p.ranks.size());
      r.host = gang[k];
      r.local_rank = int(l);
      r.gpu_slots = seats[k][l];
      hp.ranks.push_back(r.rank);
      p.ranks.push_back(std::move(r));
    }
  }
}

void set_restart_count(Plan& p, int restart_count) { p.runtime.restart_count = restart_count; }

}  // namespace mltrain::plan
