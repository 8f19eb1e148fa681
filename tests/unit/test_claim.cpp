// A job's claim on a host: free GPUs only, all or nothing, never a GPU a foreign process computes
// on, the host alone when exclusive, and first come first served for whoever waits.
#include <unistd.h>

#include <chrono>
#include <string>

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
  auto gpus = four_gpus();
  lease::Claim running;
  running.attempt(ask("run-0", 3), gpus, 20ms);
  REQUIRE(running.granted());
  // The first in the queue wants 2: only 1 is free, so it waits, holding its place.
  lease::Claim first, second, plain;
  first.attempt(ask("run-1", 2, lease::order_key(100, "run-1")), gpus, 20ms);
  CHECK_FALSE(first.granted());
  CHECK(first.ahead() == 0);
  // A later job wanting the 1 free GPU does not pass it (no starvation of big jobs)...
  second.attempt(ask("run-2", 1, lease::order_key(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  CHECK(second.ahead() == 1);
  REQUIRE(!second.in_the_way().empty());
  CHECK(second.in_the_way()[0].what == "queue");
  plain.attempt(ask("run-3", 1), gpus, 20ms);  // ... nor does a job that does not queue
  CHECK_FALSE(plain.granted());
  CHECK(plain.ahead() == 2);
  // The running job ends: the first goes, then the second, in turn.
  running = lease::Claim();
  second.attempt(ask("run-2", 1, lease::order_key(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  first.attempt(ask("run-1", 2, lease::order_key(100, "run-1")), gpus, 20ms);
  REQUIRE(first.granted());
  first.leave_queue();
  second.attempt(ask("run-2", 1, lease::order_key(200, "run-2")), gpus, 20ms);
  CHECK(second.granted());
}

TEST_CASE("claim: a job that asks for no GPU goes by the queue, but not by a job that has the host alone") {
  auto gpus = four_gpus();
  lease::Claim running, waiting, cpu;
  running.attempt(ask("run-0", 4), gpus, 20ms);
  REQUIRE(running.granted());
  waiting.attempt(ask("run-1", 1, lease::order_key(100, "run-1")), gpus, 20ms);
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
  auto gpus = four_gpus();
  lease::Claim first, second;
  first.attempt(ask("run-1", 4, lease::order_key(100, "run-1")), gpus, 20ms);
  REQUIRE(first.granted());
  first.release_grant();  // another of its hosts said no
  second.attempt(ask("run-2", 1, lease::order_key(200, "run-2")), gpus, 20ms);
  CHECK_FALSE(second.granted());
  CHECK(second.ahead() == 1);
  first.attempt(ask("run-1", 4, lease::order_key(100, "run-1")), gpus, 20ms);
  CHECK(first.granted());
}

TEST_CASE("claim: an exclusive job has the host alone") {
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

TEST_CASE("claim: queue keys sort by time, then run id, and fit a lease name") {
  CHECK(lease::order_key(5, "b") < lease::order_key(10, "a"));
  CHECK(lease::order_key(5, "a") < lease::order_key(5, "b"));
  const std::string k = lease::order_key(1733456789123456789, std::string(300, 'x') + "/ bad");
  CHECK(lease::valid_name("queue/" + k));
}
