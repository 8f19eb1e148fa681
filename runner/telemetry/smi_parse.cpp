// Parsers of nvidia-smi's --query-gpu and --query-compute-apps CSV (nvidia-smi --help-query-gpu).
#include "runner/telemetry/detail/reuse.h"
#include "runner/telemetry/detail/text.h"
#include "runner/telemetry/parse.h"

namespace mltrain::telemetry {
namespace {

using detail::next_cell;
using detail::next_line;
using detail::trim;

enum class Field {
  other,
  index,
  uuid,
  util,
  mem_used,
  mem_total,
  power,
  power_limit,
  temperature,
  sm_clock,
  reasons,
  pid,
  used_memory,
};

constexpr size_t kMaxFields = 64;

Field field_of(std::string_view name) {
  struct Name {
    const char* text;
    Field field;
  };
  // The names and aliases nvidia-smi --help-query-gpu / --help-query-compute-apps document.
  static constexpr Name kNames[] = {
      {"index", Field::index},
      {"uuid", Field::uuid},
      {"gpu_uuid", Field::uuid},
      {"utilization.gpu", Field::util},
      {"memory.used", Field::mem_used},
      {"memory.total", Field::mem_total},
      {"power.draw", Field::power},
      {"power.draw.instant", Field::power},
      {"power.limit", Field::power_limit},
      {"enforced.power.limit", Field::power_limit},
      {"temperature.gpu", Field::temperature},
      {"clocks.sm", Field::sm_clock},
      {"clocks.current.sm", Field::sm_clock},
      {"clocks_event_reasons.active", Field::reasons},
      {"clocks_throttle_reasons.active", Field::reasons},
      {"pid", Field::pid},
      {"used_memory", Field::used_memory},
      {"used_gpu_memory", Field::used_memory},
  };
  for (const auto& n : kNames)
    if (name == n.text) return n.field;
  return Field::other;
}

// The fields of a --query-* list; 0 when there are more than kMaxFields.
size_t split_fields(std::string_view list, Field (&out)[kMaxFields]) {
  size_t n = 0;
  bool done = false;
  std::string_view cell;
  while (next_cell(list, ',', cell, done)) {
    if (n == kMaxFields) return 0;
    out[n++] = field_of(trim(cell));
  }
  return n;
}

// The cells of one CSV line; 0 when there are not exactly `want` (a stray message line).
size_t split_cells(std::string_view line, std::string_view (&out)[kMaxFields], size_t want) {
  size_t n = 0;
  bool done = false;
  std::string_view cell;
  while (next_cell(line, ',', cell, done)) {
    if (n == kMaxFields) return 0;
    out[n++] = trim(cell);
  }
  return n == want ? n : 0;
}

// A value nvidia-smi could not give: "[N/A]", "[Not Supported]", "[Insufficient Permissions]",
// "[Unknown Error]", ... and the unbracketed "N/A" of some versions.
bool is_missing(std::string_view v) {
  return v.empty() || v.front() == '[' || v == "N/A" || v == "Not Supported";
}

// A number with an optional unit after a space ("87", "87 %", "245.10 W"), times 10^digits.
std::optional<uint64_t> number(std::string_view v, int digits) {
  if (is_missing(v)) return std::nullopt;
  size_t space = v.find(' ');
  if (space != std::string_view::npos) v = v.substr(0, space);
  return detail::parse_fixed(v, digits);
}

std::optional<uint32_t> number32(std::string_view v, int digits = 0) {
  auto n = number(v, digits);
  if (!n || *n > UINT32_MAX) return std::nullopt;
  return uint32_t(*n);
}

}  // namespace

std::optional<uint64_t> parse_hex_mask(std::string_view text) {
  text = trim(text);
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) text.remove_prefix(2);
  if (text.empty() || text.size() > 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : text) {
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | uint64_t(d);
  }
  return v;
}

size_t parse_nvidia_smi_gpus(std::string_view text, std::string_view fields, std::vector<GpuSample>& out) {
  Field f[kMaxFields];
  size_t nf = split_fields(fields, f);
  size_t n = 0;
  std::string_view line;
  std::string_view cells[kMaxFields];
  while (nf > 0 && next_line(text, line)) {
    if (trim(line).empty() || split_cells(line, cells, nf) == 0) continue;
    GpuSample& g = detail::row_at(out, n);
    g.index = int32_t(n);
    for (size_t i = 0; i < nf; ++i) {
      std::string_view v = cells[i];
      switch (f[i]) {
        case Field::index:
          if (auto x = number32(v); x && *x <= INT32_MAX) g.index = int32_t(*x);
          break;
        case Field::uuid:
          if (!is_missing(v)) g.uuid.assign(v);
          break;
        case Field::util:
          g.util_percent = number32(v);
          break;
        case Field::mem_used:
          g.mem_used_mib = number(v, 0);
          break;
        case Field::mem_total:
          g.mem_total_mib = number(v, 0);
          break;
        case Field::power:
          g.power_mw = number32(v, 3);
          break;
        case Field::power_limit:
          g.power_limit_mw = number32(v, 3);
          break;
        case Field::temperature:
          g.temperature_c = number32(v);
          break;
        case Field::sm_clock:
          g.sm_clock_mhz = number32(v);
          break;
        case Field::reasons:
          if (!is_missing(v)) g.throttle_reasons = parse_hex_mask(v);
          break;
        default:
          break;
      }
    }
    ++n;
  }
  out.resize(n);
  return n;
}

size_t parse_nvidia_smi_apps(std::string_view text, std::string_view fields, std::vector<GpuSample>& gpus) {
  Field f[kMaxFields];
  size_t nf = split_fields(fields, f);
  size_t uuid_at = kMaxFields, pid_at = kMaxFields, mem_at = kMaxFields;
  for (size_t i = 0; i < nf; ++i) {
    if (f[i] == Field::uuid) uuid_at = i;
    if (f[i] == Field::pid) pid_at = i;
    if (f[i] == Field::used_memory) mem_at = i;
  }
  if (uuid_at == kMaxFields || pid_at == kMaxFields) return 0;
  size_t added = 0;
  std::string_view line;
  std::string_view cells[kMaxFields];
  while (next_line(text, line)) {
    if (trim(line).empty() || split_cells(line, cells, nf) == 0) continue;
    auto pid = number32(cells[pid_at]);
    if (!pid) continue;
    for (auto& g : gpus) {
      if (g.uuid.empty() || g.uuid != cells[uuid_at]) continue;
      GpuProcess p;
      p.pid = *pid;
      if (mem_at != kMaxFields) p.used_mib = number(cells[mem_at], 0);
      g.processes.push_back(p);
      ++added;
      break;
    }
  }
  return added;
}

}  // namespace mltrain::telemetry
