#include "runner/records/metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "runner/common/regex.h"
#include "runner/common/text.h"
#include "runner/spec/spec.h"

namespace mltrain::records {

namespace {

using Json = nlohmann::ordered_json;  // the names in the order the rank wrote them
constexpr size_t kWriteChunk = 64 * 1024;

// Letters, digits, '_', '.', '/', '-', starting with a letter or '_', at most 64: what `ls --where
// metric.NAME` can name. The record's own fields are not names.
bool metric_name(std::string_view n) {
  if (n.empty() || n.size() > 64 || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_'))
    return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '/' && c != '-')
      return false;
  return n != "t" && n != "rank" && n != "restart" && n != "step";
}

void append_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

struct MetricsLog::Pattern {
  std::unique_ptr<text::Regex> re;
  std::vector<std::string> groups;  // of each capturing group: its name, "" unnamed
  std::string text;                 // as the spec wrote it, for the message that switches it off
  bool off = false;                 // it took longer than kMatchBudget on one line
};

namespace {
// RE2 matches in time linear in the line (4 KiB at most); a pattern that still takes this long on
// one line would slow the console of every rank: it is switched off for the run, said once.
constexpr std::chrono::milliseconds kMatchBudget{50};
}  // namespace

MetricsLog::MetricsLog(std::string run_dir, const std::vector<std::string>& patterns)
    : path_(std::move(run_dir) + "/" + kMetricsFile), start_(std::chrono::steady_clock::now()) {
  for (const auto& p : patterns) {
    auto compiled = std::make_unique<Pattern>();
    std::string error;
    const std::string re2 = spec::metric_regex(p, compiled->groups, error);
    if (re2.empty()) continue;  // the spec's loader refused it already
    compiled->re = text::Regex::compile(re2, error);
    if (!compiled->re) continue;
    compiled->text = p;
    patterns_.push_back(std::move(compiled));
  }
}

MetricsLog::~MetricsLog() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

// Splits `bytes` into lines of `p` (bounded), calling take(line, overlong) for each ended one.
template <class F>
void MetricsLog::lines(Partial& p, std::string_view bytes, F&& take) {
  while (!bytes.empty()) {
    const size_t nl = bytes.find('\n');
    const std::string_view piece = bytes.substr(0, nl);
    if (!p.overlong) {
      const size_t room = kMaxMetricLine - p.line.size();
      p.line.append(piece.substr(0, room));
      p.overlong = piece.size() > room;
    }
    if (nl == std::string_view::npos) return;
    take(std::string_view(p.line), p.overlong);
    p.line.clear();
    p.overlong = false;
    bytes.remove_prefix(nl + 1);
  }
}

void MetricsLog::channel(int rank, std::string_view bytes) {
  lines(channel_[rank], bytes, [&](std::string_view line, bool overlong) {
    if (overlong)
      ++summary_.dropped;
    else
      take_channel_line(rank, line);
  });
}

void MetricsLog::take_channel_line(int rank, std::string_view line) {
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    ++summary_.dropped;
    return;
  }
  std::optional<int64_t> step;
  std::vector<std::pair<std::string, double>> values;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const Json& v = it.value();
    if (it.key() == "step") {
      // A whole number from 0 to 2^53 (JSON's exact integers); any other step drops the line, counted
      // (-1, 1e30 and 2^63 were renumbered as the next step without a word).
      if ((v.is_number_unsigned() && v.get<uint64_t>() <= kMaxStep) ||
          (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 0 &&
           uint64_t(v.get<int64_t>()) <= kMaxStep)) {
        step = v.get<int64_t>();
        continue;
      }
      bad_step(rank, v.dump());
      return;
    }
    if (!metric_name(it.key()) || !(v.is_number() || v.is_null())) {
      ++summary_.dropped;
      continue;
    }
    values.emplace_back(it.key(), v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>());
  }
  if (!values.empty()) put(rank, step, values);
}

// Said once a run, counted always.
void MetricsLog::bad_step(int rank, std::string_view step) {
  ++summary_.dropped;
  if (said_bad_step_) return;
  said_bad_step_ = true;
  std::fprintf(
      stderr,
      "mltrain: rank %d reported a metric at step %s, not a whole number from 0 to 2^53: that record "
      "is dropped (and any later such, counted in mltrain show)\n",
      rank, text::host_text(step, 40).c_str());
}

void MetricsLog::output(int rank, int stream, std::string_view bytes) {
  if (rank != 0 || patterns_.empty() || stream < 1 || stream > 2) return;
  // An overlong line is matched on its first kMaxMetricLine bytes.
  lines(out_[stream - 1], bytes, [&](std::string_view line, bool) { match(line); });
}

void MetricsLog::match(std::string_view line) {
  // A line rewritten in place (tqdm's '\r') counts as what it ends as.
  while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (size_t cr = line.rfind('\r'); cr != std::string_view::npos) line.remove_prefix(cr + 1);
  std::optional<int64_t> step;
  std::vector<std::pair<std::string, double>> values;
  std::vector<std::string_view> found;
  for (const auto& p : patterns_) {
    if (p->off) continue;
    const auto t0 = std::chrono::steady_clock::now();
    const bool hit = p->re->search(line, found);
    if (const auto took = std::chrono::steady_clock::now() - t0; took > kMatchBudget) {
      p->off = true;
      std::fprintf(
          stderr,
          "mltrain: [metrics] pattern '%s' took %lld ms on one line; it is switched off for this run\n",
          text::host_text(p->text, 80).c_str(),
          (long long)std::chrono::duration_cast<std::chrono::milliseconds>(took).count());
    }
    if (!hit) continue;
    for (size_t g = 0; g < p->groups.size() && g < found.size(); ++g) {
      const std::string& name = p->groups[g];
      if (name.empty() || !found[g].data()) continue;
      const std::string text(found[g]);
      if (name == "step") {
        int64_t s = 0;
        auto r = std::from_chars(text.data(), text.data() + text.size(), s);
        if (r.ec != std::errc() || r.ptr != text.data() + text.size() || s < 0 || uint64_t(s) > kMaxStep)
          return bad_step(0, text);
        step = s;
        continue;
      }
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0') {
        ++summary_.dropped;  // the group matched something that is not a number
        continue;
      }
      values.emplace_back(name, v);
    }
  }
  if (values.empty()) return;
  if (!step) step = pattern_step_;
  pattern_step_ = *step + 1;
  put(0, step, values);
}

bool MetricsLog::known_name(const std::string& name) {
  if (std::find(summary_.names.begin(), summary_.names.end(), name) != summary_.names.end()) return true;
  if (summary_.names.size() >= kMaxMetricNames) return false;
  summary_.names.push_back(name);
  return true;
}

void MetricsLog::put(int rank, std::optional<int64_t> step,
                     const std::vector<std::pair<std::string, double>>& values) {
  int64_t& next = next_step_[rank];
  const int64_t s = step ? *step : next;
  next = s + 1;
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  char head[96];
  std::snprintf(head, sizeof head, "{\"t\":%.3f,\"rank\":%d,\"restart\":%d,\"step\":%lld", t, rank, restart_,
                (long long)s);
  std::string line = head;
  size_t kept = 0;
  for (const auto& [name, v] : values) {
    if (!known_name(name)) {
      ++summary_.dropped;
      continue;
    }
    line += ",\"" + name + "\":";
    append_number(line, v);
    ++kept;
  }
  if (kept == 0) return;
  line += "}\n";
  if (failed_ || written_ + buf_.size() + line.size() > kMaxMetricsBytes) {
    if (!failed_ && written_ + buf_.size() <= kMaxMetricsBytes)
      std::fprintf(stderr, "mltrain: %s reached %llu MiB; later metrics are dropped\n", path_.c_str(),
                   (unsigned long long)(kMaxMetricsBytes >> 20));
    written_ = kMaxMetricsBytes + 1;  // said once
    ++summary_.dropped;
    return;
  }
  if (buf_.empty()) buffered_since_ = std::chrono::steady_clock::now();
  buf_ += line;
  ++summary_.records;
  if (buf_.size() >= kWriteChunk) flush();
}

void MetricsLog::restarted(int restart) {
  restart_ = restart;
  channel_.clear();
  out_[0] = out_[1] = Partial{};
}

std::chrono::milliseconds MetricsLog::due_in() const {
  using std::chrono::milliseconds;
  if (buf_.empty() || failed_) return milliseconds(60000);
  const auto age =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - buffered_since_);
  return age >= kFlushEvery ? milliseconds(0) : kFlushEvery - age;
}

void MetricsLog::flush_if_due() {
  if (!buf_.empty() && std::chrono::steady_clock::now() - buffered_since_ >= kFlushEvery) flush();
}

void MetricsLog::flush() {
  if (buf_.empty() || failed_) return;
  if (fd_ < 0) fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0 || !write_all(fd_, buf_)) {
    std::fprintf(stderr, "mltrain: cannot write %s (%s); metrics are not recorded for this run\n",
                 path_.c_str(), std::strerror(errno));
    failed_ = true;
  }
  written_ += buf_.size();
  buf_.clear();
}

// ---- reading back ----

std::vector<MetricSeries> read_metrics(const std::string& run_dir, size_t* skipped) {
  struct Acc {
    int rank = std::numeric_limits<int>::max();
    std::map<int64_t, double> points;
  };
  std::vector<std::string> order;
  std::map<std::string, Acc> acc;
  std::ifstream in(run_dir + "/" + kMetricsFile);
  std::string line;
  size_t bad = 0;
  while (std::getline(in, line)) {
    Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
        !j.contains("rank") || !j["rank"].is_number_integer()) {
      ++bad;
      continue;
    }
    const int64_t step = j["step"].get<int64_t>();
    const int rank = j["rank"].get<int>();
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!metric_name(it.key())) continue;
      auto [a, fresh] = acc.try_emplace(it.key());
      if (fresh) order.push_back(it.key());
      if (rank > a->second.rank) continue;
      if (rank < a->second.rank) a->second = Acc{rank, {}};
      if (it.value().is_number()) {
        const double v = it.value().get<double>();
        if (std::isfinite(v)) a->second.points[step] = v;  // a step again (a restart): the later value
      } else {
        a->second.points.erase(step);
      }
    }
  }
  if (skipped) *skipped = bad;
  std::vector<MetricSeries> out;
  for (const auto& name : order) {
    const Acc& a = acc[name];
    if (a.points.empty()) continue;
    MetricSeries s;
    s.name = name;
    s.rank = a.rank;
    for (const auto& [step, v] : a.points) s.steps.push_back(step), s.values.push_back(v);
    out.push_back(std::move(s));
  }
  return out;
}

MetricStats stats_of(const MetricSeries& s) {
  MetricStats st;
  st.count = s.values.size();
  if (s.values.empty()) return st;
  st.first = s.values.front();
  st.last = s.values.back();
  st.last_step = s.steps.back();
  const auto lo = std::min_element(s.values.begin(), s.values.end());
  st.min = *lo;
  st.min_step = s.steps[size_t(lo - s.values.begin())];
  st.max = *std::max_element(s.values.begin(), s.values.end());
  return st;
}

// ---- the chart ----

namespace {

std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Dots on a grid of w by h, (0, 0) bottom left, one layer per series.
struct Canvas {
  int w, h;
  std::vector<std::vector<uint8_t>> layers;
  Canvas(int w_, int h_, size_t n) : w(w_), h(h_), layers(n, std::vector<uint8_t>(size_t(w_ * h_), 0)) {}
  void dot(size_t layer, int x, int y) {
    if (x >= 0 && x < w && y >= 0 && y < h) layers[layer][size_t(y * w + x)] = 1;
  }
  // The dots between two points, so the curve stays one line however steep.
  void line(size_t layer, int x0, int y0, int x1, int y1) {
    const int n = std::max(std::abs(x1 - x0), std::abs(y1 - y0));
    for (int i = 0; i <= n; ++i) {
      const double f = n == 0 ? 0 : double(i) / n;
      dot(layer, int(std::lround(x0 + (x1 - x0) * f)), int(std::lround(y0 + (y1 - y0) * f)));
    }
  }
  bool at(size_t layer, int x, int y) const { return layers[layer][size_t(y * w + x)] != 0; }
};

}  // namespace

std::vector<std::string> line_chart(const std::vector<const MetricSeries*>& series, int width, int height,
                                    bool utf8, const std::vector<std::string>& colors) {
  std::vector<std::string> rows;
  int64_t s0 = std::numeric_limits<int64_t>::max(), s1 = std::numeric_limits<int64_t>::min();
  double v0 = std::numeric_limits<double>::infinity(), v1 = -v0;
  for (const auto* s : series) {
    if (s->steps.empty()) continue;
    s0 = std::min(s0, s->steps.front());
    s1 = std::max(s1, s->steps.back());
    for (double v : s->values) v0 = std::min(v0, v), v1 = std::max(v1, v);
  }
  if (s0 > s1 || width < 2 || height < 2) return rows;
  if (v0 == v1) {  // a flat line sits in the middle
    const double pad = v0 == 0 ? 1 : std::abs(v0) * 0.01;
    v0 -= pad, v1 += pad;
  }
  const int sx = utf8 ? 2 : 1, sy = utf8 ? 4 : 1;  // dots per cell
  Canvas c(width * sx, height * sy, series.size());
  for (size_t k = 0; k < series.size(); ++k) {
    const auto& s = *series[k];
    int px = -1, py = -1;
    for (size_t i = 0; i < s.steps.size(); ++i) {
      const int x = s1 == s0 ? 0 : int(std::lround(double(s.steps[i] - s0) / double(s1 - s0) * (c.w - 1)));
      const int y = int(std::lround((s.values[i] - v0) / (v1 - v0) * (c.h - 1)));
      if (px < 0)
        c.dot(k, x, y);
      else
        c.line(k, px, py, x, y);
      px = x, py = y;
    }
  }
  const std::string top = short_number(v1), bottom = short_number(v0), mid = short_number((v0 + v1) / 2);
  const size_t label = std::max({top.size(), bottom.size(), mid.size()});
  const std::string reset = "\033[0m";
  for (int row = 0; row < height; ++row) {
    std::string text = row == 0 ? top : row == height - 1 ? bottom : row == (height - 1) / 2 ? mid : "";
    std::string line = std::string(label - text.size(), ' ') + text + (utf8 ? " ┤" : " |");
    for (int col = 0; col < width; ++col) {
      unsigned bits[2] = {0, 0};
      bool any[2] = {false, false};
      for (size_t k = 0; k < series.size() && k < 2; ++k)
        for (int dx = 0; dx < sx; ++dx)
          for (int dy = 0; dy < sy; ++dy) {
            const int x = col * sx + dx, y = (height - 1 - row) * sy + (sy - 1 - dy);  // dy 0: the cell's top
            if (!c.at(k, x, y)) continue;
            any[k] = true;
            // Braille: dots 1-3 and 7 down the left column, 4-6 and 8 down the right.
            static const unsigned kBit[2][4] = {{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}};
            bits[k] |= kBit[dx][dy];
          }
      if (!any[0] && !any[1]) {
        line += ' ';
        continue;
      }
      const int only = any[0] && any[1] ? -1 : any[0] ? 0 : 1;
      const std::string color = only >= 0 && size_t(only) < colors.size() ? colors[size_t(only)] : "";
      std::string glyph;
      if (utf8) {
        const unsigned cp = 0x2800 + (bits[0] | bits[1]);
        glyph = {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
      } else {
        glyph = only == 0 ? "*" : only == 1 ? "o" : "#";
      }
      line += color.empty() ? glyph : color + glyph + reset;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    rows.push_back(std::move(line));
  }
  std::string axis = std::string(label + 1, ' ') + (utf8 ? "└" : "+");
  for (int col = 0; col < width; ++col) axis += utf8 ? "─" : "-";
  rows.push_back(axis);
  const std::string first = "step " + std::to_string(s0), last = std::to_string(s1);
  std::string steps = std::string(label + 2, ' ') + first;
  if (s1 != s0 && int(first.size() + last.size()) < width)
    steps += std::string(size_t(width) - first.size() - last.size(), ' ') + last;
  rows.push_back(steps);
  return rows;
}

}  // namespace mltrain::records
