#include "runner/records/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
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
#include "runner/records/detail/metric_digest.h"
#include "runner/spec/spec.h"
#include "runner/tree/atomic_file.h"

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
    : path_(std::move(run_dir) + "/" + kMetricsFile),
      start_(std::chrono::steady_clock::now()),
      digest_(std::make_unique<detail::MetricDigest>()) {
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
  save_digest();
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
  std::vector<size_t> kept;
  for (size_t i = 0; i < values.size(); ++i) {
    const auto& [name, v] = values[i];
    if (!known_name(name)) {
      ++summary_.dropped;
      continue;
    }
    line += ",\"" + name + "\":";
    append_number(line, v);
    kept.push_back(i);
  }
  if (kept.empty()) return;
  line += "}\n";
  if (failed_ || written_ + buf_.size() + line.size() > kMaxMetricsBytes) {
    if (!failed_ && !said_full_)
      std::fprintf(stderr, "mltrain: %s reached %llu MiB; later metrics are dropped\n", path_.c_str(),
                   (unsigned long long)(kMaxMetricsBytes >> 20));
    said_full_ = true;
    ++summary_.dropped;
    return;
  }
  if (buf_.empty()) buffered_since_ = std::chrono::steady_clock::now();
  buf_ += line;
  ++summary_.records;
  for (size_t i : kept) digest_->add(values[i].first, rank, s, values[i].second);
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
    return;
  }
  written_ += buf_.size();
  buf_.clear();
  // The digest follows the file: often enough that a reader has few lines to read after it (a
  // live run, a launcher killed), rarely enough that a large one costs the loop little.
  const auto now = std::chrono::steady_clock::now();
  const uint64_t fresh = written_ - digest_bytes_;
  if (now - digest_saved_ >= std::chrono::seconds(5) ||
      (fresh >= kDigestEvery && now - digest_saved_ >= std::chrono::seconds(1)))
    save_digest();
}

void MetricsLog::save_digest() {
  if (failed_ || written_ == digest_bytes_ || digest_->empty()) return;
  digest_saved_ = std::chrono::steady_clock::now();
  digest_bytes_ = written_;
  const std::string dir = path_.substr(0, path_.rfind('/') + 1);
  std::string error;
  // The series first: a reader of the summary that finds it current finds the series current too.
  if (!sync::write_atomically(AT_FDCWD, dir + detail::kSeriesFile, digest_->series_json(written_), 0600,
                              false, error) ||
      !sync::write_atomically(AT_FDCWD, dir + detail::kSummaryFile, digest_->summary_json(written_), 0600,
                              false, error)) {
    if (!said_digest_)
      std::fprintf(stderr, "mltrain: %s; show, ls and diff read all of %s instead\n", error.c_str(),
                   path_.c_str());
    said_digest_ = true;
  }
}

// ---- reading back ----

namespace detail {

void MetricDigest::cut(Series& s, int64_t step) {
  while (!s.buckets.empty() && s.buckets.back().first.step >= step) s.buckets.pop_back();
  if (s.buckets.empty() || s.buckets.back().last.step < step) return;
  // The cut falls inside a thinned bucket: keep the points it knows from before the cut.
  Bucket& b = s.buckets.back();
  std::vector<Point> known;
  for (const Point& p : {b.first, b.min, b.max, b.last})
    if (p.step < step &&
        std::none_of(known.begin(), known.end(), [&](const Point& k) { return k.step == p.step; }))
      known.push_back(p);
  std::sort(known.begin(), known.end(), [](const Point& x, const Point& y) { return x.step < y.step; });
  Bucket n{known.front(), known.front(), known.front(), known.back(), 0};
  for (const Point& p : known) {
    if (p.value < n.min.value) n.min = p;
    if (p.value > n.max.value) n.max = p;
  }
  const double kept_share = double(step - b.first.step) / double(b.last.step - b.first.step + 1);
  n.count = std::clamp<uint64_t>(uint64_t(std::llround(double(b.count) * kept_share)), known.size(),
                                 std::max<uint64_t>(known.size(), b.count - 1));
  b = n;
}

void MetricDigest::add(const std::string& name, int rank, int64_t step, double value) {
  auto [it, fresh] = index_.try_emplace(name, series_.size());
  if (fresh) series_.push_back(Series{name, std::numeric_limits<int>::max(), 1, {}});
  Series& s = series_[it->second];
  if (rank > s.rank) return;
  if (rank < s.rank) s = Series{name, rank, 1, {}};
  if (!s.buckets.empty() && step <= s.buckets.back().last.step) cut(s, step);
  if (!std::isfinite(value)) return;
  const Point p{step, value};
  if (s.buckets.empty() || s.buckets.back().count >= s.width) {
    s.buckets.push_back(Bucket{p, p, p, p, 1});
  } else {
    Bucket& b = s.buckets.back();
    if (value < b.min.value) b.min = p;  // ties keep the earliest, as min_element does
    if (value > b.max.value) b.max = p;
    b.last = p;
    ++b.count;
  }
  if (s.buckets.size() <= kMaxBuckets) return;
  std::vector<Bucket> merged;
  merged.reserve(s.buckets.size() / 2 + 1);
  for (size_t i = 0; i < s.buckets.size(); i += 2) {
    if (i + 1 == s.buckets.size()) {
      merged.push_back(s.buckets[i]);
      break;
    }
    const Bucket &a = s.buckets[i], &b = s.buckets[i + 1];
    merged.push_back(Bucket{a.first, b.min.value < a.min.value ? b.min : a.min,
                            b.max.value > a.max.value ? b.max : a.max, b.last, a.count + b.count});
  }
  s.buckets = std::move(merged);
  s.width *= 2;
}

bool MetricDigest::add_line(std::string_view line) {
  Json j = Json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      !j.contains("rank") || !j["rank"].is_number_integer())
    return false;
  const int64_t step = j["step"].get<int64_t>();
  const int rank = j["rank"].get<int>();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!metric_name(it.key())) continue;
    add(it.key(), rank, step,
        it.value().is_number() ? it.value().get<double>() : std::numeric_limits<double>::quiet_NaN());
  }
  return true;
}

std::vector<MetricSeries> MetricDigest::series() const {
  std::vector<MetricSeries> out;
  for (const Series& s : series_) {
    if (s.buckets.empty()) continue;
    MetricSeries m;
    m.name = s.name;
    m.rank = s.rank;
    for (const Bucket& b : s.buckets) {
      Point pts[4] = {b.first, b.min, b.max, b.last};
      std::sort(std::begin(pts), std::end(pts),
                [](const Point& x, const Point& y) { return x.step < y.step; });
      for (const Point& p : pts)
        if (m.steps.empty() || m.steps.back() != p.step)
          m.steps.push_back(p.step), m.values.push_back(p.value);
      m.count += b.count;
    }
    out.push_back(std::move(m));
  }
  return out;
}

namespace {

void put_number(std::string& out, double v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}
void put_number(std::string& out, int64_t v) { out += std::to_string(v); }
void put_number(std::string& out, uint64_t v) { out += std::to_string(v); }

}  // namespace

// Names are metric_name()s (letters, digits, "_./-"): written as they are, no escaping needed.
std::string MetricDigest::summary_json(uint64_t bytes) const {
  std::string out = "{\"version\":1,\"bytes\":" + std::to_string(bytes) + ",\"metrics\":[";
  bool first = true;
  for (const MetricSeries& m : series()) {
    const MetricStats st = stats_of(m);
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"name\":\"" + m.name + "\",\"rank\":" + std::to_string(m.rank) + ",\"count\":";
    put_number(out, uint64_t(st.count));
    for (auto [key, v] : {std::pair{",\"first\":", st.first},
                          {",\"min\":", st.min},
                          {",\"max\":", st.max},
                          {",\"last\":", st.last}})
      out += key, put_number(out, v);
    out += ",\"min_step\":", put_number(out, st.min_step);
    out += ",\"last_step\":", put_number(out, st.last_step);
    out += "}";
  }
  return out + "]}\n";
}

std::string MetricDigest::series_json(uint64_t bytes) const {
  std::string out = "{\"version\":1,\"bytes\":" + std::to_string(bytes) + ",\"metrics\":[";
  bool first = true;
  for (const Series& s : series_) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "{\"name\":\"" + s.name + "\",\"rank\":" + std::to_string(s.rank) +
           ",\"width\":" + std::to_string(s.width) + ",\"buckets\":[";
    for (size_t i = 0; i < s.buckets.size(); ++i) {
      const Bucket& b = s.buckets[i];
      out += i ? ",[" : "[";
      put_number(out, b.count);
      for (const Point& p : {b.first, b.min, b.max, b.last}) {
        out += ',', put_number(out, p.step);
        out += ',', put_number(out, p.value);
      }
      out += ']';
    }
    out += "]}";
  }
  return out + "]}\n";
}

bool MetricDigest::load_series(std::string_view text, uint64_t& bytes) {
  *this = MetricDigest{};
  const Json doc = Json::parse(text, nullptr, false);
  auto fail = [&] {
    *this = MetricDigest{};
    return false;
  };
  if (!doc.is_object() || doc.value("version", 0) != 1 || !doc.contains("bytes") ||
      !doc["bytes"].is_number_unsigned() || !doc.contains("metrics") || !doc["metrics"].is_array())
    return fail();
  bytes = doc["bytes"].get<uint64_t>();
  for (const auto& m : doc["metrics"]) {
    if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || !m.contains("buckets") ||
        !m["buckets"].is_array() || !m.contains("rank") || !m["rank"].is_number_integer() ||
        !m.contains("width") || !m["width"].is_number_unsigned())
      return fail();
    Series s{m["name"].get<std::string>(),
             m["rank"].get<int>(),
             std::max<uint64_t>(1, m["width"].get<uint64_t>()),
             {}};
    if (!metric_name(s.name) || index_.count(s.name) || m["buckets"].size() > kMaxBuckets) return fail();
    for (const auto& b : m["buckets"]) {
      if (!b.is_array() || b.size() != 9 || !b[0].is_number_unsigned()) return fail();
      for (size_t i = 1; i < 9; i += 2)
        if (!b[i].is_number_integer() || !b[i + 1].is_number()) return fail();
      auto pt = [&](size_t i) { return Point{b[i].get<int64_t>(), b[i + 1].get<double>()}; };
      s.buckets.push_back(Bucket{pt(1), pt(3), pt(5), pt(7), b[0].get<uint64_t>()});
    }
    index_.emplace(s.name, series_.size());
    series_.push_back(std::move(s));
  }
  return true;
}

}  // namespace detail

namespace {

// What `name` in the run folder holds (bounded: a summary is small), "" when there is none.
std::string small_file(const std::string& path) {
  constexpr size_t kMaxSummaryBytes = 64u << 20;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return {};
  std::string out;
  char buf[1 << 16];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < kMaxSummaryBytes) out.append(buf, size_t(n));
  ::close(fd);
  return n < 0 || out.size() >= kMaxSummaryBytes ? std::string() : out;
}

uint64_t metrics_bytes(const std::string& run_dir) {
  struct stat st {};
  return ::stat((run_dir + "/" + kMetricsFile).c_str(), &st) == 0 ? uint64_t(st.st_size) : 0;
}

}  // namespace

std::vector<MetricSeries> read_metrics(const std::string& run_dir, size_t* skipped) {
  detail::MetricDigest digest;
  uint64_t from = 0;
  if (!digest.load_series(small_file(run_dir + "/" + detail::kSeriesFile), from) ||
      from > metrics_bytes(run_dir))
    digest = detail::MetricDigest{}, from = 0;  // none, or it belongs to another file: all of it
  // The lines after what the digest holds: a live run's newest, or all of a run without one.
  std::ifstream in(run_dir + "/" + kMetricsFile);
  if (from) in.seekg(std::streamoff(from));
  std::string line;
  size_t bad = 0;
  while (std::getline(in, line))
    if (!digest.add_line(line)) ++bad;
  if (skipped) *skipped = bad;
  return digest.series();
}

std::vector<NamedStats> read_metric_stats(const std::string& run_dir) {
  std::vector<NamedStats> out;
  const Json doc = Json::parse(small_file(run_dir + "/" + detail::kSummaryFile), nullptr, false);
  bool whole = doc.is_object() && doc.value("version", 0) == 1 && doc.contains("bytes") &&
               doc["bytes"].is_number_unsigned() && doc["bytes"].get<uint64_t>() == metrics_bytes(run_dir) &&
               doc.contains("metrics") && doc["metrics"].is_array();
  for (const auto& m : whole ? doc["metrics"] : Json::array()) {
    auto num = [&](const char* k) { return m.contains(k) && m[k].is_number(); };
    if (!m.is_object() || !m.contains("name") || !m["name"].is_string() || !num("rank") || !num("count") ||
        !num("first") || !num("min") || !num("max") || !num("last") || !num("min_step") ||
        !num("last_step")) {
      whole = false;
      break;
    }
    NamedStats s{m["name"].get<std::string>(), m["rank"].get<int>(), {}};
    s.stats.count = m["count"].get<size_t>();
    s.stats.first = m["first"].get<double>();
    s.stats.min = m["min"].get<double>();
    s.stats.max = m["max"].get<double>();
    s.stats.last = m["last"].get<double>();
    s.stats.min_step = m["min_step"].get<int64_t>();
    s.stats.last_step = m["last_step"].get<int64_t>();
    out.push_back(std::move(s));
  }
  if (whole) return out;
  out.clear();  // a live run, one without a summary, or a summary that does not read
  for (const MetricSeries& m : read_metrics(run_dir)) out.push_back({m.name, m.rank, stats_of(m)});
  return out;
}

MetricStats stats_of(const MetricSeries& s) {
  MetricStats st;
  st.count = std::max<size_t>(s.count, s.values.size());
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
