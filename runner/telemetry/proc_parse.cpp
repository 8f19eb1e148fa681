// Parsers of /proc/stat, /proc/loadavg, /proc/meminfo, /proc/net/dev and /proc/PID/stat (proc(5)).
#include <cstring>

#include "runner/telemetry/detail/text.h"
#include "runner/telemetry/parse.h"

namespace mltrain::telemetry {

using detail::next_line;
using detail::next_token;
using detail::parse_fixed;
using detail::parse_u64;
using detail::trim;

bool parse_proc_stat(std::string_view text, CpuTimes& out) {
  out = CpuTimes{};
  bool found = false;
  std::string_view line;
  while (next_line(text, line)) {
    if (line.compare(0, 3, "cpu") != 0) continue;
    std::string_view rest = line;
    std::string_view name = next_token(rest);
    if (name != "cpu") {
      if (name.size() > 3 && detail::is_digit(name[3])) ++out.cpus;
      continue;
    }
    // user nice system idle iowait irq softirq steal guest guest_nice; older kernels stop early.
    uint64_t v[8] = {};
    int n = 0;
    for (; n < 8; ++n) {
      std::string_view token = next_token(rest);
      if (token.empty()) break;
      auto value = parse_u64(token);
      if (!value) return false;
      v[n] = *value;
    }
    if (n < 4) return false;
    out.busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    out.total = out.busy + v[3] + v[4];
    found = true;
  }
  return found;
}

bool parse_loadavg(std::string_view text, LoadAvg& out) {
  uint32_t* slots[3] = {&out.load1_x100, &out.load5_x100, &out.load15_x100};
  for (auto* slot : slots) {
    auto value = parse_fixed(next_token(text), 2);
    if (!value || *value > UINT32_MAX) return false;
    *slot = uint32_t(*value);
  }
  return true;
}

MemInfo parse_meminfo(std::string_view text) {
  MemInfo out;
  std::string_view line;
  while (next_line(text, line) && !(out.total_bytes && out.available_bytes)) {
    std::optional<uint64_t>* slot = nullptr;
    if (line.compare(0, 9, "MemTotal:") == 0)
      slot = &out.total_bytes;
    else if (line.compare(0, 13, "MemAvailable:") == 0)
      slot = &out.available_bytes;
    else
      continue;
    std::string_view rest = line.substr(line.find(':') + 1);
    auto value = parse_u64(next_token(rest));
    std::string_view unit = next_token(rest);
    if (!value) continue;
    // Always "kB" (meaning KiB) in practice; a bare number would be bytes.
    *slot = unit == "kB" ? *value * 1024 : *value;
  }
  return out;
}

bool parse_net_dev(std::string_view text, std::vector<NetInterface>& out) {
  out.clear();
  std::string_view line;
  while (next_line(text, line)) {
    // "  eth0: 77914318 2393 ..."; a long name may touch the colon or the first number.
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view name = trim(line.substr(0, colon));
    if (name.empty() || name.find('|') != std::string_view::npos) continue;
    std::string_view rest = line.substr(colon + 1);
    uint64_t v[9] = {};
    int n = 0;
    for (; n < 9; ++n) {
      auto value = parse_u64(next_token(rest));
      if (!value) break;
      v[n] = *value;
    }
    if (n < 9) continue;
    NetInterface row;
    size_t len = name.size() < sizeof row.name - 1 ? name.size() : sizeof row.name - 1;
    std::memcpy(row.name, name.data(), len);
    row.rx_bytes = v[0];
    row.tx_bytes = v[8];
    out.push_back(row);
  }
  return !out.empty();
}

NetTotals net_totals(const std::vector<NetInterface>& interfaces) {
  NetTotals t;
  for (const auto& i : interfaces) {
    if (std::strcmp(i.name, "lo") == 0) continue;
    t.rx_bytes += i.rx_bytes;
    t.tx_bytes += i.tx_bytes;
  }
  return t;
}

bool parse_pid_stat(std::string_view text, PidStat& out) {
  size_t close = text.rfind(')');
  if (close == std::string_view::npos) return false;
  std::string_view rest = text.substr(close + 1);
  // Fields from 3 (state) on: utime is field 14, stime 15, cutime 16, cstime 17, starttime 22,
  // rss 24.
  std::string_view state = next_token(rest);
  if (state.size() != 1) return false;
  uint64_t utime = 0, stime = 0, cutime = 0, cstime = 0, start = 0, rss = 0;
  for (int field = 4; field <= 24; ++field) {
    std::string_view token = next_token(rest);
    if (token.empty()) return false;
    if ((field < 14 || field > 17) && field != 22 && field != 24) continue;
    // rss (and cutime, cstime) are signed in the kernel's format string; a negative one is no count.
    auto value = parse_u64(token);
    if (!value) return false;
    (field == 14   ? utime
     : field == 15 ? stime
     : field == 16 ? cutime
     : field == 17 ? cstime
     : field == 22 ? start
                   : rss) = *value;
  }
  out.state = state[0];
  out.cpu_ticks = utime + stime;
  out.child_ticks = cutime + cstime;
  out.start_ticks = start;
  out.rss_pages = rss;
  return true;
}

}  // namespace mltrain::telemetry
