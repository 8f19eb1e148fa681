// telemetry.jsonl in a run's folder: one JSON line per kept Telemetry sample (docs/json.md).
//
// Size: every sample is kept for the first 2 minutes, then one per host every 10 s, so a 1-hour
// run at the default 1 s interval keeps 120 + 348 lines per host. A host of 4 CPU ranks writes
// about 1.1 KB a line (measured): about 0.5 MB for the hour. Each GPU adds about 330 bytes and
// each rank about 300, so a host of 8 ranks on 8 GPUs writes about 5.5 KB a line, about 2.6 MB
// for the hour; every further hour adds about 2 MB.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runner/telemetry/sample.h"

namespace mltrain::records {

inline constexpr int64_t kTelemetryKeepAllMs = 2 * 60 * 1000;  // every sample, the first 2 min
inline constexpr int64_t kTelemetryThinnedMs = 10 * 1000;      // then one per host every 10 s
// The latest sample of each host, rewritten as they come (at most every kTelemetryLiveMs): what
// `mltrain top RUN` reads while the run goes on, whatever telemetry.jsonl keeps.
inline constexpr const char* kTelemetryLiveFile = "telemetry-live.jsonl";
inline constexpr int64_t kTelemetryLiveMs = 250;

// Whether a sample taken `elapsed_ms` into the run is kept, given when this host's last kept one
// was taken (-1: none yet).
bool keep_telemetry_sample(int64_t elapsed_ms, int64_t last_kept_ms);

// The JSON line (no newline) for one encoded sample (runner/telemetry/sample.h's text) from
// `host`; "" with `error` set when the sample does not decode.
std::string telemetry_json_line(const std::string& host, std::string_view encoded_sample, std::string& error);

// Reads one telemetry.jsonl line back into `host` and `out`; false with `error` set when it is not
// a schema-1 sample.
bool telemetry_from_json(std::string_view line, std::string& host, telemetry::Sample& out,
                         std::string& error);

// Every sample in a telemetry file (telemetry.jsonl or the live file), in file order; lines that do
// not read are counted in `skipped`. Empty when the file is missing.
std::vector<std::pair<std::string, telemetry::Sample>> read_telemetry(const std::string& path,
                                                                      size_t* skipped = nullptr);

// Appends kept samples to <run folder>/telemetry.jsonl, opened on the first one. A file that
// cannot be written is said once on stderr and telemetry is dropped; nothing throws.
class TelemetryLog {
 public:
  explicit TelemetryLog(std::string run_dir);
  ~TelemetryLog();
  TelemetryLog(const TelemetryLog&) = delete;
  TelemetryLog& operator=(const TelemetryLog&) = delete;

  void append(const std::string& host, std::string_view encoded_sample, int64_t elapsed_ms);

 private:
  void write_live(int64_t elapsed_ms);

  std::string path_, live_path_;
  int fd_ = -1;
  std::map<std::string, std::string> live_;  // host -> its latest JSON line
  int64_t live_written_ms_ = -1;
  bool live_failed_ = false;
  bool failed_ = false;
  bool bad_sample_said_ = false;
  std::map<std::string, int64_t> last_kept_ms_;
};

}  // namespace mltrain::records
