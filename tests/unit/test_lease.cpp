// Leases held by the kernel: one holder a name, freed with the holder, seen by every reader with
// the holder's uid and pid and what it says.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "doctest/doctest.h"
#include "runner/lease/lease.h"

using namespace mltrain;
using namespace std::chrono_literals;

namespace {

// A space of this test process alone, so parallel runs of the suite (and jobs) never meet.
const lease::Space& space() {
  static const lease::Space s{"test-" + std::to_string(::getpid())};
  return s;
}

// Answers readers on a thread until stopped, as the agent's loop does.
struct Answering {
  lease::Lease& held;
  std::atomic<bool> stop{false};
  std::thread t;
  explicit Answering(lease::Lease& l)
      : held(l), t([this] {
          while (!stop) {
            held.answer();
            std::this_thread::sleep_for(1ms);
          }
        }) {}
  ~Answering() {
    stop = true;
    t.join();
  }
};

}  // namespace

TEST_CASE("lease: one holder a name; the name is free again once the holder lets go") {
  std::string err;
  auto a = lease::take(space(), "gpu/GPU-1", {{"run", "r1"}}, &err);
  REQUIRE(a);
  CHECK(err.empty());
  auto b = lease::take(space(), "gpu/GPU-1", {{"run", "r2"}}, &err);
  CHECK_FALSE(b);
  CHECK(err.empty());                                  // held, not an error
  CHECK(lease::take(space(), "gpu/GPU-2", {}, &err));  // another name is another lease
  a.reset();
  CHECK(lease::take(space(), "gpu/GPU-1", {}, &err));
}

TEST_CASE("lease: a holder that dies, even by SIGKILL, frees its lease") {
  const std::string name = "gpu/GPU-killed";
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto l = lease::take(space(), name, {{"run", "child"}}, nullptr);
    char c = l ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK(c == 'y');
  CHECK_FALSE(lease::take(space(), name, {}, nullptr));
  auto seen = lease::holder(space(), name, 50ms);
  REQUIRE(seen);
  CHECK(seen->pid == child);
  CHECK(seen->uid == ::getuid());
  CHECK_FALSE(seen->answered);  // the child never answers: the kernel's word is all a reader gets
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  CHECK(lease::take(space(), name, {}, nullptr));
  CHECK_FALSE(lease::holder(space(), name, 50ms));
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_CASE("lease: readers list every lease under a prefix with its holder and what it says") {
  auto a = lease::take(space(), "gpu/GPU-a", {{"run", "20261206-run-a"}, {"user", "alice"}}, nullptr);
  auto b = lease::take(space(), "gpu/GPU-b", {{"run", "20261206-run-b"}, {"user", "bob"}}, nullptr);
  auto other = lease::take(space(), "queue/1", {{"run", "q"}}, nullptr);
  REQUIRE((a && b && other));
  Answering answering_a(*a), answering_b(*b);
  auto seen = lease::list(space(), "gpu/", 2s);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].name == "gpu/GPU-a");
  CHECK(seen[0].answered);
  CHECK(seen[0].info.at("run") == "20261206-run-a");
  CHECK(seen[0].info.at("user") == "alice");
  CHECK(seen[0].pid == ::getpid());
  CHECK(seen[1].info.at("user") == "bob");
  // A changed info is what the next reader gets.
  a->set_info({{"run", "20261206-run-a"}, {"state", "running"}});
  auto one = lease::holder(space(), "gpu/GPU-a", 2s);
  REQUIRE(one);
  CHECK(one->info.at("state") == "running");
}

TEST_CASE("lease: a holder that never answers costs a reader its timeout, not more") {
  auto mute = lease::take(space(), "gpu/GPU-mute", {{"run", "x"}}, nullptr);
  REQUIRE(mute);
  auto t0 = std::chrono::steady_clock::now();
  auto seen = lease::list(space(), "gpu/", 100ms);
  auto took = std::chrono::steady_clock::now() - t0;
  REQUIRE(seen.size() == 1);
  CHECK_FALSE(seen[0].answered);
  CHECK(seen[0].info.empty());
  CHECK(took < 5s);
}

TEST_CASE("lease: two spaces never contend for a name") {
  auto a = lease::take(space(), "gpu/GPU-same", {}, nullptr);
  auto b = lease::take(lease::Space{space().name + "-other"}, "gpu/GPU-same", {}, nullptr);
  CHECK((a && b));
  CHECK_FALSE(lease::take(lease::Space{"Bad Space"}, "gpu/GPU-same", {}, nullptr));
}

TEST_CASE("lease: names and infos are bounded and checked") {
  CHECK(lease::valid_name("gpu/GPU-4049c22c-0000-4000-8000-000000000000"));
  CHECK(lease::valid_name("queue/00001733456789123456789-20261206-101500-bert"));
  CHECK_FALSE(lease::valid_name(""));
  CHECK_FALSE(lease::valid_name("gpu/a b"));
  CHECK_FALSE(lease::valid_name("gpu/\n"));
  CHECK_FALSE(lease::valid_name(std::string(lease::kMaxName + 1, 'a')));
  std::string err;
  CHECK_FALSE(lease::take(space(), "bad name", {}, &err));
  CHECK(err.find("not a lease name") != std::string::npos);

  CHECK(lease::decode(lease::encode({{"run", "a\nb"}, {"user", "u"}})) ==
        lease::Info{{"run", "a b"}, {"user", "u"}});
  // A hostile holder's answer: junk lines, bad keys, no end: what parses is kept, within bounds.
  auto got = lease::decode("run=r\nBAD=1\nnoequals\n=v\nuser=" + std::string(5000, 'x'));
  CHECK(got.at("run") == "r");
  CHECK(got.count("BAD") == 0);
  CHECK(got.at("user").size() < lease::kMaxInfoBytes);
  std::string many;
  for (int i = 0; i < 100; ++i)
    many += std::string(1, char('a' + i % 26)) + std::string(i / 26 + 1, 'k') + "=v\n";
  CHECK(lease::decode(many).size() <= 32);
}

TEST_CASE("lease: /proc/net/unix is read for listeners under the prefix only") {
  const std::string text =
      "Num       RefCount Protocol Flags    Type St Inode Path\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 101 @mltrain-lease/gpu/GPU-1\n"
      "0000000000000000: 00000003 00000000 00000000 0001 03 102 @mltrain-lease/gpu/GPU-2\n"  // a connection
      "0000000000000000: 00000002 00000000 00010000 0001 01 103 @other/gpu/GPU-3\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 104 /run/mltrain-lease/gpu/GPU-4\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 105 @mltrain-lease/queue/7\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 106 @mltrain-lease/gpu/bad name\n"
      "0000000000000000: 00000002 00000000 00010000 0001 01 107 @mltrain-lease-t1/gpu/GPU-5\n"
      "garbage\n";
  CHECK(lease::detail::names_in_proc_net_unix(text, lease::Space{}, "gpu/", 10) ==
        std::vector<std::string>{"gpu/GPU-1"});
  CHECK(lease::detail::names_in_proc_net_unix(text, lease::Space{}, "", 10) ==
        std::vector<std::string>{"gpu/GPU-1", "queue/7"});
  CHECK(lease::detail::names_in_proc_net_unix(text, lease::Space{}, "", 1).size() == 1);
  CHECK(lease::detail::names_in_proc_net_unix(text, lease::Space{"t1"}, "", 10) ==
        std::vector<std::string>{"gpu/GPU-5"});
}

TEST_CASE("lease: another user of the host sees the lease and its holder but cannot take it") {
  if (::geteuid() != 0) return;  // switching users needs root (CI runs as root)
  const std::string name = "gpu/GPU-mine";
  auto mine = lease::take(space(), name, {{"run", "mine"}}, nullptr);
  REQUIRE(mine);
  int out[2];
  REQUIRE(::pipe(out) == 0);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    auto seen = lease::holder(space(), name, 100ms);
    char r[2] = {lease::take(space(), name, {}, nullptr) ? 't' : '-', seen && seen->uid == 0 ? 's' : '-'};
    (void)!::write(out[1], r, 2);
    ::_exit(0);
  }
  char r[2] = {};
  REQUIRE(::read(out[0], r, 2) == 2);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(r[0] == '-');                         // not taken
  CHECK(r[1] == 's');                         // seen, held by root
  CHECK(lease::holder(space(), name, 10ms));  // still held
  ::close(out[0]);
  ::close(out[1]);
}
