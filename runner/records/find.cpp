#include "runner/records/find.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runner/common/error.h"
#include "runner/common/regex.h"
#include "runner/common/text.h"

namespace mltrain::records {

namespace {

const char* const kPlainFields[] = {"id",       "name",  "status",   "kind",  "exit",
                                    "ranks",    "hosts", "started",  "ended", "duration",
                                    "restarts", "git",   "rerun_of", "spec",  "spec_text"};
const char* const kStats[] = {"first", "min", "max", "last", "count"};
constexpr const char* kFieldHint =
    "fields: id name status kind exit ranks hosts started ended duration restarts git rerun_of spec, "
    "metric.NAME (its last value) or metric.NAME.first|min|max|last|count, env.KEY (os kernel arch glibc "
    "cpus gpus gpu_driver cuda nccl python torch mltrain)";

std::optional<double> number_of(const std::string& s) {
  if (s.empty()) return std::nullopt;
  double v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

// `expr` cut at the word `word` (spaces around it), outside quotes.
std::vector<std::string> split_word(const std::string& expr, const std::string& word) {
  std::vector<std::string> parts;
  std::string cur;
  char quote = 0;
  for (size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (quote) {
      quote = c == quote ? 0 : quote;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (std::isspace(static_cast<unsigned char>(c)) && expr.compare(i + 1, word.size(), word) == 0 &&
               i + 1 + word.size() < expr.size() &&
               std::isspace(static_cast<unsigned char>(expr[i + 1 + word.size()]))) {
      parts.push_back(cur);
      cur.clear();
      i += word.size();
      continue;
    }
    cur += c;
  }
  parts.push_back(cur);
  return parts;
}

// "FIELD OP VALUE": a field name ([A-Za-z_][A-Za-z0-9_./-]*), an operator, a value (trimmed, not
// empty). By hand, not a std::regex: a value may be 100,000 characters long.
bool split_condition(const std::string& part, std::string& field, std::string& op, std::string& value) {
  size_t i = part.find_first_not_of(" \t");
  if (i == std::string::npos || !(std::isalpha(static_cast<unsigned char>(part[i])) || part[i] == '_'))
    return false;
  size_t f = i;
  while (i < part.size() && (std::isalnum(static_cast<unsigned char>(part[i])) ||
                             std::string_view("_./-").find(part[i]) != std::string_view::npos))
    ++i;
  field = part.substr(f, i - f);
  i = part.find_first_not_of(" \t", i);
  if (i == std::string::npos) return false;
  for (const char* o : {"<=", ">=", "==", "!=", "=", "<", ">", "~"})
    if (part.compare(i, std::strlen(o), o) == 0) {
      op = o;
      break;
    }
  if (op.empty()) return false;
  value = trim(part.substr(i + op.size()));
  return !value.empty();
}

}  // namespace

bool known_field(const std::string& field, std::string& why) {
  for (const char* f : kPlainFields)
    if (field == f) return true;
  if (field.rfind("metric.", 0) == 0 && field.size() > 7) return true;
  if (field.rfind("env.", 0) == 0 && field.size() > 4) return true;
  why = "unknown field '" + field + "'";
  return false;
}

const std::vector<NamedStats>& RunFields::metrics() {
  if (!metrics_) metrics_ = read_metric_stats(run_dir(r_.id));
  return *metrics_;
}

std::optional<FieldValue> RunFields::get(const std::string& f) {
  const RunRecord& r = r_;
  auto text = [](const std::string& s) -> std::optional<FieldValue> {
    if (s.empty()) return std::nullopt;
    return FieldValue(s);
  };
  if (f == "id") return FieldValue(r.id);
  if (f == "name") return FieldValue(r.name);
  if (f == "status") return FieldValue(r.status);
  if (f == "kind") return FieldValue(r.kind);
  if (f == "exit") return r.exit_code >= 0 ? std::optional<FieldValue>(double(r.exit_code)) : std::nullopt;
  if (f == "ranks") return FieldValue(double(r.ranks.size()));
  if (f == "hosts") return FieldValue(double(r.hosts.size()));
  if (f == "started") return text(r.started_at);
  if (f == "ended") return text(r.ended_at);
  if (f == "duration")
    return live_status(r.status) ? std::nullopt
                                 : std::optional<FieldValue>(double(std::lround(r.duration_s * 1000)) / 1000);
  if (f == "restarts") return FieldValue(double(r.restarts));
  if (f == "git") return text(r.git_commit);
  if (f == "rerun_of") return text(r.rerun_of);
  if (f == "spec") return text(r.spec_file);
  if (f == "spec_text") return text(r.spec_toml);
  if (f.rfind("env.", 0) == 0) {
    for (const auto& [k, v] : environment_rows(r))
      if (k == f.substr(4)) return FieldValue(v);
    return std::nullopt;
  }
  if (f.rfind("metric.", 0) != 0) return std::nullopt;
  const std::string rest = f.substr(7);
  // "metric.train.loss" is the metric train.loss if there is one, else train's "loss" statistic.
  std::string name = rest, stat = "last";
  bool found = false;
  for (const auto& s : metrics()) found = found || s.name == rest;
  if (!found)
    if (size_t dot = rest.rfind('.'); dot != std::string::npos)
      for (const char* st : kStats)
        if (rest.substr(dot + 1) == st) name = rest.substr(0, dot), stat = st;
  for (const auto& s : metrics()) {
    if (s.name != name) continue;
    const MetricStats& st = s.stats;
    if (stat == "first") return st.first;
    if (stat == "min") return st.min;
    if (stat == "max") return st.max;
    if (stat == "count") return double(st.count);
    return st.last;
  }
  return std::nullopt;
}

Filter::Filter(const std::string& expr) {
  if (trim(expr).empty()) return;
  for (const auto& alternative : split_word(expr, "or")) {
    std::vector<Condition> all;
    for (const auto& part : split_word(alternative, "and")) {
      std::string field, op, value;
      if (!split_condition(part, field, op, value))
        throw Error(
            "--where: '" + text::excerpt(trim(part), 80) + "' is not a condition FIELD OP VALUE",
            "as in --where 'metric.loss < 0.3 and status = succeeded'; OP: < <= > >= = != ~ (regex); " +
                std::string(kFieldHint));
      Condition c{field, op, value, std::nullopt, nullptr};
      if (std::string why; !known_field(c.field, why)) throw Error("--where: " + why, kFieldHint);
      if (c.value.size() >= 2 && (c.value[0] == '\'' || c.value[0] == '"') && c.value.back() == c.value[0])
        c.value = c.value.substr(1, c.value.size() - 2);
      else
        c.number = number_of(c.value);
      if (c.op == "~") {
        std::string error;
        c.re = text::Regex::compile(c.value, error);
        if (!c.re)
          throw Error("--where: '" + text::excerpt(c.value, 80) + "' is not a regular expression: " + error,
                      "escape special characters (RE2's syntax: no back-references or look-around)");
      }
      all.push_back(std::move(c));
    }
    any_of_.push_back(std::move(all));
  }
}

std::vector<std::string> Filter::fields() const {
  std::vector<std::string> out;
  for (const auto& all : any_of_)
    for (const auto& c : all)
      if (std::find(out.begin(), out.end(), c.field) == out.end()) out.push_back(c.field);
  return out;
}

bool Filter::matches(RunFields& run) const {
  if (any_of_.empty()) return true;
  for (const auto& all : any_of_) {
    bool ok = true;
    for (const auto& c : all) {
      const std::optional<FieldValue> v = run.get(c.field);
      if (!v) {
        ok = false;
        break;
      }
      int cmp = 0;
      const double* num = std::get_if<double>(&*v);
      if (c.op == "~") {
        ok = c.re->search(cell_text(v));
      } else {
        if (num && c.number)
          cmp = *num < *c.number ? -1 : *num > *c.number ? 1 : 0;
        else
          cmp = cell_text(v).compare(c.value), cmp = cmp < 0 ? -1 : cmp > 0 ? 1 : 0;
        ok = c.op == "<"                   ? cmp < 0
             : c.op == "<="                ? cmp <= 0
             : c.op == ">"                 ? cmp > 0
             : c.op == ">="                ? cmp >= 0
             : c.op == "=" || c.op == "==" ? cmp == 0
                                           : cmp != 0;
      }
      if (!ok) break;
    }
    if (ok) return true;
  }
  return false;
}

std::vector<std::string> parse_columns(const std::string& list) {
  std::vector<std::string> out;
  for (const auto& part : text::split(list, ',')) {
    std::string f = trim(part), why;
    if (f.empty()) continue;
    if (!known_field(f, why)) throw Error("--columns: " + why, kFieldHint);
    out.push_back(f);
  }
  if (out.empty())
    throw Error("--columns is empty", "name the fields, as in --columns id,status,metric.loss");
  return out;
}

std::string jsonl_row(RunFields& run, const std::vector<std::string>& columns) {
  if (!columns.empty()) {
    std::string out = "{";
    for (const auto& c : columns)
      out += (out.size() > 1 ? "," : "") + nlohmann::json(c).dump() + ":" + cell_json(run.get(c));
    return out + "}";
  }
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(to_json(run.record(), false));
  nlohmann::ordered_json last = nlohmann::ordered_json::object();
  for (const auto& s : run.metrics()) last[s.name] = s.stats.last;
  doc["metrics_last"] = last;
  return doc.dump();
}

std::string cell_text(const std::optional<FieldValue>& v) {
  if (!v) return "-";
  if (const auto* s = std::get_if<std::string>(&*v)) return *s;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", std::get<double>(*v));
  return buf;
}

std::string cell_json(const std::optional<FieldValue>& v) {
  if (!v) return "null";
  if (const auto* s = std::get_if<std::string>(&*v)) return nlohmann::json(*s).dump();
  return nlohmann::json(std::get<double>(*v)).dump();
}

}  // namespace mltrain::records
