// `mltrain top`: flags -> launch::TopRequest -> runner/launch.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {

void register_top(CLI::App& app, Global& g, std::function<int()>& handler) {
  static launch::TopRequest req;
  static std::string interval = "1s";
  auto* c = app.add_subcommand(
      "top", "Live GPU, CPU, memory and network of a run's hosts and ranks; who waits for whom");
  c->add_option(
      "target", req.target,
      "A run (id, prefix or name) or a job spec whose hosts to watch; default: the newest running run, "
      "else the hosts given, else this host");
  add_host_flags(c, req.job.overrides);
  c->add_flag("--once", req.once, "Print one snapshot and exit (once every host sent two samples)");
  c->add_flag("--json", req.json, "Print one snapshot as JSON and exit");
  c->add_option("-i,--interval", interval,
                "Refresh every DURATION (default 1s; also the sampling interval on "
                "hosts this command watches itself)");
  c->footer(
      "Examples:\n"
      "  mltrain top                       the newest running run (else this host)\n"
      "  mltrain top 20261202-0912         a run by id prefix or name\n"
      "  mltrain top --hostfile hosts.txt  hosts with or without a run of this launcher\n"
      "  mltrain top --once --json job.toml\n"
      "Keys: q quit, a all, h hosts, g GPUs, r ranks, s sort (name, cpu, gpu, comm, memory).\n"
      "The straggler is the rank the others wait for: the lowest share of time inside collectives while\n"
      "its peers' median is at least 20% and 15 points above it. Only mltrain's comm library and its DDP\n"
      "hook time collectives; with neither (stock DDP), top says so, shows IN COLLECTIVES as 'not timed'\n"
      "and estimates the straggler from CPU time (marked 'estimated'): the rank busy while the others\n"
      "use at most 60% of its CPU time, as ranks asleep in a gloo collective do (docs/json.md).\n"
      "Exit code 255 when a host could not be watched.");
  c->callback([&] {
    handler = [&] {
      auto d = text::parse_duration(interval);
      if (!d) throw Error("--interval: '" + interval + "' is not a duration", "give one like 1s or 500ms");
      req.interval = *d;
      req.color = use_color(g, 1);
      return launch::top(req);
    };
  });
}

void register_ssh(CLI::App& app, Global& g, std::function<int()>& handler) {
  static launch::ShellRequest req;
  auto* c = app.add_subcommand("ssh",
                               "A shell where a rank runs: its host, its working directory, its environment");
  c->add_option("run", req.run, "The run (id, prefix or name; default: the newest)");
  add_int_option(c, "-r,--rank", req.rank, 0, INT32_MAX,
                 "The rank whose host and environment to use (default 0)");
  c->add_option("--ssh-config", req.overrides.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->add_flag("--accept-new-host-keys", req.overrides.accept_new_host_keys,
              "Trust hosts seen for the first time");
  c->footer(
      "Examples:\n"
      "  mltrain ssh                        a login shell on rank 0's host of the newest run\n"
      "  mltrain ssh 20261202-0912 --rank 5\n"
      "  mltrain ssh latest -r 3 -- nvidia-smi\n"
      "The shell starts in the run's working directory with the variables mltrain gave the rank (RANK,\n"
      "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, CUDA_VISIBLE_DEVICES, ...; secret ones left out). Exit code:\n"
      "the shell's or the command's.");
  c->callback([&] {
    handler = [&] {
      if (g.has_trailing) req.command = g.trailing;
      return launch::shell(req);
    };
  });
}

void register_sbatch(CLI::App& app, Global&, std::function<int()>& handler) {
  static launch::SbatchRequest req;
  static std::string spec;
  static bool print = false;
  auto* c = app.add_subcommand("sbatch", "Submit a job to Slurm: mltrain run inside the allocation");
  c->add_option("job", spec, "Job spec (TOML)")->required();
  add_int_option(c, "-N,--nodes", req.nodes, 1, 4096, "Nodes (default: as many as the spec's hosts)");
  c->add_option("-t,--time", req.time, "Time limit, as sbatch takes it (e.g. 2:00:00)");
  c->add_option("-p,--partition", req.partition, "Partition");
  c->add_option("-A,--account", req.account, "Account");
  c->add_option("--sbatch-arg", req.extra,
                "Another sbatch option, e.g. --sbatch-arg=--gres=gpu:4 (repeatable)");
  c->add_option("--name", req.job.overrides.name, "Job name (for run ids and records)");
  c->add_flag("--print", print, "Print the batch script; submit nothing");
  c->footer(
      "Examples:\n"
      "  mltrain sbatch job.toml --nodes 4 --time 2:00:00 --partition gpu\n"
      "  mltrain sbatch job.toml --print\n"
      "The script runs 'mltrain run --launcher slurm' over the allocation's nodes (each node's agent is\n"
      "an srun step); the run is recorded as usual, with its Slurm job id ('mltrain ls', 'mltrain show').");
  c->callback([&] {
    handler = [&] {
      req.job.specs = {spec};
      if (print) {
        std::fputs(launch::sbatch_script(req).text.c_str(), stdout);
        return 0;
      }
      std::printf("%s\n", launch::sbatch(req).c_str());
      return 0;
    };
  });
}

void register_cp(CLI::App& app, Global&, std::function<int()>& handler) {
  static launch::CopyRequest req;
  auto* c = app.add_subcommand("cp", "Copy a file or folder from where a run's rank ran to this machine");
  c->add_option("from", req.from, "RUN:PATH or RUN:RANK:PATH (PATH relative to the run's folder)")
      ->required();
  c->add_option("to", req.to, "Where it goes here (an existing folder: into it)")->required();
  c->add_flag("-f,--force", req.force,
              "Merge into a destination that exists: files of the same name are replaced, nothing "
              "else is touched (without it, an existing destination is an error)");
  c->add_option("--ssh-config", req.overrides.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->add_flag("--accept-new-host-keys", req.overrides.accept_new_host_keys,
              "Trust hosts seen for the first time");
  c->footer(
      "Examples:\n"
      "  mltrain cp latest:outputs/ .             outputs/ of rank 0's host into ./outputs\n"
      "  mltrain cp 20261202-0912:3:train.log r3.log\n"
      "  mltrain cp latest:~/data/stats.json /tmp/\n"
      "  mltrain cp -f latest:outputs/ .          again, into the ./outputs of the last copy\n"
      "Through the agent over the run's SSH hosts (or locally), nothing to install. Exit code: 0, 1 when\n"
      "something could not be read or written, 255 when the host cannot be reached.");
  c->callback([&] {
    handler = [&] {
      launch::copy(req);
      return 0;
    };
  });
}

}  // namespace mltrain::cli
