#include "runner/records/telemetry_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "runner/telemetry/sample.h"

namespace mltrain::records {

namespace {

using Json = nlohmann::ordered_json;

template <class T>
Json value(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// A value kept in hundredths (percent x100, load x100) as a plain number.
Json hundredths(const std::optional<uint32_t>& v) { return v ? Json(double(*v) / 100.0) : Json(nullptr); }

}  // namespace

bool keep_telemetry_sample(int64_t elapsed_ms, int64_t last_kept_ms) {
  if (elapsed_ms < kTelemetryKeepAllMs || last_kept_ms < 0) return true;
  return elapsed_ms - last_kept_ms >= kTelemetryThinnedMs;
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
  const telemetry::HostSample& h = s.host;
  j["cpus"] = value(h.cpus);
  j["cpu_percent"] = hundredths(h.cpu_percent_x100);
  j["load"] = Json::array({hundredths(h.load1_x100), hundredths(h.load5_x100), hundredths(h.load15_x100)});
  j["mem_total_bytes"] = value(h.mem_total_bytes);
  j["mem_available_bytes"] = value(h.mem_available_bytes);
  j["net_rx_bytes_per_s"] = value(h.net_rx_bytes_per_s);
  j["net_tx_bytes_per_s"] = value(h.net_tx_bytes_per_s);
  j["gpu_source"] = s.gpu_source;
  if (!s.gpu_note.empty()) j["gpu_note"] = s.gpu_note;
  std::unordered_map<int32_t, int32_t> rank_of_pid;
  for (const auto& r : s.ranks) rank_of_pid[r.pid] = r.rank;
  Json gpus = Json::array();
  for (const auto& g : s.gpus) {
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
    gpus.push_back(std::move(o));
  }
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

TelemetryLog::TelemetryLog(std::string run_dir) : path_(std::move(run_dir) + "/telemetry.jsonl") {}

TelemetryLog::~TelemetryLog() {
  if (fd_ >= 0) ::close(fd_);
}

void TelemetryLog::append(const std::string& host, std::string_view encoded_sample, int64_t elapsed_ms) {
  if (failed_) return;
  auto last = last_kept_ms_.find(host);
  if (!keep_telemetry_sample(elapsed_ms, last == last_kept_ms_.end() ? -1 : last->second)) return;
  std::string error;
  std::string line = telemetry_json_line(host, encoded_sample, error);
  if (line.empty()) {
    if (!bad_sample_said_)
      std::fprintf(stderr, "mltrain: %s: a telemetry sample could not be read (%s); skipped\n", host.c_str(),
                   error.c_str());
    bad_sample_said_ = true;
    return;
  }
  last_kept_ms_[host] = elapsed_ms;
  line += '\n';
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  size_t done = 0;
  while (fd_ >= 0 && done < line.size()) {
    ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  if (done < line.size()) {
    std::fprintf(stderr, "mltrain: cannot write %s (%s); telemetry is not recorded for this run\n",
                 path_.c_str(), std::strerror(errno));
    failed_ = true;
  }
}

}  // namespace mltrain::records
