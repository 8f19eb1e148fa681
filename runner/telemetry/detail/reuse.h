// Resetting sample rows in place, so strings and process lists keep their capacity between samples.
#pragma once

#include <vector>

#include "runner/telemetry/sample.h"

namespace mltrain::telemetry::detail {

inline void reset(GpuSample& g) {
  g.index = -1;
  g.uuid.clear();
  g.util_percent.reset();
  g.mem_used_mib.reset();
  g.mem_total_mib.reset();
  g.power_mw.reset();
  g.power_limit_mw.reset();
  g.temperature_c.reset();
  g.sm_clock_mhz.reset();
  g.throttle_reasons.reset();
  g.processes.clear();
}

// The next row of `rows` at position `n` (appended when the vector is that short), reset.
inline GpuSample& row_at(std::vector<GpuSample>& rows, size_t n) {
  if (n == rows.size()) rows.emplace_back();
  reset(rows[n]);
  return rows[n];
}

}  // namespace mltrain::telemetry::detail
