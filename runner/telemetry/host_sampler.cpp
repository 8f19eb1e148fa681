// HostSampler: /proc readings turned into rates, with the previous reading kept between samples.
#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <charconv>

#include "runner/telemetry/sampler.h"

namespace mltrain::telemetry {
namespace {

constexpr size_t kInitialReadSize = 4096;

// a * b / c rounded to nearest, in 128 bits so tick and byte counts cannot overflow it.
uint64_t scale(uint64_t a, uint64_t b, uint64_t c) {
  unsigned __int128 n = static_cast<unsigned __int128>(a) * b + c / 2;
  unsigned __int128 q = n / c;
  return q > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(q);
}

std::optional<uint32_t> clamp32(uint64_t v) { return uint32_t(v > UINT32_MAX ? UINT32_MAX : v); }

}  // namespace

bool read_small_file(const char* path, std::string& out) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  if (out.capacity() < kInitialReadSize) out.reserve(kInitialReadSize);
  out.resize(out.capacity());
  size_t len = 0;
  bool ok = true;
  while (true) {
    if (len == out.size()) out.resize(out.size() * 2);
    ssize_t n = ::read(fd, out.data() + len, out.size() - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ok = false;
      break;
    }
    if (n == 0) break;
    len += size_t(n);
  }
  ::close(fd);
  out.resize(ok ? len : 0);
  return ok;
}

int64_t monotonic_us() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

int64_t wall_clock_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

HostSampler::HostSampler(HostSamplerOptions options) : opt_(std::move(options)) {
  if (!opt_.read_file) opt_.read_file = read_small_file;
  if (!opt_.monotonic_us) opt_.monotonic_us = telemetry::monotonic_us;
  if (opt_.ticks_per_second <= 0) opt_.ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (opt_.ticks_per_second <= 0) opt_.ticks_per_second = 100;
  if (opt_.page_size <= 0) opt_.page_size = ::sysconf(_SC_PAGESIZE);
  if (opt_.page_size <= 0) opt_.page_size = 4096;
  path_.reserve(opt_.proc_root.size() + 32);
}

// A rank's process and every process below it (a shell's program, a DataLoader's workers, at most
// kMaxTree): CPU time and resident memory summed, state and start of the rank's own. The CPU time
// counts each process's waited-for children too, so a child that ends and is reaped moves its
// time to its parent and the sum never drops for it. Only the main thread's children are followed.
bool HostSampler::read_tree(int32_t root, PidStat& sum) {
  constexpr size_t kMaxTree = 256;
  sum = PidStat{};
  tree_.assign(1, root);
  for (size_t i = 0; i < tree_.size(); ++i) {
    char num[16];
    auto end = std::to_chars(num, num + sizeof num, tree_[i]).ptr;
    path_.assign(opt_.proc_root);
    path_ += '/';
    path_.append(num, end);
    const size_t dir = path_.size();
    path_ += "/stat";
    PidStat st;
    if (!opt_.read_file(path_.c_str(), buf_) || !parse_pid_stat(buf_, st)) {
      if (i == 0) return false;
      continue;  // ended meanwhile
    }
    if (i == 0) sum.state = st.state, sum.start_ticks = st.start_ticks;
    sum.cpu_ticks += st.cpu_ticks + st.child_ticks;
    sum.rss_pages += st.rss_pages;
    path_.resize(dir);
    path_ += "/task/";
    path_.append(num, end);
    path_ += "/children";
    if (!opt_.read_file(path_.c_str(), buf_)) continue;
    for (std::string_view rest = buf_; !rest.empty() && tree_.size() < kMaxTree;) {
      size_t sp = rest.find(' ');
      std::string_view word = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
      int32_t child = 0;
      if (std::from_chars(word.data(), word.data() + word.size(), child).ec == std::errc() && child > 0)
        tree_.push_back(child);
    }
  }
  return true;
}

void HostSampler::sample(const std::vector<RankPid>& pids, HostSample& host, std::vector<RankSample>& ranks) {
  const int64_t now = opt_.monotonic_us();
  auto read = [&](const char* name) {
    path_.assign(opt_.proc_root);
    path_ += name;
    return opt_.read_file(path_.c_str(), buf_);
  };
  host = HostSample{};

  CpuTimes cpu;
  if (read("/stat") && parse_proc_stat(buf_, cpu)) {
    if (cpu.cpus > 0) host.cpus = cpu.cpus;
    // Counters only grow; anything else (a restore, a bad read) gives no rate this time.
    if (have_cpu_ && cpu.total > cpu_.total && cpu.busy >= cpu_.busy)
      host.cpu_percent_x100 = clamp32(scale(cpu.busy - cpu_.busy, 10000, cpu.total - cpu_.total));
    cpu_ = cpu;
    have_cpu_ = true;
  }

  LoadAvg load;
  if (read("/loadavg") && parse_loadavg(buf_, load)) {
    host.load1_x100 = load.load1_x100;
    host.load5_x100 = load.load5_x100;
    host.load15_x100 = load.load15_x100;
  }

  if (read("/meminfo")) {
    MemInfo mem = parse_meminfo(buf_);
    host.mem_total_bytes = mem.total_bytes;
    host.mem_available_bytes = mem.available_bytes;
  }

  if (read("/net/dev") && parse_net_dev(buf_, net_)) {
    NetTotals t = net_totals(net_);
    // An interface that went away makes a total shrink: no rate for this sample.
    if (have_net_ && now > net_time_us_ && t.rx_bytes >= net_totals_.rx_bytes &&
        t.tx_bytes >= net_totals_.tx_bytes) {
      uint64_t dt = uint64_t(now - net_time_us_);
      host.net_rx_bytes_per_s = scale(t.rx_bytes - net_totals_.rx_bytes, 1000000, dt);
      host.net_tx_bytes_per_s = scale(t.tx_bytes - net_totals_.tx_bytes, 1000000, dt);
    }
    net_totals_ = t;
    net_time_us_ = now;
    have_net_ = true;
  }

  ranks.resize(pids.size());
  next_pids_.clear();
  for (size_t i = 0; i < pids.size(); ++i) {
    RankSample& r = ranks[i];
    r = RankSample{};
    r.rank = pids[i].rank;
    r.pid = pids[i].pid;
    if (r.pid <= 0) continue;
    PidStat st;
    if (!read_tree(r.pid, st)) continue;
    r.state = st.state;
    r.rss_bytes = st.rss_pages * uint64_t(opt_.page_size);
    for (const auto& prev : pids_) {
      if (prev.pid != r.pid || prev.start_ticks != st.start_ticks) continue;
      if (now > prev.time_us && st.cpu_ticks >= prev.cpu_ticks) {
        // ticks / (ticks per s) over the wall seconds, as a percentage of one CPU, times 100.
        unsigned __int128 num_ticks =
            static_cast<unsigned __int128>(st.cpu_ticks - prev.cpu_ticks) * 10000 * 1000000;
        unsigned __int128 den =
            static_cast<unsigned __int128>(opt_.ticks_per_second) * uint64_t(now - prev.time_us);
        unsigned __int128 q = (num_ticks + den / 2) / den;
        r.cpu_percent_x100 = q > UINT32_MAX ? UINT32_MAX : uint32_t(q);
      }
      break;
    }
    next_pids_.push_back({r.pid, st.start_ticks, st.cpu_ticks, now});
  }
  pids_.swap(next_pids_);
}

Sampler::Sampler(GpuSamplerOptions gpu, HostSamplerOptions host)
    : host_(std::move(host)), gpu_(std::move(gpu)) {}

void Sampler::sample(const std::vector<RankPid>& pids, Sample& out) {
  out.time_ms = wall_clock_ms();
  host_.sample(pids, out.host, out.ranks);
  gpu_.sample(out.gpus);
  out.gpu_source = gpu_.source();
  out.gpu_note = gpu_.note();
}

void Sampler::sample(std::vector<RankPid>& pids, Sample& out, const AddPids& add_pids) {
  out.time_ms = wall_clock_ms();
  gpu_.sample(out.gpus);
  out.gpu_source = gpu_.source();
  out.gpu_note = gpu_.note();
  if (add_pids) add_pids(out.gpus, pids);
  host_.sample(pids, out.host, out.ranks);
}

}  // namespace mltrain::telemetry
