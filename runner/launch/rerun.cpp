// `mltrain rerun RUN`: a recorded run again, with the code it ran (restored from the code store),
// its spec and its hosts; flags override them as they do for `run` (docs/records.md, "Rerun").
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/state_home.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/records/code.h"
#include "runner/records/records.h"

namespace mltrain::launch {

namespace {

namespace fs = std::filesystem;

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out)
    throw Error(sys_error_text("write", path, errno), "free some space in the state folder",
                exit_code::state);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

JobRequest rerun_request(const std::string& run_query, JobRequest req) {
  const std::string id = records::resolve(run_query);
  const records::RunRecord old = records::load(id);
  if (old.kind != "run")
    throw Error("run " + id + " is an 'mltrain " + old.kind + "', not a job: there is nothing to rerun",
                "rerun a run that 'mltrain run' started ('mltrain ls' lists them)");
  if (old.spec_toml.empty())
    throw Error("run " + id + " recorded no spec", "its record was written by an older mltrain",
                exit_code::state);
  // The restored tree is made once per run and kept beside the records until the run is removed.
  const std::string dir = records::reruns_dir() + "/" + id, tree = dir + "/tree";
  if (!fs::exists(dir + "/complete")) {
    make_private_dirs(records::reruns_dir(), true);
    std::error_code ec;
    fs::remove_all(dir, ec);  // what an interrupted restore left (a folder of mltrain's own)
    make_private_dirs(dir);
    records::Restored got = records::restore_code(id, tree);
    std::string held;
    for (const auto& w : got.withheld) held += w + "\n";
    write_file(dir + "/withheld", held);
    write_file(dir + "/root", got.root);
    write_file(dir + "/job.toml", old.spec_toml);
    write_file(dir + "/complete", "");
  }
  std::vector<std::string> held = text::split(read_file(dir + "/withheld"), '\n');
  held.erase(std::remove(held.begin(), held.end(), std::string()), held.end());
  if (!held.empty()) {
    const bool one = held.size() == 1;
    std::fprintf(
        stderr,
        "mltrain: warning: run %s did not keep %s (%s a secret's value, or changed after the sync): the "
        "rerun runs without %s (its spec is the recorded one)\n",
        id.c_str(), text::join(held, ", ").c_str(), one ? "it held" : "they held", one ? "it" : "them");
  }
  // The hosts are reached the way the run reached them, unless the flags say otherwise.
  if (req.overrides.ssh_config.empty()) req.overrides.ssh_config = old.ssh_config;
  req.specs = {dir + "/job.toml"};
  req.rerun = JobRequest::Rerun{id, tree, read_file(dir + "/root"), old.git_commit};
  return req;
}

namespace detail {

void adapt_for_rerun(spec::JobSpec& s, const JobRequest::Rerun& r,
                     const std::map<std::string, std::string>& environ) {
  s.sync.enabled = true;
  s.sync.reuse = false;
  // The project's own folder on the hosts, as its runs use it (a running one keeps its copy).
  if (s.sync.remote_dir.empty()) s.sync.remote_dir = project_work_dir(r.root);
  s.sync.src = r.tree;
  s.sync.files.clear();    // they travelled inside the tree, at their places
  s.sync.exclude.clear();  // the tree is what travelled
  std::string& wd = s.run.workdir;
  if (wd == r.root)
    wd = r.tree;
  else if (!r.root.empty() && wd.rfind(r.root + "/", 0) == 0)
    wd = r.tree + wd.substr(r.root.size());
  for (auto& [k, v] : s.run.env) {
    if (v != secret::kShown || !secret::is_secret_name(k)) continue;
    auto it = environ.find(k);
    if (it == environ.end())
      throw Error("run " + r.of + "'s [run.env] " + k + " is a secret: its value was never recorded",
                  "set " + k + " in this shell (or pass --env " + k + "=...) to rerun it");
    v = it->second;
  }
}

}  // namespace detail

}  // namespace mltrain::launch
