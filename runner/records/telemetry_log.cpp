#include "runner/records/telemetry_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "runner/records/detail/telemetry_json.h"
#include "runner/telemetry/sample.h"
#include "runner/tree/atomic_file.h"

namespace mltrain::records {

namespace {

using detail::hundredths;
using detail::Json;
using detail::value;

template <class T>
bool get(const Json& j, const char* key, std::optional<T>& out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return true;
  if (!it->is_number()) return false;
  if constexpr (std::is_integral_v<T>) {
    if (it->is_number_float() ||
        (it->is_number_integer() && !it->is_number_unsigned() && it->get<int64_t>() < 0))
      return false;
  }
  out = it->get<T>();
  return true;
}

// A plain number back to hundredths.
bool get_hundredths(const Json& v, std::optional<uint32_t>& out) {
  if (v.is_null()) return true;
  if (!v.is_number() || v.get<double>() < 0) return false;
  out = uint32_t(std::llround(v.get<double>() * 100.0));
  return true;
}

bool get_hundredths(const Json& j, const char* key, std::optional<uint32_t>& out) {
  auto it = j.find(key);
  return it == j.end() || get_hundredths(*it, out);
}

}  // namespace

bool telemetry_from_json(std::string_view line, std::string& host, telemetry::Sample& out,
                         std::string& error) {
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    error = "not JSON";
    return false;
  }
  if (j.value("schema", 0) != 1 || !j.contains("host") || !j["host"].is_string() || !j.contains("time_ms") ||
      !j["time_ms"].is_number_integer()) {
    error = "not a schema-1 telemetry sample";
    return false;
  }
  out = {};
  host = j["host"].get<std::string>();
  out.time_ms = j["time_ms"].get<int64_t>();
  telemetry::HostSample& h = out.host;
  bool ok = get(j, "monotonic_ns", out.monotonic_ns) && get(j, "cpus", h.cpus) &&
            get_hundredths(j, "cpu_percent", h.cpu_percent_x100) &&
            get(j, "mem_total_bytes", h.mem_total_bytes) &&
            get(j, "mem_available_bytes", h.mem_available_bytes) &&
            get(j, "net_rx_bytes_per_s", h.net_rx_bytes_per_s) &&
            get(j, "net_tx_bytes_per_s", h.net_tx_bytes_per_s);
  if (auto l = j.find("load"); ok && l != j.end() && l->is_array() && l->size() == 3)
    ok = get_hundredths((*l)[0], h.load1_x100) && get_hundredths((*l)[1], h.load5_x100) &&
         get_hundredths((*l)[2], h.load15_x100);
  if (auto s = j.find("gpu_source"); s != j.end() && s->is_string()) out.gpu_source = s->get<std::string>();
  if (auto s = j.find("gpu_note"); s != j.end() && s->is_string()) out.gpu_note = s->get<std::string>();
  if (auto gs = j.find("gpus"); ok && gs != j.end() && gs->is_array()) {
    for (const Json& o : *gs) {
      if (!o.is_object()) return error = "a GPU row is not an object", false;
      telemetry::GpuSample g;
      g.index = o.value("index", -1);
      if (auto u = o.find("uuid"); u != o.end() && u->is_string()) g.uuid = u->get<std::string>();
      ok = ok && get(o, "util_percent", g.util_percent) && get(o, "mem_used_mib", g.mem_used_mib) &&
           get(o, "mem_total_mib", g.mem_total_mib) && get(o, "power_mw", g.power_mw) &&
           get(o, "power_limit_mw", g.power_limit_mw) && get(o, "temperature_c", g.temperature_c) &&
           get(o, "sm_clock_mhz", g.sm_clock_mhz);
      if (auto t = o.find("throttle_reasons"); t != o.end() && t->is_array()) {
        std::vector<std::string> names;
        for (const Json& n : *t)
          if (n.is_string()) names.push_back(n.get<std::string>());
        g.throttle_reasons = telemetry::throttle_reason_mask(names);
      }
      if (auto ps = o.find("processes"); ps != o.end() && ps->is_array())
        for (const Json& p : *ps) {
          telemetry::GpuProcess gp;
          if (!p.is_object() || !p.contains("pid") || !p["pid"].is_number_unsigned()) continue;
          gp.pid = p["pid"].get<uint32_t>();
          ok = ok && get(p, "used_mib", gp.used_mib);
          g.processes.push_back(gp);
        }
      out.gpus.push_back(std::move(g));
    }
  }
  if (auto rs = j.find("ranks"); ok && rs != j.end() && rs->is_array()) {
    for (const Json& o : *rs) {
      if (!o.is_object() || !o.contains("rank") || !o["rank"].is_number_integer())
        return error = "a rank row has no rank", false;
      telemetry::RankSample r;
      r.rank = o["rank"].get<int32_t>();
      r.pid = o.value("pid", 0);
      if (auto st = o.find("state"); st != o.end() && st->is_string() && st->get<std::string>().size() == 1)
        r.state = st->get<std::string>()[0];
      ok = ok && get_hundredths(o, "cpu_percent", r.cpu_percent_x100) && get(o, "rss_bytes", r.rss_bytes) &&
           get(o, "comm_ns", r.comm_ns) && get(o, "calls", r.calls) && get(o, "entered_ns", r.entered_ns) &&
           get(o, "last_exit_ns", r.last_exit_ns) && get(o, "started_ns", r.started_ns);
      out.ranks.push_back(std::move(r));
    }
  }
  if (!ok) error = "a value has the wrong type";
  return ok;
}

std::vector<std::pair<std::string, telemetry::Sample>> read_telemetry(const std::string& path,
                                                                      size_t* skipped) {
  std::vector<std::pair<std::string, telemetry::Sample>> out;
  if (skipped) *skipped = 0;
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (!f) return out;
  std::string line, host, error;
  char buf[65536];
  while (std::fgets(buf, sizeof buf, f)) {
    line += buf;
    if (line.back() != '\n' && !std::feof(f)) continue;  // a line longer than the buffer
    telemetry::Sample s;
    if (line.find_first_not_of(" \t\r\n") == std::string::npos) {
      line.clear();
      continue;
    }
    if (telemetry_from_json(line, host, s, error))
      out.emplace_back(host, std::move(s));
    else if (skipped)
      ++*skipped;
    line.clear();
  }
  std::fclose(f);
  return out;
}

bool keep_telemetry_sample(int64_t elapsed_ms, int64_t last_kept_ms) {
  if (elapsed_ms < kTelemetryKeepAllMs || last_kept_ms < 0) return true;
  return elapsed_ms - last_kept_ms >= kTelemetryThinnedMs;
}

void detail::put_host_fields(Json& j, const telemetry::HostSample& h) {
  j["cpus"] = value(h.cpus);
  j["cpu_percent"] = hundredths(h.cpu_percent_x100);
  j["load"] = Json::array({hundredths(h.load1_x100), hundredths(h.load5_x100), hundredths(h.load15_x100)});
  j["mem_total_bytes"] = value(h.mem_total_bytes);
  j["mem_available_bytes"] = value(h.mem_available_bytes);
  j["net_rx_bytes_per_s"] = value(h.net_rx_bytes_per_s);
  j["net_tx_bytes_per_s"] = value(h.net_tx_bytes_per_s);
}

Json detail::gpu_json(const telemetry::GpuSample& g,
                      const std::unordered_map<int32_t, int32_t>& rank_of_pid) {
  Json o;
  o["index"] = g.index;
  o["uuid"] = g.uuid.empty() ? Json(nullptr) : Json(g.uuid);
  o["util_percent"] = value(g.util_percent);
  o["mem_used_mib"] = value(g.mem_used_mib);
  o["mem_total_mib"] = value(g.mem_total_mib);
  o["power_mw"] = value(g.power_mw);
  o["power_limit_mw"] = value(g.power_limit_mw);
  o["temperature_c"] = value(g.temperature_c);
  o["sm_clock_mhz"] = value(g.sm_clock_mhz);
  o["throttle_reasons"] =
      g.throttle_reasons ? Json(telemetry::throttle_reason_names(*g.throttle_reasons)) : Json(nullptr);
  Json procs = Json::array();
  for (const auto& p : g.processes) {
    auto it = rank_of_pid.find(int32_t(p.pid));
    procs.push_back({{"pid", p.pid},
                     {"used_mib", value(p.used_mib)},
                     {"rank", it == rank_of_pid.end() ? Json(nullptr) : Json(it->second)}});
  }
  o["processes"] = std::move(procs);
  return o;
}

std::string telemetry_json_line(const std::string& host, std::string_view encoded_sample,
                                std::string& error) {
  telemetry::Sample s;
  if (!telemetry::decode(encoded_sample, s, error)) return {};
  Json j;
  j["schema"] = 1;
  j["host"] = host;
  j["time_ms"] = s.time_ms;
  j["monotonic_ns"] = value(s.monotonic_ns);
  detail::put_host_fields(j, s.host);
  j["gpu_source"] = s.gpu_source;
  if (!s.gpu_note.empty()) j["gpu_note"] = s.gpu_note;
  std::unordered_map<int32_t, int32_t> rank_of_pid;
  for (const auto& r : s.ranks) rank_of_pid[r.pid] = r.rank;
  Json gpus = Json::array();
  for (const auto& g : s.gpus) gpus.push_back(detail::gpu_json(g, rank_of_pid));
  j["gpus"] = std::move(gpus);
  Json ranks = Json::array();
  for (const auto& r : s.ranks) {
    Json o;
    o["rank"] = r.rank;
    o["pid"] = r.pid;
    o["state"] = r.state ? Json(std::string(1, *r.state)) : Json(nullptr);
    o["cpu_percent"] = hundredths(r.cpu_percent_x100);
    o["rss_bytes"] = value(r.rss_bytes);
    o["comm_ns"] = value(r.comm_ns);
    o["calls"] = value(r.calls);
    o["entered_ns"] = value(r.entered_ns);
    o["last_exit_ns"] = value(r.last_exit_ns);
    o["started_ns"] = value(r.started_ns);
    ranks.push_back(std::move(o));
  }
  j["ranks"] = std::move(ranks);
  // Text from a host (a GPU note, a UUID) may hold any bytes: replace what is not UTF-8.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

TelemetryLog::TelemetryLog(std::string run_dir)
    : path_(run_dir + "/telemetry.jsonl"), live_path_(run_dir + "/" + kTelemetryLiveFile) {}

TelemetryLog::~TelemetryLog() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

bool write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += size_t(n);
  }
  return true;
}

}  // namespace

void TelemetryLog::append(const std::string& host, std::string_view encoded_sample, int64_t elapsed_ms) {
  if (failed_) return;
  std::string error;
  std::string line = telemetry_json_line(host, encoded_sample, error);
  if (line.empty()) {
    if (!bad_sample_said_)
      std::fprintf(stderr, "mltrain: %s: a telemetry sample could not be read (%s); skipped\n", host.c_str(),
                   error.c_str());
    bad_sample_said_ = true;
    return;
  }
  line += '\n';
  live_[host] = line;
  if (live_written_ms_ < 0 || elapsed_ms - live_written_ms_ >= kTelemetryLiveMs) write_live(elapsed_ms);
  auto last = last_kept_ms_.find(host);
  if (!keep_telemetry_sample(elapsed_ms, last == last_kept_ms_.end() ? -1 : last->second)) return;
  last_kept_ms_[host] = elapsed_ms;
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0 || !write_all(fd_, line)) {
    std::fprintf(stderr, "mltrain: cannot write %s (%s); telemetry is not recorded for this run\n",
                 path_.c_str(), std::strerror(errno));
    failed_ = true;
  }
}

// Through a temporary name and a rename, so a reader never sees half a file.
void TelemetryLog::write_live(int64_t elapsed_ms) {
  if (live_failed_) return;
  live_written_ms_ = elapsed_ms;
  std::string all;
  for (const auto& [host, line] : live_) all += line;
  std::string error;
  if (sync::write_atomically(AT_FDCWD, live_path_, all, 0600, false, error)) return;
  live_failed_ = true;  // `top` then says the run has no live telemetry; telemetry.jsonl goes on
}

}  // namespace mltrain::records
