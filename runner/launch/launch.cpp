// From a JobRequest to a spec and a plan: the flag overrides, validate, dry run, doctor.
#include "runner/launch/launch.h"

#include <netdb.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <vector>

#include "knobs/gpu_library.h"
#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/transport/ssh_config.h"
#include "runner/transport/ssh_transport.h"

namespace mltrain::launch {

namespace {

std::chrono::milliseconds parse_flag_duration(const std::string& flag, const std::string& v) {
  auto d = text::parse_duration(v);
  if (!d) throw Error(flag + " '" + v + "' is not a duration", "write it like 90s, 15m, 2h or 1h30m");
  return *d;
}

void put_env(spec::JobSpec& s, const std::string& k, const std::string& v) {
  bool replaced = false;
  for (auto& [ek, ev] : s.run.env)
    if (ek == k) ev = v, replaced = true;
  if (!replaced) s.run.env.emplace_back(k, v);
}

void set_env(spec::JobSpec& s, const std::string& kv) {
  auto eq = kv.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("--env '" + kv + "' is not K=V",
                "write --env NAME=value (or -x NAME to forward this shell's value)");
  std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
  spec::check_env_name(k, "--env");
  put_env(s, k, v);
}

// mpirun's -x: "K" forwards the launcher's value of K, "K=V" sets it like --env.
void forward_env(spec::JobSpec& s, const std::string& item,
                 const std::map<std::string, std::string>& environ) {
  auto eq = item.find('=');
  std::string k = item.substr(0, eq);
  spec::check_env_name(k, "-x");
  if (eq != std::string::npos) return put_env(s, k, item.substr(eq + 1));
  auto it = environ.find(k);
  if (it == environ.end())
    throw Error("-x " + k + ": " + k + " is not set in this environment, so there is nothing to forward",
                "export " + k + " first, or give its value: -x " + k + "=VALUE");
  put_env(s, k, it->second);
}

void apply_overrides(spec::JobSpec& s, const Overrides& f,
                     const std::map<std::string, std::string>& environ) {
  if (f.nprocs > 0) s.cluster.nprocs = f.nprocs;
  if (f.procs_per_host > 0) s.cluster.procs_per_host = f.procs_per_host;
  if (f.queue) {
    s.cluster.queue = true;
    s.origins["cluster.queue"] = "--queue";
  }
  if (f.oversubscribe) {
    s.cluster.oversubscribe = true;
    s.origins["cluster.oversubscribe"] = "--oversubscribe";
  }
  if (!f.hostfile.empty()) {
    s.cluster.hostfile = f.hostfile;
    s.cluster.hosts.clear();
    s.origins["cluster.hostfile"] = "--hostfile";
  }
  if (f.hosts) {
    // An empty -H is kept: planning refuses it rather than running on localhost.
    s.cluster.hosts = {*f.hosts};
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
  for (const auto& kv : f.env) set_env(s, kv);
  for (const auto& item : f.forward) forward_env(s, item, environ);
  if (f.master_port > 0) {
    s.comm.master_port = f.master_port;
    s.origins["comm.master_port"] = "--master-port";
  }
  if (f.max_restarts >= 0) s.run.max_restarts = f.max_restarts;
  if (!f.timeout.empty()) s.run.timeout = parse_flag_duration("--timeout", f.timeout);
  if (!f.queue_timeout.empty()) {
    s.cluster.queue_timeout = parse_flag_duration("--queue-timeout", f.queue_timeout);
    s.origins["cluster.queue_timeout"] = "--queue-timeout";
  }
  if (!f.grace.empty()) s.run.grace_period = parse_flag_duration("--grace-period", f.grace);
  if (!f.name.empty()) s.name = f.name;
  if (!f.workdir.empty()) s.run.workdir = std::filesystem::absolute(f.workdir).lexically_normal().string();
  if (!f.ranks.empty()) s.logs.ranks = f.ranks;
  if (f.no_prefix) s.logs.prefix = "";
  if (f.timestamps) s.logs.timestamps = true;
  if (!f.ssh_config.empty()) s.ssh.config = f.ssh_config;
  if (f.ps && s.comm.mode != "ps") {
    s.comm.mode = "ps";
    s.origins["comm.mode"] = "--mode ps";
  }
  // A flag with a few words it may be (the CLI checks them too; this API may be called without it).
  auto one_of = [](const char* flag, const std::string& v, const std::vector<std::string>& ok,
                   const char* hint) {
    if (std::find(ok.begin(), ok.end(), v) == ok.end())
      throw Error(std::string(flag) + " '" + v + "': expected " + text::join(ok, ", "), hint,
                  exit_code::usage);
  };
  if (!f.launcher.empty()) {
    one_of("--launcher", f.launcher, {"auto", "ssh", "slurm"},
           "slurm starts each host's agent with srun inside an allocation");
    s.cluster.launcher = f.launcher;
    s.origins["cluster.launcher"] = "--launcher";
  }
  if (f.sync) {
    s.sync.reuse = !*f.sync && s.sync.enabled && f.workdir.empty();  // --workdir: that folder, as given
    s.sync.enabled = *f.sync;
    s.origins["sync.enabled"] = *f.sync ? "--sync" : "--no-sync";
  }
  if (!f.setup.empty()) {
    one_of("--setup", f.setup, {"auto", "always", "never"},
           "auto runs the setup when its command or the synced files changed");
    s.setup.mode = f.setup;
    s.origins["setup.when"] = "--setup";
  }
  if (f.accept_new_host_keys) {
    s.ssh.strict_host_keys = "accept-new";
    s.origins["ssh.strict_host_keys"] = "--accept-new-host-keys";
  }
}

// What validate can learn about a remote host without connecting: the name ssh would dial (the
// config's HostName) resolves. A host behind ProxyJump/ProxyCommand is resolved by the jump host,
// so it is skipped. Returns one line per host; `failures` gets the hosts that do not resolve.
std::vector<std::string> check_resolution(const plan::Plan& p, const spec::JobSpec& s,
                                          std::vector<std::string>& failures) {
  std::vector<std::string> lines;
  const std::string home = knobs::home.get();
  std::string config = transport::expand_home(s.ssh.config.empty() ? "~/.ssh/config" : s.ssh.config, home);
  transport::SshConfig cfg = transport::SshConfig::load(config, home);
  for (const auto& h : p.hosts) {
    if (h.local) continue;
    const std::string& name = h.host.name;
    std::string target = cfg.value(name, "hostname");
    if (target.empty()) target = name;
    std::string via = target == name ? "" : " (HostName " + target + " in " + config + ")";
    std::string jump = cfg.value(name, "proxyjump"), proxy = cfg.value(name, "proxycommand");
    if ((!jump.empty() && jump != "none") || (!proxy.empty() && proxy != "none")) {
      lines.push_back("  " + name + ": not resolved here: reached through " +
                      (jump.empty() ? "ProxyCommand" : "ProxyJump " + jump));
      continue;
    }
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int rc = ::getaddrinfo(target.c_str(), nullptr, &hints, &res);
    if (rc != 0 || !res) {
      failures.push_back(name + via + " (" + ::gai_strerror(rc) + ")");
      lines.push_back("  " + name + ": does not resolve" + via);
      continue;
    }
    char addr[NI_MAXHOST] = "?";
    ::getnameinfo(res->ai_addr, res->ai_addrlen, addr, sizeof addr, nullptr, 0, NI_NUMERICHOST);
    ::freeaddrinfo(res);
    lines.push_back("  " + name + ": resolves to " + addr + via);
  }
  return lines;
}

}  // namespace

spec::JobSpec resolve_spec(const JobRequest& req) {
  const auto& words = req.specs;
  const auto& profile = req.overrides.profile;
  if (words.size() > 1)
    throw Error("expected one job spec, got " + std::to_string(words.size()) + " words before '--'",
                "put the command after '--': mltrain run -n 4 -- " + text::join(words, " "));
  spec::JobSpec s;
  if (!words.empty()) {
    s = spec::load_file(words[0]);
    // "run job.toml --" with nothing after it keeps the spec's command.
    if (req.command && !req.command->empty()) {
      s.run.argv = *req.command;
      s.run.command.reset();
    }
    if (!profile.empty())
      throw Error("--profile applies to ad-hoc runs; the spec " + words[0] + " chooses its own",
                  "set 'profile = \"" + profile + "\"' in the spec");
  } else {
    if (!req.command || req.command->empty())
      throw Error("nothing to run",
                  "give a job spec (mltrain run job.toml) or a command (mltrain run -n 4 -- CMD ...)");
    s = spec::from_command(*req.command, profile);
  }
  apply_overrides(s, req.overrides, req.environ ? *req.environ : plan::current_environ());
  if (req.rerun) detail::adapt_for_rerun(s, *req.rerun, req.environ ? *req.environ : plan::current_environ());
  if (!req.sweep_trial.empty()) detail::apply_sweep_trial(s, req.sweep_trial);
  // exec's one word with more than a program name in it is a command line for the host's shell,
  // as ssh and pdsh run one ('cd ~/proj && git pull').
  if (req.exec && !s.run.command && s.run.argv.size() == 1 &&
      s.run.argv[0].find_first_not_of(
          "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./+,:@%") != std::string::npos) {
    s.run.command = s.run.argv[0];
    s.run.argv.clear();
  }
  spec::check(s);
  if (!s.logs.ranks.empty() && !text::parse_int_list(s.logs.ranks))
    throw Error("--ranks '" + s.logs.ranks + "' is not a rank list", "write ranks like 0,3-5");
  return s;
}

namespace detail {

std::string random_token() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + i * 8, 9, "%08x", unsigned(rd()));
  return buf;
}

plan::Inputs plan_inputs(const JobRequest& req, std::string run_id, std::string token, Ports ports) {
  plan::Inputs in;
  in.environ = req.environ ? *req.environ : plan::current_environ();
  in.cwd = req.cwd ? *req.cwd : std::filesystem::current_path().string();
  in.run_id = std::move(run_id);
  in.token = std::move(token);
  if (ports == Ports::free) {
    in.free_port = plan::find_free_port;
  } else {
    auto next = std::make_shared<int>(29500);
    in.free_port = [next] { return (*next)++; };
  }
  return in;
}

HostTransports::HostTransports(const spec::JobSpec& s) {
  local_ = transport::make_local_transport();
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
  ssh_ = transport::make_ssh_transport(so);
  slurm_ = transport::make_slurm_transport({});
  for_host_ = [this](const plan::HostPlan& h) -> transport::Transport& {
    return h.via_slurm ? *slurm_ : h.local ? *local_ : *ssh_;
  };
}

}  // namespace detail

Validation validate(const JobRequest& req) {
  if (req.specs.empty() && !req.command)
    throw Error("validate needs a job spec or a command",
                "mltrain validate job.toml, or mltrain validate -n 2 -- CMD");
  spec::JobSpec s = resolve_spec(req);
  Validation v;
  v.plan = plan::make_plan(s, detail::plan_inputs(req, "validate", "validate", detail::Ports::placeholder));
  std::vector<std::string> hosts;
  for (const auto& h : v.plan.hosts)
    hosts.push_back(h.host.name + "(" +
                    (h.spare           ? std::string("spare")
                     : h.ranks.empty() ? std::string("server")
                                       : std::to_string(h.ranks.size())) +
                    ")");
  size_t n = v.plan.ranks.size();
  std::string what = req.specs.empty() ? std::string("command") : req.specs[0];
  std::vector<std::string> failures;
  auto lines = check_resolution(v.plan, s, failures);
  if (!failures.empty())
    throw Error(
        what + ": " + (failures.size() == 1 ? "host " : "hosts ") + text::join(failures, ", ") +
            (failures.size() == 1 ? " does not resolve" : " do not resolve"),
        "check the name in -H, the hostfile or [cluster] hosts, or give it a HostName in the ssh config",
        exit_code::host_failure);
  v.summary =
      what + ": ok: " + std::to_string(n) + " rank" + (n == 1 ? "" : "s") + " on " + text::join(hosts, ", ");
  if (v.plan.ps_mode) v.summary += "; ps: " + describe_ps(v.plan);
  if (s.sweep.present) {
    const size_t trials = detail::check_sweep(s, what);
    v.summary += "; sweep: " + std::to_string(trials) + (trials == 1 ? " trial" : " trials") + ", at most " +
                 std::to_string(s.sweep.max_parallel) + " at once (mltrain sweep " + what + ")";
  }
  if (!lines.empty()) {
    v.summary += "\n" + text::join(lines, "\n");
    v.summary += "\nnot checked: connecting, host keys, login, the agent, GPUs, Python (run `mltrain doctor" +
                 (req.specs.empty() ? std::string() : " " + req.specs[0]) + "` for those)";
  }
  return v;
}

plan::Plan dry_run(const JobRequest& req) {
  spec::JobSpec s = resolve_spec(req);
  plan::Plan p =
      plan::make_plan(s, detail::plan_inputs(req, "dry-run", detail::random_token(), detail::Ports::free));
  if (auto sp = detail::plan_sync(s, req))
    p.workdir = detail::synced_workdir(s, *sp);
  else if (s.sync.reuse && !req.exec)
    p.workdir = detail::synced_workdir(s, detail::sync_folders(s, req));
  return p;
}

std::string describe_sync(const JobRequest& req) {
  spec::JobSpec s = resolve_spec(req);
  std::string out;
  if (auto sp = detail::plan_sync(s, req)) {
    char size[32];
    std::snprintf(size, sizeof size, "%.1f MiB", double(sp->tree.bytes) / (1 << 20));
    out += "sync:    " + sp->src + " -> " + sp->remote + " on every host (" + std::to_string(sp->tree.files) +
           " files, " + size + (sp->tree.git ? ", as git lists them" : "") + ")\n";
    if (!s.sync.pull.empty())
      out += "pull:    " + text::join(s.sync.pull, " ") + " from " +
             (s.sync.pull_from == "rank0" ? "rank 0's host" : "every host") + " into the run's folder\n";
  }
  if (!s.setup.command.empty())
    out += "setup:   " + s.setup.command + " (" +
           (s.setup.mode != "auto" ? s.setup.mode
            : s.setup.inputs.empty()
                ? std::string("when it or the synced files changed")
                : "when it or its inputs (" + text::join(s.setup.inputs, ", ") + ") changed") +
           ")\n";
  return out;
}

std::string describe_ps(const plan::Plan& p) {
  // Where the servers run: "h3, h4 (2 each)", or "a(2), b(1)" when the counts differ.
  std::vector<std::string> names, counted;
  int first = -1;
  bool even = true;
  for (const auto& h : p.hosts) {
    if (h.ps_servers == 0) continue;
    if (first < 0) first = h.ps_servers;
    even = even && h.ps_servers == first;
    names.push_back(h.host.name);
    counted.push_back(h.host.name + "(" + std::to_string(h.ps_servers) + ")");
  }
  std::string where =
      even ? text::join(names, ", ") + (first > 1 ? " (" + std::to_string(first) + " each)" : "")
           : text::join(counted, ", ");
  std::string out =
      std::to_string(p.ps.servers) + " server" + (p.ps.servers == 1 ? "" : "s") + " on " + where + ", ";
  if (p.ps.sync) {
    out += "sync";
  } else if (p.ps.optimizer.empty()) {
    out += "async, no optimizer (a push is added to the value)";
  } else {
    auto num = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    out += "async, optimizer " + p.ps.optimizer + " lr=" + num(p.ps.lr) + " momentum=" + num(p.ps.momentum);
    if (p.ps.weight_decay > 0) out += " weight_decay=" + num(p.ps.weight_decay);
  }
  uint64_t b = p.ps.partition_bytes;
  std::string size = b % (1u << 30) == 0   ? std::to_string(b >> 30) + " GiB"
                     : b % (1u << 20) == 0 ? std::to_string(b >> 20) + " MiB"
                     : b % (1u << 10) == 0 ? std::to_string(b >> 10) + " KiB"
                                           : std::to_string(b) + " bytes";
  return out + ", partition " + size;
}

std::string describe_plan(const plan::Plan& p) {
  std::string out;
  auto plural = [](size_t n, const char* what) {
    return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
  };
  size_t server_only = 0, spares = 0;
  for (const auto& h : p.hosts) (h.spare ? spares : server_only) += h.ranks.empty() ? 1 : 0;
  out += "run " + p.name + ": " + plural(p.ranks.size(), "rank") + " on " +
         plural(p.hosts.size() - server_only - spares, "host") +
         (server_only ? " + " + plural(server_only, "server-only host") : std::string()) +
         (spares ? " + " + plural(spares, "spare") : std::string()) + "\n";
  if (p.elastic())
    out += "elastic: a restart goes on without a lost host while " + std::to_string(p.min_hosts) + " remain" +
           (spares ? ", a spare in its place" : "") + " (docs/elastic.md)\n";
  std::vector<std::string> argv;
  for (const auto& a : p.argv) argv.push_back(text::shell_quote(a));
  out += "command: " + text::join(argv, " ") + "\nworkdir: " + p.workdir + "\nmaster:  " + p.master_addr +
         ":" + std::to_string(p.master_port) + "   store: " + p.store_addr + "\n";
  // What the agent adds to each rank's environment on its host (runner/agent/spawn.cpp).
  out += std::string("runtime: the agent sets MLTRAIN_RUNTIME and MLTRAIN_COMM_LIB") +
         (p.python_path ? " and puts the mltrain package first on PYTHONPATH\n"
                        : "; PYTHONPATH left alone ([run] python_path = false)\n");
  if (p.gpus_per_proc > 0 || p.procs_per_gpu > 0)
    out += std::string("gpus:    [gpus] ") +
           (p.gpus_per_proc > 0 ? "per_proc = " + std::to_string(p.gpus_per_proc)
                                : "procs_per_gpu = " + std::to_string(p.procs_per_gpu)) +
           " is checked against each host's GPU inventory at launch (NVML, else nvidia-smi; a\n"
           "         CUDA_VISIBLE_DEVICES set there limits it); the CUDA_VISIBLE_DEVICES below assume\n"
           "         every GPU usable, and each rank gets its own among the usable ones\n";
  if (p.ps_mode)
    out += "ps:      " + describe_ps(p) +
           "\n         the servers run in the hosts' agents; MLTRAIN_PS_SERVERS is set at launch, when they "
           "listen\n";
  for (const auto& h : p.hosts) {
    if (h.spare) {
      out += "\nhost " + h.host.name + " (spare" + std::string(h.local ? ", local" : "") +
             "): no rank until it takes a lost host's place\n";
      continue;
    }
    if (h.ranks.empty()) {
      out += "\nhost " + h.host.name + " (server only" + (h.local ? ", local" : "") +
             "): ps servers: " + std::to_string(h.ps_servers) + "\n";
      continue;
    }
    out += "\nhost " + h.host.name + " (node " + std::to_string(h.node_rank) + (h.local ? ", local" : "") +
           "): ranks";
    for (int r : h.ranks) out += " " + std::to_string(r);
    if (h.ps_servers) out += "; ps servers: " + std::to_string(h.ps_servers);
    out += "\n";
    for (int r : h.ranks) {
      out += "  rank " + std::to_string(r) + ":";
      for (const auto& [k, v] : plan::rank_env(p, p.runtime, r))
        out +=
            " " + k + "=" + (secret::is_secret_name(k) ? std::string(secret::kShown) : text::shell_quote(v));
      out += "\n";
    }
  }
  return out;
}

namespace detail {
HostTransports& lasting_transports(const spec::JobSpec& s) {
  // Kept from a static that is never destroyed: reachable to the end, so a leak checker (the ASan
  // e2e tests) sees they are kept on purpose, and no exit-time destructor runs under a connection.
  static std::mutex lock;
  static auto* kept = new std::vector<std::unique_ptr<HostTransports>>;
  std::lock_guard<std::mutex> hold(lock);
  kept->push_back(std::make_unique<HostTransports>(s));
  return *kept->back();
}
}  // namespace detail

DoctorResult doctor(const JobRequest& req) {
  JobRequest r = req;
  // Without a spec or a command doctor checks hosts alone; a spec's program names the interpreter.
  if (!r.command && r.specs.empty()) r.command = std::vector<std::string>{"true"};
  spec::JobSpec s = resolve_spec(r);
  plan::Plan p = plan::make_plan(s, detail::plan_inputs(r, "doctor", "doctor", detail::Ports::placeholder));
  // The ranks' folder as a run would give it: with [sync], the synced one (not listed here).
  if (s.sync.enabled || s.sync.reuse) p.workdir = detail::synced_workdir(s, detail::sync_folders(s, r));
  DoctorResult d;
  d.exit_code =
      supervise::run_doctor(p, detail::supervise_defaults(), detail::lasting_transports(s).for_host(),
                            s.comm.master_port, d.reports);
  for (const auto& rep : d.reports)
    if (!rep.ok && d.exit_code == 0) d.exit_code = exit_code::host_failure;
  return d;
}

namespace {

// The hosts of a request that runs nothing on them (queue, gc --hosts): a plan of `true`.
std::pair<spec::JobSpec, plan::Plan> hosts_only(const JobRequest& req, const char* what) {
  JobRequest r = req;
  if (!r.command && r.specs.empty()) r.command = std::vector<std::string>{"true"};
  spec::JobSpec s = resolve_spec(r);
  plan::Plan p = plan::make_plan(s, detail::plan_inputs(r, what, what, detail::Ports::placeholder));
  return {std::move(s), std::move(p)};
}

}  // namespace

GcHostsResult gc_hosts(const JobRequest& req, std::chrono::seconds older_than, bool dry_run) {
  auto [s, p] = hosts_only(req, "gc");
  GcHostsResult g;
  g.exit_code =
      supervise::run_gc_hosts(p, detail::supervise_defaults(), detail::lasting_transports(s).for_host(),
                              older_than, dry_run, g.hosts);
  for (const auto& h : g.hosts)
    if (!h.ok && g.exit_code == 0) g.exit_code = exit_code::host_failure;
  return g;
}

QueueResult queue(const JobRequest& req) {
  auto [s, p] = hosts_only(req, "queue");
  std::string space;
  try {
    space = knobs::mltrain_lease_space.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "unset it, or set it as `mltrain knobs` says", exit_code::usage);
  }
  QueueResult q;
  q.exit_code =
      supervise::run_queue(p, detail::supervise_defaults(), detail::lasting_transports(s).for_host(), space,
                           knobs::library_setting(knobs::GpuLibrary::nvml, p.nvml_library), q.hosts);
  for (const auto& h : q.hosts)
    if (!h.ok && q.exit_code == 0) q.exit_code = exit_code::host_failure;
  return q;
}

}  // namespace mltrain::launch
