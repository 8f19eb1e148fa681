// Job spec loading: every key, the profile merge rule, and malformed specs (one-line errors with
// file:line:col, exit code 2).
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "runner/common/error.h"
#include "runner/spec/spec.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;

using mltrain::testing::TempDir;

namespace {

std::string error_of(const std::string& text, const TempDir* dir = nullptr) {
  TempDir own;
  const TempDir& d = dir ? *dir : own;
  std::string path = d.write("job.toml", text);
  try {
    spec::check(spec::load_file(path));
  } catch (const Error& e) {
    CHECK(e.code() == 2);
    std::string msg = e.what();
    CHECK(msg.find('\n') == std::string::npos);
    // Report relative to the file name so cases read naturally.
    auto pos = msg.find("job.toml");
    return pos == std::string::npos ? msg : msg.substr(pos);
  }
  return "no error";
}

}  // namespace

TEST_CASE("spec: a full spec loads every key") {
  TempDir d;
  std::string path = d.write("job.toml", R"(
name = "train"
[run]
argv = ["python3", "train.py", "--lr", "0.1"]
workdir = "src"
env = { OMP_NUM_THREADS = 4, MODE = "fast", DEBUG = true }
forward_env = ["NCCL_*"]
max_restarts = 2
timeout = "1h30m"
grace_period = "10s"
python_path = false
[cluster]
hosts = ["a:2", "b:2"]
procs_per_host = 2
include = "a"
[comm]
mode = "ps"
backend = "tcp"
master_port = 29500
[gpus]
per_proc = 1
[ssh]
user = "me"
port = 2222
strict_host_keys = "accept-new"
connect_timeout = "5s"
[logs]
ranks = [0, 3]
prefix = false
timestamps = true
)");
  auto s = spec::load_file(path);
  CHECK(s.name == "train");
  CHECK(s.run.argv == std::vector<std::string>{"python3", "train.py", "--lr", "0.1"});
  CHECK(!s.run.command);
  CHECK(s.run.workdir == (d.path / "src").string());
  REQUIRE(s.run.env.size() == 3);
  std::map<std::string, std::string> env(s.run.env.begin(), s.run.env.end());
  CHECK(env["OMP_NUM_THREADS"] == "4");
  CHECK(env["MODE"] == "fast");
  CHECK(env["DEBUG"] == "1");
  CHECK(s.run.forward_env == std::vector<std::string>{"NCCL_*"});
  CHECK(s.run.max_restarts == 2);
  CHECK(s.run.timeout == std::chrono::minutes(90));
  CHECK(s.run.grace_period == std::chrono::seconds(10));
  CHECK(!s.run.python_path);
  CHECK(s.cluster.hosts == std::vector<std::string>{"a:2", "b:2"});
  CHECK(s.cluster.procs_per_host == 2);
  CHECK(s.comm.mode == "ps");
  CHECK(s.comm.master_port == 29500);
  CHECK(s.gpus.per_proc == 1);
  CHECK(s.ssh.port == 2222);
  CHECK(s.ssh.strict_host_keys == "accept-new");
  CHECK(s.logs.ranks == "0,3");
  CHECK(s.logs.prefix.empty());
  CHECK(s.logs.timestamps);
}

TEST_CASE("spec: defaults and the name from the file") {
  TempDir d;
  auto s = spec::load_file(d.write("my-job.toml", "[run]\ncommand = 'true'\n"));
  CHECK(s.name == "my-job");
  CHECK(s.run.command == "true");
  CHECK(s.run.grace_period == std::chrono::seconds(5));
  CHECK(s.run.python_path);
  CHECK(s.comm.master_port == 0);
  CHECK(s.logs.prefix == "auto");
}

TEST_CASE("spec: a profile merges under the spec") {
  TempDir d;
  d.write("base.toml", R"(
[run]
grace_period = "20s"
max_restarts = 5
env = { A = "from-profile", B = "from-profile" }
[comm]
backend = "nccl"
)");
  auto s = spec::load_file(d.write("job.toml", R"(
profile = "base.toml"
[run]
command = "true"
max_restarts = 1
env = { B = "from-spec", C = "from-spec" }
)"));
  CHECK(s.run.grace_period == std::chrono::seconds(20));  // only the profile sets it
  CHECK(s.run.max_restarts == 1);                         // the spec wins
  CHECK(s.comm.backend == "nccl");
  REQUIRE(s.run.env.size() == 3);  // [run.env] merges variable by variable
  CHECK(s.run.env[0] == std::pair<std::string, std::string>{"A", "from-profile"});
  CHECK(s.run.env[1] == std::pair<std::string, std::string>{"B", "from-spec"});
  CHECK(s.run.env[2] == std::pair<std::string, std::string>{"C", "from-spec"});
}

TEST_CASE("spec: built-in and user profiles") {
  TempDir d;
  auto s = spec::load_file(d.write("job.toml", "profile = 'nccl-ethernet'\n[run]\ncommand = 'true'\n"));
  CHECK(s.comm.backend == "nccl");
  CHECK(s.gpus.per_proc == 1);

  d.write("config/mltrain/profiles/mine.toml", "[run]\nmax_restarts = 7\n");
  ::setenv("XDG_CONFIG_HOME", (d.path / "config").c_str(), 1);
  auto u = spec::load_file(d.write("job2.toml", "profile = 'mine'\n[run]\ncommand = 'true'\n"));
  ::unsetenv("XDG_CONFIG_HOME");
  CHECK(u.run.max_restarts == 7);
}

TEST_CASE("spec: durations") {
  TempDir d;
  auto s =
      spec::load_file(d.write("job.toml", "[run]\ncommand = 'x'\ntimeout = 90\ngrace_period = '1.5s'\n"));
  CHECK(s.run.timeout == std::chrono::seconds(90));
  CHECK(s.run.grace_period == std::chrono::milliseconds(1500));
}

TEST_CASE("spec: malformed specs give one-line errors with their location") {
  struct Case {
    const char* text;
    const char* expected;  // a part of the message, after "job.toml"
  };
  const Case cases[] = {
      {"[run]\ncomand = 'x'\n", "job.toml:2:1: unknown key 'comand' in [run] (did you mean 'command'?)"},
      {"nmae = 'x'\n", "job.toml:1:1: unknown key 'nmae' (did you mean 'name'?)"},
      {"[clustr]\nhosts = []\n", "unknown key 'clustr' (did you mean 'cluster'?)"},
      {"[run]\ncommand = 3\n", "job.toml:2:11: 'command' must be a string, not an integer"},
      {"[run]\nargv = 'python3 x.py'\n", "'argv' must be an array of strings, not a string"},
      {"[run]\nargv = ['a', 2]\n", "job.toml:2:14: 'argv' must hold only strings, found an integer"},
      {"[run]\nargv = []\n", "'argv' is empty"},
      {"[run]\ncommand = 'x'\nmax_restarts = -1\n", "job.toml:3:16: 'max_restarts' is -1, out of range"},
      {"[run]\ncommand = 'x'\nmax_restarts = 'two'\n", "'max_restarts' must be an integer, not a string"},
      {"[run]\ncommand = 'x'\ntimeout = '10 minutes'\n",
       "job.toml:3:11: 'timeout' has a malformed duration '10 minutes'"},
      {"[run]\ncommand = 'x'\ntimeout = '5x'\n", "malformed duration '5x'"},
      {"[run]\ncommand = 'x'\ngrace_period = -3\n", "'grace_period' must not be negative"},
      {"[run]\ncommand = 'x'\n[metrics]\npattern = ['a=(?P<a>.)', 'loss=([0-9]+)']\n",
       "job.toml:4:26: [metrics] pattern 'loss=([0-9]+)': the pattern names no metric"},
      {"[run]\ncommand = 'x'\n[metrics]\npattern = 'x(?P<x>[0-9'\n", "not a regular expression"},
      {"[run]\ncommand = 'x'\ntimeout = true\n", "'timeout' must be a duration"},
      {"[run]\ncommand = 'x'\n[run.env]\nRANK = '3'\n",
       "job.toml:4:1: env 'RANK' is set by mltrain for every rank"},
      {"[run]\ncommand = 'x'\n[run.env]\nMASTER_PORT = 1\n", "env 'MASTER_PORT' is set by mltrain"},
      {"[run]\ncommand = 'x'\n[run.env]\n'1BAD' = 'v'\n", "'1BAD' is not a valid environment variable name"},
      {"[run]\ncommand = 'x'\n[run.env]\n'A-B' = 'v'\n", "'A-B' is not a valid environment variable name"},
      {"[run]\ncommand = 'x'\nenv = { A = [1] }\n",
       "env 'A' must be a string, number or boolean, not an array"},
      {"[run]\ncommand = 'x'\nforward_env = 'NCCL_*'\n", "'forward_env' must be an array of strings"},
      {"[run]\ncommand = 'x'\n[cluster]\nprocs_per_host = 0\n",
       "job.toml:4:18: 'procs_per_host' is 0, out of range"},
      {"[run]\ncommand = 'x'\n[cluster]\nhosts = [1, 2]\n", "'hosts' must hold only strings"},
      {"[run]\ncommand = 'x'\n[comm]\nmode = 'allreduse'\n",
       "'mode' is 'allreduse', which is not one of: allreduce, ps (did you mean 'allreduce'?)"},
      {"[run]\ncommand = 'x'\n[comm]\nbackend = 'mpi'\n",
       "'backend' is 'mpi', which is not one of: auto, tcp, nccl"},
      {"[run]\ncommand = 'x'\n[comm]\nmaster_port = 70000\n", "'master_port' is 70000, out of range"},
      {"[run]\ncommand = 'x'\n[comm]\nmaster_port = 'any'\n", "'master_port' is 'any'"},
      {"[run]\ncommand = 'x'\n[gpus]\nper_proc = 'all'\n", "'per_proc' must be an integer"},
      {"[run]\ncommand = 'x'\n[ssh]\nstrict_host_keys = 'maybe'\n", "'strict_host_keys' is 'maybe'"},
      {"[run]\ncommand = 'x'\n[ssh]\nport = 0\n", "'port' is 0, out of range"},
      {"[run]\ncommand = 'x'\n[logs]\nranks = '0,x'\n", "'ranks' is '0,x', not a rank list"},
      {"[run]\ncommand = 'x'\n[logs]\ntimestamps = 'yes'\n", "'timestamps' must be true or false"},
      {"run = 3\n", "job.toml:1:7: 'run' must be a table ([run]), not an integer"},
      {"[run]\ncommand = 'x\n", "job.toml:2:"},                  // unterminated string
      {"[run\ncommand = 'x'\n", "job.toml:1:"},                  // bad table header
      {"[run]\ncommand = 'x'\ncommand = 'y'\n", "job.toml:3:"},  // duplicate key
      {"name = 'x'\n", "nothing to run"},
      {"[run]\ncommand = ''\n", "job.toml:2:11: [run] command is empty"},
      {"name = 'a b'\n[run]\ncommand = 'x'\n", "job.toml:1:8: name 'a b' may hold only letters"},
      {"profile = 'nope'\n[run]\ncommand = 'x'\n", "job.toml:1:11: unknown profile 'nope'"},
      {"profile = 'locl'\n[run]\ncommand = 'x'\n", "unknown profile 'locl' (did you mean 'local'?)"},
      {"[run]\ncommand = 'x'\n[cluster]\ninclude = 'a'\nexclude = 'b'\n", "include and exclude ("},
      {"[run]\ncommand = 'x'\n[gpus]\nper_proc = 1\nprocs_per_gpu = 2\n",
       "job.toml:4:12: [gpus] per_proc and procs_per_gpu cannot both be set"},
      {"[run]\ncommand = 'x'\n[comm]\nbackend = 'nccl'\n[gpus]\nprocs_per_gpu = 2\n",
       "job.toml:6:17: [gpus] procs_per_gpu = 2 shares a GPU between ranks, but [comm] backend = \"nccl\" ("},
      {"[run]\ncommand = 'x'\n[comm]\nbackend = 'nccl'\n[gpus]\nprocs_per_gpu = 2\n",
       "job.toml:4:11) cannot: NCCL refuses two ranks of one communicator on one GPU (\"Duplicate GPU "
       "detected\")"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    std::string msg = error_of(c.text);
    CHECK_MESSAGE(msg.find(c.expected) != std::string::npos, msg);
  }
}

TEST_CASE("spec: every unknown key of a file is reported at once, in file order") {
  TempDir d;
  const char* text = "[run]\ncomand = 'x'\nmax_restart = 2\n[cluster]\nhsts = ['a']\n[gpus]\nper_prc = 1\n";
  try {
    spec::load_file(d.write("job.toml", text));
    FAIL("no error");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK_MESSAGE(m.find("job.toml: 4 problems:") != std::string::npos, m);
    size_t a = m.find("job.toml:2:1: unknown key 'comand' in [run] (did you mean 'command'?)");
    size_t b = m.find("job.toml:3:1: unknown key 'max_restart' in [run] (did you mean 'max_restarts'?)");
    size_t c = m.find("job.toml:5:1: unknown key 'hsts' in [cluster] (did you mean 'hosts'?)");
    size_t g = m.find("job.toml:7:1: unknown key 'per_prc' in [gpus] (did you mean 'per_proc'?)");
    CHECK_MESSAGE((a != std::string::npos && b != std::string::npos && c != std::string::npos &&
                   g != std::string::npos),
                  m);
    CHECK_MESSAGE((a < b && b < c && c < g), m);
  }
  // A type mistake after a typo: both are named, the typo first.
  try {
    spec::load_file(d.write("job.toml", "[run]\ncomand = 'x'\n[cluster]\nnprocs = 'two'\n"));
    FAIL("no error");
  } catch (const Error& e) {
    std::string m = e.what();
    CHECK_MESSAGE(m.find("2 problems") != std::string::npos, m);
    CHECK_MESSAGE(m.find("'comand'") < m.find("'nprocs' must be an integer"), m);
  }
}

TEST_CASE("spec: keys from other launchers point to where mltrain spells them") {
  struct Case {
    const char* text;
    const char* expected;  // a part of the message
    const char* hint;      // a part of the hint
  };
  const Case cases[] = {
      {"[run]\ncommand = 'x'\nranks = 4\n", "job.toml:3:1: unknown key 'ranks' in [run]",
       "[cluster] nprocs (or -n)"},
      {"nproc_per_node = 2\n[run]\ncommand = 'x'\n", "unknown key 'nproc_per_node'",
       "[cluster] procs_per_host"},
      {"[run]\ncommand = 'x'\nhosts = ['a']\n", "unknown key 'hosts' in [run]", "[cluster] hosts = [...]"},
      {"command = 'x'\n", "job.toml:1:1: unknown key 'command'", "'command' goes under [run]"},
      {"[run]\ncommand = ['python3', 'x.py']\n", "job.toml:2:11: 'command' must be a string, not an array",
       "write argv = [...] instead"},
      {"[run]\nargs = ['x']\n", "unknown key 'args' in [run]", "argv = [...]"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    TempDir d;
    try {
      spec::check(spec::load_file(d.write("job.toml", c.text)));
      FAIL("no error");
    } catch (const Error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(c.expected) != std::string::npos, e.what());
      CHECK_MESSAGE(e.hint().find(c.hint) != std::string::npos, e.hint());
    }
  }
}

TEST_CASE("spec: NCCL takes one GPU per rank; sharing GPUs needs another backend") {
  TempDir d;
  const char* shared = "[run]\ncommand = 'x'\n[gpus]\nprocs_per_gpu = 2\n";
  auto ok = [&](const std::string& text) { spec::check(spec::load_file(d.write("ok.toml", text))); };
  CHECK_NOTHROW(ok(std::string(shared)));                                // backend auto
  CHECK_NOTHROW(ok(std::string(shared) + "[comm]\nbackend = 'tcp'\n"));  // the CPU backend
  CHECK_NOTHROW(ok("[run]\ncommand = 'x'\n[comm]\nbackend = 'nccl'\n[gpus]\nprocs_per_gpu = 1\n"));
  CHECK_NOTHROW(ok("[run]\ncommand = 'x'\n[comm]\nbackend = 'nccl'\n[gpus]\nper_proc = 2\n"));
  // From a profile too: the error points at the spec's key and names where the backend came from.
  std::string msg =
      error_of("profile = 'nccl-ethernet'\n[run]\ncommand = 'x'\n[gpus]\nper_proc = 0\nprocs_per_gpu = 4\n");
  CHECK(msg.find("job.toml:6:17: [gpus] procs_per_gpu = 4 shares a GPU between ranks, but [comm] backend = "
                 "\"nccl\" (") != std::string::npos);
  CHECK(msg.find("Duplicate GPU detected") != std::string::npos);
}

TEST_CASE("spec: a missing file names the path") {
  try {
    spec::load_file("/nonexistent/job.toml");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "/nonexistent/job.toml: cannot read job spec: No such file or directory");
    CHECK(e.code() == 2);
  }
}

TEST_CASE("spec: errors in a profile point into the profile file") {
  TempDir d;
  d.write("bad-profile.toml", "[run]\ngrace = '3s'\n");
  std::string msg = error_of("profile = 'bad-profile.toml'\n[run]\ncommand = 'x'\n", &d);
  // error_of trims to "job.toml", which is absent here: the whole message names the profile.
  CHECK(msg.find("bad-profile.toml:2:1: unknown key 'grace' in [run] (did you mean 'grace_period'?)") !=
        std::string::npos);
}

TEST_CASE("spec: to_toml round-trips through load_file") {
  TempDir d;
  auto s = spec::load_file(d.write(
      "job.toml", "name = 'rt'\n[run]\nargv = ['a', 'b c']\nmax_restarts = 3\n[run.env]\nK = 'v w'\n"));
  auto again = spec::load_file(d.write("again.toml", spec::to_toml(s)));
  CHECK(again.name == "rt");
  CHECK(again.run.argv == s.run.argv);
  CHECK(again.run.max_restarts == 3);
  CHECK(again.run.env == s.run.env);
  // A recorded spec is what `mltrain rerun` runs: it must pass the checks a run makes, too.
  CHECK_NOTHROW(spec::check(again));
  auto synced = spec::load_file(
      d.write("sync.toml", "[run]\ncommand = 'x'\n[sync]\nexclude = ['*.log']\n[record]\ncode_max = '5M'\n"));
  auto back = spec::load_file(d.write("back.toml", spec::to_toml(synced)));
  CHECK_NOTHROW(spec::check(back));
  CHECK(back.sync.enabled);
  CHECK(back.record.code_max == 5u << 20);
  CHECK(spec::to_toml(back) == spec::to_toml(synced));
  for (const char* patterns : {"'loss=(?P<loss>[0-9.]+)'", "['a=(?P<a>.)', 'b=(?P<b>.)']"}) {
    auto m = spec::load_file(
        d.write("m.toml", std::string("[run]\ncommand = 'x'\n[metrics]\npattern = ") + patterns + "\n"));
    auto m2 = spec::load_file(d.write("m2.toml", spec::to_toml(m)));
    CHECK(m2.metrics.patterns == m.metrics.patterns);
    CHECK_FALSE(m.metrics.patterns.empty());
  }
}

TEST_CASE("spec: [ps] makes the job PS mode and loads every key") {
  TempDir d;
  auto s = spec::load_file(d.write("job.toml", R"(
[run]
command = "x"
[ps]
hosts = ["h3", "bob@h4:2"]
servers_per_host = 2
sync = false
partition_bytes = "1MiB"
[ps.optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 1e-4
)"));
  spec::check(s);
  CHECK(s.comm.mode == "ps");
  CHECK(s.ps.present);
  CHECK(s.ps.hosts == std::vector<std::string>{"h3", "bob@h4:2"});
  CHECK(s.ps.servers_per_host == 2);
  CHECK_FALSE(s.ps.sync);
  CHECK(s.ps.partition_bytes == (1u << 20));
  CHECK(s.ps.optimizer.name == "sgd");
  CHECK(s.ps.optimizer.lr == doctest::Approx(0.1));
  CHECK(s.ps.optimizer.momentum == doctest::Approx(0.9));
  CHECK(s.ps.optimizer.weight_decay == doctest::Approx(1e-4));

  // Defaults: an empty [ps], and [comm] mode = "ps" without [ps].
  auto e = spec::load_file(d.write("empty.toml", "[run]\ncommand = 'x'\n[ps]\n"));
  CHECK(e.comm.mode == "ps");
  CHECK(e.ps.sync);
  CHECK(e.ps.partition_bytes == (4u << 20));
  CHECK(e.ps.servers_per_host == 0);
  CHECK(e.ps.optimizer.name.empty());
  auto m =
      spec::load_file(d.write("mode.toml", "[run]\ncommand = 'x'\n[comm]\nmode = 'ps'\nnum_servers = 3\n"));
  CHECK(m.comm.mode == "ps");
  CHECK_FALSE(m.ps.present);
  CHECK(m.comm.num_servers == 3);
  // An explicit "ps" beside [ps] agrees; an optimizer table alone means sgd with its defaults.
  auto o = spec::load_file(
      d.write("o.toml",
              "[run]\ncommand = 'x'\n[comm]\nmode = 'ps'\n[ps]\nsync = false\npartition_bytes = 4096\n"
              "[ps.optimizer]\n"));
  CHECK_NOTHROW(spec::check(o));
  CHECK(o.ps.partition_bytes == 4096);
  CHECK(o.ps.optimizer.name == "sgd");
  CHECK(o.ps.optimizer.lr == doctest::Approx(0.01));
  CHECK(o.ps.optimizer.momentum == 0);
}

TEST_CASE("spec: [ps] errors are located and say what to do") {
  const std::string run = "[run]\ncommand = 'x'\n";
  struct Case {
    std::string text;
    const char* expected;
  };
  const Case cases[] = {
      {run + "[ps]\nsynk = false\n", "job.toml:4:1: unknown key 'synk' in [ps] (did you mean 'sync'?)"},
      {run + "[ps]\nserver_per_host = 2\n",
       "unknown key 'server_per_host' in [ps] (did you mean 'servers_per_host'?)"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nmomentun = 0.5\n",
       "job.toml:6:1: unknown key 'momentun' in [ps.optimizer] (did you mean 'momentum'?)"},
      {run + "[ps]\n[ps.optimizer]\nlr = 0.1\n",
       "job.toml:4:1: [ps.optimizer] is for asynchronous training, but [ps] sync is true (the default)"},
      {run + "[ps]\nsync = true\n[ps.optimizer]\nlr = 0.1\n",
       "job.toml:5:1: [ps.optimizer] is for asynchronous training, but [ps] sync is true (/"},
      {run + "[ps]\npartition_bytes = 0\n", "job.toml:4:19: 'partition_bytes' is 0, out of range"},
      {run + "[ps]\npartition_bytes = -5\n", "'partition_bytes' is -5, out of range"},
      {run + "[ps]\npartition_bytes = '2G'\n", "'partition_bytes' is '2G', out of range"},
      {run + "[ps]\npartition_bytes = 1073741825\n", "'partition_bytes' is 1073741825, out of range"},
      {run + "[ps]\npartition_bytes = '4 megs'\n",
       "job.toml:4:19: 'partition_bytes' is '4 megs', not a size"},
      {run + "[ps]\npartition_bytes = 1.5\n", "'partition_bytes' must be a number of bytes"},
      {run + "[ps]\nservers_per_host = 0\n", "job.toml:4:20: 'servers_per_host' is 0, out of range"},
      {run + "[ps]\nsync = 'yes'\n", "'sync' must be true or false"},
      {run + "[ps]\nhosts = []\n", "job.toml:4:9: [ps] hosts is empty"},
      {run + "[ps]\nhosts = [3]\n", "'hosts' must hold only strings"},
      {run + "[comm]\nmode = 'allreduce'\n[ps]\n",
       "job.toml:4:8: [comm] mode = \"allreduce\" contradicts the [ps] table at /"},
      {run + "[comm]\nnum_servers = 4\n[ps]\nservers_per_host = 2\n",
       "job.toml:6:20: [ps] servers_per_host and [comm] num_servers (/"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nname = 'adam'\n",
       "'name' is 'adam', which is not one of: sgd"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nlr = 0\n", "job.toml:6:6: 'lr' is 0, out of range"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nlr = 'fast'\n", "'lr' must be a number, not a string"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nmomentum = 1\n", "'momentum' is 1, out of range"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nmomentum = -0.1\n", "'momentum' is -0.1, out of range"},
      {run + "[ps]\nsync = false\n[ps.optimizer]\nweight_decay = -1\n", "'weight_decay' is -1, out of range"},
      {"ps = 3\n" + run, "'ps' must be a table ([ps]), not an integer"},
      {run + "[run.env]\nMLTRAIN_PS_SERVERS = 'h=a:1'\n", "env 'MLTRAIN_PS_SERVERS' is set by mltrain"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    std::string msg = error_of(c.text);
    CHECK_MESSAGE(msg.find(c.expected) != std::string::npos, msg);
  }
}

TEST_CASE("spec: [ps] in a profile, allreduce in the spec, is an error naming both") {
  TempDir d;
  d.write("ps-profile.toml", "[ps]\nservers_per_host = 2\n");
  std::string msg =
      error_of("profile = 'ps-profile.toml'\n[run]\ncommand = 'x'\n[comm]\nmode = 'allreduce'\n", &d);
  CHECK(msg.find("job.toml:5:8: [comm] mode = \"allreduce\" contradicts the [ps] table at ") !=
        std::string::npos);
  CHECK(msg.find("ps-profile.toml:1:1") != std::string::npos);
}

TEST_CASE("spec: to_toml keeps [ps] and num_servers") {
  TempDir d;
  auto s = spec::load_file(d.write("job.toml",
                                   "[run]\ncommand = 'x'\n[comm]\nnum_servers = 3\n[ps]\nhosts = "
                                   "['h3', 'h4']\nsync = false\npartition_bytes = '64K'\n"
                                   "[ps.optimizer]\nlr = 0.5\nmomentum = 0.25\n"));
  auto again = spec::load_file(d.write("again.toml", spec::to_toml(s)));
  CHECK_NOTHROW(spec::check(again));
  CHECK(again.comm.mode == "ps");
  CHECK(again.comm.num_servers == 3);
  CHECK(again.ps.present);
  CHECK(again.ps.hosts == s.ps.hosts);
  CHECK_FALSE(again.ps.sync);
  CHECK(again.ps.partition_bytes == 65536);
  CHECK(again.ps.optimizer.name == "sgd");
  CHECK(again.ps.optimizer.lr == doctest::Approx(0.5));
  CHECK(again.ps.optimizer.momentum == doctest::Approx(0.25));
  // Not PS: no [ps] table comes back.
  auto plain = spec::load_file(d.write("plain.toml", "[run]\ncommand = 'x'\n"));
  CHECK(spec::to_toml(plain).find("[ps]") == std::string::npos);
}

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The keys of keys_markdown(): "`run.timeout`", sections as "[run]".
std::set<std::string> schema_keys() {
  std::set<std::string> out;
  std::istringstream lines(spec::keys_markdown());
  for (std::string l; std::getline(lines, l);)
    if (l.rfind("| `", 0) == 0) out.insert(l.substr(3, l.find('`', 3) - 3));
  return out;
}

}  // namespace

TEST_CASE("spec: docs/spec.md lists every key of the schema, and only those") {
  const std::string doc = read_text(fs::path(MLTRAIN_SOURCE_DIR) / "docs/spec.md");
  const std::string begin = "<!-- keys: begin -->\n", end = "<!-- keys: end -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  // On a difference, paste the schema's table (printed here) between the markers.
  const std::string table = spec::keys_markdown();
  CHECK_MESSAGE(doc.substr(b + begin.size(), e - b - begin.size()) == table,
                "docs/spec.md's key table differs from the schema's:\n"
                    << table);

  // Every key the page's TOML examples write (or show commented out) is a key of the schema.
  const auto known = schema_keys();
  std::istringstream lines(doc);
  bool in_toml = false;
  std::string section;
  for (std::string l; std::getline(lines, l);) {
    if (l.rfind("```", 0) == 0) {
      in_toml = l == "```toml";
      section.clear();
      continue;
    }
    if (!in_toml) continue;
    std::string line = l.rfind("# ", 0) == 0 ? l.substr(2) : l;
    if (line.rfind("[", 0) == 0) {
      section = line.substr(line.find_first_not_of('['), line.find(']') - line.find_first_not_of('['));
      CHECK_MESSAGE(known.count("[" + section + "]") + known.count(section) == 1, l);
      continue;
    }
    const size_t eq = line.find(" = ");
    const std::string key = line.substr(0, eq);
    if (eq == std::string::npos || key.empty() || key.find_first_of(" #\"") != std::string::npos) continue;
    CHECK_MESSAGE(known.count(section.empty() ? key : section + "." + key) == 1, l);
  }
}
