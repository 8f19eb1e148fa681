// `mltrain run` and `mltrain validate`: parse flags, load and override the spec, plan, supervise.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "cli/commands.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/plan/plan.h"
#include "runner/records/records.h"
#include "runner/spec/spec.h"
#include "runner/supervise/doctor.h"
#include "runner/supervise/supervisor.h"
#include "runner/transport/ssh_transport.h"
#include "runner/transport/transport.h"

namespace mltrain::cli {
namespace {

struct RunFlags {
  std::vector<std::string> positional;
  int nprocs = 0;
  int procs_per_host = 0;
  std::string hostfile;
  std::string hosts;
  std::vector<std::string> env;
  int max_restarts = -1;
  std::string timeout, grace;
  std::string profile, name, workdir, include, exclude, ranks, ssh_config;
  bool accept_new_host_keys = false;
  bool dry_run = false, json = false, detach = false, no_prefix = false, timestamps = false;
};

void add_job_flags(CLI::App* c, RunFlags& f) {
  c->add_option("job", f.positional, "Job spec (TOML); or give a command after '--'");
  c->add_option("-n,--nprocs", f.nprocs, "Number of ranks (on localhost, or spread over the hosts)")->check(CLI::Range(1, 1 << 20));
  c->add_option("--procs-per-host", f.procs_per_host, "Ranks on each host")->check(CLI::Range(1, 4096));
  c->add_option("--hostfile", f.hostfile, "Hostfile (DeepSpeed, Open MPI or Horovod format)");
  c->add_option("-H,--hosts", f.hosts, "Hosts, e.g. 'a:4,b:4' or 'gpu[01-04]:8'");
  c->add_option("--include", f.include, "Only these hosts/slots, e.g. 'host1:0,2@host2'");
  c->add_option("--exclude", f.exclude, "All but these hosts/slots");
  c->add_option("-e,--env", f.env, "Set a variable for every rank (K=V; repeatable)")->allow_extra_args(false);
  c->add_option("--max-restarts", f.max_restarts, "Restart the whole gang up to N times on failure")->check(CLI::Range(0, 1000));
  c->add_option("--timeout", f.timeout, "Stop the job after this long, e.g. 90s, 2h");
  c->add_option("--grace-period", f.grace, "Time between SIGTERM and SIGKILL when stopping ranks");
  c->add_option("--profile", f.profile, "Profile to merge under the spec (name or path)");
  c->add_option("--name", f.name, "Job name (for run ids and records)");
  c->add_option("--workdir", f.workdir, "Working directory of every rank");
  c->add_option("--ranks", f.ranks, "Show only these ranks on the console, e.g. 0,3-5 (files get all)");
  c->add_flag("--no-prefix", f.no_prefix, "Print rank output without the [rank] prefix");
  c->add_flag("--timestamps", f.timestamps, "Start console lines with the time");
  c->add_option("--ssh-config", f.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->add_flag("--accept-new-host-keys", f.accept_new_host_keys, "Accept and record host keys never seen before");
}

spec::JobSpec build_spec(RunFlags& f, Global& g) {
  spec::JobSpec s;
  bool have_spec = !f.positional.empty();
  if (f.positional.size() > 1)
    throw Error("expected one job spec, got " + std::to_string(f.positional.size()) + " words before '--'",
                "put the command after '--': mltrain run -n 4 -- " + text::join(f.positional, " "));
  if (have_spec) {
    s = spec::load_file(f.positional[0]);
    if (g.has_trailing) {
      s.run.argv = g.trailing;
      s.run.command.reset();
    }
  } else {
    if (!g.has_trailing || g.trailing.empty())
      throw Error("nothing to run", "give a job spec (mltrain run job.toml) or a command (mltrain run -n 4 -- CMD ...)");
    s = spec::from_command(g.trailing, f.profile);
  }
  if (have_spec && !f.profile.empty())
    throw Error("--profile applies to ad-hoc runs; the spec " + f.positional[0] + " chooses its own",
                "set 'profile = \"" + f.profile + "\"' in the spec");

  // Command-line flags override the spec.
  if (f.nprocs > 0) s.cluster.nprocs = f.nprocs;
  if (f.procs_per_host > 0) s.cluster.procs_per_host = f.procs_per_host;
  if (!f.hostfile.empty()) {
    s.cluster.hostfile = f.hostfile;
    s.cluster.hosts.clear();
    s.origins["cluster.hostfile"] = "--hostfile";
  }
  if (!f.hosts.empty()) {
    s.cluster.hosts = {f.hosts};
    s.cluster.hostfile.clear();
    s.origins["cluster.hosts"] = "-H";
  }
  if (!f.include.empty()) {
    s.cluster.include = f.include;
    s.origins["cluster.include"] = "--include";
  }
  if (!f.exclude.empty()) {
    s.cluster.exclude = f.exclude;
    s.origins["cluster.exclude"] = "--exclude";
  }
  for (const auto& kv : f.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error("--env '" + kv + "' is not K=V", "write --env NAME=value");
    std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
    spec::check_env_name(k, "--env");
    bool replaced = false;
    for (auto& [ek, ev] : s.run.env)
      if (ek == k) ev = v, replaced = true;
    if (!replaced) s.run.env.emplace_back(k, v);
  }
  if (f.max_restarts >= 0) s.run.max_restarts = f.max_restarts;
  auto duration = [](const std::string& flag, const std::string& v) {
    auto d = text::parse_duration(v);
    if (!d) throw Error(flag + " '" + v + "' is not a duration", "write it like 90s, 15m, 2h or 1h30m");
    return *d;
  };
  if (!f.timeout.empty()) s.run.timeout = duration("--timeout", f.timeout);
  if (!f.grace.empty()) s.run.grace_period = duration("--grace-period", f.grace);
  if (!f.name.empty()) s.name = f.name;
  if (!f.workdir.empty()) s.run.workdir = std::filesystem::absolute(f.workdir).lexically_normal().string();
  if (!f.ranks.empty()) s.logs.ranks = f.ranks;
  if (f.no_prefix) s.logs.prefix = "";
  if (f.timestamps) s.logs.timestamps = true;
  if (!f.ssh_config.empty()) s.ssh.config = f.ssh_config;
  if (f.accept_new_host_keys) {
    s.ssh.strict_host_keys = "accept-new";
    s.origins["ssh.strict_host_keys"] = "--accept-new-host-keys";
  }
  spec::check(s);
  if (!s.logs.ranks.empty() && !text::parse_int_list(s.logs.ranks))
    throw Error("--ranks '" + s.logs.ranks + "' is not a rank list", "write ranks like 0,3-5");
  return s;
}

std::string random_token() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + i * 8, 9, "%08x", unsigned(rd()));
  return buf;
}

std::string git_commit(const std::string& dir) {
  std::string cmd = "git -C " + text::shell_quote(dir) + " rev-parse HEAD 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {};
  char buf[64] = {};
  std::string out;
  if (std::fgets(buf, sizeof buf, p)) out = text::trim(buf);
  ::pclose(p);
  return out;
}

void print_plan(const plan::Plan& p) {
  std::printf("run %s: %zu rank%s on %zu host%s\n", p.name.c_str(), p.ranks.size(), p.ranks.size() == 1 ? "" : "s",
              p.hosts.size(), p.hosts.size() == 1 ? "" : "s");
  std::vector<std::string> argv;
  for (const auto& a : p.argv) argv.push_back(text::shell_quote(a));
  std::printf("command: %s\nworkdir: %s\nmaster:  %s:%d   store: %s\n", text::join(argv, " ").c_str(), p.workdir.c_str(),
              p.master_addr.c_str(), p.master_port, p.store_addr.c_str());
  for (const auto& h : p.hosts) {
    std::printf("\nhost %s (node %d%s): ranks", h.host.name.c_str(), h.node_rank, h.local ? ", local" : "");
    for (int r : h.ranks) std::printf(" %d", r);
    std::printf("\n");
    for (int r : h.ranks) {
      std::printf("  rank %d:", r);
      for (const auto& [k, v] : p.ranks[size_t(r)].env)
        std::printf(" %s=%s", k.c_str(), k == "MLTRAIN_TOKEN" ? "<secret>" : text::shell_quote(v).c_str());
      std::printf("\n");
    }
  }
}

// The local transport for this machine, SSH for every other host.
struct Transports {
  std::unique_ptr<transport::Transport> local, ssh;
  supervise::TransportFor for_host;
  explicit Transports(const spec::JobSpec& s) {
    local = transport::make_local_transport();
    transport::SshOptions so;
    so.config = s.ssh.config;
    so.user = s.ssh.user;
    so.port = s.ssh.port;
    so.identity_file = s.ssh.identity_file;
    so.known_hosts = s.ssh.known_hosts;
    so.strict_host_keys = s.ssh.strict_host_keys;
    so.connect_timeout = s.ssh.connect_timeout;
    so.connect_timeout_set = s.origins.count("ssh.connect_timeout") > 0;
    so.strict_host_keys_set = s.origins.count("ssh.strict_host_keys") > 0;
    ssh = transport::make_ssh_transport(so);
    for_host = [this](const plan::HostPlan& h) -> transport::Transport& { return h.local ? *local : *ssh; };
  }
};

int do_run(RunFlags& f, Global& g) {
  spec::JobSpec s = build_spec(f, g);
  plan::Inputs in;
  in.environ = plan::current_environ();
  in.cwd = std::filesystem::current_path().string();
  in.token = random_token();
  in.free_port = plan::find_free_port;

  if (f.dry_run) {
    in.run_id = "dry-run";
    plan::Plan p = plan::make_plan(s, in);
    if (f.json) std::printf("%s\n", records::plan_to_json(p).c_str());
    else print_plan(p);
    return 0;
  }

  // Plan before creating the record, so a bad host list leaves no empty run behind.
  in.run_id = "pending";
  plan::make_plan(s, in);
  in.run_id = records::create_run(s.name);
  plan::Plan p = plan::make_plan(s, in);

  records::RunRecord rec;
  rec.id = p.run_id;
  rec.name = s.name;
  rec.spec_file = s.source.empty() ? "" : std::filesystem::absolute(s.source).string();
  rec.spec_toml = spec::to_toml(s);
  rec.max_restarts = s.run.max_restarts;
  rec.started_at = records::now_iso8601();
  rec.git_commit = git_commit(p.workdir);
  records::fill_from_plan(rec, p);

  supervise::Options o;
  o.grace = s.run.grace_period;
  o.timeout = s.run.timeout;
  o.max_restarts = s.run.max_restarts;
  o.json_summary = f.json;
  o.console_fd = f.json ? 2 : 1;  // with --json, stdout carries the summary alone
  o.console.color = use_color(g, 1);
  o.console.timestamps = s.logs.timestamps;
  o.console.prefix = s.logs.prefix;
  if (!s.logs.ranks.empty()) {
    auto list = text::parse_int_list(s.logs.ranks);
    o.console.ranks = std::set<int>(list->begin(), list->end());
  }

  if (f.detach) {
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno), {}, exit_code::internal);
    if (pid > 0) {
      if (f.json) std::printf("{\"run_id\": \"%s\", \"launcher_pid\": %d}\n", rec.id.c_str(), int(pid));
      else std::printf("%s\n", rec.id.c_str());
      std::fprintf(stderr, "mltrain: run %s started in the background; follow it with 'mltrain logs -f %s', end it with 'mltrain stop %s'\n",
                   rec.id.c_str(), rec.id.c_str(), rec.id.c_str());
      return 0;
    }
    // The detached launcher: its own session, its console into console.log.
    ::setsid();
    int devnull = ::open("/dev/null", O_RDONLY);
    std::string console = records::run_dir(rec.id) + "/console.log";
    int cfd = ::open(console.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ::dup2(devnull, 0);
    if (cfd >= 0) {
      ::dup2(cfd, 1);
      ::dup2(cfd, 2);
    }
    rec.detached = true;
    o.console.color = false;
    o.json_summary = false;
  }
  rec.launcher_pid = ::getpid();
  rec.launcher_start = records::process_start_time(rec.launcher_pid);
  records::save(rec);

  Transports t(s);
  int code = supervise::run_job(p, rec, o, t.for_host);
  if (f.detach) {
    std::fflush(stdout);
    ::_exit(code);
  }
  return code;
}

int do_validate(RunFlags& f, Global& g) {
  if (f.positional.empty() && !g.has_trailing)
    throw Error("validate needs a job spec or a command", "mltrain validate job.toml, or mltrain validate -n 2 -- CMD");
  spec::JobSpec s = build_spec(f, g);
  plan::Inputs in;
  in.environ = plan::current_environ();
  in.cwd = std::filesystem::current_path().string();
  in.token = "validate";
  in.run_id = "validate";
  int next_port = 29500;
  in.free_port = [&] { return next_port++; };
  plan::Plan p = plan::make_plan(s, in);
  if (f.json) {
    std::printf("%s\n", records::plan_to_json(p).c_str());
  } else {
    std::vector<std::string> hosts;
    for (const auto& h : p.hosts) hosts.push_back(h.host.name + "(" + std::to_string(h.ranks.size()) + ")");
    std::printf("%s: ok: %zu rank%s on %s\n", f.positional.empty() ? "command" : f.positional[0].c_str(), p.ranks.size(), p.ranks.size() == 1 ? "" : "s",
                text::join(hosts, ", ").c_str());
  }
  return 0;
}

int do_doctor(RunFlags& f, Global& g) {
  if (!g.has_trailing) {
    g.has_trailing = true;
    g.trailing = {"true"};  // doctor checks hosts, not a program
  }
  spec::JobSpec s = build_spec(f, g);
  plan::Inputs in;
  in.environ = plan::current_environ();
  in.cwd = std::filesystem::current_path().string();
  in.token = "doctor";
  in.run_id = "doctor";
  int port = 29500;
  in.free_port = [&] { return port++; };
  plan::Plan p = plan::make_plan(s, in);
  Transports t(s);
  auto reports = supervise::run_doctor(p.hosts, t.for_host, s.comm.master_port);
  std::fputs(supervise::format_doctor(reports, f.json).c_str(), stdout);
  for (const auto& r : reports)
    if (!r.ok) return exit_code::host_failure;
  return 0;
}

}  // namespace

void register_doctor(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("doctor", "Check every host of a job: reachable, host key, auth, agent, GPUs, NCCL, Python, torch, clock");
  add_job_flags(c, f);
  c->add_flag("--json", f.json, "Print the report as JSON");
  c->footer("Examples:\n  mltrain doctor job.toml\n  mltrain doctor --hostfile hosts.txt --ssh-config ./ssh_config\n"
            "Exit code 0 when every host is ready, 255 when one is not.");
  c->callback([&] { handler = [&] { return do_doctor(f, g); }; });
}

void register_run(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("run", "Start a job's ranks, stream their output, stop them together");
  add_job_flags(c, f);
  c->add_flag("--dry-run", f.dry_run, "Print the plan (hosts, ranks, each rank's environment); start nothing");
  c->add_flag("--json", f.json, "Machine-readable output (the plan with --dry-run, else the final summary)");
  c->add_flag("-d,--detach", f.detach, "Print the run id and leave the job running in the background");
  c->footer(
      "Examples:\n"
      "  mltrain run examples/hello.toml\n"
      "  mltrain run -n 4 -- sh -c 'echo $RANK of $WORLD_SIZE'\n"
      "  mltrain run -n 8 --max-restarts 2 -- /usr/bin/python3 train.py --epochs 3\n"
      "  mltrain run job.toml -H a:4,b:4 --env OMP_NUM_THREADS=2 --dry-run\n"
      "Exit code: 0 when every rank succeeds, else the first failed rank's code (128+N for signal N);\n"
      "2 for a bad spec, 124 on timeout, 130 on Ctrl-C, 143 when stopped, 255 when a host is lost.");
  c->callback([&] { handler = [&] { return do_run(f, g); }; });
}

void register_validate(CLI::App& app, Global& g, std::function<int()>& handler) {
  static RunFlags f;
  auto* c = app.add_subcommand("validate", "Check a job spec and its hosts without starting anything");
  add_job_flags(c, f);
  c->add_flag("--json", f.json, "Print the resolved plan as JSON");
  c->footer("Example:\n  mltrain validate examples/hello.toml\nExit code 2 and a file:line:column message on any error.");
  c->callback([&] { handler = [&] { return do_validate(f, g); }; });
}

}  // namespace mltrain::cli
