// agent_core on a fake clock: the launcher is this test, speaking the real protocol over pipes;
// the ranks are a fake process table that records the signals its groups get and ends a rank
// when one would. Nothing sleeps: time moves when a test advances it.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runner/agent/agent_core.h"
#include "runner/protocol/protocol.h"
#include "runner/tree/hash.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;
namespace msg = mltrain::agent::msg;

namespace {

class FakeClock final : public agent::Clock {
 public:
  int64_t now_ms() const override { return now_; }
  void sleep_ms(int64_t ms) override { now_ += ms; }
  void advance(int64_t ms) { now_ += ms; }

 private:
  int64_t now_ = 1'000'000;
};

// A rank as the fake table keeps it: the signals its group got, the test's ends of its pipes.
struct FakeRank {
  agent::ProcessSpec spec;
  std::vector<int> signals;
  bool ignores_term = false;
  bool alive = true;
  int out = -1, err = -1, metrics = -1;  // the rank's write ends
};

class FakeProcesses final : public agent::ProcessTable {
 public:
  ~FakeProcesses() override {
    for (auto& [pid, r] : ranks) close_ends(r);
    for (int fd : warden_fds_) ::close(fd);
  }

  pid_t spawn(const agent::ProcessSpec& spec, agent::ProcessPipes& pipes, std::string& error) override {
    if (spec.argv[0] == "missing") {
      error = "exec of 'missing': No such file or directory";
      return -1;
    }
    FakeRank r;
    r.spec = spec;
    int out[2], err[2] = {-1, -1};
    REQUIRE(::pipe2(out, O_CLOEXEC | O_NONBLOCK) == 0);
    if (!spec.one_stream) REQUIRE(::pipe2(err, O_CLOEXEC | O_NONBLOCK) == 0);
    int metrics[2] = {-1, -1};
    if (spec.metrics_pipe) REQUIRE(::pipe2(metrics, O_CLOEXEC | O_NONBLOCK) == 0);
    pipes = agent::ProcessPipes{out[0], err[0], -1, metrics[0]};
    r.out = out[1], r.err = err[1], r.metrics = metrics[1];
    r.ignores_term = spec.argv[0] == "ignores-term";
    const pid_t pid = next_pid_++;
    ranks[pid] = std::move(r);
    return pid;
  }

  void signal_group(pid_t group, int sig) override {
    auto it = ranks.find(group);
    if (it == ranks.end() || !it->second.alive) return;
    it->second.signals.push_back(sig);
    if (sig == SIGKILL || (sig == SIGTERM && !it->second.ignores_term))
      end(group, sig);  // status: the signal
  }

  pid_t reap(int& status) override {
    if (ended_.empty()) return 0;
    auto [pid, st] = ended_.front();
    ended_.pop_front();
    status = st;
    return pid;
  }

  // Processes below the ranks that left their groups: found by the next `stray_sweeps` sweeps.
  bool kill_descendants(pid_t) override {
    if (stray_sweeps == 0) return false;
    --stray_sweeps;
    ++sweeps;
    return true;
  }

  int start_warden(const std::string&, const std::string&, pid_t& warden) override {
    warden = 1;
    warden_fds_.push_back(::open("/dev/null", O_WRONLY | O_CLOEXEC));
    return warden_fds_.back();
  }

  agent::OomMark oom_mark() override { return {}; }
  bool oom_killed(pid_t, const agent::OomMark&) override { return false; }

  // The rank exits by itself with `status` (as waitpid gives it), its pipes closed.
  void end(pid_t pid, int status) {
    FakeRank& r = ranks.at(pid);
    r.alive = false;
    close_ends(r);
    ended_.emplace_back(pid, status);
  }

  std::map<pid_t, FakeRank> ranks;
  int stray_sweeps = 0, sweeps = 0;

 private:
  static void close_ends(FakeRank& r) {
    for (int* fd : {&r.out, &r.err, &r.metrics})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }
  pid_t next_pid_ = 4000;
  std::deque<std::pair<pid_t, int>> ended_;
  std::vector<int> warden_fds_;
};

class FakeEnvironment final : public agent::Environment {
 public:
  std::optional<std::string> get(std::string_view name) const override {
    auto it = vars.find(std::string(name));
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  std::vector<std::string> entries() const override {
    std::vector<std::string> out;
    for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
    return out;
  }
  std::map<std::string, std::string> vars{{"HOME", "/nonexistent"}, {"PATH", "/usr/bin:/bin"}};
};

// The launcher's side: frames in over one pipe, frames out over another, a turn of the agent's
// loop at a time (it never waits: step(0)).
class Launcher {
 public:
  Launcher() {
    REQUIRE(::pipe2(to_agent_, O_CLOEXEC | O_NONBLOCK) == 0);
    REQUIRE(::pipe2(from_agent_, O_CLOEXEC | O_NONBLOCK) == 0);
    auto runtime = [](std::string&) { return std::string("/opt/mltrain-runtime"); };
    core_ = std::make_unique<agent::AgentCore>(agent::AgentStream{to_agent_[0], from_agent_[1], -1},
                                               agent::AgentWorld{clock, procs, env, runtime});
  }
  ~Launcher() {
    core_.reset();
    for (int fd : {to_agent_[0], to_agent_[1], from_agent_[0], from_agent_[1]})
      if (fd >= 0) ::close(fd);
  }

  template <class M>
  void send(const M& m, uint32_t id = 0) {
    std::string out;
    agent::encode(out, m, id);
    // A frame bigger than the pipe goes in as the agent reads it.
    for (size_t done = 0; done < out.size(); core_->step(0)) {
      ssize_t n = ::write(to_agent_[1], out.data() + done, out.size() - done);
      REQUIRE((n > 0 || errno == EAGAIN));
      if (n > 0) done += size_t(n);
    }
  }
  void hang_up() {
    ::close(to_agent_[1]);
    to_agent_[1] = -1;
  }
  // A few turns of the loop, enough for what was sent and for the ranks' ends to be seen; the
  // agent's exit code once it said Bye.
  std::optional<int> turns(int n = 3) {
    for (int i = 0; i < n; ++i)
      if (auto code = core_->step(0)) return code;
    return std::nullopt;
  }
  // Everything the agent said since the last call.
  std::vector<agent::Message> said() {
    char buf[1 << 16];
    ssize_t n;
    while ((n = ::read(from_agent_[0], buf, sizeof buf)) > 0) decoder_.feed(buf, size_t(n));
    std::vector<agent::Message> out;
    agent::Frame f;
    while (decoder_.next(f)) {
      std::string error;
      auto m = agent::decode(std::move(f), error);
      REQUIRE_MESSAGE(m, error);
      out.push_back(std::move(*m));
    }
    return out;
  }
  void hello(uint32_t grace_ms, uint32_t heartbeat_timeout_ms) {
    msg::Hello h;
    h.grace_ms = grace_ms;
    h.heartbeat_timeout_ms = heartbeat_timeout_ms;
    send(h);
    turns();
    auto got = said();
    REQUIRE(got.size() == 1);
    REQUIRE(std::holds_alternative<msg::HelloAck>(got[0]));
  }
  // Starts rank `id` running `program`; its pid.
  pid_t spawn(uint32_t id, const std::string& program) {
    msg::Spawn s;
    s.argv = {program};
    s.env = {"MLTRAIN_RUN_ID=unit-run"};
    send(s, id);
    turns();
    auto got = said();
    REQUIRE(got.size() == 1);
    REQUIRE(std::holds_alternative<msg::Started>(got[0]));
    return pid_t(std::get<msg::Started>(got[0]).pid);
  }

  FakeClock clock;
  FakeProcesses procs;
  FakeEnvironment env;

 private:
  int to_agent_[2], from_agent_[2];
  std::unique_ptr<agent::AgentCore> core_;
  agent::Decoder decoder_;
};

template <class M>
std::vector<M> all_of(const std::vector<agent::Message>& got) {
  std::vector<M> out;
  for (const auto& m : got)
    if (auto* p = std::get_if<M>(&m)) out.push_back(*p);
  return out;
}

const std::vector<int> kTermThenKill = {SIGCONT, SIGTERM, SIGKILL};

}  // namespace

TEST_CASE("agent_core: the launcher's pings stop, and after its silence window the agent stops its ranks") {
  Launcher l;
  l.hello(5000, 2000);
  const pid_t pid = l.spawn(0, "train");
  for (uint64_t seq = 1; seq <= 3; ++seq) {  // pings every 1.5 s keep it going
    l.clock.advance(1500);
    l.send(msg::Ping{seq});
    CHECK_FALSE(l.turns());
    auto pongs = all_of<msg::Pong>(l.said());
    REQUIRE(pongs.size() == 1);
    CHECK(pongs[0].seq == seq);
  }
  l.clock.advance(2000);  // the window, not past it
  CHECK_FALSE(l.turns());
  CHECK(l.said().empty());
  CHECK(l.procs.ranks.at(pid).signals.empty());

  l.clock.advance(1);
  CHECK_FALSE(l.turns(1));
  CHECK(l.procs.ranks.at(pid).signals == std::vector<int>{SIGCONT, SIGTERM});
  CHECK(l.turns() == 0);  // the rank ended on TERM: the agent leaves
  auto got = l.said();
  REQUIRE(!got.empty());
  REQUIRE(std::holds_alternative<msg::LauncherSilent>(got[0]));  // said first
  CHECK(std::get<msg::LauncherSilent>(got[0]).silent_ms == 2001);
  auto exits = all_of<msg::Exited>(got);
  REQUIRE(exits.size() == 1);
  CHECK(WIFSIGNALED(exits[0].status));
  CHECK(WTERMSIG(exits[0].status) == SIGTERM);
  CHECK(std::holds_alternative<msg::Bye>(got.back()));
}

TEST_CASE("agent_core: launcher silence: a paused launcher is waited for, a closed stream is not") {
  Launcher l;
  l.hello(5000, 2000);
  const pid_t pid = l.spawn(0, "ignores-term");

  SUBCASE("paused: no window until the next frame, which starts a new one") {
    l.send(msg::Pause{});
    CHECK_FALSE(l.turns());
    l.clock.advance(60'000);  // a laptop asleep for a minute
    CHECK_FALSE(l.turns());
    CHECK(l.said().empty());
    CHECK(l.procs.ranks.at(pid).signals.empty());
    l.send(msg::Ping{1});
    CHECK_FALSE(l.turns());
    CHECK(all_of<msg::Pong>(l.said()).size() == 1);
    l.clock.advance(2001);
    CHECK_FALSE(l.turns(1));
    CHECK(all_of<msg::LauncherSilent>(l.said()).size() == 1);
  }
  SUBCASE("closed: the ranks get the lost launcher's short grace (2 s, not the job's 5 s), then KILL") {
    l.hang_up();
    CHECK_FALSE(l.turns());
    CHECK(l.said().empty());  // nothing to say to a launcher that is gone
    CHECK(l.procs.ranks.at(pid).signals == std::vector<int>{SIGCONT, SIGTERM});
    l.clock.advance(1999);
    CHECK_FALSE(l.turns());
    CHECK(l.procs.ranks.at(pid).alive);
    l.clock.advance(1);
    CHECK(l.turns() == 0);
    CHECK(l.procs.ranks.at(pid).signals == kTermThenKill);
  }
}

TEST_CASE("agent_core: Terminate escalates: TERM and CONT to every group, KILL after the grace") {
  Launcher l;
  l.hello(5000, 0);
  const pid_t obeys = l.spawn(0, "train");
  const pid_t ignores = l.spawn(1, "ignores-term");
  l.send(msg::Terminate{3000});
  CHECK_FALSE(l.turns());
  CHECK(l.procs.ranks.at(obeys).signals == std::vector<int>{SIGCONT, SIGTERM});
  CHECK(l.procs.ranks.at(ignores).signals == std::vector<int>{SIGCONT, SIGTERM});
  auto exits = all_of<msg::Exited>(l.said());  // the one that obeyed is reported at once
  REQUIRE(exits.size() == 1);
  CHECK(WTERMSIG(exits[0].status) == SIGTERM);

  l.clock.advance(2999);
  CHECK_FALSE(l.turns());
  CHECK(l.procs.ranks.at(ignores).alive);
  CHECK(l.said().empty());
  l.clock.advance(1);
  CHECK_FALSE(l.turns());
  CHECK(l.procs.ranks.at(ignores).signals == kTermThenKill);
  exits = all_of<msg::Exited>(l.said());
  REQUIRE(exits.size() == 1);
  CHECK(WTERMSIG(exits[0].status) == SIGKILL);
}

TEST_CASE("agent_core: a rank that ignores TERM is killed at the heartbeat teardown's grace") {
  Launcher l;
  l.hello(10'000, 1000);
  const pid_t pid = l.spawn(0, "ignores-term");
  l.procs.end(l.spawn(1, "train"), 0);  // a rank that already finished stays reported once
  l.turns();
  CHECK(all_of<msg::Exited>(l.said()).size() == 1);

  l.clock.advance(1001);
  CHECK_FALSE(l.turns());
  CHECK(all_of<msg::LauncherSilent>(l.said()).size() == 1);
  CHECK(l.procs.ranks.at(pid).signals == std::vector<int>{SIGCONT, SIGTERM});
  l.clock.advance(1999);  // the lost launcher's grace is 2 s whatever the job's
  CHECK_FALSE(l.turns());
  CHECK(l.procs.ranks.at(pid).alive);
  l.clock.advance(1);
  CHECK(l.turns() == 0);
  auto got = l.said();
  auto exits = all_of<msg::Exited>(got);
  REQUIRE(exits.size() == 1);
  CHECK(WTERMSIG(exits[0].status) == SIGKILL);
  CHECK(std::holds_alternative<msg::Bye>(got.back()));
}

TEST_CASE("agent_core: Shutdown kills at once and sweeps what left the groups until a sweep finds none") {
  Launcher l;
  l.hello(5000, 0);
  const pid_t pid = l.spawn(0, "ignores-term");
  l.procs.stray_sweeps = 3;
  const int64_t before = l.clock.now_ms();
  l.send(msg::Shutdown{});
  CHECK(l.turns() == 0);
  CHECK(l.procs.ranks.at(pid).signals == std::vector<int>{SIGCONT, SIGKILL});  // no grace
  CHECK(l.procs.sweeps == 3);
  CHECK(l.clock.now_ms() - before == 2);  // a millisecond between sweeps, after the first
  auto got = l.said();
  auto exits = all_of<msg::Exited>(got);
  REQUIRE(exits.size() == 1);
  CHECK(WTERMSIG(exits[0].status) == SIGKILL);
  CHECK(std::holds_alternative<msg::Bye>(got.back()));
}

TEST_CASE("agent_core: a rank's output precedes its exit, and a failed exec is said once") {
  Launcher l;
  l.hello(5000, 0);
  const pid_t pid = l.spawn(3, "train");
  const std::string line = "step 1 loss 0.5\n";
  REQUIRE(::write(l.procs.ranks.at(pid).out, line.data(), line.size()) == ssize_t(line.size()));
  l.procs.end(pid, 1 << 8);  // exit code 1
  CHECK_FALSE(l.turns());
  auto got = l.said();
  REQUIRE(got.size() == 2);
  REQUIRE(std::holds_alternative<msg::Output>(got[0]));
  CHECK(std::get<msg::Output>(got[0]).bytes == line);
  REQUIRE(std::holds_alternative<msg::Exited>(got[1]));
  CHECK(WEXITSTATUS(std::get<msg::Exited>(got[1]).status) == 1);

  msg::Spawn s;
  s.argv = {"missing"};
  l.send(s, 4);
  CHECK_FALSE(l.turns());
  auto failed = all_of<msg::SpawnFailed>(l.said());
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].message == "exec of 'missing': No such file or directory");
}

// What the run records of a host: asked for, it comes with Prepared; not asked, nothing is probed.
TEST_CASE("agent_core: Prepare with facts says the host's OS, kernel, Python and mltrain") {
  Launcher l;
  l.hello(5000, 0);
  msg::Prepare p;
  p.argv0 = "train";
  l.send(p);
  CHECK_FALSE(l.turns());
  auto plain = all_of<msg::Prepared>(l.said());
  REQUIRE(plain.size() == 1);
  CHECK(plain[0].facts.empty());
  p.facts = 1;
  l.send(p);
  CHECK_FALSE(l.turns());
  auto got = all_of<msg::Prepared>(l.said());
  REQUIRE(got.size() == 1);
  std::map<std::string, std::string> facts;
  for (const auto& f : got[0].facts) facts[f.substr(0, f.find('='))] = f.substr(f.find('=') + 1);
  struct utsname u;
  REQUIRE(::uname(&u) == 0);
  CHECK(facts["kernel"] == u.release);
  CHECK(facts["arch"] == u.machine);
  CHECK_FALSE(facts["os"].empty());
  CHECK(facts["mltrain"].rfind("0.", 0) == 0);
  // python3 as the ranks' PATH (/usr/bin:/bin) finds it; no GPUs asked: no GPU facts.
  CHECK(facts["python"].find("(/usr/bin/python3)") != std::string::npos);
  CHECK(facts.count("torch") == 1);
  CHECK(facts.count("gpus") == 0);
  CHECK(facts.count("gpu_driver") == 0);
}

// mltrain.log's lines travel as stream 3 of the rank, apart from its output, before its exit.
TEST_CASE("agent_core: a rank's metrics pipe is forwarded as stream 3; the setup command has none") {
  Launcher l;
  l.hello(5000, 0);
  const pid_t pid = l.spawn(0, "train");
  const FakeRank& r = l.procs.ranks.at(pid);
  REQUIRE(r.spec.metrics_pipe);
  CHECK(std::find(r.spec.env.begin(), r.spec.env.end(), "MLTRAIN_METRICS_FD=3") != r.spec.env.end());
  const std::string metric = "{\"step\":1,\"loss\":0.5}\n", line = "step 1\n";
  REQUIRE(::write(r.metrics, metric.data(), metric.size()) == ssize_t(metric.size()));
  REQUIRE(::write(r.out, line.data(), line.size()) == ssize_t(line.size()));
  l.procs.end(pid, 0);
  CHECK_FALSE(l.turns());
  auto out = all_of<msg::Output>(l.said());
  REQUIRE(out.size() == 2);
  CHECK(out[0].stream == 1);
  CHECK(out[0].bytes == line);
  CHECK(out[1].stream == 3);
  CHECK(out[1].bytes == metric);

  msg::Spawn setup;
  setup.argv = {"sh"};
  setup.env = {"MLTRAIN_METRICS_FD=9"};
  l.send(setup, agent::kSetupId);
  CHECK_FALSE(l.turns());
  const FakeRank& s = std::prev(l.procs.ranks.end())->second;
  CHECK_FALSE(s.spec.metrics_pipe);
  for (const auto& kv : s.spec.env) CHECK(kv.rfind("MLTRAIN_METRICS_FD=", 0) != 0);
}

namespace {

std::string hash_of(const std::string& bytes) {
  return sync::canonical(XXH3_128bits(bytes.data(), bytes.size()));
}

msg::SyncManifest manifest_of(const std::string& dir, const std::string& name, const std::string& bytes) {
  msg::SyncManifest m;
  m.dir = dir;
  agent::SyncEntry e;
  e.path = name;
  e.mode = 0644;
  e.size = bytes.size();
  e.mtime_ns = 1'700'000'000'000'000'000;
  e.hash = hash_of(bytes);
  m.entries.push_back(e);
  return m;
}

msg::SyncData chunk(uint64_t offset, const std::string& bytes) {
  msg::SyncData d;
  d.offset = offset;
  d.raw_size = uint32_t(bytes.size());
  d.bytes = bytes;
  return d;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE(
    "agent_core: a sync cut off mid-file leaves no partial file under its name; the next completes it") {
  testing::TempDir tmp("agent-core-sync");
  const std::string dir = (tmp.path / "work").string();
  const std::string bytes(100'000, 'x');
  {
    Launcher l;
    l.hello(5000, 0);
    l.send(manifest_of(dir, "model.bin", bytes));
    CHECK_FALSE(l.turns());
    auto want = all_of<msg::SyncWant>(l.said());
    REQUIRE(want.size() == 1);
    CHECK(want[0].want == std::vector<int32_t>{0});
    l.send(chunk(0, bytes.substr(0, 60'000)), 0);
    CHECK_FALSE(l.turns());
    l.hang_up();  // the launcher is gone mid-file
    CHECK(l.turns() == 0);
    CHECK_FALSE(fs::exists(tmp.path / "work" / "model.bin"));
    // The part that came is only in this sync's own work folder.
    size_t partial = 0;
    for (const auto& e : fs::recursive_directory_iterator(tmp.path / "work" / ".mltrain-sync"))
      if (e.path().filename() == "f-0") partial = fs::file_size(e.path());
    CHECK(partial == 60'000);
  }
  Launcher l;
  l.hello(5000, 0);
  l.send(manifest_of(dir, "model.bin", bytes));
  CHECK_FALSE(l.turns());
  auto want = all_of<msg::SyncWant>(l.said());
  REQUIRE(want.size() == 1);
  CHECK(want[0].want == std::vector<int32_t>{0});  // nothing of the first try counts
  l.send(chunk(0, bytes.substr(0, 60'000)), 0);
  l.send(chunk(60'000, bytes.substr(60'000)), 0);
  l.send(msg::SyncEnd{});
  CHECK_FALSE(l.turns());
  auto done = all_of<msg::SyncDone>(l.said());
  REQUIRE(done.size() == 1);
  CHECK(done[0].files == 1);
  CHECK(done[0].problems.empty());
  CHECK(read_file(tmp.path / "work" / "model.bin") == bytes);
  CHECK((fs::status(tmp.path / "work" / "model.bin").permissions() & fs::perms::all) == fs::perms(0644));
}

TEST_CASE("agent_core: a plain command is exec'd by its shell, so the rank's process is the program") {
  Launcher l;
  l.hello(5000, 0);
  const std::pair<const char*, const char*> cases[] = {
      {"python3 train.py --lr 0.1", "exec python3 train.py --lr 0.1"},
      {"  /usr/bin/python3 -u t.py \"$X\"", "exec   /usr/bin/python3 -u t.py \"$X\""},
      {"cd src && python3 t.py", "cd src && python3 t.py"},
      {"python3 t.py > out.log", "python3 t.py > out.log"},
      {"A=1 python3 t.py", "A=1 python3 t.py"},
      {"export A=1", "export A=1"},
      {"for i in 1 2; do echo $i; done", "for i in 1 2; do echo $i; done"},
      {"echo $(hostname)", "echo $(hostname)"},
      {"python3 t.py\necho done", "python3 t.py\necho done"},
      {"$PY t.py", "$PY t.py"},
  };
  uint32_t id = 0;
  for (auto [command, ran] : cases) {
    msg::Spawn s;
    s.argv = {"/bin/sh", "-c", command};
    l.send(s, id++);
    CHECK_FALSE(l.turns());
    REQUIRE(all_of<msg::Started>(l.said()).size() == 1);
    const agent::ProcessSpec& spec = l.procs.ranks.rbegin()->second.spec;
    CHECK(spec.argv == std::vector<std::string>{"/bin/sh", "-c", ran});
  }
  msg::Spawn argv;  // argv is run as it is
  argv.argv = {"python3", "t.py"};
  l.send(argv, id);
  CHECK_FALSE(l.turns());
  REQUIRE(all_of<msg::Started>(l.said()).size() == 1);
  CHECK(l.procs.ranks.rbegin()->second.spec.argv == std::vector<std::string>{"python3", "t.py"});
}

TEST_CASE("agent_core: the ranks' environment: the agent's own, the job's over it") {
  Launcher l;
  l.env.vars["SHARED"] = "agent";
  l.env.vars["ONLY_AGENT"] = "1";
  l.hello(5000, 0);
  msg::Spawn s;
  s.argv = {"train"};
  s.env = {"SHARED=job", "RANK=2"};
  s.cwd = "~/proj";
  l.send(s, 2);
  CHECK_FALSE(l.turns());
  REQUIRE(all_of<msg::Started>(l.said()).size() == 1);
  const agent::ProcessSpec& spec = l.procs.ranks.begin()->second.spec;
  auto has = [&](const std::string& kv) {
    return std::find(spec.env.begin(), spec.env.end(), kv) != spec.env.end();
  };
  CHECK(has("SHARED=job"));
  CHECK(has("ONLY_AGENT=1"));
  CHECK(has("RANK=2"));
  CHECK(spec.cwd == "/nonexistent/proj");  // HOME as the agent's environment has it
  CHECK(has("MLTRAIN_RUNTIME=/opt/mltrain-runtime"));
}

// A claim through the protocol: Claim takes the host's leases, Claimed says granted or who is in
// the way, and Unclaim gives a grant back.
TEST_CASE("agent_core: Claim takes the host for the job; another job finds it in the way until Unclaim") {
  // This process plays both jobs' agents: it carries an agent's name, as lease holders are believed by.
  char old_name[17] = {};
  ::prctl(PR_GET_NAME, old_name);
  ::prctl(PR_SET_NAME, "mltrain-agent-a");
  struct Restore {
    const char* name;
    ~Restore() { ::prctl(PR_SET_NAME, name); }
  } restore{old_name};
  const std::string space = "agent-core-" + std::to_string(::getpid());
  auto claim = [&](const std::string& run, bool exclusive) {
    msg::Claim c;
    c.exclusive = exclusive ? 1 : 0;
    c.run_id = run;
    c.lease_space = space;
    c.claim_info = {"run=" + run, "user=tester"};
    return c;
  };
  auto claimed = [](Launcher& l) {
    l.turns();
    auto got = all_of<msg::Claimed>(l.said());
    REQUIRE(got.size() == 1);
    return got[0];
  };
  Launcher a, b;
  a.hello(5000, 0);
  b.hello(5000, 0);
  a.send(claim("run-a", true));
  CHECK(claimed(a).state == uint32_t(msg::ClaimState::granted));
  b.send(claim("run-b", false));
  auto cb = claimed(b);
  CHECK(cb.state == uint32_t(msg::ClaimState::busy));
  REQUIRE(cb.in_the_way.size() == 1);
  CHECK(cb.in_the_way[0].find("what=exclusive\n") != std::string::npos);
  CHECK(cb.in_the_way[0].find("pid=" + std::to_string(::getpid()) + "\n") != std::string::npos);
  a.send(msg::Unclaim{});
  a.turns();
  b.send(claim("run-b", false));
  CHECK(claimed(b).state == uint32_t(msg::ClaimState::granted));
}
