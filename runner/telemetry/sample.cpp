// Throttle reason names and the text encoding of a Sample.
//
// Encoding, version 1. Lines end with '\n'; fields are space-separated key=value; a key that is
// absent is a value that is missing (never written as 0). Integers are decimal, `thr` is hex.
// Text values (src, note, uuid) are percent-escaped: bytes <= 0x20 or >= 0x7f and % = , : become
// %XX. A reader skips line kinds and keys it does not know; the first line names the version.
//
//   MLTEL 1 t=<unix ms> mono=<CLOCK_MONOTONIC ns>
//   host ncpu=<cpus> cpu=<% x100> l1=<load x100> l5= l15= mt=<bytes> ma=<bytes> rx=<B/s> tx=<B/s>
//   gpus src=<nvml|nvidia-smi> note=<text>                  (only when either is set)
//   gpu i=<index> uuid=<text> u=<%> mu=<MiB> mt=<MiB> pw=<mW> pl=<mW> temp=<C> sm=<MHz> thr=<hex>
//       procs=<pid>:<MiB>,<pid>:-                           (- = memory unknown; one line per GPU)
//   rank r=<rank> pid=<pid> st=<letter> cpu=<% of one CPU x100> rss=<bytes>
//        cns=<comm ns> calls=<n> cen=<entered ns> cex=<last exit ns> cst=<started ns>
#include "runner/telemetry/sample.h"

#include <charconv>
#include <iterator>
#include <limits>

#include "runner/telemetry/detail/text.h"
#include "runner/telemetry/parse.h"

namespace mltrain::telemetry {
namespace {

constexpr std::string_view kMagic = "MLTEL";
constexpr uint64_t kVersion = 1;

void put_u64(std::string& out, uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

void put_i64(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

template <class T>
void put(std::string& out, const char* key, const std::optional<T>& v) {
  if (!v) return;
  out += ' ';
  out += key;
  out += '=';
  put_u64(out, uint64_t(*v));
}

bool needs_escape(unsigned char c) {
  return c <= 0x20 || c >= 0x7f || c == '%' || c == '=' || c == ',' || c == ':';
}

void put_text(std::string& out, const char* key, std::string_view text) {
  if (text.empty()) return;
  static constexpr char kHex[] = "0123456789ABCDEF";
  out += ' ';
  out += key;
  out += '=';
  for (char ch : text) {
    auto c = static_cast<unsigned char>(ch);
    if (!needs_escape(c)) {
      out += ch;
      continue;
    }
    out += '%';
    out += kHex[c >> 4];
    out += kHex[c & 0xf];
  }
}

int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                : -1;
}

bool get_text(std::string_view v, std::string& out) {
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != '%') {
      out += v[i];
      continue;
    }
    if (i + 2 >= v.size()) return false;
    int hi = hex_digit(v[i + 1]), lo = hex_digit(v[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out += char(hi << 4 | lo);
    i += 2;
  }
  return true;
}

template <class T>
bool get_num(std::string_view v, std::optional<T>& out) {
  auto n = detail::parse_u64(v);
  if (!n || *n > uint64_t(std::numeric_limits<T>::max())) return false;
  out = T(*n);
  return true;
}

template <class T>
bool get_int(std::string_view v, T& out) {
  auto n = detail::parse_i64(v);
  if (!n || *n < int64_t(std::numeric_limits<T>::min()) || *n > int64_t(std::numeric_limits<T>::max()))
    return false;
  out = T(*n);
  return true;
}

bool get_procs(std::string_view v, std::vector<GpuProcess>& out) {
  out.clear();
  bool done = false;
  std::string_view cell;
  while (detail::next_cell(v, ',', cell, done)) {
    size_t colon = cell.find(':');
    if (colon == std::string_view::npos) return false;
    GpuProcess p;
    std::optional<uint32_t> pid;
    if (!get_num(cell.substr(0, colon), pid)) return false;
    p.pid = *pid;
    std::string_view mib = cell.substr(colon + 1);
    if (mib != "-" && !get_num(mib, p.used_mib)) return false;
    out.push_back(p);
  }
  return true;
}

bool get_host(std::string_view key, std::string_view v, HostSample& h) {
  if (key == "ncpu") return get_num(v, h.cpus);
  if (key == "cpu") return get_num(v, h.cpu_percent_x100);
  if (key == "l1") return get_num(v, h.load1_x100);
  if (key == "l5") return get_num(v, h.load5_x100);
  if (key == "l15") return get_num(v, h.load15_x100);
  if (key == "mt") return get_num(v, h.mem_total_bytes);
  if (key == "ma") return get_num(v, h.mem_available_bytes);
  if (key == "rx") return get_num(v, h.net_rx_bytes_per_s);
  if (key == "tx") return get_num(v, h.net_tx_bytes_per_s);
  return true;
}

bool get_gpu(std::string_view key, std::string_view v, GpuSample& g) {
  if (key == "i") return get_int(v, g.index);
  if (key == "uuid") return get_text(v, g.uuid);
  if (key == "u") return get_num(v, g.util_percent);
  if (key == "mu") return get_num(v, g.mem_used_mib);
  if (key == "mt") return get_num(v, g.mem_total_mib);
  if (key == "pw") return get_num(v, g.power_mw);
  if (key == "pl") return get_num(v, g.power_limit_mw);
  if (key == "temp") return get_num(v, g.temperature_c);
  if (key == "sm") return get_num(v, g.sm_clock_mhz);
  if (key == "thr") return (g.throttle_reasons = parse_hex_mask(v)).has_value();
  if (key == "procs") return get_procs(v, g.processes);
  return true;
}

bool get_rank(std::string_view key, std::string_view v, RankSample& r) {
  if (key == "r") return get_int(v, r.rank);
  if (key == "pid") return get_int(v, r.pid);
  if (key == "st") {
    if (v.size() != 1) return false;
    r.state = v[0];
    return true;
  }
  if (key == "cpu") return get_num(v, r.cpu_percent_x100);
  if (key == "rss") return get_num(v, r.rss_bytes);
  if (key == "cns") return get_num(v, r.comm_ns);
  if (key == "calls") return get_num(v, r.calls);
  if (key == "cen") return get_num(v, r.entered_ns);
  if (key == "cex") return get_num(v, r.last_exit_ns);
  if (key == "cst") return get_num(v, r.started_ns);
  return true;
}

constexpr const char* kReasonNames[] = {
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
};
}  // namespace

uint64_t throttle_reason_mask(const std::vector<std::string>& names) {
  uint64_t mask = 0;
  for (const auto& name : names) {
    for (unsigned bit = 0; bit < std::size(kReasonNames); ++bit)
      if (name == kReasonNames[bit]) mask |= uint64_t(1) << bit;
    if (name.size() > 2 && name[0] == '0' && name[1] == 'x') {
      uint64_t v = 0;
      std::from_chars(name.data() + 2, name.data() + name.size(), v, 16);
      mask |= v;
    }
  }
  return mask;
}

std::vector<std::string> throttle_reason_names(uint64_t mask) {
  const auto& kNames = kReasonNames;
  std::vector<std::string> out;
  for (unsigned bit = 0; bit < 64; ++bit) {
    if (!(mask >> bit & 1)) continue;
    if (bit < sizeof kNames / sizeof kNames[0]) {
      out.emplace_back(kNames[bit]);
    } else {
      char buf[24] = "0x";
      auto r = std::to_chars(buf + 2, buf + sizeof buf, uint64_t(1) << bit, 16);
      out.emplace_back(buf, r.ptr);
    }
  }
  return out;
}

void encode(const Sample& s, std::string& out) {
  out.clear();
  out += kMagic;
  out += ' ';
  put_u64(out, kVersion);
  out += " t=";
  put_i64(out, s.time_ms);
  put(out, "mono", s.monotonic_ns);
  out += "\nhost";
  const HostSample& h = s.host;
  put(out, "ncpu", h.cpus);
  put(out, "cpu", h.cpu_percent_x100);
  put(out, "l1", h.load1_x100);
  put(out, "l5", h.load5_x100);
  put(out, "l15", h.load15_x100);
  put(out, "mt", h.mem_total_bytes);
  put(out, "ma", h.mem_available_bytes);
  put(out, "rx", h.net_rx_bytes_per_s);
  put(out, "tx", h.net_tx_bytes_per_s);
  out += '\n';
  if (!s.gpu_source.empty() || !s.gpu_note.empty()) {
    out += "gpus";
    put_text(out, "src", s.gpu_source);
    put_text(out, "note", s.gpu_note);
    out += '\n';
  }
  for (const auto& g : s.gpus) {
    out += "gpu i=";
    put_i64(out, g.index);
    put_text(out, "uuid", g.uuid);
    put(out, "u", g.util_percent);
    put(out, "mu", g.mem_used_mib);
    put(out, "mt", g.mem_total_mib);
    put(out, "pw", g.power_mw);
    put(out, "pl", g.power_limit_mw);
    put(out, "temp", g.temperature_c);
    put(out, "sm", g.sm_clock_mhz);
    if (g.throttle_reasons) {
      char buf[24];
      auto r = std::to_chars(buf, buf + sizeof buf, *g.throttle_reasons, 16);
      out += " thr=";
      out.append(buf, r.ptr);
    }
    if (!g.processes.empty()) {
      out += " procs=";
      for (size_t i = 0; i < g.processes.size(); ++i) {
        if (i) out += ',';
        put_u64(out, g.processes[i].pid);
        out += ':';
        if (g.processes[i].used_mib)
          put_u64(out, *g.processes[i].used_mib);
        else
          out += '-';
      }
    }
    out += '\n';
  }
  for (const auto& r : s.ranks) {
    out += "rank r=";
    put_i64(out, r.rank);
    out += " pid=";
    put_i64(out, r.pid);
    if (r.state && *r.state > 0x20 && *r.state < 0x7f) {
      out += " st=";
      out += *r.state;
    }
    put(out, "cpu", r.cpu_percent_x100);
    put(out, "rss", r.rss_bytes);
    put(out, "cns", r.comm_ns);
    put(out, "calls", r.calls);
    put(out, "cen", r.entered_ns);
    put(out, "cex", r.last_exit_ns);
    put(out, "cst", r.started_ns);
    out += '\n';
  }
}

std::string encode(const Sample& sample) {
  std::string out;
  encode(sample, out);
  return out;
}

bool decode(std::string_view text, Sample& out, std::string& error) {
  out = Sample{};
  std::string_view line;
  if (!detail::next_line(text, line)) {
    error = "empty telemetry sample";
    return false;
  }
  std::string_view rest = line;
  if (detail::next_token(rest) != kMagic) {
    error = "not a telemetry sample (no MLTEL header)";
    return false;
  }
  std::string_view version = detail::next_token(rest);
  auto v = detail::parse_u64(version);
  if (!v || *v != kVersion) {
    error = "telemetry sample version '" + std::string(version) + "' (this reader knows 1)";
    return false;
  }
  for (std::string_view field = detail::next_token(rest); !field.empty(); field = detail::next_token(rest)) {
    bool ok = true;
    if (field.compare(0, 2, "t=") == 0) ok = get_int(field.substr(2), out.time_ms);
    if (field.compare(0, 5, "mono=") == 0) ok = get_num(field.substr(5), out.monotonic_ns);
    if (!ok) {
      error = "bad time in telemetry sample: " + std::string(field);
      return false;
    }
  }
  int line_no = 1;
  while (detail::next_line(text, line)) {
    ++line_no;
    rest = line;
    std::string_view kind = detail::next_token(rest);
    if (kind.empty()) continue;
    GpuSample* gpu = nullptr;
    RankSample* rank = nullptr;
    if (kind == "gpu") gpu = &out.gpus.emplace_back();
    if (kind == "rank") rank = &out.ranks.emplace_back();
    for (std::string_view field = detail::next_token(rest); !field.empty();
         field = detail::next_token(rest)) {
      size_t eq = field.find('=');
      if (eq == std::string_view::npos) continue;
      std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
      bool ok = true;
      if (kind == "host") {
        ok = get_host(key, value, out.host);
      } else if (kind == "gpus") {
        if (key == "src") ok = get_text(value, out.gpu_source);
        if (key == "note") ok = get_text(value, out.gpu_note);
      } else if (gpu) {
        ok = get_gpu(key, value, *gpu);
      } else if (rank) {
        ok = get_rank(key, value, *rank);
      }
      if (!ok) {
        error = "telemetry sample line " + std::to_string(line_no) + ": bad value in '" + std::string(field) +
                "'";
        return false;
      }
    }
  }
  return true;
}

}  // namespace mltrain::telemetry
