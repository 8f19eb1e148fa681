// The JSON of telemetry values, one encoding for telemetry.jsonl (telemetry_log.cpp) and top's
// snapshot (telemetry_view.cpp): a missing value is null, hundredths are plain numbers.
// Internal to runner/records.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "runner/telemetry/sample.h"

namespace mltrain::records::detail {

using Json = nlohmann::ordered_json;

template <class T>
Json value(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

// A value kept in hundredths (percent x100, load x100) as a plain number.
inline Json hundredths(const std::optional<uint32_t>& v) {
  return v ? Json(double(*v) / 100.0) : Json(nullptr);
}

// The host's fields, cpus to net_tx_bytes_per_s, added to `j` in docs/json.md's order.
void put_host_fields(Json& j, const telemetry::HostSample& h);

// One GPU's fields, index to processes (each process's rank when `rank_of_pid` has its pid).
Json gpu_json(const telemetry::GpuSample& g, const std::unordered_map<int32_t, int32_t>& rank_of_pid);

}  // namespace mltrain::records::detail
