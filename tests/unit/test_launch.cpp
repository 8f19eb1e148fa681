// The job API: flag overrides over a spec, validate and dry run, without starting any process.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "runner/common/error.h"
#include "runner/launch/launch.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;

using mltrain::testing::TempDir;
using mltrain::testing::TempHome;

namespace {

const char* kSpec = R"(name = "t"
[run]
command = "echo hi"
timeout = "1m"
max_restarts = 1
[run.env]
A = "from-spec"
B = "kept"
[cluster]
hosts = ["a:2", "b:2"]
)";

// A request with a fixed launcher environment and directory, so plans do not depend on the host.
launch::JobRequest adhoc(std::vector<std::string> cmd) {
  launch::JobRequest r;
  r.command = std::move(cmd);
  r.environ = std::map<std::string, std::string>{{"HOME", "/root"}};
  r.cwd = "/work";
  return r;
}

std::string error_of(const launch::JobRequest& r) {
  try {
    launch::resolve_spec(r);
  } catch (const Error& e) {
    CHECK(e.code() == exit_code::usage);
    return e.what();
  }
  return "no error";
}

// Rank `rank`'s environment as plan `p` gives it at spawn.
std::map<std::string, std::string> env_of(const plan::Plan& p, int rank) {
  auto env = plan::rank_env(p, p.runtime, rank);
  return {env.begin(), env.end()};
}

}  // namespace

TEST_CASE("launch: flags override spec keys and are recorded in origins") {
  TempDir d;
  launch::JobRequest r;
  r.specs = {d.write("job.toml", kSpec)};
  r.overrides.hosts = "c:4";
  r.overrides.nprocs = 3;
  r.overrides.max_restarts = 0;
  r.overrides.timeout = "90s";
  r.overrides.grace = "2s";
  r.overrides.name = "renamed";
  r.overrides.include = "c:0,1";
  r.overrides.accept_new_host_keys = true;
  r.overrides.no_prefix = true;
  r.overrides.ranks = "0,2";

  auto s = launch::resolve_spec(r);
  CHECK(s.cluster.hosts == std::vector<std::string>{"c:4"});
  CHECK(s.cluster.hostfile.empty());
  CHECK(s.cluster.nprocs == 3);
  CHECK(s.cluster.include == "c:0,1");
  CHECK(s.run.max_restarts == 0);
  CHECK(s.run.timeout == std::chrono::seconds(90));
  CHECK(s.run.grace_period == std::chrono::seconds(2));
  CHECK(s.name == "renamed");
  CHECK(s.ssh.strict_host_keys == "accept-new");
  CHECK(s.logs.prefix.empty());
  CHECK(s.logs.ranks == "0,2");
  CHECK(s.origins["cluster.hosts"] == "-H");
  CHECK(s.origins["cluster.include"] == "--include");
  CHECK(s.origins["ssh.strict_host_keys"] == "--accept-new-host-keys");
  // Keys no flag touched keep pointing into the file.
  CHECK(s.origins["run.command"].find("job.toml:") != std::string::npos);

  // --hostfile replaces the spec's hosts the same way.
  launch::JobRequest h;
  h.specs = r.specs;
  h.overrides.hostfile = "hosts.txt";
  auto sh = launch::resolve_spec(h);
  CHECK(sh.cluster.hosts.empty());
  CHECK(sh.cluster.hostfile == "hosts.txt");
  CHECK(sh.origins["cluster.hostfile"] == "--hostfile");
}

TEST_CASE("launch: --env K=V replaces the spec's value and adds new ones") {
  TempDir d;
  launch::JobRequest r;
  r.specs = {d.write("job.toml", kSpec)};
  r.overrides.env = {"A=from-flag", "C=new=with=equals", "D="};
  auto s = launch::resolve_spec(r);
  std::map<std::string, std::string> env(s.run.env.begin(), s.run.env.end());
  CHECK(s.run.env.size() == 4);  // replaced in place, not appended twice
  CHECK(env["A"] == "from-flag");
  CHECK(env["B"] == "kept");
  CHECK(env["C"] == "new=with=equals");
  CHECK(env["D"] == "");
}

TEST_CASE("launch: bad --env and bad durations are usage errors naming the flag") {
  auto r = adhoc({"prog"});
  r.overrides.env = {"NOEQUALS"};
  CHECK(error_of(r) == "--env 'NOEQUALS' is not K=V");
  r.overrides.env = {"=v"};
  CHECK(error_of(r) == "--env '=v' is not K=V");
  r.overrides.env = {"RANK=3"};
  CHECK(error_of(r).find("RANK") != std::string::npos);

  auto t = adhoc({"prog"});
  t.overrides.timeout = "soon";
  CHECK(error_of(t) == "--timeout 'soon' is not a duration");
  auto g = adhoc({"prog"});
  g.overrides.grace = "5 parsecs";
  CHECK(error_of(g) == "--grace-period '5 parsecs' is not a duration");
  auto k = adhoc({"prog"});
  k.overrides.ranks = "0,x";
  CHECK(error_of(k) == "--ranks '0,x' is not a rank list");
}

TEST_CASE("launch: a spec and a command after '--': the command replaces the spec's") {
  TempDir d;
  launch::JobRequest r;
  r.specs = {d.write("job.toml", kSpec)};
  r.command = std::vector<std::string>{"python3", "train.py", "--lr", "0.1"};
  auto s = launch::resolve_spec(r);
  CHECK_FALSE(s.run.command.has_value());
  CHECK(s.run.argv == *r.command);
  CHECK(s.name == "t");

  r.overrides.profile = "local";
  CHECK(error_of(r).find("--profile applies to ad-hoc runs") == 0);
}

TEST_CASE("launch: two words before '--', or nothing to run, are usage errors") {
  launch::JobRequest r;
  r.specs = {"train.py", "--epochs"};
  CHECK(error_of(r) == "expected one job spec, got 2 words before '--'");
  try {
    launch::resolve_spec(r);
  } catch (const Error& e) {
    CHECK(e.hint() == "put the command after '--': mltrain run -n 4 -- train.py --epochs");
  }
  CHECK(error_of(launch::JobRequest{}) == "nothing to run");
  CHECK(error_of(adhoc({})) == "nothing to run");
}

TEST_CASE("launch: validate an ad-hoc command") {
  auto r = adhoc({"prog", "arg"});
  r.overrides.nprocs = 3;
  auto v = launch::validate(r);
  CHECK(v.summary == "command: ok: 3 ranks on localhost(3)");
  REQUIRE(v.plan.ranks.size() == 3);
  CHECK(v.plan.run_id == "validate");
  CHECK(v.plan.argv == std::vector<std::string>{"prog", "arg"});
  CHECK(v.plan.workdir == "/work");

  auto one = adhoc({"prog"});
  CHECK(launch::validate(one).summary == "command: ok: 1 rank on localhost(1)");

  try {
    launch::validate(launch::JobRequest{});
    FAIL("validate of nothing passed");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "validate needs a job spec or a command");
    CHECK(e.code() == exit_code::usage);
  }
}

TEST_CASE("launch: dry_run plans ranks and their environment without starting anything") {
  auto r = adhoc({"prog"});
  r.overrides.nprocs = 2;
  r.overrides.env = {"OMP_NUM_THREADS=2"};
  r.overrides.workdir = "/tmp";
  plan::Plan p = launch::dry_run(r);
  CHECK(p.run_id == "dry-run");
  CHECK(p.workdir == "/tmp");
  CHECK(p.token.size() == 32);
  REQUIRE(p.ranks.size() == 2);
  REQUIRE(p.hosts.size() == 1);
  CHECK(p.hosts[0].local);
  for (int i = 0; i < 2; ++i) {
    auto e = env_of(p, i);
    CHECK(e["RANK"] == std::to_string(i));
    CHECK(e["WORLD_SIZE"] == "2");
    CHECK(e["OMP_NUM_THREADS"] == "2");
    CHECK(e["MLTRAIN_RUN_ID"] == "dry-run");
    CHECK(e["MLTRAIN_TOKEN"] == p.token);
  }
  // Every dry run gets its own secret.
  CHECK(launch::dry_run(r).token != p.token);

  std::string text = launch::describe_plan(p);
  CHECK(text.find("run prog: 2 ranks on 1 host\n") == 0);
  CHECK(text.find("command: prog\nworkdir: /tmp\n") != std::string::npos);
  CHECK(text.find("MLTRAIN_TOKEN=<secret>") != std::string::npos);
  CHECK(text.find(p.token) == std::string::npos);
  CHECK(text.find("OMP_NUM_THREADS=2") != std::string::npos);
}

TEST_CASE("launch: a PS dry run shows each host's servers and one line for the servers") {
  TempDir d;
  launch::JobRequest r;
  r.specs = {d.write("job.toml", R"(name = "ps"
[run]
command = "python3 train.py"
[cluster]
hosts = ["a:2", "b:2"]
[ps]
hosts = ["b", "c"]
servers_per_host = 2
partition_bytes = "4M"
)")};
  r.environ = std::map<std::string, std::string>{{"HOME", "/root"}};
  r.cwd = "/work";
  plan::Plan p = launch::dry_run(r);
  std::string text = launch::describe_plan(p);
  CAPTURE(text);
  CHECK(text.find("run ps: 4 ranks on 2 hosts + 1 server-only host\n") == 0);
  CHECK(text.find("\nps:      4 servers on b, c (2 each), sync, partition 4 MiB\n") != std::string::npos);
  CHECK(text.find("\nhost a (node 0): ranks 0 1\n") != std::string::npos);
  CHECK(text.find("\nhost b (node 1): ranks 2 3; ps servers: 2\n") != std::string::npos);
  CHECK(text.find("\nhost c (server only): ps servers: 2\n") != std::string::npos);
  CHECK(text.find("MLTRAIN_PS_SYNC=1") != std::string::npos);

  // Async with an optimizer; uneven counts are listed per host.
  p.ps.sync = false;
  p.ps.optimizer = "sgd";
  p.ps.lr = 0.1;
  p.ps.momentum = 0.9;
  p.ps.partition_bytes = 65536;
  p.hosts[1].ps_servers = 1;
  p.ps.servers = 3;
  CHECK(launch::describe_ps(p) ==
        "3 servers on b(1), c(2), async, optimizer sgd lr=0.1 momentum=0.9, partition 64 KiB");
  p.ps.optimizer.clear();
  CHECK(launch::describe_ps(p).find("async, no optimizer") != std::string::npos);

  // Not PS: no ps line, no servers on host lines.
  auto plain = launch::describe_plan(launch::dry_run(adhoc({"prog"})));
  CHECK(plain.find("ps:") == std::string::npos);
  CHECK(plain.find("ps servers") == std::string::npos);
  CHECK(plain.find("DMLC_") == std::string::npos);
}

TEST_CASE("launch: the hosts' folder is keyed by the project, not by the job's name or program") {
  TempHome d;
  fs::create_directories(d.str() + "/a/proj");
  fs::create_directories(d.str() + "/b/proj");
  auto workdir = [&](const std::string& cwd, std::vector<std::string> cmd) {
    auto r = adhoc(std::move(cmd));
    r.cwd = cwd;
    r.overrides.sync = true;
    return launch::dry_run(r).workdir;
  };
  const std::string a = workdir(d.str() + "/a/proj", {"python3", "a.py"});
  // The same program from another folder of the same name: another folder on the hosts.
  const std::string b = workdir(d.str() + "/b/proj", {"python3", "b.py"});
  CHECK(a.rfind("~/.cache/mltrain/work/proj-", 0) == 0);
  CHECK(a.size() == std::string("~/.cache/mltrain/work/proj-").size() + 8);
  CHECK(b.rfind("~/.cache/mltrain/work/proj-", 0) == 0);
  CHECK(a != b);
  // Another program (so another job name) from the same folder: the same folder.
  CHECK(workdir(d.str() + "/a/proj", {"sh", "train.sh"}) == a);
  CHECK(workdir(d.str() + "/a/proj/", {"python3", "a.py"}) == a);
}
