// `mltrain run`, `validate`, `doctor` and `queue`: flags -> launch::JobRequest -> runner/launch -> print.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <ctime>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "runner/common/error.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {
namespace {

struct RunFlags {
  std::vector<std::string> positional;
  launch::Overrides overrides;
  bool dry_run = false, json = false, detach = false;
  std::string sweep_trial;  // --sweep-trial SWEEP/N (hidden: mltrain sweep starts its trials with it)
};

void add_spec_arg(CLI::App* c, RunFlags& rf) {
  c->add_option("job", rf.positional, "Job spec (TOML); or give a command after '--'");
}

launch::JobRequest request(const RunFlags& f, const Global& g) {
  launch::JobRequest r;
  r.specs = f.positional;
  if (g.has_trailing) r.command = g.trailing;
  r.overrides = f.overrides;
  r.json = f.json;
  r.detach = f.detach;
  r.color = use_color(g, 1);
  r.sweep_trial = f.sweep_trial;
  return r;
}

// Runs (or with --dry-run plans) a request as `run` and `rerun` do; returns the exit code.
int run_request(const launch::JobRequest& req, const RunFlags& f) {
  if (f.dry_run) {
    plan::Plan p = launch::dry_run(req);
    if (f.json)
      std::printf("%s\n", records::plan_to_json(p).c_str());
    else
      std::fputs((launch::describe_plan(p) + launch::describe_sync(req)).c_str(), stdout);
    return 0;
  }
  launch::RunResult r = launch::run(req);
  if (r.detached) {
    const char* id = r.run_id.c_str();
    if (f.json)
      std::printf("{\"run_id\": \"%s\", \"launcher_pid\": %d}\n", id, r.launcher_pid);
    else
      std::printf("%s\n", id);
    if (!r.queued.empty())
      std::fprintf(stderr,
                   "mltrain: run %s waits in the hosts' queue (%s); it starts by itself in the background. "
                   "'mltrain queue' shows its place, 'mltrain logs -f %s' follows it, 'mltrain stop %s' "
                   "takes it out\n",
                   id, r.queued.c_str(), id, id);
    else
      std::fprintf(stderr,
                   "mltrain: run %s started in the background; follow it with 'mltrain logs -f %s', end it "
                   "with 'mltrain stop %s'\n",
                   id, id, id);
  }
  return r.exit_code;
}

int do_run(const RunFlags& f, const Global& g) { return run_request(request(f, g), f); }

int do_rerun(const RunFlags& f, const Global& g) {
  if (g.has_trailing)
    throw Error("mltrain rerun runs the recorded command; it takes none after '--'",
                "to run another command, use mltrain run", exit_code::usage);
  if (f.positional.size() != 1)
    throw Error("mltrain rerun needs one run id",
                "e.g. mltrain rerun 20261129-141502-hello-3fa2 ('mltrain ls' lists them)", exit_code::usage);
  RunFlags spec_flags = f;
  spec_flags.positional.clear();
  return run_request(launch::rerun_request(f.positional[0], request(spec_flags, g)), f);
}

int do_validate(const RunFlags& f, const Global& g) {
  launch::Validation v = launch::validate(request(f, g));
  if (f.json)
    std::printf("%s\n", records::plan_to_json(v.plan).c_str());
  else
    std::printf("%s\n", v.summary.c_str());
  return 0;
}

int do_exec(const RunFlags& f, const Global& g) {
  if (!g.has_trailing || g.trailing.empty())
    throw Error("mltrain exec needs a command after '--'", "mltrain exec --hostfile hosts.txt -- uname -a");
  launch::JobRequest req = request(f, g);
  req.exec = true;
  return launch::run(req).exit_code;
}

int do_doctor(const RunFlags& f, const Global& g) {
  launch::DoctorResult d = launch::doctor(request(f, g));
  std::fputs(supervise::format_doctor(d.reports, f.json).c_str(), stdout);
  return d.exit_code;
}

int do_queue(const RunFlags& f, const Global& g) {
  launch::QueueResult q = launch::queue(request(f, g));
  std::fputs(supervise::format_queue(q.hosts, f.json, int64_t(std::time(nullptr))).c_str(), stdout);
  return q.exit_code;
}

}  // namespace

void register_queue(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("queue",
                               "Who holds which GPUs on the hosts, and which jobs wait for them (all users)");
  add_spec_arg(c, f);
  add_host_flags(c, f.overrides);
  c->add_flag("--json", f.json, "Print every host's leases as JSON");
  c->footer(
      "Examples:\n  mltrain queue job.toml\n  mltrain queue -H h1,h2\n"
      "Every host is asked for its leases (docs/sharing.md): each GPU with the run that holds it, its\n"
      "user and launcher, for how long, and its utilization; jobs without GPUs; then the jobs waiting\n"
      "(--queue) in the order they will start. Exit code 0 when every host answered, 255 when one did not.");
  c->callback([&] { handler = [&] { return do_queue(f, g); }; });
}

void register_doctor(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand(
      "doctor",
      "Check every host of a job: reachable, host key, auth, agent, GPUs, NCCL, Python, torch, clock");
  add_spec_arg(c, f);
  add_host_flags(c, f.overrides);
  c->add_flag("--json", f.json, "Print the report as JSON");
  c->footer(
      "Examples:\n  mltrain doctor job.toml\n  mltrain doctor --hostfile hosts.txt --ssh-config "
      "./ssh_config\n"
      "torch is checked with the interpreter the job runs, found as a rank finds it: the spec's program\n"
      "(a command's first word) when it is a python (.venv/bin/python from the workdir, python3.11 in the\n"
      "ranks' PATH), else the python its #! line names (torchrun), else python3; the output names it. A\n"
      "host without the job's interpreter fails (stage python). Exit code 0 when every host is ready, 255\n"
      "when one is not.");
  c->callback([&] { handler = [&] { return do_doctor(f, g); }; });
}

void register_exec(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("exec", "Run one command on every host of a job, output prefixed by host");
  c->add_option("job", f.positional, "Job spec (TOML) whose hosts to use; or give them with --hostfile / -H");
  add_host_flags(c, f.overrides);
  c->add_option("-e,--env", f.overrides.env, "Set a variable for the command (K=V; repeatable)")
      ->allow_extra_args(false);
  c->add_option("--workdir", f.overrides.workdir,
                "Where it runs on every host (default: the spec's workdir, else the login directory)");
  c->add_option("--timeout", f.overrides.timeout, "Stop it after this long, e.g. 90s");
  c->add_flag_callback(
      "--sync", [] { f.overrides.sync = true; },
      "Sync the spec's [sync] folder first and run the command in it");
  c->add_flag("--no-prefix", f.overrides.no_prefix, "Print output without the [host] prefix");
  c->add_flag("--json", f.json, "Print the summary as JSON on stdout (output on stderr)");
  c->footer(
      "Examples:\n"
      "  mltrain exec --hostfile hosts.txt -- nvidia-smi -L\n"
      "  mltrain exec job.toml -- df -h /data\n"
      "  mltrain exec -H a,b,c -- 'cd ~/proj && git pull'   (one word: run by the login shell's sh -c)\n"
      "Every host runs the command to its end. Exit code: 0 when it succeeds everywhere, else the first\n"
      "failure's (its host named on stderr); 255 when a host cannot be reached. Recorded like a run:\n"
      "'mltrain logs latest --by-rank' has each host's output.");
  c->callback([&] { handler = [&] { return do_exec(f, g); }; });
}

void register_run(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("run", "Start a job's ranks, stream their output, stop them together");
  add_spec_arg(c, f);
  add_host_flags(c, f.overrides);
  add_job_flags(c, f.overrides);
  add_console_flags(c, f.overrides);
  c->add_flag("--dry-run", f.dry_run,
              "Print the plan (hosts, ranks, each rank's environment); start nothing");
  c->add_flag("--json", f.json, "Machine-readable output (the plan with --dry-run, else the final summary)");
  c->add_flag("-d,--detach", f.detach,
              "After preflight, print the run id and leave the job running in the background");
  auto* in = c->add_flag_callback(
      "--stdin", [&] { f.overrides.stdin_rank = std::max(f.overrides.stdin_rank, 0); },
      "Forward this terminal's stdin to rank 0 (e.g. for pdb); other ranks read /dev/null");
  add_int_option(c, "--stdin-rank", f.overrides.stdin_rank, 0, 1 << 20,
                 "Forward stdin to rank N instead of rank 0")
      ->excludes(in);
  c->add_option("--sweep-trial", f.sweep_trial,
                "SWEEP/N: this run is trial N of a sweep (mltrain sweep sets it)")
      ->group("");
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

void register_sweep(CLI::App& app, Global& g, std::function<int()>& handler) {
  static launch::SweepRequest r;
  static std::vector<std::string> spec;
  auto* c = app.add_subcommand("sweep", "Run a job once per trial of its [sweep] parameters and rank them");
  c->add_option("job", spec, "Job spec with [sweep] (TOML)")->expected(0, 1);
  c->add_option("--resume", r.resume,
                "Go on with a sweep (its id, a unique part, or 'latest'): the trials not finished");
  add_int_option(c, "--max-parallel", r.max_parallel, 1, 1000, "Trials at once (over [sweep] max_parallel)");
  c->footer(
      "Examples:\n  mltrain sweep sweep.toml\n  mltrain sweep --resume latest\n"
      "Each trial is an ordinary run with {name} replaced by its parameters in the command, argv and "
      "[run.env];\n"
      "the table at the end is sorted by [sweep] metric and ends with the best trial's rerun line\n"
      "(docs/sweep.md). Exit code: 0 when a trial succeeded, 1 when none did, 130 on Ctrl-C.");
  c->callback([&] {
    handler = [&] {
      if (spec.empty() == r.resume.empty())
        throw Error(spec.empty() ? "give a spec with [sweep], or --resume SWEEP"
                                 : "give a spec or --resume, not both",
                    "mltrain sweep sweep.toml, or mltrain sweep --resume latest");
      r.spec = spec.empty() ? "" : spec[0];
      r.color = use_color(g, 1);
      return launch::sweep(r);
    };
  });
}

void register_rerun(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("rerun", "Run a recorded run again: the same code, spec and hosts");
  c->add_option("run", f.positional, "Run id, a unique part of it, or 'latest'")->expected(1);
  add_host_flags(c, f.overrides);
  add_job_flags(c, f.overrides);
  add_console_flags(c, f.overrides);
  c->add_flag("--dry-run", f.dry_run, "Print the plan; start nothing");
  c->add_flag("--json", f.json, "Machine-readable output (the plan with --dry-run, else the final summary)");
  c->add_flag("-d,--detach", f.detach, "After preflight, print the run id and leave the job running");
  c->footer(
      "Examples:\n  mltrain rerun 20261129-141502-hello-3fa2\n  mltrain rerun latest -H a:4,b:4 --env "
      "LR=0.01\n"
      "The code is the tree the run synced, restored from the code store (docs/records.md), even if the\n"
      "project changed or is gone; the spec and hosts are the run's, and flags override them as for run.\n"
      "A secret of [run.env] was never recorded: it is taken from this shell again. The new record says\n"
      "'rerun of RUN'. Exit codes as for run.");
  c->callback([&] { handler = [&] { return do_rerun(f, g); }; });
}

void register_validate(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("validate", "Check a job spec and its hosts without starting anything");
  add_spec_arg(c, f);
  add_host_flags(c, f.overrides);
  add_job_flags(c, f.overrides);
  c->add_flag("--json", f.json, "Print the resolved plan as JSON");
  c->footer(
      "Example:\n  mltrain validate examples/hello.toml\nExit code 2 and a file:line:column message on any "
      "error.");
  c->callback([&] { handler = [&] { return do_validate(f, g); }; });
}

}  // namespace mltrain::cli
