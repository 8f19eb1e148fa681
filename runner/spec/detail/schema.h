// The spec's schema: one row per key (section, name, member, type, bounds, doc) that drives
// loading (spec_load.cpp), the checks after flags (spec_check.cpp), to_toml and the key list of
// docs/spec.md (keys_markdown, which test_spec compares with the doc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "runner/spec/detail/document.h"
#include "runner/spec/spec.h"

namespace mltrain::spec::detail {

using Pairs = std::vector<std::pair<std::string, std::string>>;

// A member of JobSpec reached through a path of member pointers, read or written.
template <class T>
struct Ref {
  T& (*get)(JobSpec&);
  const T& (*read)(const JobSpec&);
};
// At<&JobSpec::run, &RunSection::timeout>::get(s) is s.run.timeout: a fold of .* over the path.
template <auto... Path>
struct At {
  static auto& get(JobSpec& s) { return (s.*....*Path); }
  static const auto& read(const JobSpec& s) { return (s.*....*Path); }
};
using Member =
    std::variant<std::monostate, Ref<std::string>, Ref<int>, Ref<bool>, Ref<double>, Ref<uint64_t>,
                 Ref<Duration>, Ref<std::vector<std::string>>, Ref<Pairs>, Ref<std::optional<std::string>>>;
template <auto... Path>
Member member() {
  using T = std::remove_reference_t<decltype(At<Path...>::get(std::declval<JobSpec&>()))>;
  return Ref<T>{&At<Path...>::get, &At<Path...>::read};
}

enum class Type {
  section,   // a table of keys (rows whose section is this key's path)
  string,    // a string
  path,      // a string, relative to the spec's folder
  integer,   // an integer from lo to hi
  boolean,   // true or false
  number,    // a float or an integer within the bounds
  duration,  // "90s" or a number of seconds, at most max_duration after the flags
  size,      // bytes or "4M", 1 to hi
  strings,   // an array of strings
  choice,    // one of choices
  env,       // a table of environment variables (names checked, values as strings)
  custom,    // read and written by the row's own functions
};

// When to_toml writes a key: always, when it differs from a fresh JobSpec's value, never, or
// through the row's write function.
enum class Emit { always, unless_default, never, custom };

struct Load;
struct Key {
  std::string_view section = {};  // "" (top level), "run", "ps.optimizer", "sync.files", ...
  std::string_view name = {};
  Type type = Type::string;
  Member member = {};
  std::string_view doc = {};
  Emit emit = Emit::always;
  int64_t lo = 0, hi = 0;                 // integer; size: hi is the most
  std::vector<std::string> choices = {};  // choice
  std::string_view range_hint = {};       // number: the hint when out of bounds; size: the most, in words
  double min = -std::numeric_limits<double>::infinity(), max = std::numeric_limits<double>::infinity();
  bool min_open = false, max_open = false;  // number: bounds excluded
  Duration max_duration{0};                 // duration: the most check() accepts (0: no bound)
  std::string_view shown = {};              // custom: its type as docs/spec.md names it
  // A section: runs before its keys are read (it may refuse the table). A custom key: reads it.
  void (*read)(Load&, const Value&) = nullptr;
  void (*write)(const JobSpec&, Value& table) = nullptr;  // Emit::custom: writes the key into its table
  bool (*written)(const JobSpec&) = nullptr;  // a section: whether to_toml writes it (null: always)

  std::string path() const {
    return section.empty() ? std::string(name) : std::string(section) + "." + std::string(name);
  }
};

// Every key in docs order: a section's row, then its keys.
const std::vector<Key>& keys();
// The row of `path` ("run.timeout"), or nullptr.
const Key* find_key(const std::string& path);

// A mistake in a document, kept so that one load reports every one of them, in file order.
struct Problem {
  Pos at;
  std::string message;  // "job.toml:2:1: unknown key ..."
  std::string hint;
};

// The state of applying one document (a profile or the spec) over a JobSpec.
struct Load {
  JobSpec& spec;
  const Document& doc;
  std::string base_dir;  // relative paths start here
  bool is_profile = false;
  std::vector<Problem> problems;

  [[noreturn]] void fail(Pos at, const std::string& msg, const std::string& hint = {}) const;
  std::string resolve(const std::string& path) const;
};

// Readers of one value; each throws mltrain::Error at the value's place.
std::string get_string(const Load& l, const Value& v, const std::string& key);
std::vector<std::string> get_strings(const Load& l, const Value& v, const std::string& key);
int64_t get_int(const Load& l, const Value& v, const std::string& key, int64_t lo, int64_t hi);
bool get_bool(const Load& l, const Value& v, const std::string& key);
double get_number(const Load& l, const Value& v, const std::string& key);  // a float or an integer, finite
const Value& as_table(const Load& l, const Value& v, const std::string& section);
std::string get_choice(const Load& l, const Value& v, const std::string& key,
                       const std::vector<std::string>& choices);
// Sets `k` in a list of name-value pairs, replacing an earlier value in place (a spec over its
// profile), else at the end.
void set_pair(Pairs& pairs, const std::string& k, std::string v);
// Reads a row of a generic type into its member.
void read_value(Load& l, const Key& k, const Value& v);
// Writes a row of a generic type from its member.
void write_value(const JobSpec& s, const Key& k, Value& table);

// Visits each key of `table` (the section at `path`) with its row; an unknown key (with a
// suggestion) or a row's error is noted in l.problems and the walk goes on.
// `read` takes each known key instead of its row's reader (a table read into a local value).
void walk(Load& l, const Value& table, const std::string& path,
          const std::function<void(const Key&, const Value&)>& read = {});

}  // namespace mltrain::spec::detail
