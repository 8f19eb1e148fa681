// What the comm library's per-rank counters (mltrain/comm_stats.h) cost per collective, on the real
// call path: two one-rank communicators in this process, one keeping counters (stats=1) and one
// not (stats=0), make 4 KiB in-place f32 allreduces in interleaved rounds (the order swaps every
// round). A one-rank allreduce moves no data, so the difference is the counters' own work with
// little to hide it behind. Prints the medians over the rounds, then checks what the counters say
// (exit 1 when they are wrong: a cheap counter that lies is no use).
// Two ranks in one process would also time the allreduce itself, but an A/A run (both sides
// without counters) differed by up to 100 ns there: the pair of communicators, not the counters.
// bench/comm_stats_cost.sh builds and runs this beside `mltrain bench`.
// Usage: comm_stats_cost [ROUNDS=101] [CALLS=20000]
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "mltrain/comm.hpp"
#include "mltrain/comm_stats.h"

namespace {

using namespace mltrain::comm;
using Clock = std::chrono::steady_clock;

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ns per call of `calls` 4 KiB allreduces; adds the time they took to *total_ns
double time_calls(Communicator& c, float* x, long calls, double* total_ns) {
  const auto t0 = Clock::now();
  for (long i = 0; i < calls; ++i) c.allreduce(x, 1024, DataType::f32, ReduceOp::sum);
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
  *total_ns += ns;
  return ns / double(calls);
}

// What an agent would read from the block of `run`, rank 0, after `calls` allreduces that took
// `timed_ns` with the loop around them. Returns an error, or empty.
std::string check(const std::string& run, unsigned long long calls, double timed_ns, double* ghz,
                  double* inside) {
  const std::string name = "/mltrain-" + run + "-stats-0";
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return "no block at /dev/shm" + name;
  void* p = ::mmap(nullptr, sizeof(mltrain_comm_stats), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return "cannot map /dev/shm" + name;
  const auto& s = *static_cast<const mltrain_comm_stats*>(p);
  const mltrain_comm_stats_clock clock = mltrain_comm_stats_read_clock(&s);
  const std::uint64_t now = monotonic_ns();
  const std::uint64_t started = mltrain_comm_stats_time_ns(&clock, s.started_ns);
  const std::uint64_t last_exit = mltrain_comm_stats_time_ns(&clock, s.last_exit_ns);
  *inside = double(mltrain_comm_stats_span_ns(&clock, s.comm_ns)) / timed_ns;
  *ghz = 4294967296.0 / double(clock.scale);
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "calls %llu (want %llu), bytes %llu, comm_ns %.3f of the time timed, started %llu, last "
                "exit %llu, now %llu (CLOCK_MONOTONIC ns)",
                (unsigned long long)s.calls, calls, (unsigned long long)s.bytes, *inside,
                (unsigned long long)started, (unsigned long long)last_exit, (unsigned long long)now);
  std::string wrong;
  if (s.version != MLTRAIN_COMM_STATS_VERSION) wrong = "version";
  if (s.calls != calls || s.bytes != calls * 4096) wrong = "calls, bytes";
  if (s.entered_ns != 0) wrong = "entered_ns (none is open)";
  if (started > last_exit || last_exit > now || now - last_exit > 1000000000u) wrong = "last_exit_ns";
  // Inside the calls is a little less than the loop around them; sampled (comm_stats.h), a timed
  // call's extra clock read makes it stand a little long for the untimed ones.
  if (*inside > 1.2 || *inside < 0.5) wrong = "comm_ns";
  ::munmap(p, sizeof(mltrain_comm_stats));
  return wrong.empty() ? "" : wrong + ": " + buf;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 101;
  const long calls = argc > 2 ? std::atol(argv[2]) : 20000;
  if (rounds < 1 || calls < 1) {
    std::fprintf(stderr, "usage: comm_stats_cost [ROUNDS=101] [CALLS=20000]\n");
    return 2;
  }
  const std::string run = "stats-cost-" + std::to_string(::getpid());
  Options o;
  o.run_id = run;
  auto on = Communicator::create(o);
  o.stats = false;
  auto off = Communicator::create(o);

  float x[1024] = {};
  double on_total = 0, off_total = 0;
  time_calls(*on, x, calls, &on_total);  // warm up both
  time_calls(*off, x, calls, &off_total);
  std::vector<double> with, without, cost;
  for (int r = 0; r < rounds; ++r) {
    double a, b;
    if (r % 2 == 0) {
      a = time_calls(*on, x, calls, &on_total);
      b = time_calls(*off, x, calls, &off_total);
    } else {
      b = time_calls(*off, x, calls, &off_total);
      a = time_calls(*on, x, calls, &on_total);
    }
    with.push_back(a);
    without.push_back(b);
    cost.push_back(a - b);
  }
  double ghz = 0, inside = 0;
  const std::string wrong = check(run, (unsigned long long)(rounds + 1) * calls, on_total, &ghz, &inside);
  if (!wrong.empty()) {
    std::fprintf(stderr, "comm_stats_cost: the counters are wrong: %s\n", wrong.c_str());
    return 1;
  }
  std::printf(
      "# counters' cost per one-rank 4 KiB allreduce, medians of %d interleaved rounds of %ld calls; "
      "clock: %s\n",
      rounds, calls, ghz == 1.0 ? "clock_gettime" : ("TSC at " + std::to_string(ghz) + " GHz").c_str());
  std::printf("%11s %11s %9s\n", "stats=1 ns", "stats=0 ns", "cost ns");
  std::printf("%11.1f %11.1f %9.1f\n", median(with), median(without), median(cost));
  std::printf("# comm_ns over the time the counted loops took: %.3f\n", inside);
  return 0;
}
