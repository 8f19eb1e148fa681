// Metrics: [metrics] patterns, metrics.jsonl as the launcher writes it from what ranks send (any
// of which may be hostile), read back, and the chart (runner/records/metrics.h).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runner/records/metrics.h"
#include "runner/spec/spec.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;

namespace {

using testing::lines_of;

// The line without its "t" field, which is a time.
std::string untimed(const std::string& line) {
  const size_t comma = line.find(',');
  return comma == std::string::npos ? line : "{" + line.substr(comma + 1);
}

}  // namespace

TEST_CASE("metrics: a pattern's Python named groups are its metrics, and bad ones are refused") {
  std::vector<std::string> groups;
  std::string error;
  CHECK(spec::metric_regex(R"(step (?P<step>\d+) loss=(?P<loss>[-0-9.e+]+) \((x)\))", groups, error) ==
        R"(step (?P<step>\d+) loss=(?P<loss>[-0-9.e+]+) \((x)\))");
  CHECK(groups == std::vector<std::string>{"step", "loss", ""});
  CHECK(spec::metric_regex(R"((?:acc|accuracy)=(?<acc>[0-9.]+)[(?<x>])", groups, error) ==
        R"((?:acc|accuracy)=(?P<acc>[0-9.]+)[(?<x>])");  // inside a class, nothing is a group
  CHECK(groups == std::vector<std::string>{"acc"});
  // Over the bounds: a pattern of 100,000 characters (std::regex overflowed its stack on it), and
  // groups nested past 64; what RE2 lacks (back-references, look-around).
  const std::string huge = "(?P<loss>" + std::string(100000, 'a') + ")";
  const std::string deep = std::string(70, '(') + "(?P<loss>.)" + std::string(70, ')');
  for (const std::string& bad :
       {std::string("loss=([0-9.]+)"), std::string("(?P<step>\\d+)"), std::string("(?P<1x>.)"),
        std::string("(?P<a>.)(?P<a>.)"), std::string("(?P<a>[)"), std::string("(?P<a>.)(?P=a)"),
        std::string("(?P<a>.)\\1"), std::string("(?=x)(?P<a>.)"), huge, deep}) {
    CAPTURE(bad.substr(0, 40));
    error.clear();
    CHECK(spec::metric_regex(bad, groups, error).empty());
    CHECK_FALSE(error.empty());
  }
  error.clear();
  spec::metric_regex(huge, groups, error);
  CHECK(error ==
        "not a regular expression (RE2's syntax): the pattern is 100010 characters long; at most 4096 "
        "are taken");
}

TEST_CASE("metrics: a step that is no whole number from 0 to 2^53 drops its record, counted") {
  testing::TempDir dir("metrics-steps");
  records::MetricsLog log(dir.path.string(), {R"(it (?P<step>-?\d+) loss=(?P<loss>[0-9.]+))"});
  // They were renumbered as the next step, without a word.
  log.channel(
      0, "{\"step\":-1,\"loss\":1}\n{\"step\":1e30,\"loss\":1}\n{\"step\":9223372036854775808,\"loss\":1}\n");
  log.channel(0, "{\"step\":9007199254740993,\"loss\":1}\n{\"step\":7,\"loss\":0.5}\n");
  log.output(0, 1, "it -3 loss=0.25\nit 8 loss=0.25\n");
  log.flush();
  CHECK(log.summary().records == 2);
  CHECK(log.summary().dropped == 5);
}

// `diff` without colour (a pipe, NO_COLOR) on a UTF-8 terminal: two braille curves read alike.
TEST_CASE("metrics: diff's chart without colour draws A as '*' and B as 'o' and says so") {
  records::MetricSeries a{"loss", 0, {0, 1, 2, 3}, {4, 3, 2, 1}}, b{"loss", 0, {0, 1, 2, 3}, {1, 2, 3, 4}};
  const std::string plain = records::format_metrics_diff({a}, {b}, /*utf8=*/true, /*color=*/false);
  CHECK(plain.find("loss: A *, B o\n") != std::string::npos);
  CHECK(plain.find('*', plain.find("A *, B o") + 8) != std::string::npos);
  CHECK(plain.find('o', plain.find("A *, B o") + 8) != std::string::npos);
  CHECK(plain.find("\xe2\xa0") == std::string::npos);  // no braille (U+28xx)
  const std::string colored = records::format_metrics_diff({a}, {b}, true, true);
  CHECK(colored.find("loss: A cyan, B magenta\n") != std::string::npos);
}

// A line built to make a backtracking engine take exponential time (std::regex took 76 s on long
// lines): RE2 matches it in time linear in the line.
TEST_CASE("metrics: a pattern that backtracks catastrophically elsewhere matches a long line at once") {
  testing::TempDir dir("metrics-slow");
  records::MetricsLog log(dir.path.string(), {R"((a+)+b loss=(?P<loss>[0-9.]+))"});
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) log.output(0, 1, std::string(4000, 'a') + "c\n");
  log.output(0, 1, "aaab loss=0.5\n");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  log.flush();
  CHECK(log.summary().records == 1);
}

TEST_CASE(
    "metrics: mltrain.log lines and pattern matches land in metrics.jsonl; what is not a metric does not") {
  testing::TempDir dir("metrics-log");
  records::MetricsSummary summary;
  {
    records::MetricsLog log(dir.path.string(), {R"(it (?P<step>\d+) .*loss=(?P<ploss>[-0-9.e+]+))"});
    // A rank's pipe, in pieces that split lines anywhere.
    log.channel(1, R"({"step":3,"loss":0.5,"lr":1e-3}
{"step":4,"lo)");
    log.channel(1, R"(ss":null,"acc":1})"
                   "\n");
    log.channel(1, "not json\n[1,2]\n{\"step\":5,\"t\":9,\"bad name\":1,\"ok\":\"text\"}\n");
    log.channel(1, "{\"x\":\"" + std::string(5000, 'a') + "\"}\n{\"step\":6,\"loss\":0.25}\n");
    // Rank 0's output: a progress line counts as what it ends as; other ranks are not matched.
    log.output(0, 1, "it 7 loss=9\rit 7 ... loss=0.75\n");
    log.output(1, 1, "it 8 loss=0.1\n");
    log.output(0, 2, "nothing here\n");
    log.restarted(1);
    log.channel(1, R"({"loss":0.125})"
                   "\n");  // no step: the one after this rank's last
    log.flush();
    summary = log.summary();
  }
  std::vector<std::string> got;
  for (const auto& l : lines_of(dir.path / records::kMetricsFile)) got.push_back(untimed(l));
  CHECK(got == std::vector<std::string>{
                   R"({"rank":1,"restart":0,"step":3,"loss":0.5,"lr":0.001})",
                   R"({"rank":1,"restart":0,"step":4,"loss":null,"acc":1})",
                   R"({"rank":1,"restart":0,"step":6,"loss":0.25})",
                   R"({"rank":0,"restart":0,"step":7,"ploss":0.75})",
                   R"({"rank":1,"restart":1,"step":7,"loss":0.125})",
               });
  CHECK(summary.names == std::vector<std::string>{"loss", "lr", "acc", "ploss"});
  CHECK(summary.records == 5);
  // not json, [1,2], the step-5 line's "t", "bad name" and "ok", the overlong line
  CHECK(summary.dropped == 6);
  CHECK((fs::status(dir.path / records::kMetricsFile).permissions() & fs::perms::all) == fs::perms(0600));
}

TEST_CASE("metrics: a host that floods names or bytes is bounded") {
  testing::TempDir dir("metrics-bounds");
  records::MetricsLog log(dir.path.string(), {});
  std::string many;
  for (size_t i = 0; i < records::kMaxMetricNames + 10; ++i)
    many += "{\"step\":" + std::to_string(i) + ",\"m" + std::to_string(i) + "\":1}\n";
  log.channel(0, many);
  log.flush();
  CHECK(log.summary().names.size() == records::kMaxMetricNames);
  CHECK(log.summary().dropped == 10);
}

TEST_CASE("metrics: read back per metric from the lowest rank, a repeated step keeping its last value") {
  testing::TempDir dir("metrics-read");
  std::ofstream(dir.path / records::kMetricsFile)
      << R"({"t":0,"rank":1,"restart":0,"step":0,"loss":9})"
         "\n"
      << R"({"t":0,"rank":0,"restart":0,"step":0,"loss":4,"acc":0.1})"
         "\n"
      << R"({"t":0,"rank":0,"restart":0,"step":1,"loss":3})"
         "\n"
      << "garbage\n"
      << R"({"t":0,"rank":1,"restart":0,"step":1,"loss":8})"
         "\n"
      << R"({"t":0,"rank":0,"restart":1,"step":1,"loss":2,"acc":null})"
         "\n"
      << R"({"t":0,"rank":0,"restart":1,"step":2,"loss":1})"
         "\n";
  size_t skipped = 0;
  const auto series = records::read_metrics(dir.path.string(), &skipped);
  CHECK(skipped == 1);
  REQUIRE(series.size() == 2);
  CHECK(series[0].name == "loss");
  CHECK(series[0].rank == 0);
  CHECK(series[0].steps == std::vector<int64_t>{0, 1, 2});
  CHECK(series[0].values == std::vector<double>{4, 2, 1});
  CHECK(series[1].name == "acc");
  CHECK(series[1].steps == std::vector<int64_t>{0});
  const records::MetricStats st = records::stats_of(series[0]);
  CHECK(st.first == 4);
  CHECK(st.min == 1);
  CHECK(st.min_step == 2);
  CHECK(st.last == 1);
  CHECK(st.count == 3);
  CHECK(records::read_metrics((dir.path / "none").string()).empty());
}

TEST_CASE("metrics: the chart puts the first step bottom-left or top-left by value, with both axes") {
  records::MetricSeries down{"loss", 0, {0, 10, 20}, {2, 1, 0}};
  const auto rows = records::line_chart({&down}, 20, 4, false);
  REQUIRE(rows.size() == 6);             // 4 plot rows, the axis, the steps
  CHECK(rows[0].rfind("2 |*", 0) == 0);  // the first (highest) value at the left end of the top row
  CHECK(rows[0].size() < 3 + 12);
  CHECK(rows[3].rfind("0 |", 0) == 0);
  CHECK(rows[3].back() == '*');  // the last (lowest) value at the right end of the bottom row
  CHECK(rows[4] == "  +--------------------");
  CHECK(rows[5] == "   step 0" + std::string(20 - 6 - 2, ' ') + "20");
  // Two series: where they overlap '#', else each its own glyph.
  records::MetricSeries up{"loss", 0, {0, 20}, {0, 2}};
  const auto both = records::line_chart({&down, &up}, 3, 3, false);
  CHECK(both[0] == "2 |* o");
  CHECK(both[1] == "1 | #");
  CHECK(both[2] == "0 |o *");
  // Braille: one cell holds 2 by 4 dots; a single point is one dot.
  records::MetricSeries one{"x", 0, {5}, {1}};
  const auto dot = records::line_chart({&one}, 2, 2, true);
  REQUIRE(dot.size() == 4);
  CHECK(dot[2].find("└──") != std::string::npos);
}

namespace {

// A run whose rank 0 reports `loss` at steps 0..n-1 through the launcher's MetricsLog: a V with its
// trough at `low` and one spike at `high`.
double vee(int64_t step, int64_t low, int64_t high) {
  return step == high ? 1e6 : 1.0 + double(step > low ? step - low : low - step) / 100.0;
}

void write_run(const fs::path& dir, int64_t n, int64_t low, int64_t high) {
  records::MetricsLog log(dir.string(), {});
  std::string lines;
  for (int64_t s = 0; s < n; ++s) {
    char line[96];
    std::snprintf(line, sizeof line, "{\"step\":%lld,\"loss\":%.6f}\n", (long long)s, vee(s, low, high));
    lines += line;
    if (lines.size() > 60000) log.channel(0, lines), lines.clear();
  }
  log.channel(0, lines);
}

}  // namespace

TEST_CASE("metrics: a long series is read back thinned, its first, min, max, last and count exact") {
  testing::TempDir dir("metrics-long");
  write_run(dir.path, 200000, 123457, 77777);
  const auto series = records::read_metrics(dir.path.string());
  REQUIRE(series.size() == 1);
  const auto& s = series[0];
  CHECK(s.steps.size() <= 4 * 256);
  CHECK(s.steps.size() >= 256);
  CHECK(std::is_sorted(s.steps.begin(), s.steps.end()));
  const records::MetricStats st = records::stats_of(s);
  CHECK(st.count == 200000);
  CHECK(st.first == doctest::Approx(vee(0, 123457, 77777)));
  CHECK(st.min == doctest::Approx(1.0));
  CHECK(st.min_step == 123457);
  CHECK(st.max == 1e6);
  CHECK(st.last_step == 199999);
  CHECK(st.last == doctest::Approx(vee(199999, 123457, 77777)));
  // `ls` reads the same statistics from the summary alone.
  const auto stats = records::read_metric_stats(dir.path.string());
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].name == "loss");
  CHECK(stats[0].stats.count == 200000);
  CHECK(stats[0].stats.min_step == 123457);
  CHECK(stats[0].stats.max == 1e6);
}

TEST_CASE("metrics: readers read the digest and only the lines written after it, never the whole file") {
  testing::TempDir dir("metrics-digest");
  write_run(dir.path, 50000, 40000, 10);
  const fs::path file = dir.path / records::kMetricsFile;
  const auto size = fs::file_size(file);
  // Garble what the digest covers (same length): a reader that parsed the file would see no metric.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f << std::string(size_t(size) - 1, 'x') << "\n";
  }
  size_t skipped = 0;
  auto series = records::read_metrics(dir.path.string(), &skipped);
  REQUIRE(series.size() == 1);
  CHECK(skipped == 0);
  CHECK(records::stats_of(series[0]).count == 50000);
  CHECK(records::stats_of(series[0]).min_step == 40000);
  // Lines after the digest (a live run; a launcher killed before it saved again) are read.
  std::ofstream(file, std::ios::app) << R"({"t":0,"rank":0,"restart":0,"step":50000,"loss":0.5})"
                                        "\n"
                                     << "not json\n";
  series = records::read_metrics(dir.path.string(), &skipped);
  CHECK(skipped == 1);
  const records::MetricStats st = records::stats_of(series[0]);
  CHECK(st.count == 50001);
  CHECK(st.min == 0.5);
  CHECK(st.last_step == 50000);
  // The summary no longer covers the file: `ls` reads as `show` does.
  const auto stats = records::read_metric_stats(dir.path.string());
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].stats.last == 0.5);
  // A digest that does not read is not trusted: the file is read whole.
  std::ofstream(dir.path / "metrics-series.json") << "{\"version\":1,\"bytes\":3,\"metrics\":[{\"name\":1}]}";
  series = records::read_metrics(dir.path.string(), &skipped);
  REQUIRE(series.size() == 1);  // the garbled line is not read; the one record after it is
  CHECK(records::stats_of(series[0]).count == 1);
  CHECK(skipped == 2);
}

TEST_CASE("metrics: after a restart the resumed steps replace the lost ones, in a thinned series too") {
  testing::TempDir dir("metrics-restart");
  {
    records::MetricsLog log(dir.path.string(), {});
    std::string lines;
    for (int s = 0; s < 10000; ++s)
      lines += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(10000 - s) + "}\n";
    log.channel(0, lines);
    log.restarted(1);  // resumed from the checkpoint of step 6000; the new attempt ends higher
    lines.clear();
    for (int s = 6000; s < 7000; ++s)
      lines += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(50000 + s) + "}\n";
    log.channel(0, lines);
  }
  const auto series = records::read_metrics(dir.path.string());
  REQUIRE(series.size() == 1);
  const records::MetricStats st = records::stats_of(series[0]);
  CHECK(st.last_step == 6999);
  CHECK(st.last == 56999);
  CHECK(st.max == 56999);
  // Steps 7000..9999 of the lost attempt are gone: the lowest value left is from before step 6000.
  CHECK(st.min > 4000);
  CHECK(st.min <= 4001 + 64);
  CHECK(st.count >= 7000 - 64);
  CHECK(st.count <= 7000);
}
