// How `show` and `diff` print a run's metrics (runner/records/metrics.h).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "knobs/knobs.h"
#include "runner/common/text.h"
#include "runner/records/metrics.h"

namespace mltrain::records {

namespace {

constexpr int kChartWidth = 60, kChartHeight = 8;
constexpr const char* kColorA = "\033[36m";
constexpr const char* kColorB = "\033[35m";

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void add_chart(std::string& out, const std::vector<const MetricSeries*>& s, bool utf8,
               const std::vector<std::string>& colors) {
  for (const auto& row : line_chart(s, kChartWidth, kChartHeight, utf8, colors)) out += "  " + row + "\n";
}

const MetricSeries* find(const std::vector<MetricSeries>& all, const std::string& name) {
  for (const auto& s : all)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

bool utf8_locale() {
  for (const auto* knob : {&knobs::lc_all, &knobs::lc_ctype, &knobs::lang}) {
    std::string l = knob->get();
    if (l.empty()) continue;
    for (char& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
    return l.find("utf-8") != std::string::npos || l.find("utf8") != std::string::npos;
  }
  return true;  // nothing set: today's terminals
}

std::string format_metrics(const std::vector<MetricSeries>& series, bool utf8, bool color) {
  std::string out;
  for (const auto& s : series) {
    const MetricStats st = stats_of(s);
    out += "\n" + text::host_text(s.name) + (s.rank ? " (rank " + std::to_string(s.rank) + ")" : "") +
           ": first " + num(st.first) + ", min " + num(st.min) + " at step " + std::to_string(st.min_step) +
           ", last " + num(st.last) + " at step " + std::to_string(st.last_step) + " (" +
           std::to_string(st.count) + (st.count == 1 ? " step)\n" : " steps)\n");
    add_chart(out, {&s}, utf8, color ? std::vector<std::string>{kColorA} : std::vector<std::string>{});
  }
  return out;
}

std::string format_metrics_diff(const std::vector<MetricSeries>& a, const std::vector<MetricSeries>& b,
                                bool utf8, bool color) {
  std::vector<std::string> names;
  for (const auto* all : {&a, &b})
    for (const auto& s : *all)
      if (std::find(names.begin(), names.end(), s.name) == names.end()) names.push_back(s.name);
  if (names.empty()) return {};
  auto cell = [](const MetricSeries* s) {
    if (!s) return std::string("-");
    const MetricStats st = stats_of(*s);
    return num(st.last) + " / " + num(st.min);
  };
  std::string out = "\nmetrics    A (final / min)          B (final / min)\n";
  for (const auto& n : names) {
    const MetricSeries *x = find(a, n), *y = find(b, n);
    char line[256];
    const std::string ca = cell(x), cb = cell(y);
    std::snprintf(line, sizeof line, "%s %-9s %-24s %s\n", ca == cb ? " " : "*",
                  text::host_text(n, 9).c_str(), ca.c_str(), cb.c_str());
    out += line;
  }
  for (const auto& n : names) {
    const MetricSeries *x = find(a, n), *y = find(b, n);
    std::vector<const MetricSeries*> both;
    if (x) both.push_back(x);
    if (y) both.push_back(y);
    // Which dots are whose: colour tells them apart on a terminal; without colour, two curves are
    // drawn in glyphs ('*' A, 'o' B) even where braille could be had (two braille curves read alike).
    const bool glyphs = !color && x && y;
    const char* legend = !(x && y) ? (x ? "A only" : "B only") : color ? "A cyan, B magenta" : "A *, B o";
    out += "\n" + text::host_text(n) + ": " + legend + "\n";
    std::vector<std::string> colors;
    if (color && x) colors.push_back(kColorA);
    if (color && y) colors.push_back(kColorB);
    add_chart(out, both, utf8 && !glyphs, colors);
  }
  return out;
}

std::string metric_series_json(const std::vector<MetricSeries>& series) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  for (const auto& s : series) {
    const MetricStats st = stats_of(s);
    std::vector<size_t> keep;
    const size_t n = s.steps.size();
    if (n <= kMaxJsonPoints) {
      for (size_t i = 0; i < n; ++i) keep.push_back(i);
    } else {
      for (size_t i = 0; i < kMaxJsonPoints - 1; ++i) keep.push_back(i * (n - 1) / (kMaxJsonPoints - 2));
      keep.push_back(size_t(std::min_element(s.values.begin(), s.values.end()) - s.values.begin()));
      std::sort(keep.begin(), keep.end());
      keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
    }
    nlohmann::ordered_json steps = nlohmann::ordered_json::array(), values = nlohmann::ordered_json::array();
    for (size_t i : keep) steps.push_back(s.steps[i]), values.push_back(s.values[i]);
    doc[s.name] = {{"rank", s.rank},  {"count", st.count},         {"first", st.first},
                   {"min", st.min},   {"min_step", st.min_step},   {"max", st.max},
                   {"last", st.last}, {"last_step", st.last_step}, {"steps", steps},
                   {"values", values}};
  }
  return doc.dump(2);
}

}  // namespace mltrain::records
