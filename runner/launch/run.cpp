// launch::run: the run record, the git commit, detaching, the transports, then the supervisor.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/supervise/supervisor.h"

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

records::RunRecord new_record(const spec::JobSpec& s, const plan::Plan& p) {
  records::RunRecord rec;
  rec.id = p.run_id;
  rec.name = s.name;
  rec.spec_file = s.source.empty() ? "" : std::filesystem::absolute(s.source).string();
  spec::JobSpec shown = s;  // the record shows secret values as <secret>; ranks get the real ones
  for (auto& [k, v] : shown.run.env) v = secret::shown_value(k, v);
  rec.spec_toml = spec::to_toml(shown);
  rec.max_restarts = s.run.max_restarts;
  rec.started_at = records::now_iso8601();
  rec.git_commit = git_commit(p.workdir);
  records::fill_from_plan(rec, p);
  return rec;
}

supervise::Options supervise_options(const spec::JobSpec& s, const JobRequest& req) {
  supervise::Options o;
  o.grace = s.run.grace_period;
  o.timeout = s.run.timeout;
  o.max_restarts = s.run.max_restarts;
  o.json_summary = req.json;
  o.console_fd = req.json ? 2 : 1;  // with --json, stdout carries the summary alone
  o.console.color = req.color;
  o.console.timestamps = s.logs.timestamps;
  o.console.prefix = s.logs.prefix;
  if (!s.logs.ranks.empty()) {
    auto list = text::parse_int_list(s.logs.ranks);
    o.console.ranks = std::set<int>(list->begin(), list->end());
  }
  return o;
}

// In the detached child: its own session, stdin from /dev/null, its console into console.log.
void become_background_launcher(const std::string& run_id) {
  ::setsid();
  int devnull = ::open("/dev/null", O_RDONLY);
  std::string console = records::run_dir(run_id) + "/console.log";
  int cfd = ::open(console.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  ::dup2(devnull, 0);
  if (cfd >= 0) {
    ::dup2(cfd, 1);
    ::dup2(cfd, 2);
  }
}

}  // namespace

RunResult run(const JobRequest& req) {
  spec::JobSpec s = resolve_spec(req);
  std::string token = detail::random_token();
  // Plan before creating the record, so a bad host list leaves no empty run behind.
  plan::make_plan(s, detail::plan_inputs(req, "pending", token, detail::Ports::free));
  plan::Plan p =
      plan::make_plan(s, detail::plan_inputs(req, records::create_run(s.name), token, detail::Ports::free));

  RunResult result;
  result.run_id = p.run_id;
  records::RunRecord& rec = result.record;
  rec = new_record(s, p);
  supervise::Options o = supervise_options(s, req);

  if (req.detach) {
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = ::fork();
    if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno), {}, exit_code::internal);
    if (pid > 0) {
      result.detached = true;
      result.launcher_pid = int(pid);
      rec.detached = true;
      rec.launcher_pid = result.launcher_pid;
      return result;
    }
    become_background_launcher(rec.id);
    rec.detached = true;
    o.console.color = false;
    o.json_summary = false;
  }
  rec.launcher_pid = ::getpid();
  rec.launcher_start = records::process_start_time(rec.launcher_pid);
  records::save(rec);

  result.exit_code = supervise::run_job(p, rec, o, detail::lasting_transports(s).for_host());
  if (req.detach) {
    std::fflush(stdout);
    ::_exit(result.exit_code);
  }
  result.launcher_pid = rec.launcher_pid;
  return result;
}

}  // namespace mltrain::launch
