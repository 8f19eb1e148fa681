// `mltrain sbatch JOB.toml`: a batch script that runs `mltrain run` inside the allocation Slurm
// gives it (every node's agent through srun), written next to the run records and submitted.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "runner/common/error.h"
#include "runner/common/state_home.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"

namespace mltrain::launch {

namespace fs = std::filesystem;

SbatchScript sbatch_script(const SbatchRequest& req) {
  if (req.job.specs.size() != 1)
    throw Error("sbatch needs one job spec", "mltrain sbatch job.toml --nodes 2", exit_code::usage);
  spec::JobSpec s = resolve_spec(req.job);
  if (!s.cluster.spares.empty())  // the allocation's nodes are the hosts; srun starts no spare
    throw Error(s.origin("cluster.spares", "[cluster] spares") + ": spares are for hosts reached over SSH",
                "remove spares for a batch job (min_hosts alone works in an allocation)", exit_code::usage);
  // The spec's plan outside any allocation: its hosts are the node count, its ranks per host the
  // tasks per node (hosts = ["a:2", "b:2"] is 2 nodes of 2).
  int nodes = req.nodes, per_node = s.cluster.procs_per_host;
  if (nodes <= 0 || per_node <= 0) {
    spec::JobSpec plain = s;
    plain.cluster.launcher = "ssh";
    plan::Plan p =
        plan::make_plan(plain, detail::plan_inputs(req.job, "sbatch", "sbatch", detail::Ports::placeholder));
    std::vector<std::string> counts;
    int first = -1;
    bool even = true;
    for (const auto& h : p.hosts) {
      if (h.ranks.empty()) continue;  // a PS server-only host
      const int n = int(h.ranks.size());
      if (first < 0) first = n;
      even = even && n == first;
      counts.push_back(h.host.name + ":" + std::to_string(n));
    }
    if (per_node <= 0 && nodes > 0 && s.cluster.nprocs > 0 && s.cluster.nprocs % nodes == 0)
      per_node = s.cluster.nprocs / nodes;  // nprocs over the nodes asked for
    if (per_node <= 0 && !even)
      throw Error("sbatch: Slurm gives every node the same number of tasks, but the spec plans " +
                      text::join(counts, ", "),
                  "give every host the same slots, or set [cluster] procs_per_host", exit_code::usage);
    if (per_node <= 0) per_node = first > 0 ? first : 1;
    if (nodes <= 0) nodes = int(p.hosts.size());
  }
  std::error_code ec;
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string bin = n > 0 ? std::string(self, size_t(n)) : std::string("mltrain");
  SbatchScript out;
  std::string dir = state_home() + "/slurm";
  out.output = dir + "/" + s.name + "-%j.out";
  std::string t;
  t += "#!/bin/sh\n";
  t += "# Written by mltrain sbatch for " + fs::absolute(req.job.specs[0]).string() + "\n";
  t += "#SBATCH --job-name=" + s.name + "\n";
  t += "#SBATCH --nodes=" + std::to_string(nodes) + "\n";
  t += "#SBATCH --ntasks-per-node=" + std::to_string(per_node) + "\n";
  if (!req.time.empty()) t += "#SBATCH --time=" + req.time + "\n";
  if (!req.partition.empty()) t += "#SBATCH --partition=" + req.partition + "\n";
  if (!req.account.empty()) t += "#SBATCH --account=" + req.account + "\n";
  for (const auto& a : req.extra) t += "#SBATCH " + a + "\n";
  t += "#SBATCH --output=" + out.output + "\n";
  t += "# Every node of the allocation, its tasks per node as ranks; each agent starts with srun.\n";
  std::vector<std::string> argv = {bin, "run", "--launcher", "slurm"};
  if (!req.job.overrides.ssh_config.empty())
    argv.insert(argv.end(), {"--ssh-config", req.job.overrides.ssh_config});
  if (!req.job.overrides.name.empty()) argv.insert(argv.end(), {"--name", req.job.overrides.name});
  argv.push_back(fs::absolute(req.job.specs[0]).string());
  std::vector<std::string> quoted;
  for (const auto& a : argv) quoted.push_back(text::shell_quote(a));
  t += "exec " + text::join(quoted, " ") +
       " -H \"$SLURM_JOB_NODELIST\" --procs-per-host \"${SLURM_NTASKS_PER_NODE:-" + std::to_string(per_node) +
       "}\"\n";
  out.text = t;
  out.path =
      dir + "/" + s.name + "-" + std::to_string(::time(nullptr)) + "-" + std::to_string(::getpid()) + ".sh";
  (void)ec;
  return out;
}

std::string sbatch(const SbatchRequest& req) {
  SbatchScript sc = sbatch_script(req);
  make_private_dirs(state_home() + "/slurm");
  {
    std::ofstream f(sc.path);
    f << sc.text;
    if (!f) throw Error("cannot write " + sc.path, "free some space in " + state_home());
  }
  ::chmod(sc.path.c_str(), 0700);
  std::string cmd = "sbatch --parsable " + text::shell_quote(sc.path) + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) throw Error("cannot run sbatch", "install Slurm's client (sbatch)", exit_code::host_failure);
  std::string said;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) said += buf;
  int status = ::pclose(p);
  said = text::trim(said);
  std::string id = said.substr(0, said.find(';'));
  if (status != 0 || id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    // Its lines as lines (at most 10, each cut), not one line with escaped newlines.
    std::vector<std::string> lines;
    for (const auto& l : text::split(said, '\n')) {
      if (text::trim(l).empty()) continue;
      if (lines.size() == 10) {
        lines.push_back("...");
        break;
      }
      lines.push_back("  " + text::excerpt(text::trim(l), 200));
    }
    throw Error("sbatch refused the job:" +
                    (lines.empty() ? std::string(" (it said nothing)") : "\n" + text::join(lines, "\n")),
                "check the partition, time and node count (the script is " + sc.path + ")",
                exit_code::host_failure);
  }
  std::string output = sc.output;
  if (auto k = output.find("%j"); k != std::string::npos) output.replace(k, 2, id);
  std::fprintf(stderr, "mltrain: submitted batch job %s (script %s; its output %s)\n", id.c_str(),
               sc.path.c_str(), output.c_str());
  return id;
}

}  // namespace mltrain::launch
