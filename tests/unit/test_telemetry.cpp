#include <dlfcn.h>
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "runner/telemetry/parse.h"
#include "runner/telemetry/sample.h"
#include "runner/telemetry/sampler.h"
#include "temp_dir.h"

using namespace mltrain::telemetry;
namespace fs = std::filesystem;

// For sanitizer builds: what the fake libnvidia-ml.so.1 leaks is the fake's, not the sampler's.
extern "C" const char* __lsan_default_suppressions() { return "leak:libnvidia-ml.so.1\n"; }

namespace {

// A rank row without comm counters.
RankSample rank_row(int32_t rank, int32_t pid, std::optional<char> state, std::optional<uint32_t> cpu,
                    std::optional<uint64_t> rss) {
  RankSample r;
  r.rank = rank, r.pid = pid, r.state = state, r.cpu_percent_x100 = cpu, r.rss_bytes = rss;
  return r;
}

// A fixture without its leading '#' lines; `fields` gets the "# fields:" list when there is one.
std::string fixture(const std::string& name, std::string* fields = nullptr) {
  std::ifstream in(std::string(MLTRAIN_TELEMETRY_FIXTURES) + "/" + name);
  REQUIRE_MESSAGE(in.good(), "missing fixture " << name);
  std::string line, body;
  bool header = true;
  while (std::getline(in, line)) {
    if (header && !line.empty() && line[0] == '#') {
      const std::string tag = "# fields: ";
      if (fields && line.compare(0, tag.size(), tag) == 0) *fields = line.substr(tag.size());
      continue;
    }
    header = false;
    body += line + "\n";
  }
  return body;
}

// The fake libraries' UUID of GPU i on this host (fake_conf.c's fake_gpu_uuid).
std::string fake_uuid(int i) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  unsigned h = 2166136261u;
  for (const char* p = host; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 16777619u;
  char out[64];
  std::snprintf(out, sizeof out, "GPU-%08x-0000-4000-8000-%012x", h, unsigned(i));
  return out;
}

// A folder holding a copy of the fake libnvidia-ml.so.1 (and nvidia-smi-query as nvidia-smi)
// beside its own fake-gpus.conf.
struct FakeGpuDir {
  mltrain::testing::TempDir dir{"telemetry"};
  explicit FakeGpuDir(const std::string& conf) {
    dir.write("fake-gpus.conf", conf);
    fs::copy_file(fs::path(MLTRAIN_FAKES_DIR) / "libnvidia-ml.so.1", dir.path / "libnvidia-ml.so.1");
    fs::copy_file(fs::path(MLTRAIN_FAKES_DIR) / "nvidia-smi-query", dir.path / "nvidia-smi");
    // The fakes' conf reader leaks its strings on purpose (fake_conf.c). Kept loaded to the end, the
    // copy stays known to LeakSanitizer, which __lsan_default_suppressions tells to skip it.
    if (void* lib = dlopen(nvml().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) dlclose(lib);
  }
  std::string nvml() const { return (dir.path / "libnvidia-ml.so.1").string(); }
  std::string path() const { return dir.str(); }
};

// An in-memory /proc, its clock set by hand.
struct FakeProc {
  std::map<std::string, std::string> files;
  int64_t now_us = 1000000;
  HostSamplerOptions options() {
    HostSamplerOptions o;
    o.proc_root = "/proc";
    o.read_file = [this](const char* path, std::string& out) {
      auto it = files.find(path);
      if (it == files.end()) return false;
      out = it->second;
      return true;
    };
    o.monotonic_us = [this] { return now_us; };
    o.ticks_per_second = 100;
    o.page_size = 4096;
    return o;
  }
};

std::string pid_stat(int pid, const char* comm, char state, uint64_t utime, uint64_t stime, uint64_t start,
                     uint64_t rss, uint64_t cutime = 0) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%d (%s) %c 1 %d %d 0 -1 4194304 100 0 0 0 %llu %llu %llu 0 20 0 4 0 %llu 123456789 %llu "
                "18446744073709551615 1 1 0\n",
                pid, comm, state, pid, pid, static_cast<unsigned long long>(utime),
                static_cast<unsigned long long>(stime), static_cast<unsigned long long>(cutime),
                static_cast<unsigned long long>(start), static_cast<unsigned long long>(rss));
  return buf;
}

constexpr const char* kNetHeader =
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls "
    "carrier "
    "compressed\n";

std::string net_dev(uint64_t eth_rx, uint64_t eth_tx, uint64_t lo) {
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "    lo: %llu 10 0 0 0 0 0 0 %llu 10 0 0 0 0 0 0\n  eth0: %llu 20 0 0 0 0 0 0 %llu 30 0 0 0 0 0 0\n",
      static_cast<unsigned long long>(lo), static_cast<unsigned long long>(lo),
      static_cast<unsigned long long>(eth_rx), static_cast<unsigned long long>(eth_tx));
  return std::string(kNetHeader) + buf;
}

double cpu_seconds(int who) {
  rusage ru{};
  getrusage(who, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

TEST_CASE("telemetry: /proc/stat's aggregate line and CPU count") {
  CpuTimes t;
  REQUIRE(parse_proc_stat(fixture("proc_stat.txt"), t));
  // cpu  334606 0 54709 87836 1988 0 2934 4477 0 0
  CHECK(t.busy == 334606 + 0 + 54709 + 0 + 2934 + 4477);
  CHECK(t.total == t.busy + 87836 + 1988);
  CHECK(t.cpus == 2);
  CHECK_FALSE(parse_proc_stat("intr 1 2 3\n", t));
  CHECK_FALSE(parse_proc_stat("cpu  1 2 x 4\n", t));
  CHECK_FALSE(parse_proc_stat("cpu  1 2\n", t));
  REQUIRE(parse_proc_stat("cpu  10 1 5 100\n", t));  // a kernel before iowait: four fields
  CHECK(t.busy == 16);
  CHECK(t.total == 116);
}

TEST_CASE("telemetry: /proc/loadavg and /proc/meminfo") {
  LoadAvg load;
  REQUIRE(parse_loadavg(fixture("proc_loadavg.txt"), load));  // 2.57 2.95 3.16 1/116 17434
  CHECK(load.load1_x100 == 257);
  CHECK(load.load5_x100 == 295);
  CHECK(load.load15_x100 == 316);
  CHECK_FALSE(parse_loadavg("0.5\n", load));
  CHECK_FALSE(parse_loadavg("a b c", load));

  MemInfo mem = parse_meminfo(fixture("proc_meminfo.txt"));
  CHECK(mem.total_bytes == uint64_t(24683584) * 1024);
  CHECK(mem.available_bytes == uint64_t(24142404) * 1024);
  // A kernel before 3.14 has no MemAvailable: it stays missing, not zero.
  MemInfo old = parse_meminfo("MemTotal:        1000 kB\nMemFree:          500 kB\n");
  CHECK(old.total_bytes == 1024000);
  CHECK_FALSE(old.available_bytes.has_value());
}

TEST_CASE("telemetry: /proc/net/dev per interface, lo left out of the totals") {
  std::vector<NetInterface> rows;
  REQUIRE(parse_net_dev(fixture("proc_net_dev.txt"), rows));
  REQUIRE(rows.size() == 7);
  CHECK(std::string(rows[0].name) == "lo");
  CHECK(rows[0].rx_bytes == 155290376156ull);
  CHECK(std::string(rows[3].name) == "eth0");
  CHECK(rows[3].rx_bytes == 77914318);
  CHECK(rows[3].tx_bytes == 80174);
  CHECK(std::string(rows[5].name) == "mlt-h1-br");  // a long name reaches the colon
  CHECK(rows[5].rx_bytes == 48255);
  CHECK(rows[5].tx_bytes == 827945);
  NetTotals t = net_totals(rows);
  CHECK(t.rx_bytes == 0 + 0 + 77914318 + 86206 + 48255 + 44601);
  CHECK(t.tx_bytes == 0 + 0 + 80174 + 880430 + 827945 + 55199);
  // Old kernels print "eth0:123" with no space after the colon.
  REQUIRE(parse_net_dev("eth0:123 1 0 0 0 0 0 0 456 2 0 0 0 0 0 0\n", rows));
  CHECK(rows[0].rx_bytes == 123);
  CHECK(rows[0].tx_bytes == 456);
  CHECK_FALSE(parse_net_dev(kNetHeader, rows));
}

TEST_CASE("telemetry: /proc/PID/stat read from the last ')'") {
  PidStat st;
  REQUIRE(parse_pid_stat(fixture("proc_pid_stat_spaces.txt"), st));  // comm "a) b (c"
  CHECK(st.state == 'S');
  CHECK(st.cpu_ticks == 0);
  CHECK(st.start_ticks == 243293);
  CHECK(st.rss_pages == 392);
  REQUIRE(parse_pid_stat(fixture("proc_pid_stat_busy.txt"), st));
  CHECK(st.state == 'S');
  CHECK(st.cpu_ticks == 71 + 155);  // utime + stime; cutime and cstime are the children's
  CHECK(st.start_ticks == 15);
  CHECK(st.rss_pages == 2309);
  CHECK_FALSE(parse_pid_stat("123 no parenthesis S 1 2", st));
  CHECK_FALSE(parse_pid_stat("123 (x) S 1 2 3", st));  // cut short
  CHECK_FALSE(parse_pid_stat("", st));
}

TEST_CASE("telemetry: nvidia-smi --query-gpu, real samples with missing values") {
  std::vector<GpuSample> gpus;
  std::string fields;

  SUBCASE("A100 with MIG: utilization [N/A], memory [Insufficient Permissions]") {
    std::string text = fixture("nvidia_smi_gpu_mig_a100.csv", &fields);
    REQUIRE(parse_nvidia_smi_gpus(text, fields, gpus) == 1);
    CHECK(gpus[0].index == 0);  // no index field: the line number
    CHECK(gpus[0].temperature_c == 47u);
    CHECK_FALSE(gpus[0].util_percent.has_value());
    CHECK_FALSE(gpus[0].mem_total_mib.has_value());
    CHECK_FALSE(gpus[0].mem_used_mib.has_value());
    CHECK_FALSE(gpus[0].power_mw.has_value());
  }
  SUBCASE("GeForce: power with decimals, [Unknown Error] in a field not mapped") {
    std::string text = fixture("nvidia_smi_gpu_geforce.csv", &fields);
    REQUIRE(parse_nvidia_smi_gpus(text, fields, gpus) == 1);
    CHECK(gpus[0].util_percent == 100u);
    CHECK(gpus[0].temperature_c == 56u);
    CHECK(gpus[0].power_mw == 228820u);
    CHECK(gpus[0].power_limit_mw == 210000u);
    CHECK_FALSE(gpus[0].sm_clock_mhz.has_value());  // clocks.current.graphics is not the SM clock
  }
  SUBCASE("H100 vGPU: [N/A] first") {
    std::string text = fixture("nvidia_smi_gpu_h100_vgpu.csv", &fields);
    REQUIRE(parse_nvidia_smi_gpus(text, fields, gpus) == 1);
    CHECK(gpus[0].mem_total_mib == 24576u);
    CHECK_FALSE(gpus[0].sm_clock_mhz.has_value());
  }
}

TEST_CASE("telemetry: nvidia-smi, mltrain's own query and its compute apps") {
  std::string fields;
  std::string text = fixture("nvidia_smi_gpu_query.csv", &fields);
  CHECK(fields == std::string(kNvidiaSmiGpuFields) + "," + kNvidiaSmiReasonsField);
  std::vector<GpuSample> gpus;
  REQUIRE(parse_nvidia_smi_gpus(text, fields, gpus) == 4);
  const GpuSample& g0 = gpus[0];
  CHECK(g0.index == 0);
  CHECK(g0.uuid == "GPU-2ac434d3-1aca-57a0-597d-1d2effdba9f3");
  CHECK(g0.util_percent == 97u);
  CHECK(g0.mem_used_mib == 35211u);
  CHECK(g0.mem_total_mib == 40960u);
  CHECK(g0.power_mw == 391270u);
  CHECK(g0.power_limit_mw == 400000u);
  CHECK(g0.temperature_c == 66u);
  CHECK(g0.sm_clock_mhz == 1410u);
  CHECK(g0.throttle_reasons == kReasonSwPowerCap);
  CHECK(gpus[1].throttle_reasons == kReasonGpuIdle);
  CHECK(gpus[1].util_percent == 0u);              // a real 0 stays 0
  CHECK_FALSE(gpus[2].util_percent.has_value());  // MIG
  CHECK(gpus[2].throttle_reasons == 0u);
  CHECK_FALSE(gpus[3].power_mw.has_value());
  CHECK_FALSE(gpus[3].power_limit_mw.has_value());
  CHECK_FALSE(gpus[3].throttle_reasons.has_value());
  CHECK(gpus[3].util_percent == 12u);

  // The older field name for the reasons maps to the same thing.
  std::vector<GpuSample> old;
  std::string old_fields = std::string(kNvidiaSmiGpuFields) + "," + kNvidiaSmiOldReasonsField;
  REQUIRE(parse_nvidia_smi_gpus(text, old_fields, old) == 4);
  CHECK(old == gpus);

  std::string app_fields;
  std::string apps = fixture("nvidia_smi_apps.csv", &app_fields);
  CHECK(parse_nvidia_smi_apps(apps, app_fields, gpus) == 3);
  REQUIRE(gpus[0].processes.size() == 2);
  CHECK(gpus[0].processes[0].pid == 41873u);
  CHECK(gpus[0].processes[0].used_mib == 35202u);
  CHECK(gpus[0].processes[1].used_mib == 0u);
  CHECK(gpus[1].processes.empty());
  REQUIRE(gpus[2].processes.size() == 1);
  CHECK(gpus[2].processes[0].pid == 41874u);
  CHECK_FALSE(gpus[2].processes[0].used_mib.has_value());

  // Parsing again reuses the rows and starts them clean; stray lines and short lines are skipped.
  REQUIRE(parse_nvidia_smi_gpus(
              "Field \"clocks_event_reasons.active\" is not a valid field to query.\n\n0, a, 1\n", fields,
              gpus) == 0);
  CHECK(gpus.empty());
  REQUIRE(parse_nvidia_smi_gpus("3, GPU-x, 87 %, 1 MiB, 2 MiB, 245.10 W, 300.00 W, 50, 1980 MHz, 0x0\n",
                                fields, gpus) == 1);
  CHECK(gpus[0].index == 3);  // units (without nounits) are accepted
  CHECK(gpus[0].util_percent == 87u);
  CHECK(gpus[0].power_mw == 245100u);
  CHECK(gpus[0].sm_clock_mhz == 1980u);
  CHECK(parse_nvidia_smi_apps("GPU-x, 5, 10\n", "pid,used_memory", gpus) == 0);  // no gpu_uuid field
}

TEST_CASE("telemetry: throttle reasons decode by NVML's bits") {
  // clocks_throttle_reasons.supported on a GTX 1080 (https://github.com/NVIDIA/nvidia-settings/issues/80).
  auto mask = parse_hex_mask("0x00000000000001FF");
  REQUIRE(mask == 0x1FFu);
  CHECK(throttle_reason_names(*mask) ==
        std::vector<std::string>{"gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown",
                                 "sync_boost", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                 "hw_power_brake_slowdown", "display_clock_setting"});
  CHECK(throttle_reason_names(kReasonSwPowerCap | kReasonHwThermalSlowdown) ==
        std::vector<std::string>{"sw_power_cap", "hw_thermal_slowdown"});
  CHECK(throttle_reason_names(0).empty());
  CHECK(throttle_reason_names(0x200) == std::vector<std::string>{"0x200"});
  CHECK(parse_hex_mask("4") == 4u);
  CHECK_FALSE(parse_hex_mask("0x").has_value());
  CHECK_FALSE(parse_hex_mask("[N/A]").has_value());
  CHECK_FALSE(parse_hex_mask("0x10000000000000000").has_value());
}

TEST_CASE("telemetry: rates from two snapshots, exactly") {
  FakeProc proc;
  proc.files["/proc/stat"] =
      "cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 50 0 50 400 0 0 0 0 0 0\ncpu1 50 0 50 400 0 0 0 0 0 0\n";
  proc.files["/proc/loadavg"] = "0.52 1.00 12.25 1/100 4242\n";
  proc.files["/proc/meminfo"] = "MemTotal: 2000 kB\nMemAvailable: 1000 kB\n";
  proc.files["/proc/net/dev"] = net_dev(1000, 2000, 500);
  proc.files["/proc/42/stat"] = pid_stat(42, "python3 train.py", 'R', 100, 50, 777, 1000);
  HostSampler sampler(proc.options());
  std::vector<RankPid> pids = {{0, 42}, {1, 43}};
  HostSample host;
  std::vector<RankSample> ranks;

  sampler.sample(pids, host, ranks);
  CHECK(host.cpus == 2u);
  CHECK_FALSE(host.cpu_percent_x100.has_value());  // one reading: no rate yet
  CHECK_FALSE(host.net_rx_bytes_per_s.has_value());
  CHECK(host.load1_x100 == 52u);
  CHECK(host.load15_x100 == 1225u);
  CHECK(host.mem_total_bytes == 2048000u);
  CHECK(host.mem_available_bytes == 1024000u);
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[0].rank == 0);
  CHECK(ranks[0].pid == 42);
  CHECK(ranks[0].state == 'R');
  CHECK(ranks[0].rss_bytes == 1000u * 4096);
  CHECK_FALSE(ranks[0].cpu_percent_x100.has_value());
  CHECK(ranks[1].rank == 1);  // pid 43 does not exist: everything missing
  CHECK_FALSE(ranks[1].state.has_value());
  CHECK_FALSE(ranks[1].rss_bytes.has_value());

  proc.now_us += 2000000;  // two seconds later
  proc.files["/proc/stat"] = "cpu  300 0 200 1300 0 0 0 0 0 0\n";
  proc.files["/proc/net/dev"] = net_dev(1000 + 4000, 2000 + 1000, 999999);
  proc.files["/proc/42/stat"] = pid_stat(42, "python3 train.py", 'S', 250, 100, 777, 1500);
  sampler.sample(pids, host, ranks);
  CHECK(host.cpu_percent_x100 == 3750u);    // busy +300 of +800 jiffies
  CHECK(host.net_rx_bytes_per_s == 2000u);  // 4000 B in 2 s; lo's traffic left out
  CHECK(host.net_tx_bytes_per_s == 500u);
  CHECK(ranks[0].cpu_percent_x100 == 10000u);  // 200 ticks at 100 Hz = 2 s of CPU in 2 s
  CHECK(ranks[0].state == 'S');
  CHECK(ranks[0].rss_bytes == 1500u * 4096);

  proc.now_us += 500000;
  proc.files["/proc/stat"] = "cpu  400 0 200 1400 0 0 0 0 0 0\n";
  proc.files["/proc/net/dev"] = net_dev(10, 10, 0);  // counters went back (an interface went away)
  proc.files["/proc/42/stat"] = pid_stat(42, "other", 'R', 5, 5, 999, 10);  // pid reused
  sampler.sample(pids, host, ranks);
  CHECK(host.cpu_percent_x100 == 5000u);
  CHECK_FALSE(host.net_rx_bytes_per_s.has_value());
  CHECK_FALSE(ranks[0].cpu_percent_x100.has_value());

  proc.now_us += 500000;
  proc.files["/proc/net/dev"] = net_dev(510, 60, 0);
  proc.files["/proc/42/stat"] = pid_stat(42, "other", 'R', 105, 105, 999, 10);
  proc.files.erase("/proc/stat");
  proc.files.erase("/proc/loadavg");
  sampler.sample(pids, host, ranks);
  CHECK(host.net_rx_bytes_per_s == 1000u);
  CHECK(host.net_tx_bytes_per_s == 100u);
  CHECK(ranks[0].cpu_percent_x100 == 40000u);  // four CPUs' worth
  CHECK_FALSE(host.cpu_percent_x100.has_value());
  CHECK_FALSE(host.cpus.has_value());
  CHECK_FALSE(host.load1_x100.has_value());
}

// `command = "python3 train.py | tee log"`: the rank's process is a shell that uses nothing; its
// program and the program's DataLoader worker are what a user means by the rank.
TEST_CASE("telemetry: a rank is its process and every process below it") {
  FakeProc proc;
  proc.files["/proc/42/stat"] = pid_stat(42, "sh", 'S', 1, 1, 777, 100);
  proc.files["/proc/42/task/42/children"] = "50 51 ";
  proc.files["/proc/50/stat"] = pid_stat(50, "python3", 'R', 100, 0, 780, 10000);
  proc.files["/proc/50/task/50/children"] = "60";
  proc.files["/proc/51/stat"] = pid_stat(51, "tee", 'S', 2, 0, 780, 200);
  proc.files["/proc/60/stat"] = pid_stat(60, "pt_data_worker", 'R', 50, 0, 790, 5000);
  HostSampler sampler(proc.options());
  std::vector<RankPid> pids = {{0, 42}};
  HostSample host;
  std::vector<RankSample> ranks;
  sampler.sample(pids, host, ranks);
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0].state == 'S');  // the rank's own
  CHECK(ranks[0].rss_bytes == (100u + 10000 + 200 + 5000) * 4096);

  proc.now_us += 1000000;
  proc.files["/proc/50/stat"] = pid_stat(50, "python3", 'R', 180, 0, 780, 10000);
  proc.files["/proc/60/stat"] = pid_stat(60, "pt_data_worker", 'R', 100, 0, 790, 5000);
  sampler.sample(pids, host, ranks);
  CHECK(ranks[0].cpu_percent_x100 == 13000u);  // 80 + 50 ticks at 100 Hz in 1 s

  // The worker ends and python waits for it: its time moves into python's cutime, nothing lost.
  proc.now_us += 1000000;
  proc.files.erase("/proc/60/stat");
  proc.files["/proc/50/task/50/children"] = "";
  proc.files["/proc/50/stat"] = pid_stat(50, "python3", 'R', 280, 0, 780, 10000, 120);
  sampler.sample(pids, host, ranks);
  CHECK(ranks[0].cpu_percent_x100 == 12000u);  // 100 ticks of python's, 20 more of the worker's
  CHECK(ranks[0].rss_bytes == (100u + 10000 + 200) * 4096);
}

TEST_CASE("telemetry: the real /proc of this machine and this process") {
  HostSampler sampler;
  HostSample host;
  std::vector<RankSample> ranks;
  std::vector<RankPid> pids = {{0, int32_t(getpid())}};
  sampler.sample(pids, host, ranks);
  volatile uint64_t spin = 0;
  for (int i = 0; i < 20000000; ++i) spin = spin + uint64_t(i);
  usleep(20000);
  sampler.sample(pids, host, ranks);
  CHECK(host.cpus.value_or(0) >= 1);
  CHECK(host.cpu_percent_x100.has_value());
  CHECK(host.mem_total_bytes.value_or(0) > 0);
  CHECK(host.net_rx_bytes_per_s.has_value());
  REQUIRE(ranks.size() == 1);
  CHECK(ranks[0].state == 'R');
  CHECK(ranks[0].rss_bytes.value_or(0) > 0);
  CHECK(ranks[0].cpu_percent_x100.has_value());
}

TEST_CASE("telemetry: encoding round trip; missing stays missing, zero stays zero") {
  Sample s;
  s.time_ms = 1796184878123;
  s.host.cpus = 2;
  s.host.cpu_percent_x100 = 3750;
  s.host.load1_x100 = 0;  // a real zero
  s.host.load5_x100 = 295;
  s.host.mem_total_bytes = 25275990016ull;
  s.host.net_rx_bytes_per_s = 0;
  s.gpu_source = "nvml";
  s.gpu_note = "GPU 3: GPU is lost; 50% = worse, really:";
  GpuSample g;
  g.index = 0;
  g.uuid = "GPU-2ac434d3-1aca-57a0-597d-1d2effdba9f3";
  g.util_percent = 0;
  g.mem_used_mib = 35211;
  g.mem_total_mib = 40960;
  g.power_mw = 391270;
  g.power_limit_mw = 400000;
  g.temperature_c = 66;
  g.sm_clock_mhz = 1410;
  g.throttle_reasons = kReasonSwPowerCap | kReasonHwThermalSlowdown;
  g.processes = {{41873, 35202}, {41874, std::nullopt}, {41875, 0}};
  s.gpus.push_back(g);
  GpuSample mig;  // everything missing but its index
  mig.index = 1;
  s.gpus.push_back(mig);
  s.ranks.push_back(rank_row(0, 41873, 'R', 10000, 1u << 30));
  s.ranks.push_back(rank_row(1, 41874, std::nullopt, std::nullopt, std::nullopt));
  s.ranks.push_back(rank_row(2, 41875, 'Z', 0, 0));
  s.monotonic_ns = 9'000'000'000'000ull;
  RankSample comm = rank_row(3, 41876, 'S', 150, 4096);  // with comm counters, one of them a real zero
  comm.comm_ns = 1'500'000'000ull;
  comm.calls = 42;
  comm.entered_ns = 0;
  comm.last_exit_ns = 8'999'000'000'000ull;
  comm.started_ns = 8'000'000'000'000ull;
  s.ranks.push_back(comm);

  std::string text = encode(s);
  INFO(text);
  Sample back;
  std::string error;
  REQUIRE(decode(text, back, error));
  CHECK(error.empty());
  CHECK(back == s);
  CHECK(encode(back) == text);
  CHECK(text.find("l1=0") != std::string::npos);
  CHECK(text.find("l15=") == std::string::npos);  // missing: no key at all
  CHECK(text.find("procs=41873:35202,41874:-,41875:0") != std::string::npos);
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find("rank r=3 pid=41876 st=S cpu=150 rss=4096 cns=1500000000 calls=42 cen=0 ") !=
        std::string::npos);
  CHECK(text.find("rank r=1 pid=41874\n") != std::string::npos);  // no block: no comm keys
  CHECK(text.size() < 800);

  Sample empty;
  REQUIRE(decode(encode(empty), back, error));
  CHECK(back == empty);
  CHECK_FALSE(back.host.cpu_percent_x100.has_value());

  // Unknown kinds and keys are skipped; a newer version, a bad value or no header are errors.
  REQUIRE(decode("MLTEL 1 t=5\nhost cpu=7 future=1\nfan x=1\n", back, error));
  CHECK(back.time_ms == 5);
  CHECK(back.host.cpu_percent_x100 == 7u);
  CHECK_FALSE(decode("MLTEL 2 t=5\n", back, error));
  CHECK(error.find("version '2'") != std::string::npos);
  CHECK_FALSE(decode("MLTEL 1 t=5\ngpu i=0 u=-1\n", back, error));
  CHECK(error.find("line 2") != std::string::npos);
  CHECK_FALSE(decode("MLTEL 1\nrank r=0 st=RR\n", back, error));
  CHECK_FALSE(decode("MLTEL 1\ngpus note=%4\n", back, error));
  CHECK_FALSE(decode("hello\n", back, error));
  CHECK_FALSE(decode("", back, error));
}

TEST_CASE("telemetry: parsers and decoder survive mutated input") {
  Sample s;
  s.time_ms = 1;
  s.host.cpu_percent_x100 = 5;
  s.gpu_note = "x y";
  GpuSample g;
  g.index = 0;
  g.uuid = "GPU-1";
  g.util_percent = 3;
  g.processes = {{1, 2}, {3, std::nullopt}};
  s.gpus.push_back(g);
  s.ranks.push_back(rank_row(0, 9, 'R', 1, 2));
  const std::string texts[] = {encode(s), fixture("proc_stat.txt"), fixture("proc_net_dev.txt"),
                               fixture("proc_pid_stat_spaces.txt"), fixture("nvidia_smi_gpu_query.csv")};
  const std::string fields = std::string(kNvidiaSmiGpuFields) + "," + kNvidiaSmiReasonsField;
  uint64_t seed = 88172645463325252ull;
  auto next = [&seed] {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    return seed;
  };
  Sample out;
  std::string error;
  std::vector<NetInterface> net;
  std::vector<GpuSample> gpus;
  CpuTimes cpu;
  PidStat st;
  LoadAvg load;
  for (int round = 0; round < 3000; ++round) {
    std::string t = texts[next() % 5];
    for (int k = int(next() % 4); k >= 0; --k) {
      size_t at = t.empty() ? 0 : next() % t.size();
      switch (next() % 3) {
        case 0:
          if (!t.empty()) t[at] = char(next());
          break;
        case 1:
          t.insert(at, 1, "0123456789 ,:=()%[]\n-x"[next() % 23]);
          break;
        default:
          t.erase(at, next() % 8);
      }
    }
    decode(t, out, error);
    parse_proc_stat(t, cpu);
    parse_net_dev(t, net);
    parse_pid_stat(t, st);
    parse_loadavg(t, load);
    parse_meminfo(t);
    parse_nvidia_smi_gpus(t, fields, gpus);
    parse_nvidia_smi_apps(t, kNvidiaSmiAppFields, gpus);
  }
  CHECK(true);
}

// Before any test loads the fake: a dlopen of "libnvidia-ml.so.1" would find a loaded copy by its
// soname. On a GPU machine this prints what NVML sampling really costs.
TEST_CASE("telemetry: cost of sampling the real NVML, where there is one") {
  if (void* loaded = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(loaded);
    MESSAGE("skipped: a libnvidia-ml.so.1 is already loaded in this process");
    return;
  }
  GpuSampler real;
  std::vector<GpuSample> gpus;
  real.sample(gpus);
  if (real.source() != "nvml") {
    MESSAGE("skipped: no NVML on this host (" << real.note() << ")");
    return;
  }
  constexpr int kSamples = 200;
  double t0 = cpu_seconds(RUSAGE_SELF);
  for (int i = 0; i < kSamples; ++i) real.sample(gpus);
  double ms = (cpu_seconds(RUSAGE_SELF) - t0) * 1000 / kSamples;
  MESSAGE("real NVML: " << ms << " ms CPU per sample for " << gpus.size() << " GPUs");
  for (const auto& g : gpus) {
    CAPTURE(g.index);
    CHECK_FALSE(g.uuid.empty());
    CHECK(g.mem_total_mib.has_value());
  }
  // Printed, not asserted (the budget: 10 ms per sample, 1% of one core at 1 s).
}

// The fake nvidia-smi is a bash script: on a loaded machine it has taken more than the real one's
// 5 s to answer (the test failed), so the tests of what it answers give it a minute.
constexpr int kFakeSmiTimeoutMs = 60000;

TEST_CASE("telemetry: GpuSampler through the fake NVML") {
  FakeGpuDir fake(
      "* gpus 4\n* util 87\n* mig.2 1\n* mem_used_mib 1234\n* mem_used_mib.1 0\n* power_w 245.5\n"
      "* power_limit_w.3 none\n* throttle 0x4\n* throttle.1 0x1\n* temp_c 65\n* sm_clock_mhz 1755\n"
      "* pids.0 1234:5678,99:-\n* pids.3 7:1\n");
  GpuSamplerOptions o;
  o.nvml_library = fake.nvml();
  o.use_nvidia_smi = false;
  GpuSampler sampler(o);
  std::vector<GpuSample> gpus;
  sampler.sample(gpus);
  CHECK(sampler.source() == "nvml");
  CHECK(sampler.note() == "");
  REQUIRE(gpus.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(gpus[size_t(i)].index == i);
    CHECK(gpus[size_t(i)].uuid == fake_uuid(i));
    CHECK(gpus[size_t(i)].mem_total_mib == 81559u);
    CHECK(gpus[size_t(i)].temperature_c == 65u);
    CHECK(gpus[size_t(i)].sm_clock_mhz == 1755u);
    CHECK(gpus[size_t(i)].power_mw == 245500u);
  }
  CHECK(gpus[0].util_percent == 87u);
  CHECK(gpus[0].mem_used_mib == 1234u);
  CHECK(gpus[1].mem_used_mib == 0u);
  CHECK_FALSE(gpus[2].util_percent.has_value());  // MIG: NOT_SUPPORTED
  CHECK(gpus[0].power_limit_mw == 700000u);
  CHECK_FALSE(gpus[3].power_limit_mw.has_value());
  CHECK(gpus[0].throttle_reasons == kReasonSwPowerCap);
  CHECK(gpus[1].throttle_reasons == kReasonGpuIdle);
  REQUIRE(gpus[0].processes.size() == 2);
  CHECK(gpus[0].processes[0].pid == 1234u);
  CHECK(gpus[0].processes[0].used_mib == 5678u);
  CHECK(gpus[0].processes[1].pid == 99u);
  CHECK_FALSE(gpus[0].processes[1].used_mib.has_value());
  CHECK(gpus[1].processes.empty());
  REQUIRE(gpus[3].processes.size() == 1);

  // A second sample reuses the rows and gives the same answer.
  std::vector<GpuSample> first = gpus;
  sampler.sample(gpus);
  CHECK(gpus == first);

  // The same conf through nvidia-smi (the fallback) gives the same rows.
  GpuSamplerOptions smi;
  smi.use_nvml = false;
  smi.nvidia_smi_timeout_ms = kFakeSmiTimeoutMs;
  smi.path = fake.path();
  GpuSampler fallback(smi);
  std::vector<GpuSample> smi_gpus;
  fallback.sample(smi_gpus);
  CHECK(fallback.source() == "nvidia-smi");
  CHECK(fallback.note() == "NVML not used");
  CHECK(smi_gpus == gpus);
}

TEST_CASE("telemetry: GpuSampler's fallbacks and failures") {
  SUBCASE("an old driver: the Throttle name of the reasons call, many processes") {
    std::string pids;
    for (int i = 0; i < 100; ++i) pids += (i ? "," : "") + std::to_string(1000 + i) + ":" + std::to_string(i);
    FakeGpuDir fake("* gpus 1\n* event_reasons 0\n* throttle 0x40\n* pids.0 " + pids + "\n");
    GpuSamplerOptions o;
    o.nvml_library = fake.nvml();
    GpuSampler sampler(o);
    std::vector<GpuSample> gpus;
    sampler.sample(gpus);
    REQUIRE(gpus.size() == 1);
    CHECK(gpus[0].throttle_reasons == kReasonHwThermalSlowdown);
    REQUIRE(gpus[0].processes.size() == 100);  // more than the first buffer holds
    CHECK(gpus[0].processes[99].pid == 1099u);
    CHECK(gpus[0].processes[99].used_mib == 99u);
  }
  SUBCASE("nvidia-smi before R535 rejects clocks_event_reasons.active: retried with the old name") {
    FakeGpuDir fake("* gpus 2\n* smi_event_reasons 0\n* throttle 0x20\n* util.1 none\n");
    GpuSamplerOptions o;
    o.use_nvml = false;
    o.nvidia_smi_timeout_ms = kFakeSmiTimeoutMs;
    o.path = "/nonexistent:" + fake.path();
    GpuSampler sampler(o);
    std::vector<GpuSample> gpus;
    sampler.sample(gpus);
    CHECK(sampler.source() == "nvidia-smi");
    REQUIRE(gpus.size() == 2);
    CHECK(gpus[0].throttle_reasons == kReasonSwThermalSlowdown);
    CHECK(gpus[0].util_percent == 0u);
    CHECK_FALSE(gpus[1].util_percent.has_value());  // "[Not Supported]"
  }
  SUBCASE("a lost GPU is named in the note, its fields empty") {
    FakeGpuDir fake("* gpus 2\n* lost.1 1\n");
    GpuSamplerOptions o;
    o.nvml_library = fake.nvml();
    GpuSampler sampler(o);
    std::vector<GpuSample> gpus;
    sampler.sample(gpus);
    REQUIRE(gpus.size() == 2);
    CHECK(gpus[0].mem_total_mib.has_value());
    CHECK_FALSE(gpus[1].mem_total_mib.has_value());
    CHECK_FALSE(gpus[1].temperature_c.has_value());
    CHECK(sampler.note().find("GPU 1: ") == 0);
  }
  SUBCASE("no driver: no rows and the reasons") {
    FakeGpuDir fake("* gpus 0\n");
    GpuSamplerOptions o;
    o.nvml_library = fake.nvml();
    o.path = fake.path();
    o.nvidia_smi_timeout_ms = kFakeSmiTimeoutMs;
    GpuSampler sampler(o);
    std::vector<GpuSample> gpus(3);
    sampler.sample(gpus);
    CHECK(gpus.empty());
    CHECK(sampler.source() == "");
    INFO(sampler.note());
    CHECK(sampler.note().find("nvmlInit: Driver Not Loaded") != std::string::npos);
    CHECK(sampler.note().find("exit 9") != std::string::npos);
  }
  SUBCASE("neither NVML nor nvidia-smi") {
    GpuSamplerOptions o;
    o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
    o.path = "/nonexistent";
    GpuSampler sampler(o);
    std::vector<GpuSample> gpus;
    sampler.sample(gpus);
    CHECK(gpus.empty());
    CHECK(sampler.note().find("/nonexistent/libnvidia-ml.so.1") != std::string::npos);
    CHECK(sampler.note().find("nvidia-smi not in PATH") != std::string::npos);
  }
}

TEST_CASE("telemetry: cost of a sample (host + 4 fake GPUs + 8 ranks)") {
  FakeGpuDir fake("* gpus 4\n* util 50\n* throttle 0x4\n* pids.0 100:1000\n* pids.1 101:1000\n");
  std::vector<pid_t> children;
  std::vector<RankPid> pids;
  for (int i = 0; i < 8; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      pause();
      _exit(0);
    }
    children.push_back(pid);
    pids.push_back({i, int32_t(pid)});
  }
  constexpr int kSamples = 200;

  GpuSamplerOptions o;
  o.nvml_library = fake.nvml();
  Sampler sampler(o);
  Sample s;
  std::string encoded;
  sampler.sample(pids, s);  // warm: NVML loaded, buffers grown
  double t0 = cpu_seconds(RUSAGE_SELF);
  for (int i = 0; i < kSamples; ++i) {
    sampler.sample(pids, s);
    encode(s, encoded);
  }
  double all_ms = (cpu_seconds(RUSAGE_SELF) - t0) * 1000 / kSamples;
  CHECK(s.gpus.size() == 4);
  CHECK(s.ranks.size() == 8);
  CHECK(s.ranks[7].state == 'S');

  HostSampler host_only;
  HostSample host;
  std::vector<RankSample> ranks;
  t0 = cpu_seconds(RUSAGE_SELF);
  for (int i = 0; i < kSamples; ++i) host_only.sample(pids, host, ranks);
  double host_ms = (cpu_seconds(RUSAGE_SELF) - t0) * 1000 / kSamples;

  // The fake NVML re-reads fake-gpus.conf on every call, which real NVML does not: time the same
  // calls straight into the fake to tell its cost from the sampler's.
  void* lib = dlopen(fake.nvml().c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  using Call = int (*)(void*, void*);
  using Call3 = int (*)(void*, unsigned, void*);
  auto init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
  auto handle = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  const char* two_arg[] = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                           "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetCurrentClocksEventReasons"};
  REQUIRE(init() == 0);
  struct {
    unsigned version = unsigned(40 | (2 << 24));
    unsigned long long v[4];
  } mem;
  unsigned long long out[64] = {};
  auto mem_v2 = reinterpret_cast<Call>(dlsym(lib, "nvmlDeviceGetMemoryInfo_v2"));
  auto temp = reinterpret_cast<Call3>(dlsym(lib, "nvmlDeviceGetTemperature"));
  auto clock = reinterpret_cast<Call3>(dlsym(lib, "nvmlDeviceGetClockInfo"));
  auto procs = reinterpret_cast<int (*)(void*, unsigned*, void*)>(
      dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  Call calls[4];
  for (int i = 0; i < 4; ++i) {
    calls[i] = reinterpret_cast<Call>(dlsym(lib, two_arg[i]));
    REQUIRE(bool(calls[i]));
  }
  constexpr int kFakeSamples = 300;
  t0 = cpu_seconds(RUSAGE_SELF);
  for (int i = 0; i < kFakeSamples; ++i) {
    for (unsigned d = 0; d < 4; ++d) {
      void* dev = nullptr;
      handle(d, &dev);
      for (Call call : calls) call(dev, out);
      mem_v2(dev, &mem);
      temp(dev, 0, out);
      clock(dev, 1, out);
      unsigned count = 16;
      procs(dev, &count, out);
    }
  }
  double fake_ms = (cpu_seconds(RUSAGE_SELF) - t0) * 1000 / kFakeSamples;
  reinterpret_cast<int (*)()>(dlsym(lib, "nvmlShutdown"))();
  dlclose(lib);

  // The fallback: two nvidia-smi processes per sample (here the fake bash script, far from what
  // real nvidia-smi costs, so this only shows the mechanism's order of magnitude).
  GpuSamplerOptions smi;
  smi.use_nvml = false;
  smi.nvidia_smi_timeout_ms = kFakeSmiTimeoutMs;
  smi.path = fake.path();
  GpuSampler fallback(smi);
  std::vector<GpuSample> gpus;
  fallback.sample(gpus);
  double c0 = cpu_seconds(RUSAGE_CHILDREN), s0 = cpu_seconds(RUSAGE_SELF);
  constexpr int kSmiSamples = 3;
  for (int i = 0; i < kSmiSamples; ++i) fallback.sample(gpus);
  double smi_child_ms = (cpu_seconds(RUSAGE_CHILDREN) - c0) * 1000 / kSmiSamples;
  double smi_self_ms = (cpu_seconds(RUSAGE_SELF) - s0) * 1000 / kSmiSamples;
  CHECK(gpus.size() == 4);

  for (pid_t pid : children) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  char line[768];
  std::snprintf(
      line, sizeof line,
      "CPU per sample (getrusage, %d samples): all %.3f ms, of which host + 8 ranks %.3f ms and the fake "
      "NVML's own calls ~%.3f ms (it re-reads fake-gpus.conf on every call), leaving ~%.3f ms (noise) "
      "for the sampler's GPU side and encode. nvidia-smi fallback (the fake bash script, "
      "2 processes a sample): %.1f ms in children + %.3f ms in the agent",
      kSamples, all_ms, host_ms, fake_ms, all_ms - host_ms - fake_ms, smi_child_ms, smi_self_ms);
  MESSAGE(line);
  // Printed, not asserted: the machine is shared and noisy (speed belongs in bench/). The budget
  // is 10 ms per sample: 1% of one core at a 1 s interval.
}
