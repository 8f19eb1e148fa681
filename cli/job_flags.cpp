// The flag groups of job_flags.h: one definition of each flag, whichever verb shows it.
#include "cli/job_flags.h"

#include <CLI/CLI.hpp>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {

CLI::Option* add_int_option(CLI::App* c, const std::string& names, int& value, long long lo, long long hi,
                            const std::string& help) {
  std::string flag;  // the longest name, as the user most likely wrote it
  for (const auto& n : text::split(names, ','))
    if (n.size() > flag.size()) flag = n;
  return c
      ->add_option_function<std::string>(
          names,
          [&value, flag, lo, hi](const std::string& v) { value = int(text::parse_int_arg(v, flag, lo, hi)); },
          help)
      ->type_name("INT");
}

void add_host_flags(CLI::App* c, launch::Overrides& f) {
  add_int_option(c, "-n,--nprocs", f.nprocs, 1, 1 << 20,
                 "Number of ranks (on localhost, or over the hosts' slots)");
  add_int_option(c, "--procs-per-host", f.procs_per_host, 1, 4096,
                 "Ranks on each host (alias --nproc-per-node)");
  c->add_flag("--oversubscribe", f.oversubscribe, "Allow more ranks than the hosts have slots");
  c->add_flag("--queue", f.queue,
              "When the GPUs (or hosts) are held by other jobs, wait for them in the hosts' queue instead of "
              "failing ([cluster] queue)");
  c->add_option("--queue-timeout", f.queue_timeout,
                "Give up the place in the queue after waiting this long, e.g. 30m ([cluster] queue_timeout)");
  c->add_option("--hostfile", f.hostfile, "Hostfile (DeepSpeed, Open MPI or Horovod format)");
  c->add_option_function<std::string>(
      "-H,--hosts", [&f](const std::string& v) { f.hosts = v; },
      "Hosts, e.g. 'a:4,b:4' or 'gpu[01-04]:8' (a host without :N has 1 slot)");
  c->add_option("--include", f.include, "Only these hosts/slots, e.g. 'host1:0,2@host2'");
  c->add_option("--exclude", f.exclude, "All but these hosts/slots");
  c->add_option("--ssh-config", f.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->add_option("--launcher", f.launcher,
                "How agents start: auto (srun inside a Slurm allocation, else ssh), ssh, slurm")
      ->check(CLI::IsMember({"auto", "ssh", "slurm"}));
  c->add_flag("--accept-new-host-keys", f.accept_new_host_keys,
              "Accept and record host keys never seen before");
}

void add_job_flags(CLI::App* c, launch::Overrides& f) {
  c->add_option("-e,--env", f.env, "Set a variable for every rank (K=V; repeatable)")
      ->allow_extra_args(false);
  c->add_option("-x", f.forward,
                "Forward the launcher's value of K to every rank (-x K), or set it (-x K=V); repeatable")
      ->allow_extra_args(false);
  add_int_option(c, "--max-restarts", f.max_restarts, 0, 1000,
                 "Restart the whole gang up to N times on failure");
  c->add_option("--timeout", f.timeout, "Stop the job after this long, e.g. 90s, 2h");
  c->add_option("--grace-period", f.grace, "Time between SIGTERM and SIGKILL when stopping ranks");
  c->add_option("--profile", f.profile, "Profile to merge under the spec (name or path)");
  c->add_option("--name", f.name, "Job name (for run ids and records)");
  auto* sync = c->add_flag_callback(
      "--sync", [&f] { f.sync = true; }, "Mirror the spec's folder to every host first ([sync] defaults)");
  c->add_flag_callback(
       "--no-sync", [&f] { f.sync = false; }, "Do not sync, even with [sync] in the spec")
      ->excludes(sync);
  c->add_option("--setup", f.setup, "When [setup] runs: auto (it or the synced files changed), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  c->add_option("--workdir", f.workdir, "Working directory of every rank");
  add_int_option(c, "--master-port", f.master_port, 1, 65535,
                 "MASTER_PORT of the job (default: a free port)");
}

void add_console_flags(CLI::App* c, launch::Overrides& f) {
  c->add_option("--ranks", f.ranks, "Show only these ranks on the console, e.g. 0,3-5 (files get all)");
  c->add_flag("--no-prefix", f.no_prefix, "Print rank output without the [rank] prefix");
  c->add_flag("--timestamps", f.timestamps, "Start console lines with the time");
}

void translate_peer_flags(std::vector<std::string>& args) {
  struct Alias {
    const char* peer;
    const char* ours;
  };
  // Same meaning: rewritten. CLI11 would read "-np 2" as "-n p" and say "Value p not in range".
  static const Alias kAliases[] = {
      {"-np", "-n"},
      {"--np", "-n"},
      {"--nproc-per-node", "--procs-per-host"},
      {"--nproc_per_node", "--procs-per-host"},
      {"--npernode", "--procs-per-host"},
      {"-npernode", "--procs-per-host"},
      {"--master_port", "--master-port"},
      {"--host", "-H"},
      {"-host", "-H"},
      {"-hostfile", "--hostfile"},
      {"-oversubscribe", "--oversubscribe"},
  };
  // No equal in mltrain: say what to use instead.
  static const Alias kHints[] = {
      {"--nnodes",
       "mltrain runs on the hosts you give (-H a,b or --hostfile); their number is the node count"},
      {"--num_nodes",
       "mltrain runs on the hosts you give (-H a,b or --hostfile); their number is the node count"},
      {"--num-nodes",
       "mltrain runs on the hosts you give (-H a,b or --hostfile); their number is the node count"},
      {"--num_gpus", "use --procs-per-host N (ranks on each host) and [gpus] per_proc in the spec"},
      {"--num-gpus", "use --procs-per-host N (ranks on each host) and [gpus] per_proc in the spec"},
      {"--master-addr", "mltrain sets MASTER_ADDR to an address of rank 0's host; no flag is needed"},
      {"--master_addr", "mltrain sets MASTER_ADDR to an address of rank 0's host; no flag is needed"},
      {"--node-rank", "mltrain starts every node itself and sets NODE_RANK; run it once, from one machine"},
      {"--node_rank", "mltrain starts every node itself and sets NODE_RANK; run it once, from one machine"},
      {"--rdzv-endpoint", "mltrain hosts the rendezvous on rank 0's host; use --master-port to fix its port"},
      {"--rdzv_endpoint", "mltrain hosts the rendezvous on rank 0's host; use --master-port to fix its port"},
      {"--standalone", "without -H or --hostfile mltrain runs on this machine; drop the flag"},
  };
  for (auto& a : args) {
    std::string name = a.substr(0, a.find('='));
    std::string rest = a.substr(name.size());
    for (const auto& al : kAliases)
      if (name == al.peer) {
        // "-n=4" is no CLI11 form for a short flag; "-n4" is.
        std::string ours = al.ours;
        a = ours + (rest.empty() ? "" : (ours.size() == 2 ? rest.substr(1) : rest));
      }
    for (const auto& h : kHints)
      if (name == h.peer) throw Error("'" + name + "' is not a flag of mltrain", h.ours);
  }
}

}  // namespace mltrain::cli
