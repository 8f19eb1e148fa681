#include "runner/telemetry/analysis.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

namespace mltrain::telemetry {

namespace {

std::optional<double> share(std::optional<uint64_t> t0, std::optional<uint64_t> t1,
                            std::optional<uint64_t> m0, std::optional<uint64_t> m1) {
  if (!t0 || !t1 || !m0 || !m1 || *m1 <= *m0 || *t1 < *t0) return std::nullopt;
  return std::clamp(double(*t1 - *t0) / double(*m1 - *m0), 0.0, 1.0);
}

std::string percent(double v) {
  char b[16];
  std::snprintf(b, sizeof b, "%.0f%%", v * 100);
  return b;
}

// Why `shares[who]` is the straggler, in words.
std::string straggler_words(int32_t rank, const std::vector<std::optional<double>>& shares, size_t who) {
  std::vector<double> others;
  for (size_t i = 0; i < shares.size(); ++i)
    if (i != who && shares[i]) others.push_back(*shares[i]);
  std::sort(others.begin(), others.end());
  double median = others[(others.size() - 1) / 2];
  return "rank " + std::to_string(rank) + ": the other ranks spend " + percent(median) +
         " of their time in collectives waiting, it spends " + percent(*shares[who]);
}

// Why `cpu[who]` is the estimated straggler; `samples`: "in 9 of 14 samples " for a summary.
std::string estimate_words(int32_t rank, double own, double others, const std::string& samples) {
  char b[64];
  std::snprintf(b, sizeof b, "%.0f%% of a CPU, the other ranks %.0f%%", own, others);
  return "rank " + std::to_string(rank) + ": estimated from CPU time (collectives not timed): " + samples +
         "it used " + b + ", as ranks waiting for it in a collective would";
}

double median_others(const std::vector<std::optional<double>>& v, size_t who) {
  std::vector<double> others;
  for (size_t i = 0; i < v.size(); ++i)
    if (i != who && v[i]) others.push_back(*v[i]);
  std::sort(others.begin(), others.end());
  return others.empty() ? 0.0 : others[(others.size() - 1) / 2];
}

void mark_idle(std::vector<GpuRow>& gpus) {
  bool busy = false;
  for (const auto& g : gpus) busy = busy || (g.sample.util_percent && *g.sample.util_percent > kBusyGpu);
  for (auto& g : gpus) g.idle = busy && g.sample.util_percent && *g.sample.util_percent < kIdleGpu;
}

// The summary's estimate from CPU time: the rank cpu_straggler_of finds in most of the samples
// where it finds one (at least kEstimateMinSamples); its CPU and the others' over those samples.
void estimate_straggler(const std::vector<std::map<int32_t, double>>& buckets, Summary& out);

}  // namespace

std::optional<size_t> straggler_of(const std::vector<std::optional<double>>& shares, double min_peer,
                                   double min_gap) {
  std::optional<size_t> low;
  size_t known = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    if (!shares[i]) continue;
    ++known;
    if (!low || *shares[i] < *shares[*low]) low = i;
  }
  if (known < 2) return std::nullopt;
  std::vector<double> others;
  for (size_t i = 0; i < shares.size(); ++i)
    if (i != *low && shares[i]) others.push_back(*shares[i]);
  std::sort(others.begin(), others.end());
  // The lower median for an even count: one waiting peer of two is not "the others".
  double median = others[(others.size() - 1) / 2];
  if (median < min_peer || median - *shares[*low] < min_gap) return std::nullopt;
  return low;
}

std::optional<size_t> cpu_straggler_of(const std::vector<std::optional<double>>& cpu) {
  double busiest = 0;
  for (const auto& c : cpu)
    if (c) busiest = std::max(busiest, *c);
  if (busiest < kEstimateMinCpu) return std::nullopt;
  // Each rank's idle part relative to the busiest: the busiest is 0, a rank that slept through
  // its wait near 1. Then the rule for shares, with the estimate's own bar.
  std::vector<std::optional<double>> idle;
  for (const auto& c : cpu) idle.push_back(c ? std::optional<double>(1.0 - *c / busiest) : std::nullopt);
  return straggler_of(idle, kEstimateMinPeerIdle, kEstimateMinPeerIdle);
}

std::optional<uint64_t> comm_time_ns(const RankSample& r, std::optional<uint64_t> monotonic_ns) {
  if (!r.comm_ns) return std::nullopt;
  uint64_t t = *r.comm_ns;
  if (r.entered_ns && *r.entered_ns > 0 && monotonic_ns && *monotonic_ns > *r.entered_ns)
    t += *monotonic_ns - *r.entered_ns;
  return t;
}

void Board::order(const std::vector<std::string>& hosts) {
  std::vector<std::string> rest;
  for (const auto& h : order_)
    if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) rest.push_back(h);
  order_ = hosts;
  order_.insert(order_.end(), rest.begin(), rest.end());
}

void Board::add(const std::string& host, Sample sample) {
  auto it = latest_.find(host);
  if (it == latest_.end()) {
    if (std::find(order_.begin(), order_.end(), host) == order_.end()) order_.push_back(host);
    latest_[host].current = std::move(sample);
    return;
  }
  if (sample.time_ms == it->second.current.time_ms) return;  // read twice from a live file
  it->second.previous = std::move(it->second.current);
  it->second.current = std::move(sample);
}

void Board::forget(const std::string& host) {
  latest_.erase(host);
  order_.erase(std::remove(order_.begin(), order_.end(), host), order_.end());
}

size_t Board::hosts_with_rates() const {
  size_t n = 0;
  for (const auto& [host, l] : latest_) n += l.previous ? 1 : 0;
  return n;
}

Snapshot Board::snapshot() const {
  Snapshot snap;
  for (const std::string& host : order_) {
    auto found = latest_.find(host);
    if (found == latest_.end()) continue;
    const Latest& l = found->second;
    const Sample& s = l.current;
    HostRow h;
    h.host = host;
    h.time_ms = s.time_ms;
    h.sample = s.host;
    h.gpu_source = s.gpu_source;
    h.gpu_note = s.gpu_note;
    h.gpus = s.gpus.size();
    double util = 0;
    size_t with_util = 0;
    std::unordered_map<int32_t, int32_t> rank_of_pid;
    for (const auto& r : s.ranks) rank_of_pid[r.pid] = r.rank;
    for (const auto& g : s.gpus) {
      if (g.util_percent) util += *g.util_percent, ++with_util;
      GpuRow row;
      row.host = host;
      row.sample = g;
      for (const auto& p : g.processes)
        if (auto it = rank_of_pid.find(int32_t(p.pid)); it != rank_of_pid.end())
          row.ranks.push_back(it->second);
      std::sort(row.ranks.begin(), row.ranks.end());
      row.ranks.erase(std::unique(row.ranks.begin(), row.ranks.end()), row.ranks.end());
      snap.gpus.push_back(std::move(row));
    }
    if (with_util) h.gpu_util_mean = util / double(with_util);
    snap.hosts.push_back(std::move(h));
    for (const auto& r : s.ranks) {
      RankRow row;
      row.host = host;
      row.sample = r;
      if (l.previous) {
        for (const auto& p : l.previous->ranks) {
          if (p.rank != r.rank || p.pid != r.pid) continue;
          row.comm_share = share(comm_time_ns(p, l.previous->monotonic_ns), comm_time_ns(r, s.monotonic_ns),
                                 l.previous->monotonic_ns, s.monotonic_ns);
          if (p.calls && r.calls && s.time_ms > l.previous->time_ms && *r.calls >= *p.calls)
            row.calls_per_s = double(*r.calls - *p.calls) * 1000.0 / double(s.time_ms - l.previous->time_ms);
        }
      }
      double gpu_util = 0;
      size_t n = 0;
      for (const auto& g : s.gpus)
        for (const auto& p : g.processes)
          if (int32_t(p.pid) == r.pid) {
            row.gpus.push_back(g.index);
            if (g.util_percent) gpu_util += *g.util_percent, ++n;
            break;
          }
      if (n) row.gpu_util = uint32_t(std::lround(gpu_util / double(n)));
      snap.ranks.push_back(std::move(row));
    }
  }
  mark_idle(snap.gpus);
  std::stable_sort(snap.ranks.begin(), snap.ranks.end(),
                   [](const RankRow& a, const RankRow& b) { return a.sample.rank < b.sample.rank; });
  std::vector<std::optional<double>> shares, cpu, cpu_before;
  for (const auto& r : snap.ranks) {
    shares.push_back(r.comm_share);
    cpu.push_back(r.sample.cpu_percent_x100 ? std::optional<double>(*r.sample.cpu_percent_x100 / 100.0)
                                            : std::nullopt);
    cpu_before.push_back(std::nullopt);
    if (const auto& prev = latest_.at(r.host).previous)
      for (const auto& p : prev->ranks)
        if (p.rank == r.sample.rank && p.pid == r.sample.pid && p.cpu_percent_x100)
          cpu_before.back() = *p.cpu_percent_x100 / 100.0;
    snap.collectives_timed = snap.collectives_timed || r.sample.comm_ns.has_value();
  }
  // The estimate holds over the last two intervals, so a moment (one rank's slower start) is not
  // named.
  const std::optional<size_t> est = snap.collectives_timed ? std::nullopt : cpu_straggler_of(cpu);
  const bool steady = est && cpu_straggler_of(cpu_before) == est;
  const size_t busiest = est.value_or(0);
  if (auto who = straggler_of(shares)) {
    snap.ranks[*who].straggler = true;
    snap.straggler = snap.ranks[*who].sample.rank;
    snap.straggler_why = straggler_words(*snap.straggler, shares, *who);
  } else if (steady) {
    snap.ranks[busiest].straggler = true;
    snap.straggler = snap.ranks[busiest].sample.rank;
    snap.straggler_estimated = true;
    snap.straggler_why = estimate_words(snap.ranks[busiest].sample.rank, cpu[busiest].value_or(0),
                                        median_others(cpu, busiest), "");
  }
  return snap;
}

void Stat::add(double v) {
  sum += v;
  max = n ? std::max(max, v) : v;
  ++n;
}

std::optional<double> Stat::mean() const { return n ? std::optional<double>(sum / double(n)) : std::nullopt; }

Summary summarize(const std::vector<std::pair<std::string, Sample>>& samples, size_t slices) {
  Summary out;
  out.samples = samples.size();
  if (samples.empty()) return out;
  std::vector<const std::pair<std::string, Sample>*> sorted;
  for (const auto& s : samples) sorted.push_back(&s);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto* a, const auto* b) { return a->second.time_ms < b->second.time_ms; });
  out.first_ms = sorted.front()->second.time_ms;
  out.last_ms = sorted.back()->second.time_ms;

  std::map<std::pair<std::string, int32_t>, GpuSummary> gpus;
  struct RankAcc {
    RankSummary sum;
    int32_t pid = 0;
    std::optional<uint64_t> t0, m0, t1, m1;  // comm time and clock at the first and last counted sample
  };
  std::map<int32_t, RankAcc> ranks;
  // For the estimate from CPU time: each host's k-th sample in bucket k (hosts sample together).
  std::map<std::string, size_t> taken;
  std::vector<std::map<int32_t, double>> cpu_buckets;
  bool any_gpu = false;
  for (const auto* hs : sorted) {
    const auto& [host, s] = *hs;
    const size_t k = taken[host]++;
    if (cpu_buckets.size() <= k) cpu_buckets.resize(k + 1);
    if (std::find(out.hosts.begin(), out.hosts.end(), host) == out.hosts.end()) out.hosts.push_back(host);
    if (s.host.cpu_percent_x100) out.host_cpu.add(*s.host.cpu_percent_x100 / 100.0);
    std::unordered_map<int32_t, int32_t> rank_of_pid;
    for (const auto& r : s.ranks) rank_of_pid[r.pid] = r.rank;
    for (const auto& g : s.gpus) {
      any_gpu = true;
      GpuSummary& gs = gpus[{host, g.index}];
      gs.host = host;
      gs.index = g.index;
      if (!g.uuid.empty()) gs.uuid = g.uuid;
      if (g.util_percent) gs.util.add(*g.util_percent);
      if (g.mem_used_mib) gs.mem_peak_mib = std::max(gs.mem_peak_mib.value_or(0), *g.mem_used_mib);
      if (g.mem_total_mib) gs.mem_total_mib = g.mem_total_mib;
      for (const auto& p : g.processes)
        if (auto it = rank_of_pid.find(int32_t(p.pid));
            it != rank_of_pid.end() &&
            std::find(gs.ranks.begin(), gs.ranks.end(), it->second) == gs.ranks.end())
          gs.ranks.push_back(it->second);
    }
    for (const auto& r : s.ranks) {
      RankAcc& a = ranks[r.rank];
      a.sum.host = host;
      a.sum.rank = r.rank;
      if (r.cpu_percent_x100) a.sum.cpu.add(*r.cpu_percent_x100 / 100.0);
      if (r.cpu_percent_x100) cpu_buckets[k][r.rank] = *r.cpu_percent_x100 / 100.0;
      out.collectives_timed = out.collectives_timed || r.comm_ns.has_value();
      if (r.rss_bytes) a.sum.rss_peak = std::max(a.sum.rss_peak.value_or(0), *r.rss_bytes);
      if (r.calls) a.sum.calls = r.calls;
      auto t = comm_time_ns(r, s.monotonic_ns);
      if (!t || !s.monotonic_ns) continue;
      if (a.pid != r.pid || !a.t0) {  // a restarted rank: count its last life
        a.pid = r.pid;
        a.t0 = t, a.m0 = s.monotonic_ns;
      }
      a.t1 = t, a.m1 = s.monotonic_ns;
    }
  }
  for (auto& [key, g] : gpus) {
    std::sort(g.ranks.begin(), g.ranks.end());
    out.gpus.push_back(std::move(g));
  }
  std::vector<std::optional<double>> shares;
  for (auto& [rank, a] : ranks) {
    a.sum.comm_share = share(a.t0, a.t1, a.m0, a.m1);
    shares.push_back(a.sum.comm_share);
    out.ranks.push_back(std::move(a.sum));
  }
  if (auto who = straggler_of(shares)) {
    out.ranks[*who].straggler = true;
    out.straggler = out.ranks[*who].rank;
    out.straggler_why = straggler_words(*out.straggler, shares, *who);
  } else if (!out.collectives_timed) {
    estimate_straggler(cpu_buckets, out);
  }

  // The timeline: every slice's mean over the samples taken in it.
  out.timeline_is_gpu = any_gpu;
  slices = std::max<size_t>(slices, 1);
  std::vector<Stat> buckets(slices);
  const double span = double(std::max<int64_t>(out.last_ms - out.first_ms, 1));
  for (const auto* hs : sorted) {
    const Sample& s = hs->second;
    size_t b = std::min(slices - 1, size_t(double(s.time_ms - out.first_ms) / span * double(slices)));
    if (any_gpu) {
      for (const auto& g : s.gpus)
        if (g.util_percent) buckets[b].add(*g.util_percent);
    } else if (s.host.cpu_percent_x100) {
      buckets[b].add(*s.host.cpu_percent_x100 / 100.0);
    }
  }
  // A run shorter than `slices` samples per host: one point per sample time, not empty gaps.
  size_t distinct = 0;
  for (const auto& b : buckets) distinct += b.n ? 1 : 0;
  for (const auto& b : buckets)
    if (b.n || distinct >= slices / 2) out.timeline.push_back(b.mean());
  return out;
}

namespace {

void estimate_straggler(const std::vector<std::map<int32_t, double>>& buckets, Summary& out) {
  struct Found {
    size_t samples = 0;
    double own = 0, others = 0;
  };
  std::map<int32_t, Found> found;
  size_t any = 0, judged = 0;
  for (const auto& b : buckets) {
    if (b.size() < 2) continue;
    ++judged;
    std::vector<int32_t> ranks;
    std::vector<std::optional<double>> cpu;
    for (const auto& [rank, c] : b) ranks.push_back(rank), cpu.push_back(c);
    auto who = cpu_straggler_of(cpu);
    if (!who) continue;
    ++any;
    Found& f = found[ranks[*who]];
    ++f.samples;
    f.own += *cpu[*who];
    f.others += median_others(cpu, *who);
  }
  const std::pair<const int32_t, Found>* best = nullptr;
  for (const auto& e : found)
    if (!best || e.second.samples > best->second.samples) best = &e;
  if (!best || best->second.samples < kEstimateMinSamples || best->second.samples * 2 <= any) return;
  for (auto& r : out.ranks)
    if (r.rank == best->first) r.straggler = true;
  out.straggler = best->first;
  out.straggler_estimated = true;
  const double n = double(best->second.samples);
  out.straggler_why = estimate_words(
      best->first, best->second.own / n, best->second.others / n,
      "in " + std::to_string(best->second.samples) + " of " + std::to_string(judged) + " samples ");
}

}  // namespace

std::string sparkline(const std::vector<std::optional<double>>& values) {
  static const char* const kLevels[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  std::string out;
  for (const auto& v : values) {
    if (!v) {
      out += ' ';
      continue;
    }
    int level = int(std::clamp(*v, 0.0, 100.0) / 100.0 * 8.0);
    out += kLevels[std::min(level, 7)];
  }
  return out;
}

}  // namespace mltrain::telemetry
