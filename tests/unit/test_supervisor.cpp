// Gang semantics with fake agents: each "host" is a thread that speaks the agent protocol over a
// socketpair and plays a script, so fail-fast, restarts and lost hosts are checked in milliseconds.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "runner/common/error.h"
#include "runner/common/status.h"
#include "runner/plan/plan.h"
#include "runner/protocol/protocol.h"
#include "runner/records/records.h"
#include "runner/supervise/doctor.h"
#include "runner/supervise/host_state.h"
#include "runner/supervise/plays.h"
#include "runner/supervise/supervisor.h"
#include "runner/supervise/watch.h"

namespace fs = std::filesystem;
using namespace mltrain;
using namespace std::chrono_literals;
namespace proto = mltrain::agent;

namespace {

// Time as the gang sees it: moves only when a test advances it, and wakes the gang's loop then.
class FakeClock final : public supervise::Clock {
 public:
  FakeClock() { REQUIRE(::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) == 0); }
  ~FakeClock() override {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  time_point now() const override { return time_point(std::chrono::nanoseconds(ns_.load())); }
  int wake_fd() const override { return pipe_[0]; }
  void drain_wake() override {
    char buf[64];
    while (::read(pipe_[0], buf, sizeof buf) > 0) {
    }
  }
  void advance(std::chrono::milliseconds d) {
    ns_ += std::chrono::nanoseconds(d).count();
    char b = 1;
    [[maybe_unused]] ssize_t n = ::write(pipe_[1], &b, 1);
  }

 private:
  std::atomic<int64_t> ns_{int64_t(1) << 40};
  int pipe_[2];
};

class FakeSignals final : public supervise::SignalSource {
 public:
  FakeSignals() { REQUIRE(::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) == 0); }
  ~FakeSignals() override {
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  int fd() const override { return pipe_[0]; }
  std::vector<int> take() override {
    unsigned char buf[16];
    std::vector<int> v;
    ssize_t n;
    while ((n = ::read(pipe_[0], buf, sizeof buf)) > 0) v.insert(v.end(), buf, buf + n);
    return v;
  }
  void deliver(int sig) {
    unsigned char b = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t n = ::write(pipe_[1], &b, 1);
  }

 private:
  int pipe_[2];
};

// What a fake rank does: print, then exit with `status` once the fake clock passes `after`
// (never, by default), unless stopped first.
struct Script {
  std::string output;
  int status = 0;  // wait status
  std::optional<std::chrono::milliseconds> after = std::chrono::milliseconds(0);
  bool ignore_interrupt = false;
};
constexpr std::optional<std::chrono::milliseconds> kNever = std::nullopt;
using ScriptFor = std::function<Script(int rank, int restart)>;

struct FakeHostBehaviour {
  bool refuse_connect = false;                      // connect() throws
  bool go_silent_after_spawn = false;               // stops answering (a cut link)
  std::string preflight_problem;                    // reported by prepare
  bool block_connect = false;                       // connect() hangs until the transport is destroyed
  bool mute_hello = false;                          // never answers hello
  bool mute_prepare = false;                        // never answers prepare
  int gpus = 0;                                     // GPUs reported when prepare asks for some
  std::optional<std::string> cuda_visible_devices;  // ... and the value that leaves gpu_usable
  std::vector<int> gpu_usable;                      // (empty: every GPU)
  std::chrono::milliseconds prepare_delay{0};       // answers prepare this much later (a slow probe)
  bool leave_on_spawn = false;    // says LauncherSilent and Bye instead of starting its ranks
  bool leave_on_prepare = false;  // says Bye instead of answering prepare
  int cannot_spawn_from = -1;     // answers SpawnFailed to the Spawns of this restart on (a vanished workdir)
};

// What every fake agent saw, for the test to wait on and assert.
struct Seen {
  std::atomic<int> spawns{0}, prepares{0}, connects{0}, terminates{0}, interrupts{0};
  std::atomic<int> restarts{0};
  std::atomic<int> spawn_failures{0};
  std::atomic<int> gpu_slots_asked{0};  // the most gpu_slots_needed one prepare asked for
  std::atomic<int> pings_before_spawn{0};
  std::atomic<int> telemetry_starts{0};
};

class FakeAgent {
 public:
  FakeAgent(int fd, ScriptFor script, FakeHostBehaviour b, Seen& seen, FakeClock& clock)
      : fd_(fd), script_(std::move(script)), b_(b), seen_(seen), clock_(clock), thread_([this] { loop(); }) {}
  ~FakeAgent() {
    thread_.join();
    ::close(fd_);
  }

 private:
  template <class M>
  void send(const M& m, uint32_t id = 0) {
    std::string wire;
    proto::encode(wire, m, id);
    size_t off = 0;
    while (off < wire.size()) {
      ssize_t n = ::send(fd_, wire.data() + off, wire.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += size_t(n);
    }
  }
  struct Running {
    Script s;
    supervise::Clock::time_point due;
    bool done = false;
  };
  void end(uint32_t id, Running& run, int status) {
    if (run.done) return;
    run.done = true;
    send(proto::msg::Exited{status, "", 0}, id);
  }
  void loop() {
    proto::Decoder d;
    std::map<uint32_t, Running> ranks;
    bool silent = false;
    std::optional<proto::msg::Prepared> delayed;
    supervise::Clock::time_point delayed_due{};
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 2) > 0) {
        char buf[65536];
        ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n <= 0) return;  // the launcher closed: a real agent would kill its ranks here
        d.feed(buf, size_t(n));
        proto::Frame f;
        while (d.next(f)) {
          if (silent) continue;
          uint32_t id = f.id;
          std::string error;
          auto m = proto::decode(std::move(f), error);
          REQUIRE(m);
          if (std::get_if<proto::msg::Hello>(&*m)) {
            if (!b_.mute_hello)
              send(proto::msg::HelloAck{proto::kMagic, proto::kVersion, 1, "fake", "x86_64"});
          } else if (auto* prepare = std::get_if<proto::msg::Prepare>(&*m)) {
            ++seen_.prepares;
            if (b_.mute_prepare) continue;
            if (b_.leave_on_prepare) {
              send(proto::msg::Bye{});
              silent = true;
              continue;
            }
            proto::msg::Prepared r;
            r.ifname = "fake0";
            r.local_ip = "10.0.0.9";
            r.ports = {"20001", "20002"};
            if (!b_.preflight_problem.empty()) r.problems.push_back(b_.preflight_problem);
            if (prepare->gpu_slots_needed > 0) {
              seen_.gpu_slots_asked = std::max(seen_.gpu_slots_asked.load(), int(prepare->gpu_slots_needed));
              for (int g = 0; g < b_.gpus; ++g) {
                r.gpus.push_back({g, "GPU-fake-" + std::to_string(g), "NVIDIA H100 80GB HBM3", 81559, 0});
                if (b_.gpu_usable.empty()) r.gpu_usable.push_back(g);
              }
              for (int g : b_.gpu_usable) r.gpu_usable.push_back(g);
              r.gpu_source = b_.gpus > 0 ? "nvml" : "";
              r.gpu_note =
                  b_.gpus > 0 ? "" : "no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi not in PATH";
              r.has_cuda_visible_devices = b_.cuda_visible_devices ? 1 : 0;
              r.cuda_visible_devices = b_.cuda_visible_devices.value_or("");
            }
            if (b_.prepare_delay.count() > 0) {
              delayed = r;
              delayed_due = clock_.now() + b_.prepare_delay;
            } else {
              send(r);
            }
          } else if (auto* spawn = std::get_if<proto::msg::Spawn>(&*m)) {
            if (b_.leave_on_spawn) {
              send(proto::msg::LauncherSilent{12000});
              send(proto::msg::Bye{});
              silent = true;
              continue;
            }
            // Which attempt this is, as the rank itself sees it (an elastic restart numbers the
            // ranks anew: a host's rank id says nothing of it).
            int restart = 0;
            static constexpr std::string_view kCount = "TORCHELASTIC_RESTART_COUNT=";
            for (const auto& kv : spawn->env)
              if (kv.compare(0, kCount.size(), kCount) == 0) restart = std::atoi(kv.c_str() + kCount.size());
            if (id == 0) seen_.restarts = restart;
            if (b_.cannot_spawn_from >= 0 && restart >= b_.cannot_spawn_from) {
              send(proto::msg::SpawnFailed{"chdir /home/u/job: No such file or directory"}, id);
              ++seen_.spawn_failures;
              if (b_.go_silent_after_spawn) silent = true;
              continue;
            }
            Running run{script_(int(id), restart), {}, false};
            if (run.s.after) run.due = clock_.now() + *run.s.after;
            send(proto::msg::Started{1000 + int(id)}, id);
            if (!run.s.output.empty()) send(proto::msg::Output{1, run.s.output}, id);
            ranks[id] = run;
            if (b_.go_silent_after_spawn) silent = true;
            ++seen_.spawns;
          } else if (auto* sig = std::get_if<proto::msg::Signal>(&*m)) {
            ++seen_.interrupts;
            for (auto& [rid, run] : ranks)
              if (!run.s.ignore_interrupt) end(rid, run, sig->signo);
          } else if (std::get_if<proto::msg::Terminate>(&*m)) {
            ++seen_.terminates;
            for (auto& [rid, run] : ranks) end(rid, run, SIGTERM);
          } else if (auto* probe = std::get_if<proto::msg::Probe>(&*m)) {
            proto::msg::Probed r{{"arch=x86_64", "gpus=0", "time_ms=0"}, {}};
            if (probe->port != 0) r.facts.push_back("port_free=no");
            send(r);
          } else if (auto* ping = std::get_if<proto::msg::Ping>(&*m)) {
            if (seen_.spawns == 0) ++seen_.pings_before_spawn;
            send(proto::msg::Pong{ping->seq});
          } else if (std::get_if<proto::msg::TelemetryStart>(&*m)) {
            ++seen_.telemetry_starts;
          } else if (std::get_if<proto::msg::Shutdown>(&*m)) {
            send(proto::msg::Bye{});
            return;
          }
        }
      }
      auto now = clock_.now();
      if (delayed && now >= delayed_due) {
        send(*delayed);
        delayed.reset();
      }
      for (auto& [id, run] : ranks)
        if (!silent && run.s.after && now >= run.due) end(id, run, run.s.status);
    }
  }
  int fd_;
  ScriptFor script_;
  FakeHostBehaviour b_;
  Seen& seen_;
  FakeClock& clock_;
  std::thread thread_;
};

class FakeLink : public transport::AgentLink {
 public:
  FakeLink(int fd, std::string name) : fd_(fd), name_(std::move(name)) {}
  ~FakeLink() override {
    if (fd_ >= 0) ::close(fd_);
  }
  int read_fd() const override { return fd_; }
  int write_fd() const override { return fd_; }
  std::string describe() const override { return name_; }
  std::string address() const override { return name_; }
  void kill() override { ::shutdown(fd_, SHUT_RDWR); }

 private:
  int fd_;
  std::string name_;
};

class FakeTransport : public transport::Transport {
 public:
  FakeTransport(ScriptFor s, std::map<std::string, FakeHostBehaviour> b)
      : script_(std::move(s)), behaviour_(std::move(b)) {}
  ~FakeTransport() override {
    // Connections the gang abandoned may still be blocked here: release them and wait.
    {
      std::lock_guard<std::mutex> lock(m_);
      closing_ = true;
    }
    cv_.notify_all();
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return in_connect_ == 0; });
    lock.unlock();
    std::lock_guard<std::mutex> agents_lock(agents_m_);
    agents_.clear();
  }
  std::unique_ptr<transport::AgentLink> connect(const plan::HostPlan& h) override {
    auto b = behaviour_.at(h.host.name);
    ++seen.connects;
    if (b.refuse_connect) throw Error("connection refused", {}, exit_code::host_failure);
    if (b.block_connect) {
      std::unique_lock<std::mutex> lock(m_);
      ++in_connect_;
      cv_.wait(lock, [&] { return closing_; });
      --in_connect_;
      cv_.notify_all();
      throw Error("connection timed out", {}, exit_code::host_failure);
    }
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    REQUIRE(::fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
    std::lock_guard<std::mutex> lock(agents_m_);
    agents_.push_back(std::make_unique<FakeAgent>(sv[1], script_, b, seen, clock));
    return std::make_unique<FakeLink>(sv[0], h.host.name);
  }
  Seen seen;
  FakeClock clock;
  FakeSignals signals;

 private:
  ScriptFor script_;
  std::map<std::string, FakeHostBehaviour> behaviour_;
  std::mutex agents_m_;
  std::vector<std::unique_ptr<FakeAgent>> agents_;
  std::mutex m_;
  std::condition_variable cv_;
  int in_connect_ = 0;
  bool closing_ = false;
};

// Runs `step` on a thread of its own beside the gang: the test's hand on the clock and signals.
// `done` turns true when the run is over; the step must return soon after.
class Driver {
 public:
  Driver(const std::atomic<bool>& done, std::function<void(const std::atomic<bool>& done)> step)
      : thread_([&done, step] { step(done); }) {}
  ~Driver() { thread_.join(); }

 private:
  std::thread thread_;
};

// Waits (in real time, without asserting on it) until `cond` holds or the run is over.
bool wait_until(const std::atomic<bool>& done, const std::function<bool()>& cond) {
  while (!done && !cond()) std::this_thread::sleep_for(1ms);
  return cond();
}

// Moves the fake clock forward in small steps, so agents can answer heartbeats in between.
void advance_in_steps(FakeClock& c, const std::atomic<bool>& done, std::chrono::milliseconds total,
                      std::chrono::milliseconds step = 250ms) {
  for (auto t = 0ms; t < total && !done; t += step) {
    c.advance(step);
    std::this_thread::sleep_for(2ms);
  }
}

struct Run {
  fs::path home;
  records::RunRecord rec;
  plan::Plan plan;
  int code = -1;
  std::atomic<bool> finished{false};
  Run() {
    char tmpl[] = "/tmp/mltrain-sup-XXXXXX";
    home = ::mkdtemp(tmpl);
    ::setenv("MLTRAIN_HOME", home.c_str(), 1);
  }
  ~Run() {
    ::unsetenv("MLTRAIN_HOME");
    fs::remove_all(home);
  }
  void go(const std::string& hosts, FakeTransport& t, supervise::Options o = {},
          const std::function<void(spec::JobSpec&)>& tweak = {}) {
    spec::JobSpec s;
    s.name = "t";
    s.run.argv = {"x"};
    s.cluster.hosts = {hosts};
    if (tweak) tweak(s);
    plan::Inputs in;
    in.run_id = records::create_run("t");
    in.token = "tok";
    in.free_port = [] { return 12345 + std::rand() % 1000; };
    plan = plan::make_plan(s, in);
    rec.id = in.run_id;
    rec.name = "t";
    records::fill_from_plan(rec, plan);
    o.console.quiet = true;
    o.clock = &t.clock;
    o.signals = &t.signals;
    supervise::TransportFor tf = [&](const plan::HostPlan&) -> transport::Transport& { return t; };
    struct Done {
      std::atomic<bool>& f;
      ~Done() { f = true; }
    } done{finished};
    code = supervise::run_job(plan, rec, o, tf);
  }
  // An elastic run: max_restarts both where the spec and the supervisor's options keep it.
  void go_elastic(const std::string& hosts, FakeTransport& t, int max_restarts,
                  const std::function<void(spec::JobSpec&)>& tweak) {
    supervise::Options o;
    o.max_restarts = max_restarts;
    go(hosts, t, o, [&](spec::JobSpec& s) {
      s.run.max_restarts = max_restarts;
      tweak(s);
    });
  }
  std::string log(int rank) const {
    std::ifstream in(records::run_dir(rec.id) + "/rank-" + std::to_string(rank) + ".log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

int exited(int code) { return code << 8; }

FakeHostBehaviour host_that(bool FakeHostBehaviour::*what) {
  FakeHostBehaviour b;
  b.*what = true;
  return b;
}
FakeHostBehaviour host_with_problem(std::string problem) {
  FakeHostBehaviour b;
  b.preflight_problem = std::move(problem);
  return b;
}

const std::map<std::string, FakeHostBehaviour> kPlainHosts = {{"a", {}}, {"b", {}}, {"c", {}}};

}  // namespace

TEST_CASE("supervisor: every rank succeeds") {
  FakeTransport t([](int r, int) { return Script{"hello " + std::to_string(r) + "\n", 0}; }, kPlainHosts);
  Run run;
  run.go("a:2,b:2", t);
  CHECK(run.code == 0);
  CHECK(run.rec.status == "succeeded");
  CHECK(run.log(3) == "hello 3\n");
  auto saved = records::load(run.rec.id);
  CHECK(saved.status == "succeeded");
  CHECK(saved.ranks[2].exit_code == 0);
  CHECK(saved.ranks[2].pid == 1002);
  // Rendezvous learnt at preflight: rank 0's host address and the ports it chose.
  CHECK(run.rec.master_addr == "a");
  CHECK(run.rec.master_port == 20001);
  CHECK(saved.ranks[3].env["MLTRAIN_STORE_ADDR"] == "a:20002");
  CHECK(saved.ranks[3].env["NCCL_SOCKET_IFNAME"] == "fake0");
}

TEST_CASE("supervisor: the first failure stops the gang and sets the exit code") {
  FakeTransport t(
      [](int r, int) {
        if (r == 2) return Script{"boom\n", exited(3)};
        if (r == 3) return Script{"", exited(5), 2000ms};  // would fail later; must not be reported
        return Script{"", 0, kNever};
      },
      kPlainHosts);
  Run run;
  run.go("a:2,b:2", t);
  CHECK(run.code == 3);
  CHECK(run.rec.status == "failed");
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->rank == 2);
  CHECK(run.rec.failure->host == "b");
  CHECK(run.rec.failure->tail == std::vector<std::string>{"boom"});
  CHECK(run.rec.ranks[0].signal == SIGTERM);
  CHECK(run.rec.ranks[3].signal == SIGTERM);
}

// The OOM killer (or a user) SIGKILLs rank 1; rank 0's collective fails on the lost peer and its
// exit is reported first. The killed rank is the first failure, not the one that failed for it.
TEST_CASE("supervisor: a rank SIGKILLed just after another's error exit is the first failure") {
  FakeTransport t(
      [](int r, int) {
        if (r == 0) return Script{"rank 1 closed the connection\n", exited(1), 1000ms};
        if (r == 1) return Script{"", SIGKILL, 1000ms};
        return Script{"", 0, kNever};
      },
      kPlainHosts);
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 3; });
    advance_in_steps(t.clock, done, 20s);
  });
  run.go("a:3", t);
  CHECK(run.code == 128 + SIGKILL);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->rank == 1);
  CHECK(run.rec.failure->signal == SIGKILL);
  CHECK(run.rec.failure->message.find("rank 0 on a failed just before, most likely for it") !=
        std::string::npos);
  CHECK(run.rec.ranks[2].signal == SIGTERM);  // the stop's own TERM takes nothing over
}

TEST_CASE("supervisor: a signal death maps to 128+N") {
  FakeTransport t(
      [](int r, int) {
        return r == 1 ? Script{"", SIGKILL} : Script{"", 0, kNever};
      },
      kPlainHosts);
  Run run;
  run.go("a:2", t);
  CHECK(run.code == 128 + SIGKILL);
  // SIGKILL alone is no evidence of memory trouble (issue 31, item 15): only the agent's word is.
  CHECK(describe_status(SIGKILL) == "SIGKILL");
  CHECK(describe_status(SIGKILL, true) == "SIGKILL (killed by the kernel: out of memory)");
}

TEST_CASE("supervisor: max_restarts restarts the whole gang") {
  FakeTransport t(
      [](int r, int restart) {
        return (r == 1 && restart < 2) ? Script{"", exited(1)} : Script{"", 0};
      },
      kPlainHosts);
  Run run;
  supervise::Options o;
  o.max_restarts = 3;
  run.go("a:2", t, o);
  CHECK(run.code == 0);
  CHECK(run.rec.restarts == 2);
  CHECK(t.seen.restarts == 2);
  CHECK(run.log(0).find("==> mltrain: restart 1 of 3 <==") != std::string::npos);
}

namespace {

// Elastic restarts (docs/elastic.md): the first attempt's ranks run until b falls silent; the
// second attempt's end at once.
Script until_restarted(int, int restart) { return restart == 0 ? Script{"", 0, kNever} : Script{"", 0}; }

// Hosts a, b, c, where b falls silent (a cut link) after its first Spawn: runs `hosts` with
// max_restarts and the elastic keys `tweak` sets, moving the fake clock on once `spawns` ranks
// started, until the run ends.
void run_losing_b(Run& run, FakeTransport& t, const std::string& hosts, int spawns, int max_restarts,
                  const std::function<void(spec::JobSpec&)>& tweak) {
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == spawns; });
    advance_in_steps(t.clock, done, 30s);
  });
  run.go_elastic(hosts, t, max_restarts, tweak);
}

const std::map<std::string, FakeHostBehaviour> kSilentB = {
    {"a", {}}, {"b", host_that(&FakeHostBehaviour::go_silent_after_spawn)}, {"c", {}}};

}  // namespace

TEST_CASE("supervisor: an elastic gang restarts without a lost host, its ranks numbered anew") {
  FakeTransport t(until_restarted, kSilentB);
  Run run;
  // b falls silent after its first Spawn: 5 of the 6 ranks start.
  run_losing_b(run, t, "a:2,b:2,c:2", 5, 1, [](spec::JobSpec& s) { s.cluster.min_hosts = 2; });
  CHECK(run.code == 0);
  CHECK(run.rec.restarts == 1);
  REQUIRE(run.rec.generations.size() == 2);
  CHECK(run.rec.generations[0].hosts == std::vector<std::string>{"a", "b", "c"});
  CHECK(run.rec.generations[0].world_size == 6);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "c"});
  CHECK(run.rec.generations[1].world_size == 4);
  CHECK(run.rec.generations[1].why.find("b: stopped answering heartbeats") != std::string::npos);
  CHECK(run.rec.generations[1].why.find("without b, on 2 hosts") != std::string::npos);
  CHECK(t.seen.spawns == 9);
  REQUIRE(run.rec.ranks.size() == 4);
  CHECK(run.rec.ranks[2].host == 2);  // c's ranks are 2 and 3 now
  auto env = plan::rank_env(run.plan, run.plan.runtime, 3);
  std::map<std::string, std::string> e(env.begin(), env.end());
  CHECK(e["RANK"] == "3");
  CHECK(e["WORLD_SIZE"] == "4");
  CHECK(e["NODE_RANK"] == "1");
  CHECK(e["GROUP_WORLD_SIZE"] == "2");
  CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
  CHECK(run.log(2).find("==> mltrain: restart 1 of 1: without b, on 2 hosts <==") != std::string::npos);
}

TEST_CASE("supervisor: a restart that moves rank 0 to another host says where its checkpoint folder is") {
  FakeTransport t(until_restarted, kSilentB);
  Run run;
  run_losing_b(run, t, "b:2,a:2,c:2", 5, 1, [](spec::JobSpec& s) { s.cluster.min_hosts = 2; });
  CHECK(run.code == 0);
  REQUIRE(run.rec.generations.size() == 2);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "c"});
  // It started from step 0 without a word (private homes): the record and the console say it.
  CHECK(run.rec.generations[1].why.find("rank 0 moved from b to a (its checkpoint folder stays on b unless "
                                        "homes are shared)") != std::string::npos);
}

TEST_CASE("supervisor: a spare takes a lost host's place; it ran nothing before") {
  FakeTransport t(until_restarted, kSilentB);
  Run run;
  run_losing_b(run, t, "a:1,b:1", 2, 1, [](spec::JobSpec& s) { s.cluster.spares = {"c"}; });
  CHECK(run.code == 0);
  CHECK(t.seen.prepares == 3);  // the spare was prepared with the others
  CHECK(t.seen.spawns == 4);    // 2 ranks, then 2 again: the spare ran only after the restart
  REQUIRE(run.rec.generations.size() == 2);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "c"});
  CHECK(run.rec.generations[1].world_size == 2);
  CHECK(run.rec.generations[1].why.find("c in place of b") != std::string::npos);
  REQUIRE(run.rec.ranks.size() == 2);
  CHECK(run.rec.hosts[size_t(run.rec.ranks[1].host)].name == "c");
}

TEST_CASE("supervisor: fewer than min_hosts left: no restart, the lost host is the failure") {
  FakeTransport t(until_restarted, kSilentB);
  Run run;
  run_losing_b(run, t, "a:1,b:1,c:1", 3, 2, [](spec::JobSpec& s) { s.cluster.min_hosts = 3; });
  CHECK(run.code == exit_code::host_failure);
  CHECK(run.rec.restarts == 0);
  CHECK(t.seen.spawns == 3);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->host == "b");
}

namespace {

// Hosts a, b, c (or a, b and the spare c): b's rank fails at the start, and at the first restart b's
// ranks cannot start (its workdir is gone); the third attempt's ranks end at once.
Script b_fails_then_all_pass(int r, int restart) {
  if (restart == 0) return r == 1 ? Script{"", exited(1)} : Script{"", 0, kNever};
  return restart == 1 ? Script{"", 0, kNever} : Script{"", 0};
}
FakeHostBehaviour cannot_spawn_from(int restart) {
  FakeHostBehaviour b;
  b.cannot_spawn_from = restart;
  return b;
}
const std::map<std::string, FakeHostBehaviour> kBCannotRestart = {
    {"a", {}}, {"b", cannot_spawn_from(1)}, {"c", {}}};

}  // namespace

TEST_CASE("supervisor: an elastic gang leaves out a host whose ranks could not start at a restart") {
  FakeTransport t(b_fails_then_all_pass, kBCannotRestart);
  Run run;
  run.go_elastic("a:1,b:1,c:1", t, 3, [](spec::JobSpec& s) { s.cluster.min_hosts = 2; });
  CHECK(run.code == 0);
  CHECK(t.seen.spawn_failures == 1);  // b was not asked again
  CHECK(run.rec.restarts == 2);
  REQUIRE(run.rec.generations.size() == 3);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "b", "c"});
  CHECK(run.rec.generations[2].hosts == std::vector<std::string>{"a", "c"});
  CHECK(run.rec.generations[2].why.find("rank 1 could not start") != std::string::npos);
  CHECK(run.rec.generations[2].why.find("without b (its ranks could not start), on 2 hosts") !=
        std::string::npos);
}

TEST_CASE("supervisor: a spare takes the place of a host whose ranks could not start") {
  FakeTransport t(b_fails_then_all_pass, kBCannotRestart);
  Run run;
  run.go_elastic("a:1,b:1", t, 3, [](spec::JobSpec& s) { s.cluster.spares = {"c"}; });
  CHECK(run.code == 0);
  REQUIRE(run.rec.generations.size() == 3);
  CHECK(run.rec.generations[2].hosts == std::vector<std::string>{"a", "c"});
  CHECK(run.rec.generations[2].why.find("c in place of b (its ranks could not start)") != std::string::npos);
}

TEST_CASE("supervisor: a host whose ranks cannot start at the first attempt is left out of the next") {
  FakeTransport t(until_restarted, {{"a", {}}, {"b", cannot_spawn_from(0)}, {"c", {}}});
  Run run;
  run.go_elastic("a:1,b:1,c:1", t, 1, [](spec::JobSpec& s) { s.cluster.min_hosts = 2; });
  CHECK(run.code == 0);
  REQUIRE(run.rec.generations.size() == 2);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "c"});
}

TEST_CASE("supervisor: a host the gang left, lost later, does not stop the gang it is out of") {
  FakeHostBehaviour b = cannot_spawn_from(0);
  b.go_silent_after_spawn = true;  // its workdir went, then the host
  FakeTransport t(
      [](int, int restart) {
        return restart == 0 ? Script{"", 0, kNever} : Script{"", 0, std::chrono::milliseconds(20s)};
      },
      {{"a", {}}, {"b", b}, {"c", {}}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 4; });  // a and c, twice
    advance_in_steps(t.clock, done, 40s);                  // b's silence outlasts the heartbeat timeout
  });
  run.go_elastic("a:1,b:1,c:1", t, 1, [](spec::JobSpec& s) { s.cluster.min_hosts = 2; });
  CHECK(run.code == 0);
  CHECK(run.rec.restarts == 1);
  CHECK_FALSE(run.rec.failure);
}

TEST_CASE("supervisor: a spare whose ranks could not start is not called in again") {
  // b is lost, the spare c cannot start, the spare d steps in and is lost too: no spare is left
  // (c again would fail again), so the run ends rather than spend a restart on c.
  FakeHostBehaviour silent = host_that(&FakeHostBehaviour::go_silent_after_spawn);
  FakeTransport t(until_restarted, {{"a", {}}, {"b", silent}, {"c", cannot_spawn_from(0)}, {"d", silent}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    advance_in_steps(t.clock, done, 60s);
  });
  run.go_elastic("a:1,b:1", t, 3, [](spec::JobSpec& s) { s.cluster.spares = {"c", "d"}; });
  CHECK(run.code == exit_code::host_failure);
  CHECK(t.seen.spawn_failures == 1);
  REQUIRE(run.rec.generations.size() == 3);
  CHECK(run.rec.generations[1].hosts == std::vector<std::string>{"a", "c"});
  CHECK(run.rec.generations[2].hosts == std::vector<std::string>{"a", "d"});
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->host == "d");
}

TEST_CASE("supervisor: without min_hosts or spares, a host whose ranks cannot start fails every restart") {
  FakeTransport t(b_fails_then_all_pass, kBCannotRestart);
  Run run;
  supervise::Options o;
  o.max_restarts = 2;
  run.go("a:1,b:1,c:1", t, o, [](spec::JobSpec& s) { s.run.max_restarts = 2; });
  CHECK(run.code == 127);
  CHECK(run.rec.restarts == 2);
  CHECK(t.seen.spawn_failures == 2);
}

TEST_CASE("supervisor: restarts run out") {
  FakeTransport t(
      [](int r, int) {
        return r == 0 ? Script{"", exited(4)} : Script{"", 0, kNever};
      },
      kPlainHosts);
  Run run;
  supervise::Options o;
  o.max_restarts = 2;
  run.go("a:1,b:1", t, o);
  CHECK(run.code == 4);
  CHECK(run.rec.restarts == 2);
}

TEST_CASE("supervisor: a host that cannot be reached fails preflight; nothing starts") {
  FakeTransport t([&](int, int) { return Script{}; },
                  {{"a", {}},
                   {"b", host_that(&FakeHostBehaviour::refuse_connect)},
                   {"c", host_with_problem("workdir /x does not exist here")}});
  Run run;
  try {
    run.go("a:1,b:1,c:1", t);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == exit_code::host_failure);
    CHECK(std::string(e.what()).find("b: connection refused") != std::string::npos);
    CHECK(std::string(e.what()).find("c: workdir /x does not exist here") != std::string::npos);
    CHECK(std::string(e.what()).find("preflight failed on 2 of 3 hosts") != std::string::npos);
    CHECK(std::string(e.what()).find("no rank was started") != std::string::npos);
  }
  CHECK(t.seen.spawns == 0);
  CHECK(records::load(run.rec.id).status == "host-failure");
}

// A host whose agent leaves before the ranks start fails preflight at once: the other hosts do
// not wait for its answer until the preflight timeout.
TEST_CASE("supervisor: an agent that leaves during preflight fails its host; nothing starts") {
  FakeTransport t([&](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::leave_on_prepare)}});
  Run run;
  try {
    run.go("a:1,b:1", t);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == exit_code::host_failure);
    CHECK(std::string(e.what()).find("b: the agent left before the ranks started") != std::string::npos);
    CHECK(std::string(e.what()).find("preflight failed on 1 of 2 hosts") != std::string::npos);
  }
  CHECK(t.seen.spawns == 0);
  CHECK(records::load(run.rec.id).status == "host-failure");
}

// Issue 31, items 12 and 14: a host's words reach the error (and the record) escaped; a NUL in
// them does not cut the list of problems.
TEST_CASE("supervisor: a host's problem text is escaped and a NUL in it cuts nothing") {
  FakeTransport t([&](int, int) { return Script{}; },
                  {{"a", host_with_problem(std::string("bad \x1b]0;pwned\x07 name\0after the NUL", 33))},
                   {"b", host_with_problem("second problem")}});
  Run run;
  try {
    run.go("a:1,b:1", t);
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("a: bad \\x1b]0;pwned\\x07 name\\x00after the NUL") != std::string::npos);
    CHECK(what.find("b: second problem") != std::string::npos);
    CHECK(what.find('\x1b') == std::string::npos);
  }
  auto saved = records::load(run.rec.id);
  REQUIRE(saved.failure);
  CHECK(saved.failure->message.find("after the NUL") != std::string::npos);
  CHECK(saved.failure->message.find('\x1b') == std::string::npos);
}

namespace {
std::string env_value(const plan::Plan& p, int rank, const std::string& k) {
  for (const auto& [ek, ev] : plan::rank_env(p, p.runtime, rank))
    if (ek == k) return ev;
  return "<unset>";
}
FakeHostBehaviour host_with_gpus(int n, std::optional<std::string> visible = std::nullopt,
                                 std::vector<int> usable = {}) {
  FakeHostBehaviour b;
  b.gpus = n;
  b.cuda_visible_devices = std::move(visible);
  b.gpu_usable = std::move(usable);
  return b;
}
}  // namespace

TEST_CASE("supervisor: GPUs are assigned from each host's usable GPUs at preflight") {
  auto per_proc = [](int n) { return [n](spec::JobSpec& s) { s.gpus.per_proc = n; }; };
  SUBCASE("per_proc = 1, and a host's CUDA_VISIBLE_DEVICES restricts its set") {
    FakeTransport t([](int, int) { return Script{}; },
                    {{"a", host_with_gpus(4)}, {"b", host_with_gpus(4, "3,1", {3, 1})}});
    Run run;
    run.go("a:2,b:2", t, {}, per_proc(1));
    CHECK(run.code == 0);
    CHECK(t.seen.gpu_slots_asked == 2);
    CHECK(env_value(run.plan, 0, "CUDA_VISIBLE_DEVICES") == "0");
    CHECK(env_value(run.plan, 1, "CUDA_VISIBLE_DEVICES") == "1");
    CHECK(env_value(run.plan, 2, "CUDA_VISIBLE_DEVICES") == "3");  // b's first usable GPU
    CHECK(env_value(run.plan, 3, "CUDA_VISIBLE_DEVICES") == "1");
    CHECK(env_value(run.plan, 3, "CUDA_DEVICE_ORDER") == "PCI_BUS_ID");
    // The run record shows what the ranks got.
    auto rec = records::load(run.rec.id);
    REQUIRE(rec.ranks.size() == 4);
    bool found = false;
    for (const auto& [k, v] : rec.ranks[2].env) found = found || (k == "CUDA_VISIBLE_DEVICES" && v == "3");
    CHECK(found);
  }
  SUBCASE("a host with too few GPUs fails preflight, named, and nothing starts") {
    FakeTransport t(
        [](int, int) { return Script{}; },
        {{"a", host_with_gpus(4)}, {"b", host_with_gpus(4, "1,3", {1, 3})}, {"c", host_with_gpus(0)}});
    Run run;
    try {
      run.go("a:2,b:2,c:1", t, {}, per_proc(2));
      FAIL("no error");
    } catch (const Error& e) {
      std::string what = e.what();
      CHECK(e.code() == exit_code::host_failure);
      CHECK(what.find("preflight failed on 2 of 3 hosts; no rank was started:") != std::string::npos);
      CHECK(what.find("\n  b: [gpus] per_proc = 2 for 2 ranks needs 4 GPUs; b has 2 usable "
                      "(CUDA_VISIBLE_DEVICES=1,3) of 4 (GPU 0-3: NVIDIA H100 80GB HBM3)") !=
            std::string::npos);
      CHECK(what.find("\n  c: [gpus] per_proc = 2 but c has no GPU (no NVIDIA driver: libnvidia-ml.so.1 not "
                      "found, nvidia-smi not in PATH)") != std::string::npos);
      CHECK(what.find("  a:") == std::string::npos);
    }
    CHECK(t.seen.spawns == 0);
  }
  SUBCASE("a CPU job asks no host for GPUs") {
    FakeTransport t([](int, int) { return Script{}; }, {{"a", host_with_gpus(0)}});
    Run run;
    run.go("a:2", t);
    CHECK(run.code == 0);
    CHECK(t.seen.gpu_slots_asked == 0);
    CHECK(env_value(run.plan, 0, "CUDA_VISIBLE_DEVICES") == "<unset>");
  }
}

TEST_CASE("supervisor: hosts that answered are pinged while a slow host prepares") {
  // A remote agent gives up on a launcher silent for the heartbeat timeout; one host's slow
  // preflight (an NVML or nvidia-smi probe) must not make the others give up.
  FakeHostBehaviour slow;
  slow.prepare_delay = 12s;
  FakeTransport t([](int, int) { return Script{}; }, {{"a", {}}, {"b", slow}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.prepares == 2; });
    advance_in_steps(t.clock, done, 13s);
  });
  run.go("a:1,b:1", t);
  CHECK(run.code == 0);
  CHECK(t.seen.pings_before_spawn >= 5);  // every 2 s to a, from connecting on
}

TEST_CASE("supervisor: an agent that leaves without reporting its ranks ends the run, not hangs it") {
  // A remote agent that took the launcher for gone says LauncherSilent and Bye, its ranks never
  // reported: they count as lost, and the run ends as a host failure.
  FakeTransport t(
      [](int, int) {
        return Script{"", 0, kNever};
      },
      {{"a", {}}, {"b", host_that(&FakeHostBehaviour::leave_on_spawn)}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 1; });
    advance_in_steps(t.clock, done, 20s);
  });
  run.go("a:1,b:1", t);
  CHECK(run.code == exit_code::host_failure);
  auto rec = records::load(run.rec.id);
  CHECK(rec.failure);
  if (rec.failure) CHECK(rec.failure->reason == "launcher_silent");
  CHECK(rec.ranks[1].host_lost);
}

TEST_CASE("supervisor: an agent that never answers fails preflight after the preflight timeout") {
  FakeTransport t([](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::mute_hello)}});
  Run run;
  std::atomic<int> prepares_before_timeout{-1};
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.connects == 2; });
    advance_in_steps(t.clock, done, 29s, 1s);
    std::this_thread::sleep_for(20ms);
    prepares_before_timeout = t.seen.prepares.load();  // a slow host holds everyone at the door
    advance_in_steps(t.clock, done, 2s, 1s);
  });
  try {
    run.go("a:1,b:1", t);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == exit_code::host_failure);
    std::string what = e.what();
    CHECK(what.find("preflight failed on 1 of 2 hosts") != std::string::npos);
    CHECK(what.find("b: the agent did not answer within 30") != std::string::npos);
    CHECK(what.find("a: ") == std::string::npos);
  }
  CHECK(prepares_before_timeout == 0);
  CHECK(t.seen.spawns == 0);
}

TEST_CASE("supervisor: a host that stops answering is named within the heartbeat timeout") {
  FakeTransport t(
      [](int, int) {
        return Script{"", 0, kNever};
      },
      {{"a", {}}, {"b", host_that(&FakeHostBehaviour::go_silent_after_spawn)}});
  Run run;
  supervise::Options o;  // heartbeat every 2s, 10s timeout
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    advance_in_steps(t.clock, done, 30s);
  });
  run.go("a:1,b:1", t, o);
  CHECK(run.code == exit_code::host_failure);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->host == "b");
  CHECK(run.rec.failure->message.find("stopped answering heartbeats for 10") != std::string::npos);
}

// Issue 31, item 15: a cut host's peers fail first (their collectives lose it), but the host went
// silent before: it is named as the first failure, not the healthy host's rank.
TEST_CASE("supervisor: a host silent since before a rank failed is the first failure") {
  FakeTransport t(
      [](int r, int) {
        return r == 0 ? Script{"", SIGKILL, 6000ms} : Script{"", 0, kNever};
      },
      {{"a", {}}, {"b", host_that(&FakeHostBehaviour::go_silent_after_spawn)}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    advance_in_steps(t.clock, done, 40s);
  });
  run.go("a:1,b:1", t);
  CHECK(run.code == exit_code::host_failure);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->host == "b");
  CHECK(run.rec.failure->rank == -1);
  CHECK(run.rec.failure->message.find("before rank 0 on a failed") != std::string::npos);
  CHECK(run.rec.failure->message.find("out of memory") == std::string::npos);
}

// ... and with every host answering, the rank stays the first failure.
TEST_CASE("supervisor: with every host answering, a failed rank stays the first failure") {
  FakeTransport t(
      [](int r, int) {
        return r == 0 ? Script{"", exited(3), 1000ms} : Script{"", 0, kNever};
      },
      kPlainHosts);
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    advance_in_steps(t.clock, done, 40s);
  });
  run.go("a:1,b:1", t);
  CHECK(run.code == 3);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->rank == 0);
}

TEST_CASE("supervisor: timeout") {
  FakeTransport t([](int, int) { return Script{"", 0, kNever}; }, kPlainHosts);
  Run run;
  supervise::Options o;
  o.timeout = 90s;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    advance_in_steps(t.clock, done, 100s, 1s);
  });
  run.go("a:2", t, o);
  CHECK(run.code == exit_code::timeout);
  CHECK(run.rec.status == "timeout");
}

TEST_CASE("supervisor: a signal while a host is still connecting starts nothing and ends at once") {
  for (auto [sig, code] : {std::pair{SIGINT, 130}, {SIGTERM, 143}, {SIGHUP, 129}}) {
    CAPTURE(sig);
    FakeTransport t([](int, int) { return Script{}; },
                    {{"a", {}}, {"b", host_that(&FakeHostBehaviour::block_connect)}});
    Run run;
    Driver d(run.finished, [&](const std::atomic<bool>& done) {
      wait_until(done, [&] { return t.seen.connects == 2; });
      t.signals.deliver(sig);
    });
    // No clock advance anywhere: the run must end on the signal alone, not on a timeout.
    run.go("a:1,b:1", t);
    CHECK(run.code == code);
    CHECK(t.seen.prepares == 0);
    CHECK(t.seen.spawns == 0);
    CHECK(records::load(run.rec.id).status == (sig == SIGINT ? "interrupted" : "stopped"));
  }
}

TEST_CASE("supervisor: a signal during preflight starts nothing") {
  FakeTransport t([](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::mute_prepare)}});
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.prepares == 2; });
    t.signals.deliver(SIGTERM);
  });
  run.go("a:1,b:1", t);
  CHECK(run.code == 143);
  CHECK(t.seen.spawns == 0);
}

TEST_CASE("supervisor: Ctrl-C passes SIGINT; ranks that ignore it get TERM after the grace period") {
  FakeTransport t([](int, int) { return Script{"", 0, kNever, /*ignore_interrupt=*/true}; }, kPlainHosts);
  Run run;
  supervise::Options o;
  o.grace = 5s;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    t.signals.deliver(SIGINT);
    wait_until(done, [&] { return t.seen.interrupts == 1; });
    std::this_thread::sleep_for(20ms);
    CHECK(t.seen.terminates == 0);  // still inside the grace period
    advance_in_steps(t.clock, done, 6s);
  });
  run.go("a:2", t, o);
  CHECK(run.code == exit_code::interrupted);
  CHECK(t.seen.terminates >= 1);
  CHECK(run.rec.ranks[0].signal == SIGTERM);
}

TEST_CASE("supervisor: a second Ctrl-C kills at once") {
  FakeTransport t([](int, int) { return Script{"", 0, kNever, /*ignore_interrupt=*/true}; }, kPlainHosts);
  Run run;
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.spawns == 2; });
    t.signals.deliver(SIGINT);
    wait_until(done, [&] { return t.seen.interrupts == 1; });
    t.signals.deliver(SIGINT);
  });
  run.go("a:2", t);
  CHECK(run.code == exit_code::interrupted);
  CHECK(t.seen.terminates >= 1);
}

// `mltrain doctor` on `hosts` through the fake transport.
struct Doctor {
  FakeTransport& t;
  plan::Plan plan;
  std::vector<supervise::HostReport> reports;
  Doctor(FakeTransport& ft, const std::string& hosts) : t(ft) {
    spec::JobSpec s;
    s.run.argv = {"true"};
    s.cluster.hosts = {hosts};
    plan::Inputs in;
    in.run_id = "doctor";
    in.token = "t";
    in.free_port = [n = 29500]() mutable { return n++; };
    plan = plan::make_plan(s, in);
  }
  int run(int master_port) {
    supervise::Options o;
    o.clock = &t.clock;
    o.signals = &t.signals;
    return supervise::run_doctor(
        plan, o, [&](const plan::HostPlan&) -> transport::Transport& { return t; }, master_port, reports);
  }
};

TEST_CASE("doctor: every host probed through the gang's connecting phase; problems by stage") {
  FakeTransport t([](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::refuse_connect)}, {"c", {}}});
  Doctor doc(t, "a:1,b:1,c:1");
  int code = doc.run(29500);
  CHECK(code == 0);
  REQUIRE(doc.reports.size() == 3);
  CHECK(doc.reports[0].host == "a");
  CHECK_FALSE(doc.reports[0].ok);  // the master port (tested on the first host only) is taken
  CHECK(doc.reports[0].stage == "port");
  CHECK(doc.reports[0].facts.at("arch") == "x86_64");
  CHECK(doc.reports[0].facts.count("time_ms") == 0);
  CHECK_FALSE(doc.reports[1].ok);
  CHECK(doc.reports[1].problem.find("connection refused") != std::string::npos);
  CHECK(doc.reports[2].ok);
  CHECK(t.seen.spawns == 0);
  CHECK(t.seen.prepares == 0);
}

TEST_CASE("doctor: Ctrl-C while a host is still connecting ends it at once") {
  FakeTransport t([](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::block_connect)}});
  Run run;
  Doctor doc(t, "a:1,b:1");
  Driver d(run.finished, [&](const std::atomic<bool>& done) {
    wait_until(done, [&] { return t.seen.connects == 2; });
    t.signals.deliver(SIGINT);
  });
  int code = doc.run(0);
  run.finished = true;
  CHECK(code == 130);
  REQUIRE(doc.reports.size() == 2);
  CHECK_FALSE(doc.reports[1].ok);
}

// top on hosts: the connect timeout fails the hosts still connecting, never one already watched.
TEST_CASE("watch: a host still connecting at the timeout fails alone; the others stay watched") {
  FakeTransport t([](int, int) { return Script{}; },
                  {{"a", {}}, {"b", host_that(&FakeHostBehaviour::block_connect)}});
  Doctor hosts(t, "a:1,b:1");  // for its plan
  std::mutex m;
  std::vector<std::string> problems;
  auto problem_count = [&] {
    std::lock_guard<std::mutex> lock(m);
    return problems.size();
  };
  int stop[2];
  REQUIRE(::pipe2(stop, O_CLOEXEC) == 0);
  supervise::WatchOptions w;
  w.on_sample = [](const std::string&, std::string_view) { return true; };
  w.on_problem = [&](const std::string& host, const std::string& problem) {
    std::lock_guard<std::mutex> lock(m);
    problems.push_back(host + ": " + problem);
  };
  w.stop_fd = stop[0];
  supervise::Options o;
  o.clock = &t.clock;
  o.signals = &t.signals;
  std::atomic<bool> finished{false};
  int code = -1;
  {
    Driver d(finished, [&](const std::atomic<bool>& done) {
      wait_until(done, [&] { return t.seen.telemetry_starts == 1; });  // a is watched
      advance_in_steps(t.clock, done, o.preflight_timeout + 1s);       // a answers pings meanwhile
      wait_until(done, [&] { return problem_count() > 0; });
      [[maybe_unused]] ssize_t n = ::write(stop[1], "x", 1);
    });
    struct Done {
      std::atomic<bool>& f;
      ~Done() { f = true; }
    } done{finished};
    code = supervise::run_watch(
        hosts.plan, o, [&](const plan::HostPlan&) -> transport::Transport& { return t; }, w);
  }
  ::close(stop[0]);
  ::close(stop[1]);
  CHECK(code == 0);
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].rfind("b: the agent did not answer within", 0) == 0);
}

// ---- the plays' tables and the hosts' states (runner/supervise/plays.h, host_state.h) ----

TEST_CASE("plays: the run's table") {
  using namespace supervise::plays::run;
  CHECK(next(Phase::connecting, Event::greeted) == Phase::preflight);
  CHECK(next(Phase::connecting, Event::signalled) == Phase::done);
  CHECK(next(Phase::preflight, Event::signalled) == Phase::done);
  CHECK(next(Phase::preflight, Event::preflight_passed) == Phase::claiming);
  CHECK(next(Phase::preflight, Event::preflight_failed) == Phase::done);
  // The claims (docs/sharing.md): granted, the ranks start; busy, the job waits and asks again;
  // refused (no --queue, or a claim failed), nothing starts; a signal ends the wait.
  CHECK(next(Phase::claiming, Event::granted) == Phase::running);
  CHECK(next(Phase::claiming, Event::busy) == Phase::queued);
  CHECK(next(Phase::claiming, Event::refused) == Phase::done);
  CHECK(next(Phase::claiming, Event::preflight_failed) == Phase::done);
  CHECK(next(Phase::queued, Event::retry) == Phase::claiming);
  for (Phase p : {Phase::claiming, Phase::queued}) CHECK(next(p, Event::signalled) == Phase::done);
  CHECK(next(Phase::queued, Event::granted) == Phase::queued);        // only a retry leaves the queue
  CHECK(next(Phase::preflight, Event::granted) == Phase::preflight);  // no grant before a claim
  CHECK(next(Phase::running, Event::stop) == Phase::stopping);
  CHECK(next(Phase::stopping, Event::stop) == Phase::stopping);  // stopping already
  for (Phase p : {Phase::running, Phase::stopping}) {
    CHECK(next(p, Event::restart) == Phase::restarting);
    CHECK(next(p, Event::ranks_ended) == Phase::closing);
    CHECK(next(p, Event::results) == Phase::pulling);
  }
  CHECK(next(Phase::restarting, Event::restarted) == Phase::running);
  CHECK(next(Phase::pulling, Event::pulled) == Phase::closing);
  CHECK(next(Phase::closing, Event::closed) == Phase::done);
  // Once ranks may have started, a signal is the play's to handle (pass it on, stop the ranks):
  // the table moves nowhere on it; and nothing moves out of done.
  for (Phase p : {Phase::running, Phase::stopping, Phase::pulling, Phase::closing})
    CHECK(next(p, Event::signalled) == p);
  for (Event e : {Event::greeted, Event::signalled, Event::preflight_passed, Event::stop, Event::restart,
                  Event::ranks_ended, Event::pulled, Event::closed})
    CHECK(next(Phase::done, e) == Phase::done);
  CHECK(next(Phase::connecting, Event::preflight_passed) == Phase::connecting);  // not before preflight
  CHECK(std::string(phase_name(Phase::restarting)) == "restarting");
}

TEST_CASE("plays: doctor's, watch's and cp's tables") {
  {
    using namespace supervise::plays::doctor;
    CHECK(next(Phase::connecting, Event::greeted) == Phase::probing);
    CHECK(next(Phase::probing, Event::probed) == Phase::closing);
    CHECK(next(Phase::connecting, Event::signalled) == Phase::done);
    CHECK(next(Phase::probing, Event::signalled) == Phase::done);
    CHECK(next(Phase::closing, Event::signalled) == Phase::closing);
    CHECK(next(Phase::closing, Event::closed) == Phase::done);
    CHECK(next(Phase::connecting, Event::probed) == Phase::connecting);
  }
  {
    using namespace supervise::plays::watch;
    CHECK(next(Phase::connecting, Event::watching) == Phase::watching);
    CHECK(next(Phase::connecting, Event::stop) == Phase::closing);
    CHECK(next(Phase::watching, Event::stop) == Phase::closing);
    CHECK(next(Phase::watching, Event::deserted) == Phase::done);
    CHECK(next(Phase::closing, Event::stop) == Phase::closing);
    CHECK(next(Phase::closing, Event::closed) == Phase::done);
    CHECK(next(Phase::connecting, Event::deserted) == Phase::connecting);
  }
  {
    using namespace supervise::plays::pull;
    CHECK(next(Phase::connecting, Event::greeted) == Phase::pulling);
    CHECK(next(Phase::connecting, Event::signalled) == Phase::done);
    CHECK(next(Phase::pulling, Event::signalled) == Phase::pulling);  // the play ends the pull first
    CHECK(next(Phase::pulling, Event::pulled) == Phase::closing);
    CHECK(next(Phase::closing, Event::closed) == Phase::done);
  }
}

TEST_CASE("host state: only forward; a backward step is refused") {
  using supervise::HostState;
  supervise::HostStatus h;
  CHECK(h.get() == HostState::connecting);
  h.advance(HostState::greeting);
  h.advance(HostState::greeted);
  h.advance(HostState::syncing);
  h.advance(HostState::preparing);  // a step may skip states: no setup here
  CHECK_THROWS_AS(h.advance(HostState::greeted), std::logic_error);
  CHECK_THROWS_AS(h.advance(HostState::preparing), std::logic_error);  // not forward either
  CHECK(h.get() == HostState::preparing);                              // a refused step changes nothing
  h.advance(HostState::ready);
  CHECK_FALSE(h.ended());
  h.advance(HostState::closed);
  CHECK(h.ended());
  // Nothing moves out of an end, not even to another end.
  CHECK_THROWS_AS(h.advance(HostState::failed), std::logic_error);
  CHECK_THROWS_AS(h.advance(HostState::lost), std::logic_error);
  try {
    h.advance(HostState::connecting);
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()).find("from closed to connecting") != std::string::npos);
  }
  CHECK(supervise::moves_forward(HostState::connecting, HostState::failed));
  CHECK(supervise::moves_forward(HostState::ready, HostState::lost));
  CHECK_FALSE(supervise::moves_forward(HostState::failed, HostState::closed));
  CHECK_FALSE(supervise::moves_forward(HostState::setting_up, HostState::syncing));
}
