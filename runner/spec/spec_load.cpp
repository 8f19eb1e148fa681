// Job spec loading: each document (a profile, then the spec) walked key by key through the schema
// (detail/schema.h), every mistake of a document reported at once; and the spec written back.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "knobs/parse.h"
#include "profiles/profiles.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/spec/detail/schema.h"
#include "runner/spec/spec.h"

namespace mltrain::spec {

namespace fs = std::filesystem;

namespace detail {
namespace {

// A job spec is a small TOML file; past this it is not read further (a path like /dev/zero).
constexpr size_t kMaxSpecBytes = size_t{16} << 20;

template <class T>
T& ref(const Key& k, JobSpec& s) {
  return std::get<Ref<T>>(k.member).get(s);
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A byte count: an integer, or a size string as the knobs take ("4M", "512K", "1MiB").
uint64_t get_size(const Load& l, const Value& v, const std::string& key, uint64_t max,
                  std::string_view max_text) {
  const std::string hint = "give a size from 1 byte to " + std::string(max_text) + ", like 4194304 or \"4M\"";
  uint64_t n = 0;
  std::string shown;
  if (v.is(Value::Kind::integer)) {
    if (v.integer <= 0)
      l.fail(v.at, "'" + key + "' is " + std::to_string(v.integer) + ", out of range", hint);
    n = uint64_t(v.integer);
    shown = std::to_string(n);
  } else if (v.is(Value::Kind::string)) {
    auto parsed = knobs::parse_bytes(v.str);
    if (!parsed)
      l.fail(v.at, "'" + key + "' is '" + text::excerpt(v.str) + "', not a size",
             "write bytes like 4194304, or a size like \"4M\", \"512K\" or \"1MiB\" (binary multiples)");
    n = *parsed;
    shown = "'" + v.str + "'";
  } else {
    l.fail(v.at, "'" + key + "' must be a number of bytes or a size like \"4M\", not " + type_of(v));
  }
  if (n == 0 || n > max) l.fail(v.at, "'" + key + "' is " + shown + ", out of range", hint);
  return n;
}

Duration get_duration(const Load& l, const Value& v, const std::string& key) {
  if (v.is(Value::Kind::integer)) {
    if (v.integer < 0) l.fail(v.at, "'" + key + "' must not be negative");
    return std::chrono::seconds(v.integer);
  }
  if (v.is(Value::Kind::string)) {
    if (auto d = text::parse_duration(v.str)) return *d;
    l.fail(v.at, "'" + key + "' has a malformed duration '" + text::excerpt(v.str) + "'",
           "write a duration like \"90s\", \"15m\", \"2h\" or \"1h30m\"");
  }
  l.fail(v.at, "'" + key + "' must be a duration like \"90s\" or a number of seconds, not " + type_of(v));
}

// An environment variable's value as TOML may write it: a string, a number or a boolean (true: "1").
std::string env_value(const Load& l, const Value& v, const std::string& k) {
  if (v.is(Value::Kind::string)) return v.str;
  if (v.is(Value::Kind::integer)) return std::to_string(v.integer);
  if (v.is(Value::Kind::boolean)) return v.boolean ? "1" : "0";
  if (v.is(Value::Kind::floating)) return number_text(v.floating);
  l.fail(v.at, "env '" + k + "' must be a string, number or boolean, not " + type_of(v));
}

void read_number(Load& l, const Key& k, const Value& v) {
  const std::string name(k.name);
  const double x = get_number(l, v, name);
  const bool low = k.min_open ? x <= k.min : x < k.min;
  const bool high = k.max_open ? x >= k.max : x > k.max;
  if (low || high)
    l.fail(v.at, "'" + name + "' is " + number_text(x) + ", out of range", std::string(k.range_hint));
  ref<double>(k, l.spec) = x;
}

void read_env(Load& l, const Key& k, const Value& v) {
  for (const auto& [name, at, val] : as_table(l, v, k.path()).fields) {
    check_env_name(name, l.doc.where(at));
    set_pair(ref<Pairs>(k, l.spec), name, env_value(l, val, name));
  }
}

// Keys users bring from other launchers (torchrun, mpirun, SkyPilot) that mltrain spells in
// another section: where they go instead, or empty.
std::string elsewhere(const std::string& section, const std::string& key) {
  static const std::set<std::string> ranks{"ranks", "nprocs", "np", "nproc", "n", "world_size", "num_procs"};
  static const std::set<std::string> per_host{"nproc_per_node", "procs_per_host", "ppn", "slots"};
  const bool top = section.empty() || section == "run";
  if (top && ranks.count(key)) return "the number of ranks is [cluster] nprocs (or -n)";
  if (top && per_host.count(key)) return "ranks per host are [cluster] procs_per_host";
  if (top && (key == "hosts" || key == "hostfile" || key == "nodes"))
    return "hosts are [cluster] hosts = [...] or hostfile = \"...\"";
  if (section.empty() && (key == "command" || key == "argv" || key == "env" || key == "workdir"))
    return "'" + key + "' goes under [run]";
  if (section == "run" && (key == "cmd" || key == "script"))
    return "the command is 'command' (a string, run by /bin/sh -c) or 'argv' (a list)";
  if (section == "run" && key == "args") return "a list runs without a shell as argv = [...]";
  return {};
}

Problem unknown_key(const Load& l, const Value::Field& f, const std::string& path,
                    const std::vector<std::string>& known) {
  const std::string shown = text::excerpt(f.key);
  const std::string what =
      path.empty() ? "unknown key '" + shown + "'" : "unknown key '" + shown + "' in [" + path + "]";
  Problem p{f.at, l.doc.where(f.at) + ": " + what, "see docs/spec.md for every key"};
  if (std::string there = elsewhere(path, f.key); !there.empty())
    p.hint = there;
  else
    p.message += text::did_you_mean(f.key, known);
  return p;
}

bool is_default(const JobSpec& s, const Key& k) {
  static const JobSpec defaults;
  return std::visit(
      [&](const auto& r) {
        if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>)
          return true;
        else
          return r.read(s) == r.read(defaults);
      },
      k.member);
}

Value write_section(const JobSpec& s, const std::string& path) {
  Value t = table_value();
  for (const auto& k : keys()) {
    if (k.section != path) continue;
    if (k.type == Type::section) {
      if (!k.written || k.written(s)) set_field(t, std::string(k.name), write_section(s, k.path()));
    } else if (k.emit == Emit::custom) {
      k.write(s, t);
    } else if (k.emit == Emit::always || (k.emit == Emit::unless_default && !is_default(s, k))) {
      write_value(s, k, t);
    }
  }
  return t;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot read job spec: " + std::strerror(errno), "check the path");
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf).gcount() > 0) {
    text.append(buf, size_t(in.gcount()));
    if (text.size() > kMaxSpecBytes)
      throw Error(path + ": cannot read job spec: larger than " + std::to_string(kMaxSpecBytes >> 20) +
                      " MiB (is it really a job spec?)",
                  "check the path");
  }
  return text;
}

// Applies one document (a profile or the spec itself) over `s`: every key present replaces what
// was there, except [run.env], which merges variable by variable. Throws every mistake at once.
void apply(const Document& doc, JobSpec& s, const std::string& base_dir, bool is_profile) {
  Load l{s, doc, base_dir, is_profile, {}};
  walk(l, doc.root, "");
  auto& problems = l.problems;
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front().message, problems.front().hint);
  std::stable_sort(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  });
  std::string msg = doc.file + ": " + std::to_string(problems.size()) + " problems:";
  std::vector<std::string> hints;
  for (const auto& p : problems) {
    msg += "\n  " + p.message;
    if (!p.hint.empty() && std::find(hints.begin(), hints.end(), p.hint) == hints.end())
      hints.push_back(p.hint);
  }
  throw Error(msg, text::join(hints, "; "));
}

void apply_profile(JobSpec& s, const std::string& base_dir, const std::string& origin_of_name) {
  auto p = profiles::find(s.profile, base_dir);
  if (!p) {
    auto names = profiles::available();
    throw Error(
        origin_of_name + ": unknown profile '" + s.profile + "'" + text::did_you_mean(s.profile, names),
        "available profiles: " + text::join(names, ", ") + "; or give a path to a .toml file");
  }
  if (p->too_large)
    throw Error(origin_of_name + ": profile " + p->origin + " is larger than " +
                    std::to_string(profiles::kMaxProfileBytes >> 20) + " MiB (is it really a profile?)",
                "give the path of a profile's .toml file");
  Document doc = parse_document(p->text, p->origin);
  std::string dir =
      p->origin.rfind("built-in:", 0) == 0 ? base_dir : fs::path(p->origin).parent_path().string();
  apply(doc, s, dir, /*is_profile=*/true);
}

}  // namespace

bool get_bool(const Load& l, const Value& v, const std::string& key) {
  if (v.is(Value::Kind::boolean)) return v.boolean;
  l.fail(v.at, "'" + key + "' must be true or false, not " + type_of(v));
}

// A float or an integer (lr = 1 is as good as lr = 1.0).
double get_number(const Load& l, const Value& v, const std::string& key) {
  if (v.is(Value::Kind::floating)) {
    if (!std::isfinite(v.floating)) l.fail(v.at, "'" + key + "' must be a finite number");
    return v.floating;
  }
  if (v.is(Value::Kind::integer)) return double(v.integer);
  l.fail(v.at, "'" + key + "' must be a number, not " + type_of(v));
}

void Load::fail(Pos at, const std::string& msg, const std::string& hint) const {
  throw Error(doc.where(at) + ": " + msg, hint);
}

std::string Load::resolve(const std::string& p) const {
  if (p.empty() || p[0] == '/' || p[0] == '~' || base_dir.empty()) return p;
  return (fs::path(base_dir) / p).lexically_normal().string();
}

std::string get_string(const Load& l, const Value& v, const std::string& key) {
  if (v.is(Value::Kind::string)) return v.str;
  l.fail(v.at, "'" + key + "' must be a string, not " + type_of(v));
}

int64_t get_int(const Load& l, const Value& v, const std::string& key, int64_t lo, int64_t hi) {
  if (!v.is(Value::Kind::integer)) l.fail(v.at, "'" + key + "' must be an integer, not " + type_of(v));
  if (v.integer < lo || v.integer > hi)
    l.fail(v.at, "'" + key + "' is " + std::to_string(v.integer) + ", out of range",
           "use a value from " + std::to_string(lo) + " to " + std::to_string(hi));
  return v.integer;
}

std::vector<std::string> get_strings(const Load& l, const Value& v, const std::string& key) {
  if (!v.is(Value::Kind::array)) l.fail(v.at, "'" + key + "' must be an array of strings, not " + type_of(v));
  std::vector<std::string> out;
  for (const auto& e : v.items) {
    if (!e.is(Value::Kind::string)) l.fail(e.at, "'" + key + "' must hold only strings, found " + type_of(e));
    out.push_back(e.str);
  }
  return out;
}

std::string get_choice(const Load& l, const Value& v, const std::string& key,
                       const std::vector<std::string>& choices) {
  std::string s = get_string(l, v, key);
  if (std::find(choices.begin(), choices.end(), s) != choices.end()) return s;
  l.fail(v.at, "'" + key + "' is '" + s + "', which is not one of: " + text::join(choices, ", ") +
                   text::did_you_mean(s, choices));
}

const Value& as_table(const Load& l, const Value& v, const std::string& section) {
  if (v.is(Value::Kind::table)) return v;
  l.fail(v.at, "'" + section + "' must be a table ([" + section + "]), not " + type_of(v));
}

void set_pair(Pairs& pairs, const std::string& k, std::string v) {
  for (auto& [ek, ev] : pairs)
    if (ek == k) {
      ev = std::move(v);
      return;
    }
  pairs.emplace_back(k, std::move(v));
}

void read_value(Load& l, const Key& k, const Value& v) {
  const std::string name(k.name);
  switch (k.type) {
    case Type::section: {
      const Value& t = as_table(l, v, k.path());
      if (k.read) k.read(l, t);
      return walk(l, t, k.path());
    }
    case Type::custom:
      return k.read(l, v);
    case Type::string:
      ref<std::string>(k, l.spec) = get_string(l, v, name);
      return;
    case Type::path:
      ref<std::string>(k, l.spec) = l.resolve(get_string(l, v, name));
      return;
    case Type::integer:
      ref<int>(k, l.spec) = int(get_int(l, v, name, k.lo, k.hi));
      return;
    case Type::boolean:
      ref<bool>(k, l.spec) = get_bool(l, v, name);
      return;
    case Type::number:
      return read_number(l, k, v);
    case Type::duration:
      ref<Duration>(k, l.spec) = get_duration(l, v, name);
      return;
    case Type::size:
      ref<uint64_t>(k, l.spec) = get_size(l, v, name, uint64_t(k.hi), k.range_hint);
      return;
    case Type::strings:
      ref<std::vector<std::string>>(k, l.spec) = get_strings(l, v, name);
      return;
    case Type::choice:
      ref<std::string>(k, l.spec) = get_choice(l, v, name, k.choices);
      return;
    case Type::env:
      return read_env(l, k, v);
  }
}

void write_value(const JobSpec& s, const Key& k, Value& table) {
  auto strings = [](const std::vector<std::string>& v) {
    std::vector<Value> items;
    for (const auto& x : v) items.push_back(string_value(x));
    return array_value(std::move(items));
  };
  auto pairs = [](const Pairs& p) {
    Value t = table_value();
    for (const auto& [name, v] : p) set_field(t, name, string_value(v));
    return t;
  };
  std::optional<Value> v = std::visit(
      [&](const auto& r) -> std::optional<Value> {
        using R = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<R, std::monostate>)
          return std::nullopt;
        else if constexpr (std::is_same_v<R, Ref<std::string>>)
          return string_value(r.read(s));
        else if constexpr (std::is_same_v<R, Ref<int>>)
          return integer_value(r.read(s));
        else if constexpr (std::is_same_v<R, Ref<bool>>)
          return boolean_value(r.read(s));
        else if constexpr (std::is_same_v<R, Ref<double>>)
          return floating_value(r.read(s));
        else if constexpr (std::is_same_v<R, Ref<uint64_t>>)
          return integer_value(int64_t(r.read(s)));
        else if constexpr (std::is_same_v<R, Ref<Duration>>)
          return string_value(text::format_duration(r.read(s)));
        else if constexpr (std::is_same_v<R, Ref<std::vector<std::string>>>)
          return strings(r.read(s));
        else if constexpr (std::is_same_v<R, Ref<Pairs>>)
          return pairs(r.read(s));
        else if (r.read(s))
          return string_value(*r.read(s));
        else
          return std::nullopt;
      },
      k.member);
  if (v) set_field(table, std::string(k.name), std::move(*v));
}

void walk(Load& l, const Value& table, const std::string& path,
          const std::function<void(const Key&, const Value&)>& read) {
  std::vector<std::string> known;  // in key order, as "did you mean" breaks ties
  for (const auto& k : keys())
    if (k.section == path) known.emplace_back(k.name);
  std::sort(known.begin(), known.end());
  for (const auto& f : table.fields) {
    const Key* k = find_key(path.empty() ? f.key : path + "." + f.key);
    if (!k || k->section != path) {
      l.problems.push_back(unknown_key(l, f, path, known));
      continue;
    }
    l.spec.origins[k->path()] = l.doc.where(f.value.at);
    // A wrong value is reported with the typos; the walk goes on with the next key.
    try {
      read ? read(*k, f.value) : read_value(l, *k, f.value);
    } catch (const Error& e) {
      l.problems.push_back({f.value.at, e.what(), e.hint()});
    }
  }
}

}  // namespace detail

using detail::Document;

JobSpec load_file(const std::string& path) {
  const Document doc = detail::parse_document(detail::read_file(path), path);
  const std::string base_dir = fs::absolute(path).parent_path().string();
  JobSpec s;
  // The profile goes under the spec: apply it first, then the spec over it.
  if (const detail::Value* p = doc.root.find("profile")) {
    s.profile = detail::get_string(detail::Load{s, doc, base_dir, false, {}}, *p, "profile");
    detail::apply_profile(s, base_dir, doc.where(p->at));
  }
  detail::apply(doc, s, base_dir, /*is_profile=*/false);
  s.source = path;
  if (s.name.empty()) s.name = derived_name(fs::path(path).stem().string());
  return s;
}

JobSpec from_command(std::vector<std::string> argv, const std::string& profile) {
  JobSpec s;
  if (!profile.empty()) {
    s.profile = profile;
    detail::apply_profile(s, fs::current_path().string(), "--profile");
  }
  // One word may be a shell command line ('cd ~/data && ls'): its program is its first word.
  if (!argv.empty()) {
    const std::string& w = argv[0];
    const size_t b = w.find_first_not_of(" \t\n");
    const std::string first = b == std::string::npos ? w : w.substr(b, w.find_first_of(" \t\n", b) - b);
    s.name = derived_name(fs::path(first).filename().string());
  }
  s.run.argv = std::move(argv);
  s.run.command.reset();
  return s;
}

std::string to_toml(const JobSpec& s) { return detail::write_document(detail::write_section(s, "")); }

}  // namespace mltrain::spec
