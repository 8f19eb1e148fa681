// `mltrain ssh RUN [--rank N] [-- CMD]`: a shell (or one command) where a rank of a run runs: on
// its host, in its working directory, with the environment mltrain gave it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/supervise/supervisor.h"
#include "runner/transport/ssh_bootstrap.h"
#include "runner/transport/transport.h"

namespace mltrain::launch {

std::string shell_script(const records::RunRecord& r, int rank, const std::vector<std::string>& command,
                         const std::string& agent) {
  const records::RankRecord& k = r.ranks[size_t(rank)];
  const std::string host = size_t(k.host) < r.hosts.size() ? r.hosts[size_t(k.host)].name : "?";
  std::string s;
  // A synced run's folder is below each host's home: "~/..." is spelled so the shell expands it.
  const std::string workdir = records::workdir_of(r, k.host);
  const std::string dir = workdir.rfind("~/", 0) == 0 ? "\"$HOME\"/" + text::shell_quote(workdir.substr(2))
                                                      : text::shell_quote(workdir);
  if (!workdir.empty())
    s += "cd " + dir + " 2>/dev/null || echo " +
         text::shell_quote("mltrain: " + workdir + " is not on " + host +
                           "; starting in the login directory") +
         " >&2\n";
  bool own_runtime = false;
  for (const auto& [key, value] : k.env) {
    if (value != secret::kShown) s += "export " + key + "=" + text::shell_quote(value) + "\n";
    own_runtime = own_runtime || key == "MLTRAIN_RUNTIME";
  }
  // What the agent adds to a rank's environment on its host (runner/agent/spawn.cpp), from the
  // agent itself: the runtime's folder is its to choose. Not there (or cannot run): left out.
  const bool python_path = r.spec_toml.find("python_path = false") == std::string::npos;
  if (!agent.empty()) {
    s += "if mltrain_rt=$(" + agent + " --runtime-dir 2>/dev/null) && [ -n \"$mltrain_rt\" ]; then\n";
    if (!own_runtime)
      s += "  export MLTRAIN_RUNTIME=\"$mltrain_rt\" "
           "MLTRAIN_COMM_LIB=\"$mltrain_rt/lib/libmltrain-comm.so.0\"\n";
    if (python_path) s += "  export PYTHONPATH=\"$mltrain_rt/python${PYTHONPATH:+:$PYTHONPATH}\"\n";
    s += "fi\nunset mltrain_rt\n";
  }
  if (command.empty()) {
    s += "exec \"${SHELL:-/bin/sh}\" -l\n";
  } else {
    std::vector<std::string> quoted;
    for (const auto& a : command) quoted.push_back(text::shell_quote(a));
    // One word is a shell command line (as ssh runs it); several are a program and its arguments.
    s += command.size() == 1 ? "exec /bin/sh -c " + quoted[0] + "\n"
                             : "exec " + text::join(quoted, " ") + "\n";
  }
  return s;
}

namespace {

// ssh and cp are about a job's ranks and files: "latest" there is the newest run, not an exec
// that came after it (said on stderr, so the user knows which run it is).
std::string resolve_job_run(const std::string& query) {
  std::string id = records::resolve(query);
  if (!query.empty() && query != "latest" && query != "last") return id;
  auto runs = records::list();
  if (runs.empty() || runs.back().kind != "exec") return id;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it)
    if (it->kind != "exec") {
      std::fprintf(stderr, "mltrain: latest is %s, an exec; using the newest run, %s\n",
                   runs.back().id.c_str(), it->id.c_str());
      return it->id;
    }
  return id;  // nothing but execs: the newest of them
}

// The run's host of `rank` as a one-host plan, with the transports to reach it: from the run's
// spec while it still exists (user, port, ssh settings), else by the names it recorded.
struct RankHost {
  spec::JobSpec spec;
  plan::Plan plan;
};
RankHost rank_host(const records::RunRecord& r, int rank, const Overrides& o, const std::string& host) {
  JobRequest j;
  j.overrides.ssh_config = o.ssh_config.empty() ? r.ssh_config : o.ssh_config;  // as the run reached it
  j.overrides.accept_new_host_keys = o.accept_new_host_keys;
  j.command = std::vector<std::string>{"true"};
  struct stat st {};
  const bool have_spec = !r.spec_file.empty() && ::stat(r.spec_file.c_str(), &st) == 0;
  if (have_spec) j.specs = {r.spec_file};
  std::vector<std::string> names;
  for (const auto& h : r.hosts) names.push_back(h.name);
  // The spec's hosts first (they carry users and ports); the recorded names when the run was
  // given its hosts on the command line, or the spec changed since.
  for (int attempt = have_spec ? 0 : 1; attempt < 2; ++attempt) {
    if (attempt == 1) j.overrides.hosts = text::join(names, ",");
    RankHost out{resolve_spec(j), {}};
    out.spec.cluster.procs_per_host = 1;
    out.spec.cluster.nprocs = 0;
    out.spec.cluster.oversubscribe = true;
    out.spec.comm.mode = "allreduce";  // a shell or a copy starts no PS server
    out.spec.ps = {};
    plan::Plan all =
        plan::make_plan(out.spec, detail::plan_inputs(j, "cp", "cp", detail::Ports::placeholder));
    for (const auto& hp : all.hosts)
      if (hp.host.name == host) {
        out.plan = all;
        out.plan.hosts = {hp};
        out.plan.hosts[0].ranks = {0};
        out.plan.ranks.resize(1);
        out.plan.ranks[0].host = 0;
        out.plan.multi_host = false;
        return out;
      }
  }
  throw Error(
      "host " + host + " of run " + r.id + " (rank " + std::to_string(rank) + ") cannot be planned again",
      "check its name in 'mltrain show " + r.id + "'");
}

}  // namespace

int shell(const ShellRequest& req) {
  records::RunRecord r = records::load(resolve_job_run(req.run));
  if (r.ranks.empty()) throw Error("run " + r.id + " has no ranks", "pick another run with 'mltrain ls'");
  if (req.rank < 0 || size_t(req.rank) >= r.ranks.size())
    throw Error("run " + r.id + " has ranks 0.." + std::to_string(r.ranks.size() - 1) + ", not " +
                    std::to_string(req.rank),
                "pick one with --rank");
  const records::RankRecord& k = r.ranks[size_t(req.rank)];
  if (size_t(k.host) >= r.hosts.size())
    throw Error("run " + r.id + ": its record names no host for rank " + std::to_string(req.rank));
  const std::string host = r.hosts[size_t(k.host)].name;
  RankHost rh = rank_host(r, req.rank, req.overrides, host);
  const plan::HostPlan& hp = rh.plan.hosts[0];
  std::string agent;
  if (!hp.local)
    agent = transport::agent_remote_path(std::string(transport::agent_hash()));
  else if (std::string path = transport::local_agent_path(); path.rfind("/proc/", 0) != 0)
    agent = text::shell_quote(path);  // an agent in memory (a noexec state folder) cannot be run by name
  return detail::lasting_transports(rh.spec).for_host()(hp).interactive(
      hp, shell_script(r, req.rank, req.command, agent));
}

uint64_t copy(const CopyRequest& req) {
  namespace fs = std::filesystem;
  // RUN:PATH or RUN:RANK:PATH
  size_t c1 = req.from.find(':');
  if (c1 == std::string::npos || c1 == 0)
    throw Error("cp: '" + req.from + "' is not RUN:PATH",
                "write RUN:PATH or RUN:RANK:PATH, e.g. latest:outputs/", exit_code::usage);
  std::string run = req.from.substr(0, c1), path = req.from.substr(c1 + 1);
  int rank = 0;
  if (size_t c2 = path.find(':');
      c2 != std::string::npos && c2 > 0 && path.find_first_not_of("0123456789") == c2) {
    rank = int(text::parse_int_arg(path.substr(0, c2), "cp: the rank in RUN:RANK:PATH", 0, INT32_MAX));
    path = path.substr(c2 + 1);
  }
  if (path.empty())
    throw Error("cp: '" + req.from + "' names no path", "write RUN:PATH, e.g. latest:outputs/",
                exit_code::usage);
  if (req.to.empty()) throw Error("cp: no destination", "give a local path", exit_code::usage);
  records::RunRecord r = records::load(resolve_job_run(run));
  if (r.ranks.empty()) throw Error("run " + r.id + " has no ranks", "pick another run with 'mltrain ls'");
  if (size_t(rank) >= r.ranks.size() || size_t(r.ranks[size_t(rank)].host) >= r.hosts.size())
    throw Error("run " + r.id + " has ranks 0.." + std::to_string(r.ranks.size() - 1) + ", not " +
                    std::to_string(rank),
                "write RUN:RANK:PATH with one of them", exit_code::usage);
  const std::string host = r.hosts[size_t(r.ranks[size_t(rank)].host)].name;

  while (path.size() > 1 && path.back() == '/') path.pop_back();
  for (size_t p = 0; p <= path.size();) {
    size_t q = std::min(path.find('/', p), path.size());
    if (path.compare(p, q - p, "..") == 0)
      throw Error("cp: '" + req.from + "' climbs with '..'",
                  "name the file or folder by its own path (from the run's folder, ~/..., or /...)",
                  exit_code::usage);
    p = q + 1;
  }
  const std::string workdir = records::workdir_of(r, r.ranks[size_t(rank)].host);
  std::string remote = path[0] == '/' || path[0] == '~' || workdir.empty() ? path : workdir + "/" + path;
  remote = fs::path(remote).lexically_normal().string();  // "a/./b" -> "a/b", "dir/." -> "dir/"
  while (remote.size() > 1 && remote.back() == '/') remote.pop_back();
  // As cp -r: into an existing folder under the source's own name, else at the destination's name.
  const std::string base = fs::path(remote).filename().string();
  fs::path to = fs::absolute(req.to).lexically_normal();
  if (to.has_parent_path() && to.filename().empty()) to = to.parent_path();  // "dest/"
  std::error_code ec;
  const bool into = fs::is_directory(to, ec);
  if (into && (base.empty() || base == "." || base == "~" || base == "/"))
    throw Error(
        "cp: " + host + ":" + remote + " has no name of its own to copy into " + to.string() + " under",
        "give the destination's full name, e.g. " + (to / "copy").string(), exit_code::usage);
  const fs::path final_path = into ? to / base : to;
  const fs::path parent = final_path.parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error("cp: " + parent.string() + " is not a folder", "make it first", exit_code::usage);
  struct stat there {};
  const bool exists = ::lstat(final_path.c_str(), &there) == 0;
  if (exists && !req.force)
    throw Error("cp: " + final_path.string() + " exists",
                "give another destination, or --force to merge into it (files of the same name are "
                "replaced, nothing else is touched)",
                exit_code::usage);
  if (exists && S_ISLNK(there.st_mode))
    throw Error("cp: " + final_path.string() + " is a link; a copy is never written through one",
                "give another destination", exit_code::usage);

  RankHost rh = rank_host(r, rank, req.overrides, host);
  // Into a work folder of its own beside the destination (locked while it runs, so a later cp
  // can tell one left by a cp that was killed), then moved into place: a copy cut short leaves
  // nothing under the destination's name.
  detail::CopyWork work(parent.string());
  supervise::Options o = detail::supervise_defaults();
  supervise::PullJob job;
  job.dir = remote;
  job.hosts = {0};
  job.dest = work.path();
  job.per_host_folders = false;
  detail::pull_limits(job);
  o.pull = job;
  bool single_file = false;
  uint64_t files = 0;
  try {
    files = supervise::pull_files(rh.plan, o, detail::lasting_transports(rh.spec).for_host(), &single_file);
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + "\n  nothing was copied to " + final_path.string() +
                    ": a copy cut short leaves nothing under its name",
                e.hint().empty() ? "run it again" : e.hint(), e.code());
  }
  // A file arrives as <work>/<its name>; a folder's files as <work>/<their paths>.
  work.place(single_file ? base : std::string(), final_path.string(), exists);
  std::fprintf(stderr, "mltrain: copied %llu file%s from %s:%s to %s\n", (unsigned long long)files,
               files == 1 ? "" : "s", host.c_str(), remote.c_str(), final_path.c_str());
  return files;
}

}  // namespace mltrain::launch
