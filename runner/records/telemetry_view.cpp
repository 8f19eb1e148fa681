#include "runner/records/telemetry_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>
#include <vector>

#include "runner/common/text.h"
#include "runner/records/detail/telemetry_json.h"

namespace mltrain::records {

namespace {

using detail::hundredths;
using detail::Json;
using detail::value;
using telemetry::GpuRow;
using telemetry::HostRow;
using telemetry::RankRow;
Json rounded(const std::optional<double>& v, double scale = 1.0) {
  return v ? Json(std::round(*v * scale * 10.0) / 10.0) : Json(nullptr);
}

std::string fmt(const char* f, double v) {
  char b[32];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string pct(std::optional<double> v) { return v ? fmt("%.0f%%", *v) : "-"; }

std::string duration(int64_t ms) {
  int64_t s = std::max<int64_t>(ms, 0) / 1000;
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(s / 3600), (long long)(s / 60 % 60));
  return b;
}

// The IN COLLECTIVES cell of a rank without comm counters, `width` columns.
std::string not_timed(int width) {
  std::string t = "not timed";
  t.resize(size_t(std::max<int>(width, int(t.size()))), ' ');
  return t;
}

// "[|||||     ]" for 0..100, `width` columns in all.
std::string bar(std::optional<double> v, int width) {
  int inner = std::max(width - 2, 1);
  std::string out = "[";
  int fill = v ? int(std::lround(std::clamp(*v, 0.0, 100.0) / 100.0 * inner)) : 0;
  for (int i = 0; i < inner; ++i) out += !v ? (i == 0 ? '?' : ' ') : i < fill ? '|' : ' ';
  return out + "]";
}

std::string mem_pair(std::optional<uint64_t> used, std::optional<uint64_t> total) {
  if (!used && !total) return "-";
  return (used ? human_bytes(*used) : "-") + "/" + (total ? human_bytes(*total) : "-");
}

std::string ranks_text(const std::vector<int32_t>& ranks) {
  if (ranks.empty()) return "-";
  std::string out;
  for (int32_t r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::optional<double> host_cpu(const HostRow& h) {
  if (!h.sample.cpu_percent_x100) return std::nullopt;
  return *h.sample.cpu_percent_x100 / 100.0;
}
std::optional<double> rank_cpu(const RankRow& r) {
  if (!r.sample.cpu_percent_x100) return std::nullopt;
  return *r.sample.cpu_percent_x100 / 100.0;
}
std::optional<double> gpu_util(const GpuRow& g) {
  if (!g.sample.util_percent) return std::nullopt;
  return double(*g.sample.util_percent);
}

// Larger first, missing last.
template <class Row, class Key>
void sort_desc(std::vector<const Row*>& rows, Key key) {
  std::stable_sort(rows.begin(), rows.end(), [&](const Row* a, const Row* b) {
    auto ka = key(*a), kb = key(*b);
    if (!ka || !kb) return bool(ka) && !kb;
    return *ka > *kb;
  });
}

class Screen {
 public:
  explicit Screen(const TopScreen& s) : s_(s) {}
  // A line cut to the width; `red` colours it when colour is on.
  void line(std::string text, bool red = false) {
    if (s_.width > 0 && int(text.size()) > s_.width) text.resize(size_t(s_.width));
    if (red && s_.color) text = "\033[31;1m" + text + "\033[0m";
    out_ += text + "\n";
    ++lines_;
  }
  // A line that must not lose its end: wrapped at spaces to the width, up to `max_lines` (the
  // last cut with "…"), continuation lines indented; one line when the width is unlimited.
  void wrapped(const std::string& text, int max_lines = 3) {
    if (s_.width <= 8) return line(text);
    std::string rest = text;
    for (int n = 1;; ++n) {
      const std::string head = n == 1 ? "" : "  ";
      const size_t room = size_t(s_.width) - head.size();
      if (rest.size() <= room || n == max_lines) return line(head + text::cut(rest, room));
      size_t space = rest.rfind(' ', room);  // rest[0, space) fits
      if (space == std::string::npos || space == 0) {
        line(head + rest.substr(0, room));
        rest.erase(0, room);
      } else {
        line(head + rest.substr(0, space));
        rest.erase(0, space + 1);
      }
    }
  }
  std::string take() { return std::move(out_); }
  int lines() const { return lines_; }

 private:
  const TopScreen& s_;
  std::string out_;
  int lines_ = 0;
};

}  // namespace

const char* sort_name(TopSort s) {
  switch (s) {
    case TopSort::natural:
      return "name";
    case TopSort::cpu:
      return "cpu";
    case TopSort::gpu:
      return "gpu";
    case TopSort::comm:
      return "comm";
    case TopSort::memory:
      return "memory";
  }
  return "?";
}

std::string human_bytes(uint64_t v) {
  static const char* const kUnits[] = {"B", "K", "M", "G", "T", "P"};
  double d = double(v);
  int u = 0;
  while (d >= 1024.0 && u < 5) d /= 1024.0, ++u;
  if (u == 0) return std::to_string(v) + "B";
  return fmt(d < 100 ? "%.1f" : "%.0f", d) + kUnits[u];
}

namespace {

// The title, and the lines that say what stands out (no timing, the straggler, idle GPUs).
void top_header(Screen& sc, const telemetry::Snapshot& snap, const TopScreen& screen) {
  size_t gpus_total = snap.gpus.size();
  std::string title = "mltrain top";
  if (!screen.title.empty()) title += " - " + screen.title;
  title += " - " + std::to_string(snap.hosts.size()) + " host" + (snap.hosts.size() == 1 ? "" : "s") + ", " +
           std::to_string(snap.ranks.size()) + " rank" + (snap.ranks.size() == 1 ? "" : "s") + ", " +
           std::to_string(gpus_total) + " GPU" + (gpus_total == 1 ? "" : "s");
  sc.line(title);
  if (!screen.note.empty()) sc.line(screen.note);
  if (!snap.collectives_timed && !snap.ranks.empty()) sc.line(telemetry::kNotTimedNote);
  if (snap.straggler) {
    std::string host;
    for (const auto& r : snap.ranks)
      if (r.straggler) host = r.host;
    sc.line("straggler: " + snap.straggler_why + " (on " + host + ")", true);
  }
  std::vector<std::string> idle;
  for (const auto& g : snap.gpus)
    if (g.idle) idle.push_back(g.host + ":" + std::to_string(g.sample.index));
  if (!idle.empty()) {
    std::string t = "idle GPUs (under 10% while others are over 50%):";
    for (const auto& i : idle) t += " " + i;
    sc.line(t, true);
  }
}

// One row per host: CPU, load, memory, network, its GPUs' mean utilization.
void top_hosts(Screen& sc, const telemetry::Snapshot& snap, const TopScreen& screen, int bar_w) {
  char b[512];
  std::vector<const HostRow*> rows;
  for (const auto& h : snap.hosts) rows.push_back(&h);
  if (screen.sort == TopSort::cpu) sort_desc<HostRow>(rows, host_cpu);
  if (screen.sort == TopSort::gpu) sort_desc<HostRow>(rows, [](const HostRow& h) { return h.gpu_util_mean; });
  if (screen.sort == TopSort::memory)
    sort_desc<HostRow>(rows, [](const HostRow& h) -> std::optional<double> {
      if (!h.sample.mem_total_bytes || !h.sample.mem_available_bytes) return std::nullopt;
      return double(*h.sample.mem_total_bytes -
                    std::min(*h.sample.mem_total_bytes, *h.sample.mem_available_bytes));
    });
  sc.line("");
  std::snprintf(b, sizeof b, "%-16s %-*s %5s %4s %6s %13s %8s %8s %4s %5s", "HOST", bar_w, "CPU", "", "CPUS",
                "LOAD", "MEM", "NET RX/s", "NET TX/s", "GPUS", "GPU%");
  sc.line(b);
  for (const HostRow* h : rows) {
    const auto& s = h->sample;
    std::optional<uint64_t> used;
    if (s.mem_total_bytes && s.mem_available_bytes)
      used = *s.mem_total_bytes - std::min(*s.mem_total_bytes, *s.mem_available_bytes);
    std::snprintf(b, sizeof b, "%-16s %s %5s %4s %6s %13s %8s %8s %4zu %5s", h->host.c_str(),
                  bar(host_cpu(*h), bar_w).c_str(), pct(host_cpu(*h)).c_str(),
                  s.cpus ? std::to_string(*s.cpus).c_str() : "-",
                  s.load1_x100 ? fmt("%.2f", *s.load1_x100 / 100.0).c_str() : "-",
                  mem_pair(used, s.mem_total_bytes).c_str(),
                  s.net_rx_bytes_per_s ? human_bytes(*s.net_rx_bytes_per_s).c_str() : "-",
                  s.net_tx_bytes_per_s ? human_bytes(*s.net_tx_bytes_per_s).c_str() : "-", h->gpus,
                  pct(h->gpu_util_mean).c_str());
    sc.line(b);
  }
}

// One row per GPU, or why there are none.
void top_gpus(Screen& sc, const telemetry::Snapshot& snap, const TopScreen& screen, int bar_w) {
  char b[512];
  sc.line("");
  if (snap.gpus.empty()) {
    // One line per distinct reason, its hosts named once: hosts usually share the reason.
    std::vector<std::pair<std::string, std::vector<std::string>>> notes;
    for (const auto& h : snap.hosts) {
      if (h.gpu_note.empty()) continue;
      std::string note = text::host_text(h.gpu_note, 300);
      auto it = std::find_if(notes.begin(), notes.end(), [&](const auto& n) { return n.first == note; });
      if (it == notes.end()) it = notes.insert(notes.end(), {note, {}});
      it->second.push_back(h.host);
    }
    if (notes.empty()) sc.line("no GPUs");
    for (const auto& [note, hosts] : notes)
      sc.wrapped("no GPUs (" + text::cut(text::compact_names(hosts), 60) + ": " + note + ")");
  } else {
    std::vector<const GpuRow*> rows;
    for (const auto& g : snap.gpus) rows.push_back(&g);
    if (screen.sort == TopSort::gpu || screen.sort == TopSort::cpu) sort_desc<GpuRow>(rows, gpu_util);
    if (screen.sort == TopSort::memory)
      sort_desc<GpuRow>(rows, [](const GpuRow& g) -> std::optional<double> {
        if (!g.sample.mem_used_mib) return std::nullopt;
        return double(*g.sample.mem_used_mib);
      });
    std::snprintf(b, sizeof b, "%-18s %-*s %5s %13s %11s %5s %6s %-8s %s", "GPU", bar_w, "UTIL", "", "MEM",
                  "POWER", "TEMP", "SM MHz", "RANKS", "THROTTLE");
    sc.line(b);
    for (const GpuRow* g : rows) {
      const auto& s = g->sample;
      std::string power = s.power_mw || s.power_limit_mw
                              ? (s.power_mw ? std::to_string(*s.power_mw / 1000) : "-") + "/" +
                                    (s.power_limit_mw ? std::to_string(*s.power_limit_mw / 1000) : "-") + "W"
                              : "-";
      std::string throttle;
      if (s.throttle_reasons)
        for (const auto& n : telemetry::throttle_reason_names(*s.throttle_reasons))
          throttle += (throttle.empty() ? "" : ",") + n;
      std::optional<uint64_t> used, total;
      if (s.mem_used_mib) used = *s.mem_used_mib << 20;
      if (s.mem_total_mib) total = *s.mem_total_mib << 20;
      std::snprintf(b, sizeof b, "%-18s %s %5s %13s %11s %5s %6s %-8s %s",
                    (g->host + ":" + std::to_string(s.index)).c_str(), bar(gpu_util(*g), bar_w).c_str(),
                    pct(gpu_util(*g)).c_str(), mem_pair(used, total).c_str(), power.c_str(),
                    s.temperature_c ? (std::to_string(*s.temperature_c) + "C").c_str() : "-",
                    s.sm_clock_mhz ? std::to_string(*s.sm_clock_mhz).c_str() : "-",
                    ranks_text(g->ranks).c_str(), throttle.empty() ? "-" : throttle.c_str());
      sc.line(b, g->idle);
    }
  }
}

// One row per rank, the straggler marked.
void top_ranks(Screen& sc, const telemetry::Snapshot& snap, const TopScreen& screen, int bar_w) {
  char b[512];
  std::vector<const RankRow*> rows;
  for (const auto& r : snap.ranks) rows.push_back(&r);
  if (screen.sort == TopSort::cpu) sort_desc<RankRow>(rows, rank_cpu);
  if (screen.sort == TopSort::gpu)
    sort_desc<RankRow>(rows, [](const RankRow& r) -> std::optional<double> {
      if (!r.gpu_util) return std::nullopt;
      return double(*r.gpu_util);
    });
  // Lowest share first: the rank the others wait for leads.
  if (screen.sort == TopSort::comm)
    sort_desc<RankRow>(rows, [](const RankRow& r) -> std::optional<double> {
      if (!r.comm_share) return std::nullopt;
      return 1.0 - *r.comm_share;
    });
  if (screen.sort == TopSort::memory)
    sort_desc<RankRow>(rows, [](const RankRow& r) -> std::optional<double> {
      if (!r.sample.rss_bytes) return std::nullopt;
      return double(*r.sample.rss_bytes);
    });
  sc.line("");
  if (rows.empty()) {
    sc.line("no ranks running on these hosts");
  } else {
    std::snprintf(b, sizeof b, "%-6s %-16s %8s %-5s %6s %7s %-*s %5s %8s %-6s %s", "RANK", "HOST", "PID",
                  "STATE", "CPU", "RSS", bar_w, "IN COLLECTIVES", "", "CALLS/s", "GPU", "GPU%");
    sc.line(b);
    for (const RankRow* r : rows) {
      const auto& s = r->sample;
      std::optional<double> comm;
      if (r->comm_share) comm = *r->comm_share * 100.0;
      std::string gpus;
      for (int32_t g : r->gpus) gpus += (gpus.empty() ? "" : ",") + std::to_string(g);
      std::snprintf(b, sizeof b, "%-6d %-16s %8d %-5s %6s %7s %s %5s %8s %-6s %s%s", s.rank, r->host.c_str(),
                    s.pid, s.state ? std::string(1, *s.state).c_str() : "gone", pct(rank_cpu(*r)).c_str(),
                    s.rss_bytes ? human_bytes(*s.rss_bytes).c_str() : "-",
                    s.comm_ns ? bar(comm, bar_w).c_str() : not_timed(bar_w).c_str(), pct(comm).c_str(),
                    r->calls_per_s ? fmt("%.1f", *r->calls_per_s).c_str() : "-",
                    gpus.empty() ? "-" : gpus.c_str(),
                    r->gpu_util ? (std::to_string(*r->gpu_util) + "%").c_str() : "-",
                    r->straggler ? " <- straggler" : "");
      sc.line(b, r->straggler);
    }
  }
}

}  // namespace

std::string render_top(const telemetry::Snapshot& snap, const TopScreen& screen) {
  Screen sc(screen);
  const int bar_w = screen.width >= 110 ? 22 : 12;
  top_header(sc, snap, screen);
  const bool all = screen.view == TopView::all;
  if (all || screen.view == TopView::hosts) top_hosts(sc, snap, screen, bar_w);
  if (all || screen.view == TopView::gpus) top_gpus(sc, snap, screen, bar_w);
  if (all || screen.view == TopView::ranks) top_ranks(sc, snap, screen, bar_w);
  std::string body = sc.take();
  if (screen.height > 0) {
    // Keep what fits above the footer.
    int keep = screen.height - (screen.footer.empty() ? 0 : 1);
    size_t pos = 0;
    for (int i = 0; i < keep && pos != std::string::npos; ++i) {
      pos = body.find('\n', pos);
      if (pos != std::string::npos) ++pos;
    }
    if (pos != std::string::npos && pos < body.size()) body.resize(pos);
  }
  if (!screen.footer.empty()) {
    std::string f = screen.footer;
    if (screen.width > 0 && int(f.size()) > screen.width) f.resize(size_t(screen.width));
    body += (screen.color ? "\033[7m" + f + "\033[0m" : f) + "\n";
  }
  return body;
}

std::string snapshot_json(const telemetry::Snapshot& snap, const std::string& run_id,
                          const std::vector<std::pair<std::string, std::string>>& problems) {
  Json j;
  j["schema"] = 1;
  j["run"] = run_id.empty() ? Json(nullptr) : Json(run_id);
  if (snap.straggler) {
    std::string host;
    for (const auto& r : snap.ranks)
      if (r.straggler) host = r.host;
    j["straggler"] = {{"rank", *snap.straggler},
                      {"host", host},
                      {"why", snap.straggler_why},
                      {"estimated", snap.straggler_estimated}};
  } else {
    j["straggler"] = nullptr;
  }
  j["collectives_timed"] = snap.collectives_timed;
  Json hosts = Json::array();
  for (const auto& h : snap.hosts) {
    Json o;
    o["host"] = h.host;
    o["time_ms"] = h.time_ms;
    detail::put_host_fields(o, h.sample);
    o["gpu_source"] = h.gpu_source;
    o["gpu_note"] = h.gpu_note.empty() ? Json(nullptr) : Json(h.gpu_note);
    o["gpus"] = h.gpus;
    o["gpu_util_mean"] = rounded(h.gpu_util_mean);
    hosts.push_back(std::move(o));
  }
  j["hosts"] = std::move(hosts);
  // Each host's ranks by pid, to name the ranks among its GPUs' processes.
  std::map<std::string, std::unordered_map<int32_t, int32_t>> rank_of_pid;
  for (const auto& r : snap.ranks) rank_of_pid[r.host][r.sample.pid] = r.sample.rank;
  Json gpus = Json::array();
  for (const auto& g : snap.gpus) {
    Json o;
    o["host"] = g.host;
    Json fields = detail::gpu_json(g.sample, rank_of_pid[g.host]);
    for (auto& [key, v] : fields.items()) o[key] = std::move(v);
    o["idle"] = g.idle;
    o["ranks"] = g.ranks;
    gpus.push_back(std::move(o));
  }
  j["gpus"] = std::move(gpus);
  Json ranks = Json::array();
  for (const auto& r : snap.ranks) {
    const auto& s = r.sample;
    ranks.push_back(
        {{"rank", s.rank},
         {"host", r.host},
         {"pid", s.pid},
         {"state", s.state ? Json(std::string(1, *s.state)) : Json(nullptr)},
         {"cpu_percent", hundredths(s.cpu_percent_x100)},
         {"rss_bytes", value(s.rss_bytes)},
         {"comm_share", r.comm_share ? Json(std::round(*r.comm_share * 1000.0) / 1000.0) : Json(nullptr)},
         {"calls", value(s.calls)},
         {"calls_per_s", rounded(r.calls_per_s)},
         {"gpus", r.gpus},
         {"gpu_util", value(r.gpu_util)},
         {"straggler", r.straggler}});
  }
  j["ranks"] = std::move(ranks);
  Json probs = Json::array();
  for (const auto& [host, why] : problems) probs.push_back({{"host", host}, {"problem", why}});
  j["problems"] = std::move(probs);
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

std::string format_utilization(const telemetry::Summary& sum) {
  if (sum.samples == 0) return {};
  std::string out;
  char b[512];
  std::snprintf(b, sizeof b, "\nutilization (%zu samples from %zu host%s over %s)\n", sum.samples,
                sum.hosts.size(), sum.hosts.size() == 1 ? "" : "s",
                duration(sum.last_ms - sum.first_ms).c_str());
  out += b;
  if (!sum.timeline.empty())
    out += std::string(sum.timeline_is_gpu ? "GPU util   " : "CPU        ") + "|" +
           telemetry::sparkline(sum.timeline) + "|  (" +
           (sum.timeline_is_gpu ? "mean of the GPUs" : "mean of the hosts") + ", start to end)\n";
  if (auto m = sum.host_cpu.mean()) {
    std::snprintf(b, sizeof b, "host CPU   mean %.0f%%, max %.0f%%\n", *m, sum.host_cpu.max);
    out += b;
  }
  if (!sum.gpus.empty()) {
    std::snprintf(b, sizeof b, "\n%-18s %6s %6s %15s  %s\n", "GPU", "MEAN", "MAX", "MEM PEAK", "RANKS");
    out += b;
    for (const auto& g : sum.gpus) {
      std::optional<uint64_t> peak, total;
      if (g.mem_peak_mib) peak = *g.mem_peak_mib << 20;
      if (g.mem_total_mib) total = *g.mem_total_mib << 20;
      std::snprintf(b, sizeof b, "%-18s %6s %6s %15s  %s\n", (g.host + ":" + std::to_string(g.index)).c_str(),
                    pct(g.util.mean()).c_str(), g.util.n ? pct(g.util.max).c_str() : "-",
                    mem_pair(peak, total).c_str(), ranks_text(g.ranks).c_str());
      out += b;
    }
  }
  if (!sum.ranks.empty()) {
    std::snprintf(b, sizeof b, "\n%-6s %-16s %8s %8s %9s %15s %8s\n", "RANK", "HOST", "CPU MEAN", "CPU MAX",
                  "RSS PEAK", "IN COLLECTIVES", "CALLS");
    out += b;
    for (const auto& r : sum.ranks) {
      std::optional<double> comm;
      if (r.comm_share) comm = *r.comm_share * 100.0;
      std::snprintf(b, sizeof b, "%-6d %-16s %8s %8s %9s %15s %8s%s\n", r.rank, r.host.c_str(),
                    pct(r.cpu.mean()).c_str(), r.cpu.n ? pct(r.cpu.max).c_str() : "-",
                    r.rss_peak ? human_bytes(*r.rss_peak).c_str() : "-", pct(comm).c_str(),
                    r.calls ? std::to_string(*r.calls).c_str() : "-", r.straggler ? "  <- straggler" : "");
      out += b;
    }
  }
  if (!sum.collectives_timed && !sum.ranks.empty())
    out += std::string("\n") + telemetry::kNotTimedNote + "\n";
  if (sum.straggler) out += "\nstraggler: " + sum.straggler_why + "\n";
  return out;
}

std::string utilization_json(const telemetry::Summary& sum) {
  Json j;
  j["samples"] = sum.samples;
  j["hosts"] = sum.hosts;
  j["duration_s"] = double(sum.last_ms - sum.first_ms) / 1000.0;
  j["host_cpu_percent"] = {{"mean", rounded(sum.host_cpu.mean())},
                           {"max", sum.host_cpu.n ? Json(sum.host_cpu.max) : Json(nullptr)}};
  Json gpus = Json::array();
  for (const auto& g : sum.gpus)
    gpus.push_back({{"host", g.host},
                    {"index", g.index},
                    {"uuid", g.uuid.empty() ? Json(nullptr) : Json(g.uuid)},
                    {"util_mean", rounded(g.util.mean())},
                    {"util_max", g.util.n ? Json(g.util.max) : Json(nullptr)},
                    {"mem_peak_mib", value(g.mem_peak_mib)},
                    {"mem_total_mib", value(g.mem_total_mib)},
                    {"ranks", g.ranks}});
  j["gpus"] = std::move(gpus);
  Json ranks = Json::array();
  for (const auto& r : sum.ranks)
    ranks.push_back(
        {{"rank", r.rank},
         {"host", r.host},
         {"cpu_mean", rounded(r.cpu.mean())},
         {"cpu_max", r.cpu.n ? Json(r.cpu.max) : Json(nullptr)},
         {"rss_peak_bytes", value(r.rss_peak)},
         {"comm_share", r.comm_share ? Json(std::round(*r.comm_share * 1000.0) / 1000.0) : Json(nullptr)},
         {"calls", value(r.calls)},
         {"straggler", r.straggler}});
  j["ranks"] = std::move(ranks);
  Json timeline = Json::array();
  for (const auto& v : sum.timeline) timeline.push_back(rounded(v));
  j["timeline"] = {{"of", sum.timeline_is_gpu ? "gpu_util_percent" : "host_cpu_percent"},
                   {"values", timeline}};
  j["straggler"] = sum.straggler ? Json({{"rank", *sum.straggler},
                                         {"why", sum.straggler_why},
                                         {"estimated", sum.straggler_estimated}})
                                 : Json(nullptr);
  j["collectives_timed"] = sum.collectives_timed;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string status_line(const telemetry::Snapshot& snap, const std::vector<int>& alive, int ranks,
                        int64_t elapsed_ms) {
  std::string out = std::to_string(alive.size()) + "/" + std::to_string(ranks) + " ranks alive";
  if (!alive.empty() && int(alive.size()) < ranks) out += " (" + text::int_ranges(alive, 24) + ")";
  out += " - " + duration(elapsed_ms);
  double sum = 0;
  size_t n = 0;
  for (const auto& g : snap.gpus)
    if (g.sample.util_percent) sum += *g.sample.util_percent, ++n;
  if (n) {
    out += " - GPU " + fmt("%.0f%%", sum / double(n));
  } else {
    for (const auto& h : snap.hosts)
      if (h.sample.cpu_percent_x100) sum += *h.sample.cpu_percent_x100 / 100.0, ++n;
    if (n) out += " - CPU " + fmt("%.0f%%", sum / double(n));
  }
  if (snap.straggler) {
    out += " - straggler: rank " + std::to_string(*snap.straggler) +
           (snap.straggler_estimated ? " (estimated from CPU time)" : "");
  } else {
    // The slowest rank: the one with the lowest share in collectives, when shares are known.
    const RankRow* low = nullptr;
    for (const auto& r : snap.ranks)
      if (r.comm_share && (!low || *r.comm_share < *low->comm_share)) low = &r;
    size_t known = 0;
    for (const auto& r : snap.ranks) known += r.comm_share ? 1 : 0;
    if (low && known > 1) out += " - slowest: rank " + std::to_string(low->sample.rank);
  }
  return out;
}

}  // namespace mltrain::records
