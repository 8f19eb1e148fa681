// How telemetry reads to people and scripts: `mltrain top`'s screen and JSON (a Snapshot), the
// utilization part of `mltrain show` (a Summary), and the run's one-line status.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runner/telemetry/analysis.h"

namespace mltrain::records {

enum class TopView { all, hosts, gpus, ranks };
enum class TopSort { natural, cpu, gpu, comm, memory };
const char* sort_name(TopSort s);

struct TopScreen {
  int width = 100, height = 0;  // height 0: no limit (--once)
  TopView view = TopView::all;
  TopSort sort = TopSort::natural;
  bool color = false;  // ANSI: idle GPUs and the straggler in red, bars in colour
  std::string title;   // the first line's left side ("run 2026... (running 3m12s)")
  std::string footer;  // the last line (keys), interactive only
  std::string note;    // a line under the title (waiting for samples, a host lost)
};

// The screen: a title, the straggler, then hosts, GPUs and ranks (or the one view chosen) as tables
// with bars, each line at most `width` columns; lines end in "\n".
std::string render_top(const telemetry::Snapshot& snap, const TopScreen& screen);

// One JSON document (docs/json.md, "top"), ending in "\n"; `problems`: (host, why) for hosts that
// could not be watched.
std::string snapshot_json(const telemetry::Snapshot& snap, const std::string& run_id,
                          const std::vector<std::pair<std::string, std::string>>& problems = {});

// `mltrain show`'s utilization part, from a run's telemetry.jsonl ("" when it has none).
std::string format_utilization(const telemetry::Summary& sum);
// The same as a JSON object's text.
std::string utilization_json(const telemetry::Summary& sum);

// The run's status line: "4/4 ranks alive - 3m12s - GPU 87% - straggler: rank 3" (no newline); with
// some ranks ended, the ones alive: "1/8 ranks alive (5) - ...", their list cut at 24 columns.
std::string status_line(const telemetry::Snapshot& snap, const std::vector<int>& alive, int ranks,
                        int64_t elapsed_ms);

// 1536 -> "1.5K", 3 GiB -> "3.0G": powers of 1024, one decimal under 100.
std::string human_bytes(uint64_t v);

}  // namespace mltrain::records
