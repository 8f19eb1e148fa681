// `mltrain run`, `validate` and `doctor`: flags -> launch::JobRequest -> runner/launch -> print.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {
namespace {

struct RunFlags {
  std::vector<std::string> positional;
  launch::Overrides overrides;
  bool dry_run = false, json = false, detach = false;
};

void add_job_flags(CLI::App* c, RunFlags& rf) {
  auto& f = rf.overrides;
  c->add_option("job", rf.positional, "Job spec (TOML); or give a command after '--'");
  c->add_option("-n,--nprocs", f.nprocs, "Number of ranks (on localhost, or spread over the hosts)")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--procs-per-host", f.procs_per_host, "Ranks on each host")->check(CLI::Range(1, 4096));
  c->add_option("--hostfile", f.hostfile, "Hostfile (DeepSpeed, Open MPI or Horovod format)");
  c->add_option("-H,--hosts", f.hosts, "Hosts, e.g. 'a:4,b:4' or 'gpu[01-04]:8'");
  c->add_option("--include", f.include, "Only these hosts/slots, e.g. 'host1:0,2@host2'");
  c->add_option("--exclude", f.exclude, "All but these hosts/slots");
  c->add_option("-e,--env", f.env, "Set a variable for every rank (K=V; repeatable)")
      ->allow_extra_args(false);
  c->add_option("--max-restarts", f.max_restarts, "Restart the whole gang up to N times on failure")
      ->check(CLI::Range(0, 1000));
  c->add_option("--timeout", f.timeout, "Stop the job after this long, e.g. 90s, 2h");
  c->add_option("--grace-period", f.grace, "Time between SIGTERM and SIGKILL when stopping ranks");
  c->add_option("--profile", f.profile, "Profile to merge under the spec (name or path)");
  c->add_option("--name", f.name, "Job name (for run ids and records)");
  c->add_option("--workdir", f.workdir, "Working directory of every rank");
  c->add_option("--ranks", f.ranks, "Show only these ranks on the console, e.g. 0,3-5 (files get all)");
  c->add_flag("--no-prefix", f.no_prefix, "Print rank output without the [rank] prefix");
  c->add_flag("--timestamps", f.timestamps, "Start console lines with the time");
  c->add_option("--ssh-config", f.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->add_flag("--accept-new-host-keys", f.accept_new_host_keys,
              "Accept and record host keys never seen before");
}

launch::JobRequest request(const RunFlags& f, const Global& g) {
  launch::JobRequest r;
  r.specs = f.positional;
  if (g.has_trailing) r.command = g.trailing;
  r.overrides = f.overrides;
  r.json = f.json;
  r.detach = f.detach;
  r.color = use_color(g, 1);
  return r;
}

int do_run(const RunFlags& f, const Global& g) {
  launch::JobRequest req = request(f, g);
  if (f.dry_run) {
    plan::Plan p = launch::dry_run(req);
    if (f.json)
      std::printf("%s\n", records::plan_to_json(p).c_str());
    else
      std::fputs(launch::describe_plan(p).c_str(), stdout);
    return 0;
  }
  launch::RunResult r = launch::run(req);
  if (r.detached) {
    const char* id = r.run_id.c_str();
    if (f.json)
      std::printf("{\"run_id\": \"%s\", \"launcher_pid\": %d}\n", id, r.launcher_pid);
    else
      std::printf("%s\n", id);
    std::fprintf(stderr,
                 "mltrain: run %s started in the background; follow it with 'mltrain logs -f %s', end it "
                 "with 'mltrain stop %s'\n",
                 id, id, id);
  }
  return r.exit_code;
}

int do_validate(const RunFlags& f, const Global& g) {
  launch::Validation v = launch::validate(request(f, g));
  if (f.json)
    std::printf("%s\n", records::plan_to_json(v.plan).c_str());
  else
    std::printf("%s\n", v.summary.c_str());
  return 0;
}

int do_doctor(const RunFlags& f, const Global& g) {
  launch::DoctorResult d = launch::doctor(request(f, g));
  std::fputs(supervise::format_doctor(d.reports, f.json).c_str(), stdout);
  return d.exit_code;
}

}  // namespace

void register_doctor(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand(
      "doctor",
      "Check every host of a job: reachable, host key, auth, agent, GPUs, NCCL, Python, torch, clock");
  add_job_flags(c, f);
  c->add_flag("--json", f.json, "Print the report as JSON");
  c->footer(
      "Examples:\n  mltrain doctor job.toml\n  mltrain doctor --hostfile hosts.txt --ssh-config "
      "./ssh_config\n"
      "torch is checked with the interpreter the job runs (its python program, else python3 in the\n"
      "ranks' PATH); the output names it. Exit code 0 when every host is ready, 255 when one is not.");
  c->callback([&] { handler = [&] { return do_doctor(f, g); }; });
}

void register_run(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("run", "Start a job's ranks, stream their output, stop them together");
  add_job_flags(c, f);
  c->add_flag("--dry-run", f.dry_run,
              "Print the plan (hosts, ranks, each rank's environment); start nothing");
  c->add_flag("--json", f.json, "Machine-readable output (the plan with --dry-run, else the final summary)");
  c->add_flag("-d,--detach", f.detach,
              "After preflight, print the run id and leave the job running in the background");
  auto* in = c->add_flag_callback(
      "--stdin", [&] { f.overrides.stdin_rank = std::max(f.overrides.stdin_rank, 0); },
      "Forward this terminal's stdin to rank 0 (e.g. for pdb); other ranks read /dev/null");
  c->add_option("--stdin-rank", f.overrides.stdin_rank, "Forward stdin to rank N instead of rank 0")
      ->check(CLI::Range(0, 1 << 20))
      ->excludes(in);
  c->footer(
      "Examples:\n"
      "  mltrain run examples/hello.toml\n"
      "  mltrain run -n 4 -- sh -c 'echo $RANK of $WORLD_SIZE'\n"
      "  mltrain run -n 8 --max-restarts 2 -- /usr/bin/python3 train.py --epochs 3\n"
      "  mltrain run job.toml -H a:4,b:4 --env OMP_NUM_THREADS=2 --dry-run\n"
      "  mltrain run -n 2 --stdin -- python3 -m pdb train.py\n"
      "Exit code: 0 when every rank succeeds, else the first failed rank's code (128+N for signal N);\n"
      "2 for a bad spec, 124 on timeout, 127 when the program is missing, 129 on SIGHUP, 130 on Ctrl-C,\n"
      "143 when stopped, 255 when a host is lost or fails preflight. With --detach: 0 once every rank\n"
      "started; a failure before that is the command's (docs/exit-codes.md).");
  c->callback([&] { handler = [&] { return do_run(f, g); }; });
}

void register_validate(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("validate", "Check a job spec and its hosts without starting anything");
  add_job_flags(c, f);
  c->add_flag("--json", f.json, "Print the resolved plan as JSON");
  c->footer(
      "Example:\n  mltrain validate examples/hello.toml\nExit code 2 and a file:line:column message on any "
      "error.");
  c->callback([&] { handler = [&] { return do_validate(f, g); }; });
}

}  // namespace mltrain::cli
