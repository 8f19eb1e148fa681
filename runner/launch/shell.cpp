// `mltrain ssh RUN [--rank N] [-- CMD]`: a shell (or one command) where a rank of a run runs: on
// its host, in its working directory, with the environment mltrain gave it.
#include <sys/stat.h>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"

namespace mltrain::launch {

std::string shell_script(const records::RunRecord& r, int rank, const std::vector<std::string>& command) {
  const records::RankRecord& k = r.ranks[size_t(rank)];
  const std::string host = size_t(k.host) < r.hosts.size() ? r.hosts[size_t(k.host)].name : "?";
  std::string s;
  if (!r.workdir.empty())
    s += "cd " + text::shell_quote(r.workdir) + " 2>/dev/null || echo " +
         text::shell_quote("mltrain: " + r.workdir + " is not on " + host +
                           "; starting in the login directory") +
         " >&2\n";
  for (const auto& [key, value] : k.env)
    if (value != secret::kShown) s += "export " + key + "=" + text::shell_quote(value) + "\n";
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

int shell(const ShellRequest& req) {
  records::RunRecord r = records::load(records::resolve(req.run));
  if (r.ranks.empty()) throw Error("run " + r.id + " has no ranks", "pick another run with 'mltrain ls'");
  if (req.rank < 0 || size_t(req.rank) >= r.ranks.size())
    throw Error("run " + r.id + " has ranks 0.." + std::to_string(r.ranks.size() - 1) + ", not " +
                    std::to_string(req.rank),
                "pick one with --rank");
  const records::RankRecord& k = r.ranks[size_t(req.rank)];
  if (size_t(k.host) >= r.hosts.size())
    throw Error("run " + r.id + ": its record names no host for rank " + std::to_string(req.rank));
  const std::string host = r.hosts[size_t(k.host)].name;
  // The run's hosts again: from its spec while that still exists (user, port, ssh settings), else
  // by the names it recorded.
  JobRequest j;
  j.overrides.ssh_config = req.overrides.ssh_config;
  j.overrides.accept_new_host_keys = req.overrides.accept_new_host_keys;
  j.command = std::vector<std::string>{"true"};
  struct stat st {};
  if (!r.spec_file.empty() && ::stat(r.spec_file.c_str(), &st) == 0) {
    j.specs = {r.spec_file};
  } else {
    std::vector<std::string> names;
    for (const auto& h : r.hosts) names.push_back(h.name);
    j.overrides.hosts = text::join(names, ",");
  }
  spec::JobSpec s = resolve_spec(j);
  plan::Plan p = plan::make_plan(s, detail::plan_inputs(j, "ssh", "ssh", detail::Ports::placeholder));
  for (const auto& hp : p.hosts)
    if (hp.host.name == host)
      return detail::lasting_transports(s).for_host()(hp).interactive(hp,
                                                                      shell_script(r, req.rank, req.command));
  throw Error("host " + host + " of run " + r.id + " is no longer in " + r.spec_file,
              "pass its hosts again with -H, or edit the spec back");
}

}  // namespace mltrain::launch
