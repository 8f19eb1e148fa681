// `mltrain ls --where EXPR --columns LIST --jsonl` (docs/records.md, "Find and export"): the fields
// of a run by name, a filter over them, and the rows they make.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runner/records/metrics.h"
#include "runner/records/records.h"

namespace mltrain::text {
class Regex;
}

namespace mltrain::records {

// A field's value: a number or text.
using FieldValue = std::variant<double, std::string>;

// A run and what was read of it for its fields (its metrics, once, when a field needs them).
class RunFields {
 public:
  explicit RunFields(const RunRecord& r) : r_(r) {}
  // id, name, status, kind, exit, ranks, hosts, started, ended, duration (seconds), restarts,
  // git, rerun_of, spec (its file), spec_text (its TOML), metric.NAME (its last value),
  // metric.NAME.first|min|max|last|count, env.KEY (os, kernel, python, torch, ...; environment_rows).
  // nullopt: the run has none.
  std::optional<FieldValue> get(const std::string& field);
  const RunRecord& record() const { return r_; }
  const std::vector<NamedStats>& metrics();

 private:
  const RunRecord& r_;
  std::optional<std::vector<NamedStats>> metrics_;
};

// Whether `field` names a field (what get() may answer); the message says what is known when not.
bool known_field(const std::string& field, std::string& why);

// A --where expression: conditions `FIELD OP VALUE` (OP one of < <= > >= = == != ~, ~ a regular
// expression search) joined by `and` and `or` (and binds tighter). Numbers compare as numbers,
// anything else as text; a field the run lacks makes its condition false.
class Filter {
 public:
  // Throws mltrain::Error (exit 2) naming the part that does not read.
  explicit Filter(const std::string& expr);
  bool matches(RunFields& run) const;
  bool empty() const { return any_of_.empty(); }

 private:
  struct Condition {
    std::string field, op, value;
    std::optional<double> number;
    std::shared_ptr<const text::Regex> re;  // op "~": `value` compiled once
  };
  std::vector<std::vector<Condition>> any_of_;  // or over and

 public:
  // The fields the conditions name, each once.
  std::vector<std::string> fields() const;
};

// "name,metric.loss,duration" -> its fields, each checked (throws mltrain::Error, exit 2).
std::vector<std::string> parse_columns(const std::string& list);

// `ls --jsonl`'s line for a run: the given columns as one flat object, or (none given) its record
// as run.json has it plus `metrics_last` (each metric's last value).
std::string jsonl_row(RunFields& run, const std::vector<std::string>& columns);

// A value as a table cell and as JSON text.
std::string cell_text(const std::optional<FieldValue>& v);
std::string cell_json(const std::optional<FieldValue>& v);

}  // namespace mltrain::records
