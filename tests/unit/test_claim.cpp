// A job's claim on a host: free GPUs only, all or nothing, never a GPU a foreign process computes
// on, the host alone when exclusive, and first come first served for whoever waits.
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <string>
#include <vector>

#include "doctest/doctest.h"
#include "runner/lease/claim.h"

using namespace mltrain;
using namespace std::chrono_literals;

namespace {

const lease::Space& space() {
  static const lease::Space s{"claim-" + std::to_string(::getpid())};
  return s;
}

std::vector<lease::Gpu> four_gpus() {
  std::vector<lease::Gpu> g;
  for (int i = 0; i < 4; ++i) g.push_back({i, "GPU-test-" + std::to_string(i), false});
  return g;
}

// Holders are believed only when they look like an mltrain agent (lease::Seen::doubt): the test
// process plays the agents of every job, so it carries an agent's name while it does (and runs
// through a link named as an agent's program is: tests/CMakeLists.txt, AS_AGENT).
struct AsAgent {
  char old[17] = {};
  AsAgent() {
    ::prctl(PR_GET_NAME, old);
    ::prctl(PR_SET_NAME, "mltrain-agent-a");
  }
  ~AsAgent() { ::prctl(PR_SET_NAME, old); }
};

// A queue key as a launcher makes one now (a place dated before its holder started is not believed).
std::string key_at(int64_t offset_ns, const std::string& run) {
  static const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
  return lease::order_key(now + offset_ns, run);
}

lease::Ask ask(const std::string& run, int gpus, std::string key = "") {
  lease::Ask a;
  a.space = space();
  a.run_id = run;
  a.gpus = gpus;
  a.order_key = std::move(key);
  a.info = {{"run", run}, {"user", "tester"}};
  return a;
}

}  // namespace

TEST_CASE("claim: jobs get GPUs no one holds, and a job that finds too few gets none") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim a, b, c;
  a.attempt(ask("run-a", 2), gpus, 20ms);
  b.attempt(ask("run-b", 2), gpus, 20ms);
  REQUIRE(a.granted());
  REQUIRE(b.granted());
  CHECK(a.gpus() == std::vector<int>{0, 1});
  CHECK(b.gpus() == std::vector<int>{2, 3});
  CHECK(a.gpu_uuids() == std::vector<std::string>{"GPU-test-0", "GPU-test-1"});
  c.attempt(ask("run-c", 1), gpus, 20ms);
  CHECK_FALSE(c.granted());
  CHECK(c.error().empty());
  REQUIRE(c.in_the_way().size() == 4);
  CHECK(c.in_the_way()[0].what == "gpu 0");
  REQUIRE(c.in_the_way()[0].holder);
  CHECK(c.in_the_way()[0].holder->uid == ::getuid());
  // The holder answers only from its loop; the kernel's word (uid, pid) is there regardless.
  a = lease::Claim();  // job A ends: its GPUs are free
  c.attempt(ask("run-c", 1), gpus, 20ms);
  CHECK(c.granted());
  CHECK(c.gpus() == std::vector<int>{0});
}

TEST_CASE("claim: all or nothing: a job asking for more than is free holds nothing") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim a, big;
  a.attempt(ask("run-a", 2), gpus, 20ms);
  REQUIRE(a.granted());
  big.attempt(ask("run-big", 3), gpus, 20ms);
  CHECK_FALSE(big.granted());
  lease::Claim small;
  small.attempt(ask("run-small", 2), gpus, 20ms);  // the two the big one tried are free again
  CHECK(small.granted());
  CHECK(small.gpus() == std::vector<int>{2, 3});
}

TEST_CASE("claim: a GPU that a foreign process computes on is never picked") {
  AsAgent agent;
  auto gpus = four_gpus();
  gpus[0].foreign = true;
  gpus[2].foreign = true;
  lease::Claim a;
  a.attempt(ask("run-a", 2), gpus, 20ms);
  REQUIRE(a.granted());
  CHECK(a.gpus() == std::vector<int>{1, 3});
  lease::Claim b;
  b.attempt(ask("run-b", 1), gpus, 20ms);
  CHECK_FALSE(b.granted());
  bool said_foreign = false;
  for (const auto& w : b.in_the_way()) said_foreign |= w.what.find("foreign process") == 0;
  CHECK(said_foreign);
}

TEST_CASE("claim: pinned GPUs are those or none") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim a;
  auto pin = ask("run-a", 0);
  pin.pinned = {2, 3};
  a.attempt(pin, gpus, 20ms);
  REQUIRE(a.granted());
  CHECK(a.gpus() == std::vector<int>{2, 3});
  lease::Claim b;
  auto pin3 = ask("run-b", 0);
  pin3.pinned = {3};
  b.attempt(pin3, gpus, 20ms);
  CHECK_FALSE(b.granted());
  REQUIRE(b.in_the_way().size() == 1);
  CHECK(b.in_the_way()[0].what == "gpu 3");
  lease::Claim c;
  auto pin9 = ask("run-c", 0);
  pin9.pinned = {9};
  c.attempt(pin9, gpus, 20ms);
  CHECK_FALSE(c.granted());
  CHECK(c.error() == "GPU 9 is not one of this host's usable GPUs");
}

TEST_CASE("claim: queued jobs go in the order of their keys, and jobs that do not queue wait behind them") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim running;
  running.attempt(ask("run-0", 3), gpus, 20ms);
  REQUIRE(running.granted());
  // The first in the queue wants 2: only 1 is free, so it waits, holding its place.
  lease::Claim first, second, plain;
  first.attempt(ask("run-1", 2, key_at(100, "run-1")), gpus, 20ms);
  CHECK_FALSE(first.granted());
  CHECK(first.ahead() == 0);
  // A later job wanting the 1 free GPU does not pass it (no starvation of big jobs)...
  second.attempt(ask("run-2", 1, key_at(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  CHECK(second.ahead() == 1);
  REQUIRE(!second.in_the_way().empty());
  CHECK(second.in_the_way()[0].what == "queue");
  plain.attempt(ask("run-3", 1), gpus, 20ms);  // ... nor does a job that does not queue
  CHECK_FALSE(plain.granted());
  CHECK(plain.ahead() == 2);
  // The running job ends: the first goes, then the second, in turn.
  running = lease::Claim();
  second.attempt(ask("run-2", 1, key_at(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  first.attempt(ask("run-1", 2, key_at(100, "run-1")), gpus, 20ms);
  REQUIRE(first.granted());
  first.leave_queue();
  second.attempt(ask("run-2", 1, key_at(200, "run-2")), gpus, 20ms);
  CHECK(second.granted());
}

TEST_CASE("claim: a job that asks for no GPU goes by the queue, but not by a job that has the host alone") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim running, waiting, cpu;
  running.attempt(ask("run-0", 4), gpus, 20ms);
  REQUIRE(running.granted());
  waiting.attempt(ask("run-1", 1, key_at(100, "run-1")), gpus, 20ms);
  CHECK_FALSE(waiting.granted());
  cpu.attempt(ask("run-cpu", 0), gpus, 20ms);
  CHECK(cpu.granted());
  CHECK(cpu.gpus().empty());
  auto ex = ask("run-ex", 0);
  ex.exclusive = true;
  lease::Claim exclusive;
  exclusive.attempt(ex, gpus, 20ms);
  CHECK_FALSE(exclusive.granted());  // the queue first, and the others are there
  CHECK(exclusive.ahead() == 1);
}

TEST_CASE("claim: a grant given back keeps the job's place in the queue") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim first, second;
  first.attempt(ask("run-1", 4, key_at(100, "run-1")), gpus, 20ms);
  REQUIRE(first.granted());
  first.release_grant();  // another of its hosts said no
  second.attempt(ask("run-2", 1, key_at(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  CHECK(second.ahead() == 1);
  first.attempt(ask("run-1", 4, key_at(100, "run-1")), gpus, 20ms);
  CHECK(first.granted());
}

TEST_CASE("claim: an exclusive job has the host alone") {
  AsAgent agent;
  auto gpus = four_gpus();
  lease::Claim shared;
  shared.attempt(ask("run-shared", 1), gpus, 20ms);
  REQUIRE(shared.granted());
  auto ex = ask("run-ex", 1);
  ex.exclusive = true;
  lease::Claim exclusive;
  exclusive.attempt(ex, gpus, 20ms);
  CHECK_FALSE(exclusive.granted());
  REQUIRE(exclusive.in_the_way().size() == 1);
  CHECK(exclusive.in_the_way()[0].what == "job");
  shared = lease::Claim();
  exclusive.attempt(ex, gpus, 20ms);
  REQUIRE(exclusive.granted());
  lease::Claim late;
  late.attempt(ask("run-late", 1), gpus, 20ms);
  CHECK_FALSE(late.granted());
  REQUIRE(late.in_the_way().size() == 1);
  CHECK(late.in_the_way()[0].what == "exclusive");
}

// A stranger's process (here a child that calls itself python3) holding `name` with a made-up answer.
struct Squatter {
  pid_t pid = -1;
  explicit Squatter(const std::vector<std::string>& names) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_NAME, "python3");
      std::vector<lease::Lease> held;
      for (const auto& n : names)
        if (auto l = lease::take(
                space(), n, {{"run", "20261201-000000-bert"}, {"user", "alice"}, {"since", "1"}}, nullptr))
          held.push_back(std::move(*l));
      (void)!::write(ready[1], "x", 1);
      for (;;) {
        for (auto& l : held) l.answer();
        ::usleep(1000);
      }
    }
    char c;
    ::close(ready[1]);
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
  }
  ~Squatter() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

TEST_CASE("claim: a squatter on the host's names is named and ignored; the leases still exclude") {
  AsAgent agent;
  auto gpus = four_gpus();
  Squatter squat({"exclusive", "queue/0000000000000000000-zzz", "job/fake", "gpu/GPU-test-0"});
  // Neither the host alone, nor a queue place from 1970, nor a GPU's name, keeps a job out.
  lease::Claim all;
  all.attempt(ask("run-all", 4, key_at(0, "run-all")), gpus, 200ms);
  REQUIRE(all.granted());
  CHECK(all.gpus() == std::vector<int>{0, 1, 2, 3});
  std::vector<std::string> named;
  for (const auto& s : all.squatters()) {
    named.push_back(s.name);
    CHECK(s.pid == squat.pid);
    CHECK(s.doubt.rfind("it is not an mltrain agent (its process is 'python3', run as '", 0) == 0);
  }
  std::sort(named.begin(), named.end());
  CHECK(named == std::vector<std::string>{"exclusive", "gpu/GPU-test-0", "queue/0000000000000000000-zzz"});
  // GPU 0 is this job's through its second name: a job after it finds it held all the same.
  lease::Claim late;
  late.attempt(ask("run-late", 1), gpus, 200ms);
  CHECK_FALSE(late.granted());
  all = lease::Claim();
  late = lease::Claim();
  // The host alone, under the second name: it excludes as the first does, both ways.
  auto ex = ask("run-ex", 0);
  ex.exclusive = true;
  lease::Claim exclusive;
  exclusive.attempt(ex, gpus, 200ms);
  REQUIRE(exclusive.granted());  // the job/fake squatter is no job on the host either
  lease::Claim shared;
  shared.attempt(ask("run-shared", 1), gpus, 200ms);
  CHECK_FALSE(shared.granted());
  REQUIRE(shared.in_the_way().size() == 1);
  CHECK(shared.in_the_way()[0].what == "exclusive");
  CHECK(shared.in_the_way()[0].lease.rfind("exclusive/", 0) == 0);
}

TEST_CASE("lease: a holder is doubted unless the kernel's word fits an mltrain agent of a live run") {
  lease::Seen seen;
  seen.name = "exclusive";
  seen.uid = 1000;
  seen.pid = 4242;
  seen.answered = true;
  seen.info = {{"run", "r1"}, {"since", "1700000000"}};
  lease::ProcFacts agent{true,       1000,  "mltrain-agent-1",
                         1700000100, false, "/home/u/.cache/mltrain/mltrain-agent-1f2e3d4c5b6a7980"};
  CHECK(lease::doubt_of(seen, agent) == "");
  // Named like an agent but not one: the kernel's name, or the program it runs, does not fit.
  auto mimic = agent;
  mimic.comm = "mltrain-agent-x";
  CHECK(lease::doubt_of(seen, mimic) ==
        "it is not an mltrain agent (its process is 'mltrain-agent-x', run as "
        "'/home/u/.cache/mltrain/mltrain-agent-1f2e3d4c5b6a7980')");
  mimic = agent;
  mimic.argv0 = "python3";
  CHECK(lease::doubt_of(seen, mimic) ==
        "it is not an mltrain agent (its process is 'mltrain-agent-1', run as 'python3')");
  mimic.argv0 = "/tmp/mltrain-agent-2f2e3d4c5b6a7980";  // its name's first hex is not the kernel's
  CHECK(lease::doubt_of(seen, mimic) != "");
  CHECK(lease::doubt_of(seen, lease::ProcFacts{}) == "its process (4242) is gone; another holds the name");
  auto other = agent;
  other.uid = 1001;
  CHECK(lease::doubt_of(seen, other) == "its process 4242 belongs to another user now");
  auto named = agent;
  named.comm = "python3";
  CHECK(lease::doubt_of(seen, named) ==
        "it is not an mltrain agent (its process is 'python3', run as "
        "'/home/u/.cache/mltrain/mltrain-agent-1f2e3d4c5b6a7980')");
  auto late = agent;
  late.started_s = 1700000000 + lease::kClockSkewS + 10;  // held "since" a day and more before it started
  CHECK(lease::doubt_of(seen, late) == "it says it has held it since before its process started");
  seen.info.erase("since");
  seen.name = "queue/" + lease::order_key(0, "zzz");
  CHECK(lease::doubt_of(seen, agent) == "its queue place is dated before its process started");
  seen.name = "job/r1";
  seen.info.erase("run");
  CHECK(lease::doubt_of(seen, agent) == "it did not say which run it is");
  seen.answered = false;  // a stopped agent answers nothing: not held against it
  CHECK(lease::doubt_of(seen, agent) == "");
  seen.pid = 0;  // another PID namespace: the kernel names no process
  CHECK(lease::doubt_of(seen, named) == "");
  seen.pid = 4242;
  lease::ProcFacts hidden;  // /proc mounted hidepid=2: another user's process cannot be seen
  hidden.hidden = true;
  CHECK(lease::doubt_of(seen, hidden) == "");
}

TEST_CASE("claim: queue keys sort by time, then run id, and fit a lease name") {
  CHECK(lease::order_key(5, "b") < lease::order_key(10, "a"));
  CHECK(lease::order_key(5, "a") < lease::order_key(5, "b"));
  const std::string k = lease::order_key(1733456789123456789, std::string(300, 'x') + "/ bad");
  CHECK(lease::valid_name("queue/" + k));
}
