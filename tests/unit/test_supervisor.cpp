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
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "runner/common/status.h"
#include "runner/agent/protocol.h"
#include "runner/common/error.h"
#include "runner/plan/plan.h"
#include "runner/records/records.h"
#include "runner/supervise/supervisor.h"

namespace fs = std::filesystem;
using namespace mltrain;
using namespace std::chrono_literals;
namespace proto = mltrain::agent;

namespace {

// What a fake rank does: print, then exit with `status` after `delay`, unless terminated first.
struct Script {
  std::string output;
  int status = 0;  // wait status
  std::chrono::milliseconds delay{0};
  bool ignore_terminate = false;
};
using ScriptFor = std::function<Script(int rank, int restart)>;

struct FakeHostBehaviour {
  bool refuse_connect = false;  // connect() throws
  bool go_silent_after_spawn = false;  // stops answering (a cut link)
  std::string preflight_problem;       // reported by prepare
};

class FakeAgent {
 public:
  FakeAgent(int fd, ScriptFor script, FakeHostBehaviour b, std::atomic<int>& restarts_seen)
      : fd_(fd), script_(std::move(script)), b_(b), restarts_seen_(restarts_seen), thread_([this] { loop(); }) {}
  ~FakeAgent() {
    thread_.join();
    ::close(fd_);
  }

 private:
  void send(proto::Type t, uint32_t id, const std::string& payload, uint16_t flags = 0) {
    std::string wire;
    proto::encode(wire, t, id, payload, flags);
    size_t off = 0;
    while (off < wire.size()) {
      ssize_t n = ::send(fd_, wire.data() + off, wire.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += size_t(n);
    }
  }
  void loop() {
    proto::Decoder d;
    struct Running {
      Script s;
      std::chrono::steady_clock::time_point due;
      bool done = false;
    };
    std::map<uint32_t, Running> ranks;
    std::map<uint32_t, int> spawns;
    bool silent = false;
    while (true) {
      pollfd p{fd_, POLLIN, 0};
      int rc = ::poll(&p, 1, 5);
      if (rc > 0) {
        char buf[65536];
        ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n <= 0) return;  // the launcher closed: a real agent would kill its ranks here
        d.feed(buf, size_t(n));
        proto::Frame f;
        while (d.next(f)) {
          if (silent) continue;
          proto::Reader r(f.payload);
          switch (f.type) {
            case proto::Type::hello:
              send(proto::Type::hello_ack, 0, proto::Writer().u32(proto::kMagic).u32(proto::kVersion).i32(1).str("fake").str("x86_64").take());
              break;
            case proto::Type::prepare: {
              std::vector<std::string> problems;
              if (!b_.preflight_problem.empty()) problems.push_back(b_.preflight_problem);
              send(proto::Type::prepared, 0,
                   proto::Writer().str("fake0").str("10.0.0.9").strings({"20001", "20002"}).strings(problems).take());
              break;
            }
            case proto::Type::spawn: {
              int restart = spawns[f.id]++;
              if (f.id == 0) restarts_seen_ = restart;
              Running run{script_(int(f.id), restart), {}, false};
              run.due = std::chrono::steady_clock::now() + run.s.delay;
              send(proto::Type::started, f.id, proto::Writer().i32(1000 + int(f.id)).take());
              if (!run.s.output.empty()) send(proto::Type::output, f.id, run.s.output, 1);
              ranks[f.id] = run;
              if (b_.go_silent_after_spawn) silent = true;
              break;
            }
            case proto::Type::terminate:
              for (auto& [id, run] : ranks)
                if (!run.done && !run.s.ignore_terminate) {
                  run.done = true;
                  send(proto::Type::exited, id, proto::Writer().i32(SIGTERM).take());
                }
              break;
            case proto::Type::ping: send(proto::Type::pong, 0, f.payload); break;
            case proto::Type::shutdown:
              send(proto::Type::bye, 0, {});
              return;
            default: break;
          }
        }
      }
      auto now = std::chrono::steady_clock::now();
      for (auto& [id, run] : ranks)
        if (!run.done && now >= run.due && !silent) {
          run.done = true;
          send(proto::Type::exited, id, proto::Writer().i32(run.s.status).take());
        }
    }
  }
  int fd_;
  ScriptFor script_;
  FakeHostBehaviour b_;
  std::atomic<int>& restarts_seen_;
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
  FakeTransport(ScriptFor s, std::map<std::string, FakeHostBehaviour> b) : script_(std::move(s)), behaviour_(std::move(b)) {}
  ~FakeTransport() override { agents_.clear(); }
  std::unique_ptr<transport::AgentLink> connect(const plan::HostPlan& h) override {
    auto b = behaviour_[h.host.name];
    if (b.refuse_connect) throw Error("connection refused", {}, exit_code::host_failure);
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    ::fcntl(sv[0], F_SETFL, O_NONBLOCK);
    agents_.push_back(std::make_unique<FakeAgent>(sv[1], script_, b, restarts_seen));
    return std::make_unique<FakeLink>(sv[0], h.host.name);
  }
  std::atomic<int> restarts_seen{0};

 private:
  ScriptFor script_;
  std::map<std::string, FakeHostBehaviour> behaviour_;
  std::vector<std::unique_ptr<FakeAgent>> agents_;
};

struct Run {
  fs::path home;
  records::RunRecord rec;
  plan::Plan plan;
  int code = -1;
  Run() {
    char tmpl[] = "/tmp/mltrain-sup-XXXXXX";
    home = ::mkdtemp(tmpl);
    ::setenv("MLTRAIN_HOME", home.c_str(), 1);
  }
  ~Run() {
    ::unsetenv("MLTRAIN_HOME");
    fs::remove_all(home);
  }
  void go(const std::string& hosts, FakeTransport& t, supervise::Options o = {}) {
    spec::JobSpec s;
    s.name = "t";
    s.run.argv = {"x"};
    s.cluster.hosts = {hosts};
    plan::Inputs in;
    in.run_id = records::create_run("t");
    in.token = "tok";
    in.free_port = [] { return 12345 + std::rand() % 1000; };
    plan = plan::make_plan(s, in);
    rec.id = in.run_id;
    rec.name = "t";
    records::fill_from_plan(rec, plan);
    o.console.quiet = true;
    if (o.grace.count() == 5000) o.grace = 200ms;
    supervise::TransportFor tf = [&](const plan::HostPlan&) -> transport::Transport& { return t; };
    code = supervise::run_job(plan, rec, o, tf);
  }
  std::string log(int rank) const {
    std::ifstream in(records::run_dir(rec.id) + "/rank-" + std::to_string(rank) + ".log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
};

int exited(int code) { return code << 8; }

}  // namespace

TEST_CASE("supervisor: every rank succeeds") {
  FakeTransport t([](int r, int) { return Script{"hello " + std::to_string(r) + "\n", 0, 10ms}; }, {});
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
        if (r == 2) return Script{"boom\n", exited(3), 20ms};
        if (r == 3) return Script{"", exited(5), 2000ms};  // would fail later; must not be reported
        return Script{"", 0, 10000ms};
      },
      {});
  Run run;
  auto start = std::chrono::steady_clock::now();
  run.go("a:2,b:2", t);
  CHECK(std::chrono::steady_clock::now() - start < 1500ms);
  CHECK(run.code == 3);
  CHECK(run.rec.status == "failed");
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->rank == 2);
  CHECK(run.rec.failure->host == "b");
  CHECK(run.rec.failure->tail == std::vector<std::string>{"boom"});
  CHECK(run.rec.ranks[0].signal == SIGTERM);
}

TEST_CASE("supervisor: a signal death maps to 128+N") {
  FakeTransport t([](int r, int) { return r == 1 ? Script{"", SIGKILL, 10ms} : Script{"", 0, 5000ms}; }, {});
  Run run;
  run.go("a:2", t);
  CHECK(run.code == 128 + SIGKILL);
  CHECK(describe_status(SIGKILL).find("out of memory") != std::string::npos);
}

TEST_CASE("supervisor: max_restarts restarts the whole gang") {
  FakeTransport t([](int r, int restart) { return (r == 1 && restart < 2) ? Script{"", exited(1), 10ms} : Script{"", 0, 10ms}; }, {});
  Run run;
  supervise::Options o;
  o.max_restarts = 3;
  run.go("a:2", t, o);
  CHECK(run.code == 0);
  CHECK(run.rec.restarts == 2);
  CHECK(t.restarts_seen == 2);
  CHECK(run.log(0).find("==> mltrain: restart 1 of 3 <==") != std::string::npos);
}

TEST_CASE("supervisor: restarts run out") {
  FakeTransport t([](int r, int) { return r == 0 ? Script{"", exited(4), 10ms} : Script{"", 0, 5000ms}; }, {});
  Run run;
  supervise::Options o;
  o.max_restarts = 2;
  run.go("a:1,b:1", t, o);
  CHECK(run.code == 4);
  CHECK(run.rec.restarts == 2);
}

TEST_CASE("supervisor: a host that cannot be reached fails preflight; nothing starts") {
  std::atomic<int> spawned{0};
  FakeTransport t([&](int, int) { ++spawned; return Script{}; },
                  {{"b", FakeHostBehaviour{true, false, ""}}, {"c", FakeHostBehaviour{false, false, "workdir /x does not exist here"}}});
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
  CHECK(spawned == 0);
  CHECK(records::load(run.rec.id).status == "host-failure");
}

TEST_CASE("supervisor: a host that stops answering is named within the heartbeat timeout") {
  FakeTransport t([](int, int) { return Script{"", 0, 60000ms}; }, {{"b", FakeHostBehaviour{false, true, ""}}});
  Run run;
  supervise::Options o;
  o.heartbeat_interval = 50ms;
  o.heartbeat_timeout = 300ms;
  auto start = std::chrono::steady_clock::now();
  run.go("a:1,b:1", t, o);
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(run.code == exit_code::host_failure);
  REQUIRE(run.rec.failure);
  CHECK(run.rec.failure->host == "b");
  CHECK(run.rec.failure->message.find("stopped answering heartbeats") != std::string::npos);
}

TEST_CASE("supervisor: timeout") {
  FakeTransport t([](int, int) { return Script{"", 0, 60000ms}; }, {});
  Run run;
  supervise::Options o;
  o.timeout = 100ms;
  run.go("a:2", t, o);
  CHECK(run.code == exit_code::timeout);
  CHECK(run.rec.status == "timeout");
}
