// A run's metrics kept small as they come, so that `show`, `ls` and `diff` never read a whole
// metrics.jsonl (it may reach kMaxMetricsBytes). Per metric, from the lowest rank reporting it, the
// steps are thinned into at most kMaxBuckets buckets of consecutive steps, each holding its first,
// min, max and last point and how many steps it covers: the first, min (at its step), max, last
// and count of a series stay exact, and its chart keeps every peak and trough. A series of up to
// kMaxBuckets steps is kept whole.
//
// A step that is not after the series' last one (a restarted gang resuming from its checkpoint, or
// a rank that reports a step again) replaces that step and the ones after it. Where that cuts into
// a thinned bucket, the bucket keeps the points it knows from before the cut and an estimate of
// its count (in proportion to the steps it kept).
//
// The launcher's MetricsLog feeds it every record it writes and saves it beside metrics.jsonl
// (kSummaryFile: the statistics; kSeriesFile: the buckets), each saying how many bytes of
// metrics.jsonl it covers; a reader loads it and reads only the lines after those bytes.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runner/records/metrics.h"

namespace mltrain::records::detail {

inline constexpr const char* kSummaryFile = "metrics-summary.json";
inline constexpr const char* kSeriesFile = "metrics-series.json";

class MetricDigest {
 public:
  static constexpr size_t kMaxBuckets = 256;

  // One value of metric `name` at `step` from `rank`; a value that is not finite (null in the
  // file) removes the step rather than adding one.
  void add(const std::string& name, int rank, int64_t step, double value);
  // One line of metrics.jsonl; false (nothing added) when it does not read as a record.
  bool add_line(std::string_view line);
  bool empty() const { return series_.empty(); }

  // Each metric with a point, in the order the names first came (from any rank).
  std::vector<MetricSeries> series() const;
  // The files' text; `bytes`: how much of metrics.jsonl this digest holds.
  std::string summary_json(uint64_t bytes) const;
  std::string series_json(uint64_t bytes) const;
  // Loads a series file's text; false (and empty) when it does not read.
  bool load_series(std::string_view text, uint64_t& bytes);

 private:
  struct Point {
    int64_t step = 0;
    double value = 0;
  };
  struct Bucket {
    Point first, min, max, last;
    uint64_t count = 0;
  };
  struct Series {
    std::string name;
    int rank = std::numeric_limits<int>::max();
    uint64_t width = 1;  // steps a full bucket covers; doubles when the buckets are merged pairwise
    std::vector<Bucket> buckets;
  };
  static void cut(Series& s, int64_t step);
  std::vector<Series> series_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace mltrain::records::detail
