// metrics.jsonl in a run's folder: the scalars its ranks report (docs/metrics.md), through
// mltrain.log (each rank's metrics pipe, stream 3 of its Output frames) or a [metrics] pattern
// matched on rank 0's output; read back for `show`, `diff` and `ls`.
//
// One JSON object per line: {"t":12.5,"rank":0,"restart":0,"step":120,"loss":0.25,"lr":0.001},
// t in seconds since the run started; a value that is not finite is null.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::records {

namespace detail {
class MetricDigest;
}

inline constexpr const char* kMetricsFile = "metrics.jsonl";
inline constexpr size_t kMaxMetricLine = 4096;            // a longer line from a rank is dropped
inline constexpr uint64_t kMaxMetricsBytes = 256u << 20;  // metrics.jsonl stops growing here
inline constexpr size_t kMaxMetricNames = 256;            // further names in a run are dropped
inline constexpr uint64_t kMaxStep = uint64_t(1) << 53;   // a larger step (or a negative one) is refused

// What run.json says of a run's metrics.
struct MetricsSummary {
  std::vector<std::string> names;  // in the order they first came
  uint64_t records = 0;            // lines in metrics.jsonl
  uint64_t dropped = 0;            // lines or values refused (not JSON, too long, over a bound)
  bool operator==(const MetricsSummary&) const = default;
};

// Appends what the ranks report to <run folder>/metrics.jsonl, opened on the first record. What a
// host sends is bounded: a line, the names, the file. A file that cannot be written is said once
// on stderr; nothing throws.
class MetricsLog {
 public:
  // `patterns`: the spec's [metrics] patterns (spec::metric_regex accepted them).
  MetricsLog(std::string run_dir, const std::vector<std::string>& patterns);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Bytes of a rank's metrics pipe: JSON lines {"step":N,"name":value,...}.
  void channel(int rank, std::string_view bytes);
  // Bytes a rank wrote to stdout or stderr (stream 1 or 2): rank 0's lines are matched against
  // the patterns.
  void output(int rank, int stream, std::string_view bytes);
  // The gang restarted: later records say so, and each rank's partial lines are dropped.
  void restarted(int restart);
  void flush();
  // flush() when what is buffered is kFlushEvery old: readers (show, a sweep) see a run's metrics
  // while it goes on. The launcher's loop calls it every turn.
  void flush_if_due();
  static constexpr std::chrono::milliseconds kFlushEvery{200};
  // How long until flush_if_due() has something to write (a large value when nothing waits).
  std::chrono::milliseconds due_in() const;
  const MetricsSummary& summary() const { return summary_; }

 private:
  struct Pattern;
  struct Partial {
    std::string line;
    bool overlong = false;  // the line passed kMaxMetricLine: dropped up to its newline
  };
  void take_channel_line(int rank, std::string_view line);
  void match(std::string_view line);
  void bad_step(int rank, std::string_view step);
  // Writes the digest of what metrics.jsonl holds beside it (detail/metric_digest.h).
  void save_digest();
  // Writes one record of `values` (name, value; NaN when not finite).
  void put(int rank, std::optional<int64_t> step, const std::vector<std::pair<std::string, double>>& values);
  bool known_name(const std::string& name);
  template <class F>
  void lines(Partial& p, std::string_view bytes, F&& take);

  std::string path_;
  std::vector<std::unique_ptr<Pattern>> patterns_;
  std::map<int, Partial> channel_;
  Partial out_[2];            // rank 0's stdout and stderr
  int64_t pattern_step_ = 0;  // a pattern's records without a step group: counted
  std::map<int, int64_t> next_step_;
  int restart_ = 0;
  std::chrono::steady_clock::time_point start_;
  std::string buf_;
  std::chrono::steady_clock::time_point buffered_since_{};
  uint64_t written_ = 0;  // bytes in metrics.jsonl
  int fd_ = -1;
  bool failed_ = false;
  bool said_full_ = false;
  std::unique_ptr<detail::MetricDigest> digest_;
  uint64_t digest_bytes_ = 0;  // of metrics.jsonl, when the digest was last saved
  std::chrono::steady_clock::time_point digest_saved_ = std::chrono::steady_clock::now();
  bool said_digest_ = false;
  static constexpr uint64_t kDigestEvery = 8u << 20;
  bool said_bad_step_ = false;
  MetricsSummary summary_;
};

// One metric over the steps, as one rank reported it.
struct MetricSeries {
  std::string name;
  int rank = 0;
  std::vector<int64_t> steps;  // ascending; a step reported again (after a restart) keeps its last value
  std::vector<double> values;  // finite ones only
  size_t count = 0;            // steps reported; more than steps.size() where a long series was thinned
};
struct MetricStats {
  double first = 0, min = 0, max = 0, last = 0;
  int64_t min_step = 0, last_step = 0;
  size_t count = 0;
};

// Each metric of the run's metrics.jsonl from the lowest rank reporting it, in the order the
// names first came, thinned to at most a few hundred points each where it is long (its first,
// min, max and last kept; `count` says how many steps it had). Read from the digest the launcher
// keeps beside metrics.jsonl and the lines written after it, so a large file is never read
// whole. Lines that do not read are counted in `skipped`. Empty when there is none.
std::vector<MetricSeries> read_metrics(const std::string& run_dir, size_t* skipped = nullptr);
MetricStats stats_of(const MetricSeries& s);

// Each metric's statistics without its points (what `ls` needs): from the run's metrics summary
// when that covers all of metrics.jsonl, else as read_metrics would give them.
struct NamedStats {
  std::string name;
  int rank = 0;
  MetricStats stats;
};
std::vector<NamedStats> read_metric_stats(const std::string& run_dir);

// A line chart of one or two series over their steps: `height` rows of plot `width` columns
// wide, a value axis on the left and the step axis below. With `utf8`, braille dots (2 by 4 a
// cell) joined into lines; else '*' (and 'o' for the second series). `colors` ("" for none): the
// escape that starts each series' dots, where they do not overlap.
std::vector<std::string> line_chart(const std::vector<const MetricSeries*>& series, int width, int height,
                                    bool utf8, const std::vector<std::string>& colors = {});

// Whether the terminal takes UTF-8 (the chart's braille): not when LC_ALL, LC_CTYPE or LANG (the
// first set) names a locale without UTF-8, such as C or POSIX.
bool utf8_locale();

// `show`'s metrics: each metric's first, min (at its step) and last, and its chart.
std::string format_metrics(const std::vector<MetricSeries>& series, bool utf8, bool color);
// `diff`'s metrics: each metric's final and min in A and B, and a chart of both curves (A's dots
// '*', B's 'o' without UTF-8; A cyan and B magenta with colour).
std::string format_metrics_diff(const std::vector<MetricSeries>& a, const std::vector<MetricSeries>& b,
                                bool utf8, bool color);
// `show --json`'s "metric_series": per metric its stats and points, at most kMaxJsonPoints of
// them (evenly thinned, the first, the min and the last kept).
inline constexpr size_t kMaxJsonPoints = 1000;
std::string metric_series_json(const std::vector<MetricSeries>& series);

}  // namespace mltrain::records
