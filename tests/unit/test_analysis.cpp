// runner/telemetry/analysis.h: the straggler rule, top's snapshot from two samples, a run's summary.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runner/telemetry/analysis.h"

using namespace mltrain::telemetry;

namespace {

constexpr uint64_t kSec = 1'000'000'000;

RankSample rank(int32_t r, int32_t pid, uint64_t comm_ns, uint64_t calls, uint64_t entered = 0) {
  RankSample s;
  s.rank = r, s.pid = pid, s.state = 'S', s.comm_ns = comm_ns, s.calls = calls, s.entered_ns = entered;
  s.cpu_percent_x100 = 5000;
  s.rss_bytes = 1 << 20;
  return s;
}

Sample at(int64_t time_ms, uint64_t mono_ns, std::vector<RankSample> ranks,
          std::vector<GpuSample> gpus = {}) {
  Sample s;
  s.time_ms = time_ms;
  s.monotonic_ns = mono_ns;
  s.host.cpu_percent_x100 = 2500;
  s.ranks = std::move(ranks);
  s.gpus = std::move(gpus);
  return s;
}

GpuSample gpu(int32_t index, std::optional<uint32_t> util, std::vector<uint32_t> pids,
              uint64_t used_mib = 1000) {
  GpuSample g;
  g.index = index;
  g.util_percent = util;
  g.mem_used_mib = used_mib;
  g.mem_total_mib = 81559;
  for (uint32_t p : pids) g.processes.push_back({p, 100});
  return g;
}

}  // namespace

TEST_CASE("analysis: the straggler is named only when its peers clearly wait for it") {
  using S = std::vector<std::optional<double>>;
  CHECK(straggler_of(S{0.8, 0.05, 0.75, 0.82}) == std::optional<size_t>(1));
  CHECK_FALSE(straggler_of(S{0.1, 0.05, 0.12}));                   // nobody waits much
  CHECK_FALSE(straggler_of(S{0.5, 0.45, 0.52}));                   // no gap
  CHECK_FALSE(straggler_of(S{0.05}));                              // one rank
  CHECK_FALSE(straggler_of(S{std::nullopt, 0.05, std::nullopt}));  // one known share
  CHECK(straggler_of(S{0.9, 0.1}) == std::optional<size_t>(1));
  // One peer of three waits, the other does not: the lower median decides, no straggler.
  CHECK_FALSE(straggler_of(S{0.9, 0.0, 0.05}));
}

TEST_CASE("analysis: without comm counters the straggler is estimated from CPU time, and says so") {
  using S = std::vector<std::optional<double>>;
  CHECK(cpu_straggler_of(S{3, 95, 2, 4}) == std::optional<size_t>(1));  // the others sleep in gloo
  CHECK_FALSE(cpu_straggler_of(S{98, 100, 97}));                        // every rank computes
  CHECK_FALSE(cpu_straggler_of(S{0.5, 4, 0.2}));                        // a quiet job: under 10%
  CHECK_FALSE(cpu_straggler_of(S{70, 100, 75}));                        // others use over 60% of it
  CHECK_FALSE(cpu_straggler_of(S{std::nullopt, 90}));                   // one rank known

  auto bare = [](int32_t r, int32_t pid, uint32_t cpu_x100) {
    RankSample s;
    s.rank = r, s.pid = pid, s.state = 'S', s.cpu_percent_x100 = cpu_x100;
    return s;
  };
  Board b;
  b.add("h1", at(1000, 1 * kSec, {bare(0, 10, 200), bare(1, 11, 9000), bare(2, 12, 300)}));
  b.add("h1", at(2000, 2 * kSec, {bare(0, 10, 300), bare(1, 11, 9500), bare(2, 12, 200)}));
  Snapshot snap = b.snapshot();
  CHECK_FALSE(snap.collectives_timed);
  REQUIRE(snap.straggler == 1);
  CHECK(snap.straggler_estimated);
  CHECK(snap.straggler_why.find("rank 1: estimated from CPU time (collectives not timed)") == 0);
  CHECK(snap.ranks[1].straggler);
  // The interval before named another rank (a slower start): not yet.
  Board moment;
  moment.add("h1", at(1000, 1 * kSec, {bare(0, 10, 9000), bare(1, 11, 200), bare(2, 12, 300)}));
  moment.add("h1", at(2000, 2 * kSec, {bare(0, 10, 300), bare(1, 11, 9500), bare(2, 12, 200)}));
  CHECK_FALSE(moment.snapshot().straggler);

  // The same ranks with counters: no estimate, however their CPU looks.
  Board timed;
  timed.add("h1", at(1000, 1 * kSec, {rank(0, 10, 0, 1), rank(1, 11, 0, 1)}));
  timed.add("h1", at(2000, 2 * kSec, {rank(0, 10, 0, 2), rank(1, 11, 0, 2)}));
  CHECK(timed.snapshot().collectives_timed);
  CHECK_FALSE(timed.snapshot().straggler);

  // A summary: named from the samples where a rank stood out, not from means that start-up (all
  // ranks busy importing) would blur; fewer than three such samples name no one.
  std::vector<std::pair<std::string, Sample>> run;
  for (int i = 0; i < 6; ++i)  // start-up: all busy
    run.push_back({"h1", at(1000 * i, uint64_t(i) * kSec, {bare(0, 10, 9000), bare(1, 11, 9500)})});
  for (int i = 6; i < 9; ++i)  // training: rank 1 works, rank 0 waits asleep
    run.push_back({"h1", at(1000 * i, uint64_t(i) * kSec, {bare(0, 10, 300), bare(1, 11, 9000)})});
  Summary sum = summarize(run);
  CHECK_FALSE(sum.collectives_timed);
  REQUIRE(sum.straggler == 1);
  CHECK(sum.straggler_estimated);
  CHECK(sum.straggler_why.find("in 3 of 9 samples it used 90% of a CPU, the other ranks 3%") !=
        std::string::npos);
  run.pop_back();
  CHECK_FALSE(summarize(run).straggler);
}

TEST_CASE("analysis: a host forgotten leaves the snapshot: its GPUs and ranks, not a stale sample") {
  Board b;
  b.add("h1", at(1000, 1 * kSec, {rank(0, 100, 0, 1)}, {gpu(0, 90, {100})}));
  b.add("h2", at(1000, 1 * kSec, {rank(1, 200, 0, 1)}, {gpu(0, 10, {200})}));
  REQUIRE(b.snapshot().gpus.size() == 2);
  b.forget("h2");
  const Snapshot s = b.snapshot();
  REQUIRE(s.gpus.size() == 1);
  CHECK(s.gpus[0].host == "h1");
  REQUIRE(s.ranks.size() == 1);
  CHECK(s.ranks[0].sample.rank == 0);
  CHECK(b.hosts() == 1);
  b.forget("h9");  // never seen: nothing changes
  CHECK(b.hosts() == 1);
  b.add("h2",
        at(3000, 3 * kSec, {rank(1, 200, 0, 1)}));  // back with a new generation: one sample, no rates yet
  CHECK(b.hosts() == 2);
  CHECK(b.hosts_with_rates() == 0);
}

TEST_CASE("analysis: an open collective counts toward a rank's time inside collectives") {
  RankSample r = rank(0, 10, 2 * kSec, 5, /*entered=*/9 * kSec);
  CHECK(comm_time_ns(r, 10 * kSec) == 3 * kSec);
  r.entered_ns = 0;
  CHECK(comm_time_ns(r, 10 * kSec) == 2 * kSec);
  r.comm_ns.reset();
  CHECK_FALSE(comm_time_ns(r, 10 * kSec));
}

TEST_CASE("analysis: a snapshot compares each host's last two samples") {
  Board b;
  // Two hosts, two ranks each. Over one second ranks 0, 2, 3 spend 0.9 s inside collectives,
  // rank 1 only 0.05 s: the others wait for it.
  b.add("h1",
        at(1000, 10 * kSec, {rank(0, 100, 0, 0), rank(1, 101, 0, 0)}, {gpu(0, 90, {100}), gpu(1, 3, {101})}));
  b.add("h2", at(1000, 50 * kSec, {rank(2, 200, 0, 0), rank(3, 201, 0, 0)}));
  CHECK(b.hosts_with_rates() == 0);
  Snapshot first = b.snapshot();
  CHECK_FALSE(first.ranks[0].comm_share);
  CHECK_FALSE(first.straggler);
  b.add("h1", at(2000, 11 * kSec, {rank(0, 100, kSec * 9 / 10, 10), rank(1, 101, kSec / 20, 10)},
                 {gpu(0, 90, {100}), gpu(1, 3, {101})}));
  // Rank 3 is inside a collective it entered 0.5 s ago, after 0.4 s in finished ones.
  b.add("h2", at(2000, 51 * kSec,
                 {rank(2, 200, kSec * 9 / 10, 10), rank(3, 201, kSec * 4 / 10, 9, 50 * kSec + kSec / 2)}));
  b.add("h2", at(2000, 51 * kSec, {}));  // the same sample read again (a live file): ignored
  CHECK(b.hosts_with_rates() == 2);
  Snapshot s = b.snapshot();
  REQUIRE(s.ranks.size() == 4);
  CHECK(s.ranks[0].comm_share == doctest::Approx(0.9));
  CHECK(s.ranks[1].comm_share == doctest::Approx(0.05));
  CHECK(s.ranks[3].comm_share == doctest::Approx(0.9));
  CHECK(s.ranks[0].calls_per_s == doctest::Approx(10.0));
  REQUIRE(s.straggler);
  CHECK(*s.straggler == 1);
  CHECK(s.ranks[1].straggler);
  CHECK(s.straggler_why.find("rank 1") == 0);
  // GPU rows: processes mapped to ranks by pid, the idle one flagged while another is busy.
  REQUIRE(s.gpus.size() == 2);
  CHECK(s.gpus[0].ranks == std::vector<int32_t>{0});
  CHECK(s.gpus[1].ranks == std::vector<int32_t>{1});
  CHECK_FALSE(s.gpus[0].idle);
  CHECK(s.gpus[1].idle);
  CHECK(s.ranks[1].gpus == std::vector<int32_t>{1});
  CHECK(s.ranks[1].gpu_util == 3u);
  CHECK(s.hosts[0].gpu_util_mean == doctest::Approx(46.5));
  CHECK_FALSE(s.hosts[1].gpu_util_mean);  // a CPU-only host has no GPU mean, not 0
}

TEST_CASE(
    "analysis: a GPU without a utilization reading is never idle, and nothing is idle when none is busy") {
  Board b;
  b.add("h", at(1000, kSec, {}, {gpu(0, std::nullopt, {}), gpu(1, 40, {}), gpu(2, 2, {})}));
  Snapshot s = b.snapshot();
  for (const auto& g : s.gpus) CHECK_FALSE(g.idle);
}

TEST_CASE("analysis: a run's summary: per GPU and rank, the straggler over the run, a timeline") {
  std::vector<std::pair<std::string, Sample>> samples;
  for (int i = 0; i <= 10; ++i) {
    uint64_t t = uint64_t(i);
    samples.push_back(
        {"h1", at(1000 * i, 100 * kSec + t * kSec,
                  {rank(0, 100, t * kSec * 8 / 10, t * 10), rank(1, 101, t * kSec / 10, t * 10)},
                  {gpu(0, uint32_t(i * 10), {100}, 1000 + uint64_t(i)), gpu(1, 20, {101})})});
  }
  Summary sum = summarize(samples, 10);
  CHECK(sum.samples == 11);
  CHECK(sum.last_ms - sum.first_ms == 10000);
  REQUIRE(sum.gpus.size() == 2);
  CHECK(sum.gpus[0].util.mean() == doctest::Approx(50.0));
  CHECK(sum.gpus[0].util.max == doctest::Approx(100.0));
  CHECK(sum.gpus[0].mem_peak_mib == 1010u);
  CHECK(sum.gpus[0].ranks == std::vector<int32_t>{0});
  REQUIRE(sum.ranks.size() == 2);
  CHECK(sum.ranks[0].comm_share == doctest::Approx(0.8));
  CHECK(sum.ranks[1].comm_share == doctest::Approx(0.1));
  CHECK(sum.ranks[0].calls == 100u);
  CHECK(sum.straggler == 1);
  CHECK(sum.timeline_is_gpu);
  REQUIRE(sum.timeline.size() == 10);
  CHECK(*sum.timeline.front() < *sum.timeline.back());
  CHECK(summarize({}).samples == 0);
}

TEST_CASE("analysis: a restarted rank's share counts its last life only") {
  std::vector<std::pair<std::string, Sample>> samples;
  samples.push_back({"h", at(0, 0, {rank(0, 100, 0, 0)})});
  samples.push_back({"h", at(1000, kSec, {rank(0, 100, kSec, 10)})});
  samples.push_back({"h", at(2000, 2 * kSec, {rank(0, 300, 0, 0)})});
  samples.push_back({"h", at(3000, 3 * kSec, {rank(0, 300, kSec / 4, 3)})});
  Summary sum = summarize(samples);
  REQUIRE(sum.ranks.size() == 1);
  CHECK(sum.ranks[0].comm_share == doctest::Approx(0.25));
}

TEST_CASE("analysis: sparkline") {
  CHECK(sparkline({0.0, 50.0, 100.0, std::nullopt}) == "▁▅█ ");
  CHECK(sparkline({}).empty());
}
