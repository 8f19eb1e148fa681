// launch::run: the run record, the git commit, detaching (after preflight), the transports, then
// the supervisor.
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/state_home.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/lease/claim.h"
#include "runner/supervise/supervisor.h"
#include "runner/sync/manifest.h"
#include "runner/tree/hash.h"

namespace mltrain::launch {

namespace {

// The commit checked out in the ranks' working directory, or "" when it is not a git tree.
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

// `commit`: git_commit() of the synced folder or the workdir, found once.
records::RunRecord new_record(const spec::JobSpec& s, const plan::Plan& p, const std::string& commit) {
  records::RunRecord rec;
  rec.id = p.run_id;
  rec.name = s.name;
  rec.spec_file = s.source.empty() ? "" : std::filesystem::absolute(s.source).string();
  spec::JobSpec shown = s;  // the record shows secret values as <secret>; ranks get the real ones
  for (auto& [k, v] : shown.run.env) v = secret::shown_value(k, v);
  rec.spec_toml = spec::to_toml(shown);
  rec.max_restarts = s.run.max_restarts;
  rec.started_at = records::now_iso8601();
  rec.git_commit = commit;
  records::fill_from_plan(rec, p);
  return rec;
}

supervise::Options supervise_options(const spec::JobSpec& s, const JobRequest& req) {
  supervise::Options o = detail::supervise_defaults();
  o.grace = s.run.grace_period;
  o.timeout = s.run.timeout;
  o.max_restarts = s.run.max_restarts;
  o.json_summary = req.json;
  o.console_fd = req.json ? 2 : 1;  // with --json, stdout carries the summary alone
  o.console.color = req.color;
  o.console.timestamps = s.logs.timestamps;
  o.console.prefix = s.logs.prefix;
  o.stdin_rank = req.overrides.stdin_rank;
  o.metric_patterns = s.metrics.patterns;
  if (!s.logs.ranks.empty()) {
    auto list = text::parse_int_list(s.logs.ranks);
    o.console.ranks = std::set<int>(list->begin(), list->end());
  }
  return o;
}

// What the job claims of its hosts (docs/sharing.md): its GPUs, the hosts alone when exclusive, a
// place in their queue with --queue; and what it says of itself to whoever looks (`mltrain queue`).
supervise::ClaimJob claims_for(const spec::JobSpec& s, const plan::Plan& p, const std::string& run_key) {
  supervise::ClaimJob c;
  c.queue = s.cluster.queue;
  c.queue_timeout = s.cluster.queue_timeout;
  c.exclusive = s.cluster.exclusive;
  try {
    c.space = knobs::mltrain_lease_space.get();
    c.retry = knobs::mltrain_queue_retry.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "unset it, or set it as `mltrain knobs` says", exit_code::usage);
  }
  if (!lease::valid_space(c.space))
    throw Error("MLTRAIN_LEASE_SPACE='" + text::host_text(c.space, 40) + "' is not a lease space",
                "use at most 32 of a-z, 0-9 and -, or unset it", exit_code::usage);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  c.order_key = run_key;
  std::string user = std::to_string(::geteuid());
  if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  std::vector<std::string> names;
  for (const auto& h : p.hosts) names.push_back(h.host.name);
  c.info = {"run=" + p.run_id, "user=" + user, "launcher=" + std::string(host),
            "since=" + std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now).count()),
            "hosts=" + text::compact_names(names)};
  return c;
}

// mltrain's own error as main prints it, for the run's folder (shown by `logs`).
std::string error_text(const Error& e) {
  std::string t = "mltrain: error: " + std::string(e.what()) + "\n";
  if (!e.hint().empty()) t += "mltrain: hint: " + e.hint() + "\n";
  return t;
}

// The detached launcher tells the command that forked it how the start went, over a pipe:
// "R" once every host passed preflight and the ranks were sent to start, "Q" and the waiting line
// once the job waits in the hosts' queue (it starts by itself later), or "E" with the exit
// code, the error and its hint (NUL-separated) when the run failed before that. EOF without
// either: the launcher died or the run ended (a signal) before it started.
void write_all(int fd, const std::string& bytes) {
  for (size_t off = 0; off < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the waiting command is gone: nobody to tell
    off += size_t(n);
  }
}

[[noreturn]] void fail_in_child(int report_fd, const std::string& run_id, const Error& e) {
  std::string text = error_text(e);
  records::end_with_launcher_error(run_id, e.code(), e.what(), text);
  write_all(2, text);
  if (report_fd >= 0)
    write_all(report_fd, "E" + std::to_string(e.code()) + '\0' + e.what() + '\0' + e.hint());
  ::_exit(e.code());
}

// In the detached child: its own session, stdin from /dev/null, its console into console.log.
// Throws Error when one of the steps fails.
void become_background_launcher(const std::string& run_id) {
  auto failed = [](const std::string& what) {
    return Error("cannot detach the launcher: " + what + ": " + std::strerror(errno),
                 "run without --detach, or check the state folder (MLTRAIN_HOME)", exit_code::internal);
  };
  if (::setsid() < 0) throw failed("setsid");
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull < 0) throw failed("open /dev/null");
  std::string console = records::run_dir(run_id) + "/console.log";
  int cfd = ::open(console.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (cfd < 0) throw failed("open " + console);
  if (::dup2(devnull, 0) < 0) throw failed("dup2 of stdin");
  if (::dup2(cfd, 1) < 0 || ::dup2(cfd, 2) < 0) throw failed("dup2 of " + console);
  ::close(devnull);
  ::close(cfd);
}

// The forking command's side: waits until the detached launcher reports, then returns (started)
// or throws the launcher's error with its exit code (the record says the same).
volatile sig_atomic_t g_waiting_signal = 0;
void note_signal(int sig) { g_waiting_signal = sig; }

void await_background_start(int report_fd, pid_t child, const JobRequest& req, RunResult& result) {
  // Ctrl-C (or SIGTERM, SIGHUP) while waiting is meant for the run: the launcher is in its own
  // session, so pass the signal on; it ends the run before any rank starts and reports how.
  struct sigaction sa {
  }, old[3];
  sa.sa_handler = note_signal;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], &sa, &old[i]);
  int forwarded = 0;
  std::string got;
  char buf[4096];
  while (true) {
    ssize_t n = ::read(report_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) {
      if (int sig = g_waiting_signal; sig != 0) {
        g_waiting_signal = 0;
        ::kill(child, sig);
        forwarded = sig;
      }
      continue;
    }
    if (n <= 0) break;
    got.append(buf, size_t(n));
    if (got == "R") break;
  }
  ::close(report_fd);
  const bool started = got == "R" || (!got.empty() && got[0] == 'Q');
  int status = 0;
  if (!started)
    while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
  for (int i = 0; i < 3; ++i) ::sigaction(sigs[i], &old[i], nullptr);
  if (!got.empty() && got[0] == 'Q') result.queued = text::host_text(got.substr(1), 400);
  if (started) return;
  int code = exit_code_of(status);
  std::string message, hint;
  if (!got.empty() && got[0] == 'E') {
    auto parts = text::split(got.substr(1), '\0');
    if (parts.size() >= 2) message = parts[1];
    if (parts.size() >= 3) hint = parts[2];
  }
  if (message.empty() && forwarded) {
    message = "run " + result.run_id + ": stopped by " + signal_name(forwarded) + " before it started";
    hint = "no rank was started";
  } else if (message.empty()) {
    message = "run " + result.run_id + ": the background launcher ended (" + describe_status(status) +
              ") before the run started";
    hint = "see mltrain logs " + result.run_id;
  }
  if (req.json) {
    try {
      std::printf("%s\n", records::to_json(records::load(result.run_id), true).c_str());
      std::fflush(stdout);
    } catch (const Error&) {
      // No record to print: the error below says why.
    }
  }
  throw Error(message, hint, code);
}

}  // namespace

namespace detail {

// The hosts' folder for a project: named after the folder, keyed by who syncs it from where
// (user@machine:path), so two projects never share one, whatever their job names or programs.
std::string project_work_dir(const std::string& src) {
  std::string user = std::to_string(::geteuid());
  if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) host[0] = 0;
  std::string base = std::filesystem::path(src).filename().string();
  base = spec::derived_name(base.empty() ? "root" : base);
  if (base.size() > 40) base.resize(40);
  return "~/.cache/mltrain/work/" + base + "-" + sync::hash_hex(user + '@' + host + ':' + src).substr(0, 8);
}

SyncPlan sync_folders(const spec::JobSpec& s, const JobRequest& req) {
  namespace fs = std::filesystem;
  SyncPlan sp;
  std::string cwd = req.cwd.value_or(fs::current_path().string());
  sp.src = !s.sync.src.empty() ? s.sync.src
           : !s.source.empty() ? fs::absolute(s.source).parent_path().string()
                               : cwd;
  sp.src = fs::absolute(sp.src).lexically_normal().string();
  while (sp.src.size() > 1 && sp.src.back() == '/') sp.src.pop_back();
  sp.remote = s.sync.remote_dir.empty() ? project_work_dir(sp.src) : s.sync.remote_dir;
  return sp;
}

std::optional<SyncPlan> plan_sync(const spec::JobSpec& s, const JobRequest& req) {
  // exec syncs only when asked (--sync): it is for quick looks at the hosts.
  if (!s.sync.enabled || (req.exec && req.overrides.sync != true)) return std::nullopt;
  SyncPlan sp = sync_folders(s, req);
  sync::TreeOptions to;
  to.root = sp.src;
  to.exclude = s.sync.exclude;
  for (const auto& f : s.sync.files) to.files.push_back({f.src, f.dst, f.origin});
  try {  // a cache of the files' hashes; without it every launch reads the whole tree
    make_private_dirs(state_home() + "/sync");
    to.cache_file = state_home() + "/sync/" + sync::hash_hex(sp.src + '\0' + sp.remote) + ".hashes";
  } catch (const Error&) {
  }
  sp.tree = sync::build_tree(to);
  return sp;
}

std::string synced_workdir(const spec::JobSpec& s, const SyncPlan& sp) {
  if (s.run.workdir.empty()) return sp.remote;
  std::string wd = std::filesystem::path(s.run.workdir).lexically_normal().string();
  while (wd.size() > 1 && wd.back() == '/') wd.pop_back();
  if (wd == sp.src) return sp.remote;
  if (wd.rfind(sp.src + "/", 0) == 0) return sp.remote + wd.substr(sp.src.size());
  return s.run.workdir;  // elsewhere: a path on the hosts
}

}  // namespace detail

namespace {

// `mltrain exec`: one rank per host, each line named by its host; no restarts, no PS servers.
void adapt_for_exec(spec::JobSpec& s, const JobRequest& req) {
  s.cluster.procs_per_host = 1;
  s.cluster.nprocs = 0;
  s.run.max_restarts = 0;
  s.cluster.min_hosts = 0;  // nor an elastic gang's spares
  s.cluster.spares.clear();
  if (!req.overrides.no_prefix) s.logs.prefix = "[{host}]";
  // A one-off command starts no parameter servers (and server-only hosts run no rank).
  s.comm.mode = "allreduce";
  s.ps = {};
}

// A sweep's trial: its run id where the sweep looks for it (<state home>/sweeps/SWEEP/trial-N.run).
void note_sweep_trial(const std::string& trial, const std::string& run_id) {
  const size_t slash = trial.find('/');
  const std::string path =
      state_home() + "/sweeps/" + trial.substr(0, slash) + "/trial-" + trial.substr(slash + 1) + ".run";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || ::write(fd, run_id.data(), run_id.size()) != ssize_t(run_id.size()))
    std::fprintf(stderr, "mltrain: warning: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
  if (fd >= 0) ::close(fd);
}

// What the planner says of a job before its run exists.
struct Pending {
  std::chrono::milliseconds telemetry_interval{0};
  bool all_local = false;  // every host is this machine
  std::string workdir;     // the ranks' folder, as planned (before a sync moves it)
};

// What can be wrong before a run exists (a bad knob, --stdin past the ranks): said before anything
// is recorded.
Pending check_before_run(const spec::JobSpec& s, const JobRequest& req, const std::string& token) {
  std::chrono::milliseconds telemetry_interval{0};
  try {
    telemetry_interval = knobs::mltrain_telemetry_interval.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "set it like 1s or 500ms, or to 0 for no telemetry");
  }
  detail::supervise_defaults();  // the heartbeat knobs too: checked before there is a run
  // Plan before creating the record, so a bad host list leaves no empty run behind.
  const plan::Plan pending =
      plan::make_plan(s, detail::plan_inputs(req, "pending", token, detail::Ports::free));
  const size_t nranks = pending.ranks.size();
  if (const int in = req.overrides.stdin_rank; in >= 0) {
    if (req.detach)
      throw Error("--stdin cannot be used with --detach: a detached job has no terminal to read",
                  "drop --detach, or feed the rank from a file inside its command", exit_code::usage);
    if (size_t(in) >= nranks)
      throw Error("--stdin-rank " + std::to_string(in) + ": the job has " + std::to_string(nranks) + " rank" +
                      (nranks == 1 ? "" : "s") + " (0.." + std::to_string(nranks - 1) + ")",
                  "pick a rank in that range", exit_code::usage);
  }
  const bool all_local =
      std::all_of(pending.hosts.begin(), pending.hosts.end(), [](const auto& h) { return h.local; });
  return {telemetry_interval, all_local, pending.workdir};
}

// Every secret's value the launcher knows: the spec's and the environment's secret-named variables.
std::vector<std::string> secret_values(const spec::JobSpec& s, const JobRequest& req) {
  std::vector<std::string> out;
  for (const auto& [k, v] : s.run.env)
    if (secret::is_secret_name(k)) out.push_back(v);
  for (const auto& [k, v] : req.environ ? *req.environ : plan::current_environ())
    if (secret::is_secret_name(k)) out.push_back(v);
  return out;
}

// A workdir with more files and folders than this is not listed for the run's record.
constexpr size_t kMaxWorkdirEntries = 20000;

// The run's code: a tree's manifest in the run's folder and its contents in the store. A store
// that cannot be written is a warning: the run goes on without its code kept.
records::CodeSummary keep_tree(const sync::Tree& tree, const std::string& root, bool git,
                               const spec::JobSpec& s, const JobRequest& req, const std::string& run_id) {
  std::vector<records::CodeEntry> entries;
  entries.reserve(tree.entries.size());
  for (size_t i = 0; i < tree.entries.size(); ++i) {
    const auto& e = tree.entries[i];
    entries.push_back(
        {e.path, e.kind, e.mode, e.size, e.hash.empty() ? "" : sync::hex(e.hash), e.target, tree.sources[i]});
  }
  records::CodeOptions o;
  o.root = root;
  o.max_bytes = s.record.code_max;
  o.secrets = secret_values(s, req);
  o.git = git;
  try {
    return records::keep_code(run_id, entries, o);
  } catch (const Error& e) {
    std::fprintf(stderr, "mltrain: warning: the run's code was not kept: %s\n", e.what());
    records::CodeSummary none;
    none.skipped = e.what();
    return none;
  }
}

// What a run keeps of its code, before any port is chosen for it (listing and storing a tree takes
// time, and a free port the planner found stays free only while nothing else takes it): a run that
// syncs keeps the tree it syncs; a run on this machine alone without [sync] keeps its workdir,
// listed as a sync would list it, when that is a project's size (not a home folder). `git`: the
// commit of the synced folder or workdir ("" none).
records::CodeSummary keep_run_code(const spec::JobSpec& s, const JobRequest& req, const Pending& pending,
                                   const std::optional<detail::SyncPlan>& sp, const std::string& run_id,
                                   const std::string& git) {
  if (!s.record.code || req.exec) return {};
  // A rerun's tree is the run's, restored: its origin and commit are the run's.
  if (sp)
    return keep_tree(sp->tree, req.rerun ? req.rerun->root : sp->src, !git.empty() && !req.rerun, s, req,
                     run_id);
  if (!pending.all_local || s.sync.reuse || pending.workdir.empty()) return {};
  sync::TreeOptions to;
  to.root = std::filesystem::absolute(pending.workdir).lexically_normal().string();
  to.max_entries = kMaxWorkdirEntries;
  to.max_bytes = s.record.code_max;
  // Never the state folder itself (the records and the store), wherever it lies.
  const std::string home = std::filesystem::absolute(state_home()).lexically_normal().string();
  if (home == to.root || to.root.rfind(home + "/", 0) == 0) return {};
  if (home.rfind(to.root + "/", 0) == 0) to.exclude.push_back("/" + home.substr(to.root.size() + 1) + "/");
  records::CodeSummary skipped;
  skipped.recorded = true;
  try {
    make_private_dirs(state_home() + "/sync");
    to.cache_file = state_home() + "/sync/" + sync::hash_hex(to.root + "|workdir") + ".hashes";
    return keep_tree(sync::build_tree(to), to.root, !git.empty(), s, req, run_id);
  } catch (const sync::TooLarge& e) {
    skipped.skipped = "the workdir " + to.root + " is not a project's size: " + e.what() +
                      " (sync a project folder with [sync] to keep its code)";
  } catch (const Error& e) {
    skipped.skipped = "the workdir " + to.root + " could not be listed: " + e.what();
  }
  return skipped;
}

// The run's record, saved: it must be writable before anything starts (a full or read-only state
// folder is a clean error here, not a cut record later, and leaves no empty run folder behind).
records::RunRecord first_record(const spec::JobSpec& s, const plan::Plan& p, const JobRequest& req,
                                const std::string& commit, records::CodeSummary code) {
  records::RunRecord rec = new_record(s, p, commit);
  if (p.slurm) {
    auto env = req.environ ? *req.environ : plan::current_environ();
    if (const std::string* id = knobs::slurm_job_id.in(env)) rec.slurm_job_id = *id;
  }
  if (req.rerun) rec.rerun_of = req.rerun->of, rec.git_commit = req.rerun->git_commit;
  if (const size_t slash = req.sweep_trial.find('/'); slash != std::string::npos) {
    rec.sweep_id = req.sweep_trial.substr(0, slash);
    rec.sweep_trial = std::atoi(req.sweep_trial.c_str() + slash + 1);
  }
  rec.kind = req.exec ? "exec" : "run";
  rec.code = std::move(code);
  // Whose it is, from the first save on: a record without its launcher reads as lost (a sweep
  // resumed at that moment ran the trial again beside itself).
  rec.launcher_pid = ::getpid();
  rec.launcher_start = records::process_start_time(rec.launcher_pid);
  // `ssh` and `cp` reach the hosts again the way this run did, however it was given its config.
  if (!s.ssh.config.empty()) {
    const std::string home = knobs::home.get();
    std::string config = s.ssh.config;
    if (config.rfind("~/", 0) == 0 && !home.empty()) config = home + config.substr(1);
    rec.ssh_config = std::filesystem::absolute(config).lexically_normal().string();
  }
  if (!records::save(rec)) {
    std::error_code ec;
    std::filesystem::remove_all(records::run_dir(rec.id), ec);
    throw Error("cannot write the run's record in " + records::runs_dir(),
                "free some space there, or set MLTRAIN_HOME to a writable folder", exit_code::state);
  }
  return rec;
}

// Code missing on a host: how it gets there.
std::string workdir_hint(const spec::JobSpec& s, const plan::Plan& p, const JobRequest& req,
                         const std::optional<detail::SyncPlan>& sp) {
  if (s.sync.reuse && !req.exec)
    return "--no-sync runs the ranks in the folder the last sync made (" + p.workdir +
           "); run once without --no-sync to sync it";
  if (!sp && !p.workdir.empty() &&
      std::any_of(p.hosts.begin(), p.hosts.end(), [](const auto& h) { return !h.local; }))
    return std::string("the hosts do not have this folder: ") +
           (s.source.empty() ? "--sync copies it to every host before the ranks start"
                             : "add a [sync] table to " + s.source +
                                   " (or pass --sync) to copy it to every host before the ranks start") +
           " (docs/sync.md), or give a workdir every host has";
  return {};
}

supervise::SyncJob sync_job(const detail::SyncPlan& sp, const std::string& run_key) {
  const std::string home = knobs::home.get();
  std::string shown = sp.src;
  if (!home.empty() && shown.rfind(home + "/", 0) == 0) shown = "~" + shown.substr(home.size());
  supervise::SyncJob job;
  job.tree = &sp.tree;
  job.dir = sp.remote;
  job.shown = shown;
  job.run_key = run_key;
  try {
    job.warn_bytes = knobs::mltrain_sync_warn_bytes.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "set it like 100M", exit_code::usage);
  }
  return job;
}

supervise::SetupJob setup_job(const spec::JobSpec& s, const plan::Plan& p,
                              const std::optional<detail::SyncPlan>& sp) {
  supervise::SetupJob job;
  job.command = s.setup.command;
  job.cwd = sp ? sp->remote : p.workdir;
  for (const auto& [k, v] : s.run.env) job.env.push_back(k + "=" + v);
  job.env.push_back("MLTRAIN_RUN_ID=" + p.run_id);  // so the agent's warden finds its strays
  // What decides whether it runs again: the command, the folder and the synced files (only
  // those [setup] inputs names, when it names some).
  std::string files = sp ? sp->tree.digest : std::string();
  if (sp && !s.setup.inputs.empty()) {
    size_t matched = 0;
    files = sync::digest_of(sp->tree, s.setup.inputs, &matched);
    if (matched == 0)
      std::fprintf(stderr,
                   "mltrain: warning: [setup] inputs (%s) match no synced file; the setup runs again only "
                   "when its command changes\n",
                   text::join(s.setup.inputs, ", ").c_str());
  }
  std::string key = job.command;
  key += '\0' + job.cwd + '\0' + files;
  job.key = sync::hash_hex(key);
  job.force = s.setup.mode == "always";
  return job;
}

supervise::PullJob pull_job(const spec::JobSpec& s, const plan::Plan& p, const detail::SyncPlan& sp) {
  supervise::PullJob job;
  job.dir = sp.remote;
  job.patterns = s.sync.pull;
  job.dest = records::run_dir(p.run_id) + "/pulled";
  job.per_host_folders = s.sync.pull_from == "all";
  detail::pull_limits(job);
  if (job.per_host_folders) {
    for (size_t i = 0; i < p.hosts.size(); ++i)
      if (!p.hosts[i].ranks.empty()) job.hosts.push_back(i);  // a server-only host runs no program
  } else {
    job.hosts.push_back(size_t(p.ranks[0].host));
  }
  return job;
}

// Everything the supervisor is told for this run.
supervise::Options run_options(const spec::JobSpec& s, const plan::Plan& p, const JobRequest& req,
                               const std::optional<detail::SyncPlan>& sp,
                               std::chrono::milliseconds telemetry) {
  supervise::Options o = supervise_options(s, req);
  o.telemetry_interval = req.exec ? std::chrono::milliseconds(0) : telemetry;
  o.fail_fast = !req.exec;
  // When the run started, then its id: the order of its place in the hosts' queue, and of its
  // hold on the synced folders (an earlier run's folder is left to it).
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const std::string run_key =
      lease::order_key(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(), p.run_id);
  if (!req.exec) o.claims = claims_for(s, p, run_key);
  o.workdir_hint = workdir_hint(s, p, req, sp);
  if (sp) o.sync = sync_job(*sp, run_key);
  if (!s.setup.command.empty() && s.setup.mode != "never" && !req.exec) o.setup = setup_job(s, p, sp);
  if (sp && !s.sync.pull.empty() && !req.exec) o.pull = pull_job(s, p, *sp);
  return o;
}

// --detach: the launcher goes on in a child of its own; this process returns once the ranks
// started (or the run failed before that).
RunResult run_detached(const spec::JobSpec& s, plan::Plan& p, const JobRequest& req, supervise::Options& o,
                       RunResult result) {
  records::RunRecord& rec = result.record;
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0)
    throw Error(std::string("pipe2: ") + std::strerror(errno), {}, exit_code::internal);
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(report[0]);
    ::close(report[1]);
    throw Error(std::string("cannot detach the launcher: fork: ") + std::strerror(e),
                "run without --detach, or free some memory or processes", exit_code::internal);
  }
  rec.detached = true;
  if (pid > 0) {
    ::close(report[1]);
    result.detached = true;
    result.launcher_pid = int(pid);
    rec.launcher_pid = result.launcher_pid;
    await_background_start(report[0], pid, req, result);
    return result;
  }
  ::close(report[0]);
  int report_fd = report[1];
  try {
    become_background_launcher(rec.id);
  } catch (const Error& e) {
    fail_in_child(report_fd, rec.id, e);
  }
  o.console.color = false;
  o.json_summary = false;
  o.on_running = [&report_fd] {
    if (report_fd < 0) return;  // it returned when the job took its place in the queue
    write_all(report_fd, "R");
    ::close(report_fd);
    report_fd = -1;  // the command has returned: later errors go to console.log and the record
  };
  o.on_queued = [&report_fd](const std::string& status) {
    write_all(report_fd, "Q" + status);
    ::close(report_fd);
    report_fd = -1;
  };
  rec.launcher_pid = ::getpid();
  rec.launcher_start = records::process_start_time(rec.launcher_pid);
  (void)records::save(rec);  // it warns; the gang saves again and reports a record it cannot keep
  int code = exit_code::internal;
  try {
    code = supervise::run_job(p, rec, o, detail::lasting_transports(s).for_host());
  } catch (const Error& e) {
    std::fflush(stdout);
    fail_in_child(report_fd, rec.id, e);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fail_in_child(report_fd, rec.id,
                  Error(std::string("internal error: ") + e.what(), "please report this as a bug",
                        exit_code::internal));
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

}  // namespace

RunResult run(const JobRequest& req) {
  spec::JobSpec s = resolve_spec(req);
  if (s.sweep.present && req.sweep_trial.empty())
    throw Error(s.source + " has [sweep]: it is run as trials, one per combination of its parameters",
                "mltrain sweep " + text::shell_quote(s.source) + " (docs/sweep.md)", exit_code::usage);
  const bool exec_in_home = req.exec && s.run.workdir.empty();
  if (req.exec) adapt_for_exec(s, req);
  const std::string token = detail::random_token();
  const Pending pending = check_before_run(s, req, token);
  const std::chrono::milliseconds telemetry_interval = pending.telemetry_interval;
  // The tree is listed and hashed before the run exists: an unreadable file leaves no run behind.
  std::optional<detail::SyncPlan> sp = detail::plan_sync(s, req);

  const std::string run_id = records::create_run(s.name);
  plan::Plan p;
  RunResult result;
  supervise::Options o;
  try {  // the run exists from here on: an error ends its record, as one in run_job does
    if (!req.sweep_trial.empty()) note_sweep_trial(req.sweep_trial, run_id);
    // The commit of the synced folder, else of the ranks' folder (once: each asks git).
    std::string commit = exec_in_home ? "" : git_commit(sp ? sp->src : pending.workdir);
    records::CodeSummary code = keep_run_code(s, req, pending, sp, run_id, req.rerun ? "" : commit);
    plan::Inputs in = detail::plan_inputs(req, run_id, token, detail::Ports::free);
    in.error_dir = records::run_dir(in.run_id);
    p = plan::make_plan(s, in);
    if (sp) {
      p.workdir = detail::synced_workdir(s, *sp);
    } else if (s.sync.reuse && !req.exec) {
      p.workdir = detail::synced_workdir(s, detail::sync_folders(s, req));  // what the last sync left
      commit = git_commit(p.workdir);
    } else if (exec_in_home) {
      p.workdir.clear();  // the agent's own directory: the login's home over SSH
    }
    result.run_id = p.run_id;
    result.record = first_record(s, p, req, commit, std::move(code));
    o = run_options(s, p, req, sp, telemetry_interval);
  } catch (const Error& e) {
    records::end_with_launcher_error(run_id, e.code(), e.what(), error_text(e));
    throw;
  }
  if (req.detach) return run_detached(s, p, req, o, std::move(result));
  records::RunRecord& rec = result.record;
  rec.launcher_pid = ::getpid();
  rec.launcher_start = records::process_start_time(rec.launcher_pid);
  (void)records::save(rec);  // as run_detached's child

  try {
    result.exit_code = supervise::run_job(p, rec, o, detail::lasting_transports(s).for_host());
  } catch (const Error& e) {
    records::end_with_launcher_error(rec.id, e.code(), e.what(), error_text(e));
    throw;
  }
  result.launcher_pid = rec.launcher_pid;
  return result;
}

}  // namespace mltrain::launch
