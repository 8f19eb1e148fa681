// Job spec loading and validation: the only place toml++ is included.
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "knobs/parse.h"
#include "profiles/profiles.h"
#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/spec/spec.h"

namespace mltrain::spec {
namespace {

// A job spec is a small TOML file; past this it is not read further (a path like /dev/zero).
constexpr size_t kMaxSpecBytes = size_t{16} << 20;

namespace fs = std::filesystem;

// Variables mltrain sets for every rank; a spec's env may not set them (DESIGN.md, Contracts).
const std::vector<std::string> kReservedEnv = {"RANK",
                                               "WORLD_SIZE",
                                               "LOCAL_RANK",
                                               "LOCAL_WORLD_SIZE",
                                               "NODE_RANK",
                                               "GROUP_RANK",
                                               "MASTER_ADDR",
                                               "MASTER_PORT",
                                               "TORCHELASTIC_RESTART_COUNT",
                                               "TORCHELASTIC_MAX_RESTARTS",
                                               "TORCHELASTIC_RUN_ID",
                                               "MLTRAIN_RUN_ID",
                                               "MLTRAIN_STORE_ADDR",
                                               "MLTRAIN_TOKEN",
                                               "DMLC_ROLE",
                                               "DMLC_NUM_WORKER",
                                               "DMLC_NUM_SERVER",
                                               "DMLC_PS_ROOT_URI",
                                               "DMLC_PS_ROOT_PORT",
                                               "DMLC_WORKER_ID",
                                               "MLTRAIN_PS_SERVERS",
                                               "MLTRAIN_PS_SYNC",
                                               "MLTRAIN_PS_PARTITION_BYTES"};

std::string where(const toml::source_region& r) {
  std::string file = r.path ? *r.path : std::string("<spec>");
  return file + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

[[noreturn]] void fail(const toml::source_region& r, const std::string& msg, const std::string& hint = {}) {
  throw Error(where(r) + ": " + msg, hint);
}

std::string type_of(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date/time";
  }
}

struct Field {
  std::string key;
  const toml::node& node;
  std::string path() const { return key; }
};

std::string get_string(const toml::node& n, const std::string& key) {
  if (auto s = n.as_string()) return s->get();
  fail(n.source(), "'" + key + "' must be a string, not " + type_of(n));
}

int64_t get_int(const toml::node& n, const std::string& key, int64_t lo, int64_t hi) {
  auto i = n.as_integer();
  if (!i) fail(n.source(), "'" + key + "' must be an integer, not " + type_of(n));
  int64_t v = i->get();
  if (v < lo || v > hi)
    fail(n.source(), "'" + key + "' is " + std::to_string(v) + ", out of range",
         "use a value from " + std::to_string(lo) + " to " + std::to_string(hi));
  return v;
}

bool get_bool(const toml::node& n, const std::string& key) {
  if (auto b = n.as_boolean()) return b->get();
  fail(n.source(), "'" + key + "' must be true or false, not " + type_of(n));
}

// A float or an integer (lr = 1 is as good as lr = 1.0).
double get_number(const toml::node& n, const std::string& key) {
  if (auto f = n.as_floating_point()) {
    if (!std::isfinite(f->get())) fail(n.source(), "'" + key + "' must be a finite number");
    return f->get();
  }
  if (auto i = n.as_integer()) return double(i->get());
  fail(n.source(), "'" + key + "' must be a number, not " + type_of(n));
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A byte count: an integer, or a size string as the knobs take ("4M", "512K", "1MiB").
uint64_t get_size(const toml::node& n, const std::string& key, uint64_t max, const std::string& max_text) {
  const std::string hint = "give a size from 1 byte to " + max_text + ", like 4194304 or \"4M\"";
  uint64_t v = 0;
  std::string shown;
  if (auto i = n.as_integer()) {
    if (i->get() <= 0)
      fail(n.source(), "'" + key + "' is " + std::to_string(i->get()) + ", out of range", hint);
    v = uint64_t(i->get());
    shown = std::to_string(v);
  } else if (auto str = n.as_string()) {
    auto parsed = knobs::parse_bytes(str->get());
    if (!parsed)
      fail(n.source(), "'" + key + "' is '" + text::excerpt(str->get()) + "', not a size",
           "write bytes like 4194304, or a size like \"4M\", \"512K\" or \"1MiB\" (binary multiples)");
    v = *parsed;
    shown = "'" + str->get() + "'";
  } else {
    fail(n.source(), "'" + key + "' must be a number of bytes or a size like \"4M\", not " + type_of(n));
  }
  if (v == 0 || v > max) fail(n.source(), "'" + key + "' is " + shown + ", out of range", hint);
  return v;
}

Duration get_duration(const toml::node& n, const std::string& key) {
  if (auto i = n.as_integer()) {
    if (i->get() < 0) fail(n.source(), "'" + key + "' must not be negative");
    return std::chrono::seconds(i->get());
  }
  if (auto s = n.as_string()) {
    if (auto d = text::parse_duration(s->get())) return *d;
    fail(n.source(), "'" + key + "' has a malformed duration '" + text::excerpt(s->get()) + "'",
         "write a duration like \"90s\", \"15m\", \"2h\" or \"1h30m\"");
  }
  fail(n.source(), "'" + key + "' must be a duration like \"90s\" or a number of seconds, not " + type_of(n));
}

std::vector<std::string> get_strings(const toml::node& n, const std::string& key) {
  auto a = n.as_array();
  if (!a) fail(n.source(), "'" + key + "' must be an array of strings, not " + type_of(n));
  std::vector<std::string> out;
  for (const auto& e : *a) {
    if (auto s = e.as_string())
      out.push_back(s->get());
    else
      fail(e.source(), "'" + key + "' must hold only strings, found " + type_of(e));
  }
  return out;
}

std::string get_choice(const toml::node& n, const std::string& key, const std::vector<std::string>& choices) {
  std::string v = get_string(n, key);
  for (const auto& c : choices)
    if (c == v) return v;
  fail(n.source(), "'" + key + "' is '" + v + "', which is not one of: " + text::join(choices, ", ") +
                       text::did_you_mean(v, choices));
}

bool valid_env_name(const std::string& k) {
  if (k.empty() || std::isdigit(static_cast<unsigned char>(k[0]))) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// A DNS-1123 label, as Kubernetes names namespaces: [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63.
bool is_dns_label(const std::string& s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

// A DNS-1123 subdomain (service account names, label prefixes): dot-separated lowercase labels,
// at most 253 characters.
bool is_dns_subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (const auto& part : text::split(s, '.'))
    if (!is_dns_label(part)) return false;
  return true;
}

// A label's name part or value: [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, at most 63.
bool is_label_word(const std::string& s) {
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (s.empty() || s.size() > 63 || !alnum(s.front()) || !alnum(s.back())) return false;
  for (char c : s)
    if (!(alnum(c) || c == '-' || c == '_' || c == '.')) return false;
  return true;
}

// A label key: an optional DNS-subdomain prefix and '/', then a label word.
bool is_label_key(const std::string& k) {
  size_t slash = k.find('/');
  if (slash == std::string::npos) return is_label_word(k);
  return is_dns_subdomain(k.substr(0, slash)) && is_label_word(k.substr(slash + 1));
}

// Every "{word}" of a prefix template must be a placeholder mltrain fills in.
void check_prefix(const toml::source_region& r, const std::string& tmpl) {
  if (tmpl == "auto") return;
  const auto& known = prefix_placeholders();
  for (size_t open = tmpl.find('{'); open != std::string::npos; open = tmpl.find('{', open + 1)) {
    size_t close = tmpl.find('}', open);
    std::string word =
        tmpl.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
    bool ok = close != std::string::npos;
    if (ok) ok = std::find(known.begin(), known.end(), word) != known.end();
    if (!ok) {
      std::vector<std::string> braced;
      for (const auto& k : known) braced.push_back("{" + k + "}");
      std::string shown = close == std::string::npos ? tmpl.substr(open) : "{" + word + "}";
      auto near = text::closest(word, known);
      for (const auto& k : known)  // {hostname} means {host}, {node_rank} means {node}
        if (!near && word.rfind(k, 0) == 0) near = k;
      fail(r,
           "prefix '" + tmpl + "' has an unknown placeholder '" + shown + "'" +
               (near ? " (did you mean '{" + *near + "}'?)" : ""),
           "placeholders: " + text::join(braced, " "));
    }
  }
}

// An environment variable's value as TOML may write it: a string, a number or a boolean (true: "1").
std::string env_value(const toml::node& val, const std::string& k) {
  if (auto str = val.as_string()) return str->get();
  if (auto i = val.as_integer()) return std::to_string(i->get());
  if (auto b = val.as_boolean()) return b->get() ? "1" : "0";
  if (auto f = val.as_floating_point()) {
    std::ostringstream os;
    os << f->get();
    return os.str();
  }
  fail(val.source(), "env '" + k + "' must be a string, number or boolean, not " + type_of(val));
}

// Sets `k` in a list of name-value pairs, replacing an earlier value in place (a spec over its
// profile), else at the end.
void set_pair(std::vector<std::pair<std::string, std::string>>& pairs, const std::string& k, std::string v) {
  for (auto& [ek, ev] : pairs)
    if (ek == k) {
      ev = std::move(v);
      return;
    }
  pairs.emplace_back(k, std::move(v));
}

// A Kubernetes resource quantity as the API accepts it (its pattern, without a sign): a decimal
// number, then a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal one (n u m k M G T P E) or an
// exponent (e3). "64GB" and "8 cores" are not.
bool is_quantity(std::string_view q) {
  size_t i = 0, digits = 0;
  while (i < q.size() && std::isdigit(static_cast<unsigned char>(q[i]))) ++i, ++digits;
  if (i < q.size() && q[i] == '.')
    for (++i; i < q.size() && std::isdigit(static_cast<unsigned char>(q[i]));) ++i, ++digits;
  if (digits == 0) return false;
  std::string_view rest = q.substr(i);
  if (rest.empty()) return true;
  for (std::string_view s : {"Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"})
    if (rest == s) return true;
  if (rest[0] != 'e' && rest[0] != 'E') return false;
  rest.remove_prefix(1);
  if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) rest.remove_prefix(1);
  return !rest.empty() && std::all_of(rest.begin(), rest.end(),
                                      [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// [k8s] cpu or memory: a quantity string, or (cpu only) a number of cores.
std::string get_quantity(const toml::node& n, const std::string& key, const std::string& example) {
  std::string q;
  if (auto i = n.as_integer()) {
    if (key == "memory")
      fail(n.source(), "'memory' is " + std::to_string(i->get()) + ", a number of bytes",
           "write a quantity with its unit, like \"" + example + "\"");
    q = std::to_string(i->get());
  } else if (auto f = n.as_floating_point()) {
    std::ostringstream os;
    os << f->get();
    q = os.str();
  } else {
    q = get_string(n, key);
  }
  if (!is_quantity(q))
    fail(n.source(), "'" + key + "' is '" + text::excerpt(q) + "', not a Kubernetes quantity",
         "write it like \"" + example + "\" (suffixes: m, k, M, G, Ki, Mi, Gi, Ti)");
  // Kubernetes takes "100m" of memory as a tenth of a byte: a mebibyte typo.
  if (key == "memory" && (q.back() == 'm' || q.back() == 'u' || q.back() == 'n'))
    fail(n.source(),
         "'memory' is '" + q + "': '" + q.back() + "' means " +
             (q.back() == 'm'   ? "thousandths"
              : q.back() == 'u' ? "millionths"
                                : "billionths") +
             " of a byte to Kubernetes",
         "write mebibytes as \"" + q.substr(0, q.size() - 1) + "Mi\" (or gibibytes as \"...Gi\")");
  return q;
}

using Handler = std::function<void(const toml::node&)>;

// Where each visited key was written; the spec being loaded (or its profile) owns it.
thread_local std::map<std::string, std::string>* g_origins = nullptr;

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

// A mistake in a document (an unknown key, a wrong value), kept so that one run reports every one
// of them, in file order.
struct UnknownKey {
  toml::source_position at;
  std::string message;  // "job.toml:2:1: unknown key ..."
  std::string hint;
};

// The mistakes of the document being applied; apply() owns it.
thread_local std::vector<UnknownKey>* g_unknown = nullptr;

// Visits each key of `table` with its handler; an unknown key (with a suggestion) or a handler's
// error is noted and reported by apply() together with the others.
void visit(const toml::table& table, const std::string& section,
           const std::map<std::string, Handler>& handlers) {
  std::vector<std::string> known;
  for (const auto& [k, h] : handlers) known.push_back(k);
  for (const auto& [key, node] : table) {
    std::string k(key.str());
    auto it = handlers.find(k);
    if (it == handlers.end()) {
      const std::string shown = text::excerpt(k);
      std::string what = section.empty() ? "unknown key '" + shown + "'"
                                         : "unknown key '" + shown + "' in [" + section + "]";
      UnknownKey u{key.source().begin, where(key.source()) + ": " + what, "see docs/spec.md for every key"};
      if (const std::string there = elsewhere(section, k); !there.empty())
        u.hint = there;
      else
        u.message += text::did_you_mean(k, known);
      if (!g_unknown) throw Error(u.message, u.hint);
      g_unknown->push_back(std::move(u));
      continue;
    }
    if (g_origins) (*g_origins)[section.empty() ? k : section + "." + k] = where(node.source());
    if (!g_unknown) {
      it->second(node);
      continue;
    }
    // A wrong value is reported with the typos; the walk goes on with the next key.
    try {
      it->second(node);
    } catch (const Error& e) {
      g_unknown->push_back({node.source().begin, e.what(), e.hint()});
    }
  }
}

const toml::table& as_table(const toml::node& n, const std::string& section) {
  if (auto t = n.as_table()) return *t;
  fail(n.source(), "'" + section + "' must be a table ([" + section + "]), not " + type_of(n));
}

std::string resolve_path(const std::string& p, const std::string& base_dir) {
  if (p.empty() || p[0] == '/' || p[0] == '~' || base_dir.empty()) return p;
  return (fs::path(base_dir) / p).lexically_normal().string();
}

void apply_keys(const toml::table& root, JobSpec& s, const std::string& base_dir, bool is_profile);

// Applies one TOML document (a profile or the spec itself) over `s`: every key present replaces
// what was there, except [run.env], which merges variable by variable.
void apply(const toml::table& root, JobSpec& s, const std::string& base_dir, bool is_profile) {
  struct OriginsScope {
    explicit OriginsScope(std::map<std::string, std::string>* o) { g_origins = o; }
    ~OriginsScope() { g_origins = nullptr; }
  } scope(&s.origins);
  std::vector<UnknownKey> unknown;
  struct UnknownScope {
    explicit UnknownScope(std::vector<UnknownKey>* u) { g_unknown = u; }
    ~UnknownScope() { g_unknown = nullptr; }
  } unknown_scope(&unknown);
  try {
    apply_keys(root, s, base_dir, is_profile);
  } catch (const Error& e) {
    if (unknown.empty()) throw;
    // Another mistake stopped the walk: report it after the typos found before it.
    constexpr auto kLast = std::numeric_limits<toml::source_index>::max();
    unknown.push_back({{kLast, kLast}, e.what(), e.hint()});
  }
  if (unknown.empty()) return;
  if (unknown.size() == 1) throw Error(unknown.front().message, unknown.front().hint);
  std::stable_sort(unknown.begin(), unknown.end(), [](const UnknownKey& a, const UnknownKey& b) {
    return a.at.line != b.at.line ? a.at.line < b.at.line : a.at.column < b.at.column;
  });
  std::string file = root.source().path ? *root.source().path : std::string("<spec>");
  std::string msg = file + ": " + std::to_string(unknown.size()) + " problems:";
  std::vector<std::string> hints;
  for (const auto& u : unknown) {
    msg += "\n  " + u.message;
    if (!u.hint.empty() && std::find(hints.begin(), hints.end(), u.hint) == hints.end())
      hints.push_back(u.hint);
  }
  throw Error(msg, text::join(hints, "; "));
}

// apply()'s walk over the document's keys.
void apply_keys(const toml::table& root, JobSpec& s, const std::string& base_dir, bool is_profile) {
  visit(
      root, "",
      {
          {"name", [&](const toml::node& n) { s.name = get_string(n, "name"); }},
          {"profile",
           [&](const toml::node& n) {
             if (is_profile) fail(n.source(), "a profile cannot name another profile");
             s.profile = get_string(n, "profile");
           }},
          {"run",
           [&](const toml::node& n) {
             const toml::table& run = as_table(n, "run");
             // Within one document both is a contradiction; a spec over a profile may switch.
             if (run.contains("command") && run.contains("argv"))
               fail(run.get("argv")->source(),
                    "[run] has both 'command' (at " + where(run.get("command")->source()) + ") and 'argv'",
                    "keep one: 'command' runs through /bin/sh -c, 'argv' runs the program directly");
             visit(run, "run",
                   {
                       {"command",
                        [&](const toml::node& v) {
                          if (v.is_array())
                            fail(v.source(), "'command' must be a string, not an array",
                                 "a list runs the program without a shell: write argv = [...] instead");
                          s.run.command = get_string(v, "command");
                          s.run.argv.clear();
                        }},
                       {"argv",
                        [&](const toml::node& v) {
                          s.run.argv = get_strings(v, "argv");
                          if (s.run.argv.empty())
                            fail(v.source(), "'argv' is empty", "give the program and its arguments");
                          s.run.command.reset();
                        }},
                       {"workdir",
                        [&](const toml::node& v) {
                          s.run.workdir = resolve_path(get_string(v, "workdir"), base_dir);
                        }},
                       {"env",
                        [&](const toml::node& v) {
                          for (const auto& [key, val] : as_table(v, "run.env")) {
                            std::string k(key.str());
                            check_env_name(k, where(key.source()));
                            set_pair(s.run.env, k, env_value(val, k));
                          }
                        }},
                       {"forward_env",
                        [&](const toml::node& v) { s.run.forward_env = get_strings(v, "forward_env"); }},
                       {"max_restarts",
                        [&](const toml::node& v) {
                          s.run.max_restarts = int(get_int(v, "max_restarts", 0, 1000));
                        }},
                       {"timeout", [&](const toml::node& v) { s.run.timeout = get_duration(v, "timeout"); }},
                       {"grace_period",
                        [&](const toml::node& v) { s.run.grace_period = get_duration(v, "grace_period"); }},
                       {"python_path",
                        [&](const toml::node& v) { s.run.python_path = get_bool(v, "python_path"); }},
                   });
           }},
          {"cluster",
           [&](const toml::node& n) {
             visit(
                 as_table(n, "cluster"), "cluster",
                 {
                     {"hosts",
                      [&](const toml::node& v) {
                        if (auto str = v.as_string())
                          s.cluster.hosts = {str->get()};
                        else
                          s.cluster.hosts = get_strings(v, "hosts");
                        s.cluster.hostfile.clear();
                      }},
                     {"hostfile",
                      [&](const toml::node& v) {
                        s.cluster.hostfile = resolve_path(get_string(v, "hostfile"), base_dir);
                        s.cluster.hosts.clear();
                      }},
                     {"procs_per_host",
                      [&](const toml::node& v) {
                        s.cluster.procs_per_host = int(get_int(v, "procs_per_host", 1, 4096));
                      }},
                     {"nprocs",
                      [&](const toml::node& v) { s.cluster.nprocs = int(get_int(v, "nprocs", 1, 1 << 20)); }},
                     {"oversubscribe",
                      [&](const toml::node& v) { s.cluster.oversubscribe = get_bool(v, "oversubscribe"); }},
                     {"include", [&](const toml::node& v) { s.cluster.include = get_string(v, "include"); }},
                     {"launcher",
                      [&](const toml::node& v) {
                        s.cluster.launcher = get_choice(v, "launcher", {"auto", "ssh", "slurm"});
                      }},
                     {"exclude", [&](const toml::node& v) { s.cluster.exclude = get_string(v, "exclude"); }},
                 });
           }},
          {"comm",
           [&](const toml::node& n) {
             visit(as_table(n, "comm"), "comm",
                   {
                       {"mode",
                        [&](const toml::node& v) {
                          s.comm.mode = get_choice(v, "mode", {"allreduce", "ps"});
                        }},
                       {"backend",
                        [&](const toml::node& v) {
                          s.comm.backend = get_choice(v, "backend", {"auto", "tcp", "nccl"});
                        }},
                       {"master_port",
                        [&](const toml::node& v) {
                          if (auto str = v.as_string()) {
                            if (str->get() != "auto")
                              fail(v.source(), "'master_port' is '" + str->get() + "'",
                                   "write \"auto\" or a port number 1-65535");
                            s.comm.master_port = 0;
                          } else {
                            s.comm.master_port = int(get_int(v, "master_port", 1, 65535));
                          }
                        }},
                       {"num_servers",
                        [&](const toml::node& v) {
                          s.comm.num_servers = int(get_int(v, "num_servers", 0, 4096));
                        }},
                   });
           }},
          {"ps",
           [&](const toml::node& n) {
             const toml::table& ps = as_table(n, "ps");
             // [comm] is visited first (keys come in order); an explicit allreduce beside [ps]
             // in one file is a contradiction.
             if (auto mode = root.at_path("comm.mode").as_string(); mode && mode->get() == "allreduce")
               fail(mode->source(),
                    "[comm] mode = \"allreduce\" contradicts the [ps] table at " + where(n.source()),
                    "a [ps] table makes the job parameter-server mode: remove mode, or remove [ps] to train "
                    "with allreduce");
             s.ps.present = true;
             s.comm.mode = "ps";
             visit(ps, "ps",
                   {
                       {"hosts",
                        [&](const toml::node& v) {
                          if (auto str = v.as_string())
                            s.ps.hosts = {str->get()};
                          else
                            s.ps.hosts = get_strings(v, "hosts");
                          bool blank = true;
                          for (const auto& h : s.ps.hosts)
                            blank = blank && h.find_first_not_of(" \t") == std::string::npos;
                          if (blank)
                            fail(v.source(), "[ps] hosts is empty",
                                 "name the server hosts (items as in [cluster] hosts), or leave hosts out: "
                                 "then the hostfile's role=server/both hosts, else every worker host, run "
                                 "servers");
                        }},
                       {"servers_per_host",
                        [&](const toml::node& v) {
                          s.ps.servers_per_host = int(get_int(v, "servers_per_host", 1, kMaxServersPerHost));
                        }},
                       {"sync", [&](const toml::node& v) { s.ps.sync = get_bool(v, "sync"); }},
                       {"partition_bytes",
                        [&](const toml::node& v) {
                          s.ps.partition_bytes = get_size(v, "partition_bytes", kMaxPartitionBytes, "1 GiB");
                        }},
                       {"optimizer",
                        [&](const toml::node& v) {
                          auto& o = s.ps.optimizer;
                          o = {};
                          o.name = "sgd";
                          visit(as_table(v, "ps.optimizer"), "ps.optimizer",
                                {
                                    {"name",
                                     [&](const toml::node& x) { o.name = get_choice(x, "name", {"sgd"}); }},
                                    {"lr",
                                     [&](const toml::node& x) {
                                       o.lr = get_number(x, "lr");
                                       if (o.lr <= 0)
                                         fail(x.source(), "'lr' is " + number_text(o.lr) + ", out of range",
                                              "give a learning rate above 0, like 0.01");
                                     }},
                                    {"momentum",
                                     [&](const toml::node& x) {
                                       o.momentum = get_number(x, "momentum");
                                       if (o.momentum < 0 || o.momentum >= 1)
                                         fail(x.source(),
                                              "'momentum' is " + number_text(o.momentum) + ", out of range",
                                              "use a value from 0 up to, not including, 1 (0: none)");
                                     }},
                                    {"weight_decay",
                                     [&](const toml::node& x) {
                                       o.weight_decay = get_number(x, "weight_decay");
                                       if (o.weight_decay < 0)
                                         fail(x.source(),
                                              "'weight_decay' is " + number_text(o.weight_decay) +
                                                  ", out of range",
                                              "use 0 (none) or a positive value");
                                     }},
                                });
                        }},
                   });
           }},
          {"gpus",
           [&](const toml::node& n) {
             visit(as_table(n, "gpus"), "gpus",
                   {
                       {"per_proc",
                        [&](const toml::node& v) { s.gpus.per_proc = int(get_int(v, "per_proc", 0, 64)); }},
                       {"procs_per_gpu",
                        [&](const toml::node& v) {
                          s.gpus.procs_per_gpu = int(get_int(v, "procs_per_gpu", 0, 256));
                        }},
                   });
           }},
          {"ssh",
           [&](const toml::node& n) {
             visit(as_table(n, "ssh"), "ssh",
                   {
                       {"config",
                        [&](const toml::node& v) {
                          s.ssh.config = resolve_path(get_string(v, "config"), base_dir);
                        }},
                       {"user", [&](const toml::node& v) { s.ssh.user = get_string(v, "user"); }},
                       {"port", [&](const toml::node& v) { s.ssh.port = int(get_int(v, "port", 1, 65535)); }},
                       {"identity_file",
                        [&](const toml::node& v) {
                          s.ssh.identity_file = resolve_path(get_string(v, "identity_file"), base_dir);
                        }},
                       {"known_hosts",
                        [&](const toml::node& v) {
                          s.ssh.known_hosts = resolve_path(get_string(v, "known_hosts"), base_dir);
                        }},
                       {"strict_host_keys",
                        [&](const toml::node& v) {
                          if (auto b = v.as_boolean())
                            s.ssh.strict_host_keys = b->get() ? "yes" : "no";
                          else
                            s.ssh.strict_host_keys =
                                get_choice(v, "strict_host_keys", {"yes", "accept-new", "no"});
                        }},
                       {"connect_timeout",
                        [&](const toml::node& v) {
                          s.ssh.connect_timeout = get_duration(v, "connect_timeout");
                        }},
                   });
           }},
          {"sync",
           [&](const toml::node& n) {
             s.sync.enabled = true;
             visit(as_table(n, "sync"), "sync",
                   {
                       {"enabled", [&](const toml::node& v) { s.sync.enabled = get_bool(v, "enabled"); }},
                       {"src",
                        [&](const toml::node& v) {
                          s.sync.src = resolve_path(get_string(v, "src"), base_dir);
                        }},
                       {"remote_dir",
                        [&](const toml::node& v) {
                          s.sync.remote_dir = get_string(v, "remote_dir");
                          if (s.sync.remote_dir.empty() ||
                              (s.sync.remote_dir[0] != '/' && s.sync.remote_dir.rfind("~/", 0) != 0))
                            fail(v.source(),
                                 "'remote_dir' is '" + s.sync.remote_dir + "', not a path on the hosts",
                                 "give an absolute path, or one below the home folder like \"~/work/job\"");
                        }},
                       {"exclude", [&](const toml::node& v) { s.sync.exclude = get_strings(v, "exclude"); }},
                       {"pull", [&](const toml::node& v) { s.sync.pull = get_strings(v, "pull"); }},
                       {"pull_from",
                        [&](const toml::node& v) {
                          s.sync.pull_from = get_choice(v, "pull_from", {"all", "rank0"});
                        }},
                       {"files",
                        [&](const toml::node& v) {
                          auto arr = v.as_array();
                          if (!arr)
                            fail(v.source(),
                                 "'files' must be an array of tables ([[sync.files]]), not " + type_of(v));
                          s.sync.files.clear();
                          for (const auto& item : *arr) {
                            SyncSection::File f;
                            f.origin = where(item.source());
                            visit(as_table(item, "sync.files"), "sync.files",
                                  {
                                      {"src",
                                       [&](const toml::node& x) {
                                         f.src = resolve_path(get_string(x, "src"), base_dir);
                                       }},
                                      {"dst", [&](const toml::node& x) { f.dst = get_string(x, "dst"); }},
                                  });
                            if (f.src.empty())
                              fail(item.source(), "[[sync.files]] needs 'src'",
                                   "name a local file or folder");
                            if (f.dst.empty()) f.dst = fs::path(f.src).filename().string();
                            fs::path d = fs::path(f.dst).lexically_normal();
                            if (d.is_absolute() || f.dst[0] == '~' || (!d.empty() && *d.begin() == ".."))
                              fail(item.source(),
                                   "[[sync.files]] dst '" + f.dst + "' is outside the synced folder",
                                   "give a path relative to the synced folder (remote_dir), like "
                                   "\"data/train.bin\"");
                            f.dst = d.string();
                            s.sync.files.push_back(std::move(f));
                          }
                        }},
                   });
           }},
          {"setup",
           [&](const toml::node& n) {
             visit(as_table(n, "setup"), "setup",
                   {
                       {"command", [&](const toml::node& v) { s.setup.command = get_string(v, "command"); }},
                       {"when",
                        [&](const toml::node& v) {
                          s.setup.mode = get_choice(v, "when", {"auto", "always", "never"});
                        }},
                       {"inputs", [&](const toml::node& v) { s.setup.inputs = get_strings(v, "inputs"); }},
                   });
           }},
          {"k8s",
           [&](const toml::node& n) {
             s.k8s.present = true;
             visit(
                 as_table(n, "k8s"), "k8s",
                 {
                     {"image",
                      [&](const toml::node& v) {
                        s.k8s.image = get_string(v, "image");
                        if (s.k8s.image.empty() || s.k8s.image.find_first_of(" \t\n") != std::string::npos)
                          fail(v.source(),
                               "'image' is '" + text::excerpt(s.k8s.image) + "', not an image name",
                               "give the image the pods run, like \"ghcr.io/acme/train:1.4\"");
                      }},
                     {"namespace",
                      [&](const toml::node& v) {
                        s.k8s.namespace_name = get_string(v, "namespace");
                        if (!is_dns_label(s.k8s.namespace_name))
                          fail(v.source(),
                               "'namespace' is '" + text::excerpt(s.k8s.namespace_name) +
                                   "', not a Kubernetes namespace name",
                               "lowercase letters, digits and '-', at most 63, starting and ending with a "
                               "letter or digit");
                      }},
                     {"nodes",
                      [&](const toml::node& v) { s.k8s.nodes = int(get_int(v, "nodes", 1, kMaxHosts)); }},
                     {"gpus_per_pod",
                      [&](const toml::node& v) {
                        s.k8s.gpus_per_pod = int(get_int(v, "gpus_per_pod", 0, 1024));
                      }},
                     {"cpu", [&](const toml::node& v) { s.k8s.cpu = get_quantity(v, "cpu", "16"); }},
                     {"memory",
                      [&](const toml::node& v) { s.k8s.memory = get_quantity(v, "memory", "64Gi"); }},
                     {"service_account",
                      [&](const toml::node& v) {
                        s.k8s.service_account = get_string(v, "service_account");
                        if (s.k8s.service_account.empty())
                          fail(v.source(), "'service_account' is empty",
                               "name a service account, or remove it");
                        if (!is_dns_subdomain(s.k8s.service_account))
                          fail(v.source(),
                               "'service_account' is '" + text::excerpt(s.k8s.service_account) +
                                   "', not a Kubernetes service account name",
                               "lowercase letters, digits, '-' and '.', starting and ending with a letter or "
                               "digit (kubectl get serviceaccounts lists them)");
                      }},
                     {"node_selector",
                      [&](const toml::node& v) {
                        for (const auto& [key, val] : as_table(v, "k8s.node_selector")) {
                          std::string k(key.str());
                          if (k.empty()) fail(key.source(), "a node_selector label is empty");
                          if (!is_label_key(k))
                            fail(key.source(),
                                 "node_selector '" + text::excerpt(k) + "' is not a Kubernetes label key",
                                 "an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' "
                                 "or '.', starting and ending with a letter or digit (like "
                                 "\"nvidia.com/gpu.product\")");
                          auto str = val.as_string();
                          if (!str)
                            fail(val.source(),
                                 "node_selector '" + text::excerpt(k) + "' must be a string, not " +
                                     type_of(val),
                                 "label values are strings: quote it");
                          if (!str->get().empty() && !is_label_word(str->get()))
                            fail(val.source(),
                                 "node_selector '" + text::excerpt(k) + "' is '" + text::excerpt(str->get()) +
                                     "', not a Kubernetes label value",
                                 "at most 63 letters, digits, '-', '_' or '.', starting and ending with a "
                                 "letter or digit (kubectl get nodes --show-labels lists them)");
                          set_pair(s.k8s.node_selector, k, str->get());
                        }
                      }},
                     {"env",
                      [&](const toml::node& v) {
                        for (const auto& [key, val] : as_table(v, "k8s.env")) {
                          std::string k(key.str());
                          check_env_name(k, where(key.source()));
                          set_pair(s.k8s.env, k, env_value(val, k));
                        }
                      }},
                 });
           }},
          {"logs",
           [&](const toml::node& n) {
             visit(as_table(n, "logs"), "logs",
                   {
                       {"ranks",
                        [&](const toml::node& v) {
                          if (v.is_integer())
                            s.logs.ranks = std::to_string(get_int(v, "ranks", 0, 1 << 20));
                          else if (auto a = v.as_array()) {
                            std::vector<std::string> parts;
                            for (const auto& e : *a)
                              parts.push_back(std::to_string(get_int(e, "ranks", 0, 1 << 20)));
                            s.logs.ranks = text::join(parts, ",");
                          } else {
                            s.logs.ranks = get_string(v, "ranks");
                            if (!s.logs.ranks.empty() && !text::parse_int_list(s.logs.ranks))
                              fail(v.source(), "'ranks' is '" + s.logs.ranks + "', not a rank list",
                                   "write ranks like \"0,3-5\"");
                          }
                        }},
                       {"prefix",
                        [&](const toml::node& v) {
                          if (auto b = v.as_boolean())
                            s.logs.prefix = b->get() ? "auto" : "";
                          else
                            s.logs.prefix = get_string(v, "prefix");
                          check_prefix(v.source(), s.logs.prefix);
                        }},
                       {"timestamps",
                        [&](const toml::node& v) { s.logs.timestamps = get_bool(v, "timestamps"); }},
                   });
           }},
      });
}

toml::table parse_text(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::string desc(e.description());
    throw Error(where(e.source()) + ": " + desc, "fix the TOML syntax at that spot");
  }
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
  toml::table t = parse_text(p->text, p->origin);
  std::string dir =
      p->origin.rfind("built-in:", 0) == 0 ? base_dir : fs::path(p->origin).parent_path().string();
  apply(t, s, dir, /*is_profile=*/true);
}

}  // namespace

// A job name made from a file name or a command the user typed: anything a name may not hold
// becomes '-' (once per run of them), so "my job.toml" is my-job and 'echo hi there' is echo.
std::string derived_name(const std::string& from) {
  std::string out;
  for (char c : from) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (ok)
      out += c;
    else if (!out.empty() && out.back() != '-')
      out += '-';
  }
  while (!out.empty() && (out.back() == '-' || out.back() == '.')) out.pop_back();
  while (!out.empty() && out.front() == '.') out.erase(0, 1);
  if (out.size() > 64) out.resize(64);
  return out.empty() ? "job" : out;
}

const std::vector<std::string>& prefix_placeholders() {
  static const std::vector<std::string> kNames = {"rank", "host", "local_rank", "node"};
  return kNames;
}

void check_env_name(const std::string& k, const std::string& origin) {
  if (!valid_env_name(k))
    throw Error(origin + ": '" + k + "' is not a valid environment variable name",
                "use letters, digits and '_', not starting with a digit");
  for (const auto& r : kReservedEnv)
    if (r == k)
      throw Error(origin + ": env '" + k + "' is set by mltrain for every rank and cannot be overridden",
                  "remove it; see docs/spec.md, Rank environment");
}

JobSpec load_file(const std::string& path) {
  std::string text = read_file(path);
  toml::table root = parse_text(text, path);
  std::string base_dir = fs::absolute(path).parent_path().string();

  JobSpec s;
  // The profile goes under the spec: apply it first, then the spec over it.
  if (auto p = root.get("profile")) {
    s.profile = get_string(*p, "profile");
    apply_profile(s, base_dir, where(p->source()));
  }
  apply(root, s, base_dir, /*is_profile=*/false);
  s.source = path;
  if (s.name.empty()) s.name = derived_name(fs::path(path).stem().string());
  return s;
}

JobSpec from_command(std::vector<std::string> argv, const std::string& profile) {
  JobSpec s;
  if (!profile.empty()) {
    s.profile = profile;
    apply_profile(s, fs::current_path().string(), "--profile");
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

void check(const JobSpec& s) {
  std::string file = s.source.empty() ? std::string("command line") : s.source;
  if (!s.run.command && s.run.argv.empty())
    throw Error(file + ": nothing to run", "set [run] command or [run] argv, or give a command after '--'");
  if (s.run.command && s.run.command->empty())
    throw Error(s.origin("run.command", file) + ": [run] command is empty", "give a shell command");
  if (!s.cluster.include.empty() && !s.cluster.exclude.empty())
    throw Error(s.origin("cluster.include", file) + ": include and exclude (" +
                    s.origin("cluster.exclude", file) + ") cannot both be set",
                "keep one of them");
  // Bounds: past these a value is a typo or an attack, and some would overflow a clock.
  auto at_most = [&](Duration d, Duration max, const char* key, const char* what) {
    if (d > max)
      throw Error(s.origin(key, file) + ": " + what + " " + text::format_duration(d) +
                      " is longer than the " + text::format_duration(max) + " mltrain supports",
                  "give a shorter duration");
  };
  at_most(s.run.timeout, std::chrono::hours(24 * 365), "run.timeout", "[run] timeout");
  at_most(s.run.grace_period, std::chrono::hours(24), "run.grace_period", "[run] grace_period");
  at_most(s.ssh.connect_timeout, std::chrono::hours(1), "ssh.connect_timeout", "[ssh] connect_timeout");
  if (s.cluster.nprocs > kMaxRanks || s.cluster.procs_per_host > kMaxRanks)
    throw Error(s.origin(s.cluster.nprocs > kMaxRanks ? "cluster.nprocs" : "cluster.procs_per_host", file) +
                    ": more than " + std::to_string(kMaxRanks) + " ranks; mltrain runs at most that many",
                "lower nprocs / procs_per_host");
  if (s.gpus.per_proc > 0 && s.gpus.procs_per_gpu > 0)
    throw Error(s.origin("gpus.per_proc", file) + ": [gpus] per_proc and procs_per_gpu cannot both be set",
                "per_proc gives each rank N GPUs; procs_per_gpu shares one GPU among N ranks");
  if (s.comm.backend == "nccl" && s.gpus.procs_per_gpu > 1)
    throw Error(
        s.origin("gpus.procs_per_gpu", file) +
            ": [gpus] procs_per_gpu = " + std::to_string(s.gpus.procs_per_gpu) +
            " shares a GPU between ranks, but [comm] backend = \"nccl\" (" + s.origin("comm.backend", file) +
            ") cannot: NCCL refuses two ranks of one communicator on one GPU (\"Duplicate GPU detected\")",
        "give each rank its own GPU (procs_per_gpu = 1, or per_proc), or set backend = \"auto\" or \"tcp\"");
  if (s.ps.present && s.comm.mode == "allreduce")  // [ps] in a profile, mode in the spec (or the reverse)
    throw Error(s.origin("comm.mode", file) + ": [comm] mode = \"allreduce\" contradicts the [ps] table at " +
                    s.origin("ps", file),
                "a [ps] table makes the job parameter-server mode: remove mode, or remove [ps] to train with "
                "allreduce");
  if (s.ps.servers_per_host > 0 && s.comm.num_servers > 0)
    throw Error(s.origin("ps.servers_per_host", file) + ": [ps] servers_per_host and [comm] num_servers (" +
                    s.origin("comm.num_servers", file) + ") cannot both be set",
                "servers_per_host runs that many servers on each server host; num_servers is a total spread "
                "over them: keep one");
  if (s.comm.mode == "ps" && s.ps.sync && !s.ps.optimizer.name.empty()) {
    std::string sync_at =
        s.origins.count("ps.sync") ? " (" + s.origin("ps.sync", file) + ")" : " (the default)";
    throw Error(s.origin("ps.optimizer", file) +
                    ": [ps.optimizer] is for asynchronous training, but [ps] sync is true" + sync_at,
                "set sync = false in [ps] (each push is then applied at once by the server's optimizer), or "
                "remove [ps.optimizer]: in sync mode the workers step their own optimizer");
  }
  if (!s.setup.command.empty() && s.setup.command.find_first_not_of(" \t\n") == std::string::npos)
    throw Error(s.origin("setup.command", file) + ": [setup] command is empty",
                "give a shell command, or remove [setup]");
  for (const auto& n : s.name)
    if (!(std::isalnum(static_cast<unsigned char>(n)) || n == '-' || n == '_' || n == '.'))
      throw Error(
          s.origin("name", file) + ": name '" + s.name + "' may hold only letters, digits, '-', '_' and '.'",
          "rename the job");
}

std::string to_toml(const JobSpec& s) {
  toml::table root;
  root.insert("name", s.name);
  if (!s.profile.empty()) root.insert("profile", s.profile);
  toml::table run;
  if (s.run.command)
    run.insert("command", *s.run.command);
  else {
    toml::array a;
    for (const auto& x : s.run.argv) a.push_back(x);
    run.insert("argv", a);
  }
  if (!s.run.workdir.empty()) run.insert("workdir", s.run.workdir);
  toml::table env;
  for (const auto& [k, v] : s.run.env) env.insert(k, v);
  run.insert("env", env);
  toml::array fwd;
  for (const auto& g : s.run.forward_env) fwd.push_back(g);
  run.insert("forward_env", fwd);
  run.insert("max_restarts", s.run.max_restarts);
  run.insert("timeout", text::format_duration(s.run.timeout));
  run.insert("grace_period", text::format_duration(s.run.grace_period));
  run.insert("python_path", s.run.python_path);
  root.insert("run", run);
  toml::table cluster;
  toml::array hosts;
  for (const auto& h : s.cluster.hosts) hosts.push_back(h);
  cluster.insert("hosts", hosts);
  if (!s.cluster.hostfile.empty()) cluster.insert("hostfile", s.cluster.hostfile);
  if (s.cluster.procs_per_host) cluster.insert("procs_per_host", s.cluster.procs_per_host);
  if (s.cluster.nprocs) cluster.insert("nprocs", s.cluster.nprocs);
  if (s.cluster.oversubscribe) cluster.insert("oversubscribe", true);
  if (!s.cluster.include.empty()) cluster.insert("include", s.cluster.include);
  if (!s.cluster.exclude.empty()) cluster.insert("exclude", s.cluster.exclude);
  if (s.cluster.launcher != "auto") cluster.insert("launcher", s.cluster.launcher);
  root.insert("cluster", cluster);
  toml::table comm;
  comm.insert("mode", s.comm.mode);
  comm.insert("backend", s.comm.backend);
  if (s.comm.master_port)
    comm.insert("master_port", s.comm.master_port);
  else
    comm.insert("master_port", "auto");
  if (s.comm.num_servers) comm.insert("num_servers", s.comm.num_servers);
  root.insert("comm", comm);
  if (s.ps.present) {
    toml::table ps;
    toml::array ps_hosts;
    for (const auto& h : s.ps.hosts) ps_hosts.push_back(h);
    if (!ps_hosts.empty()) ps.insert("hosts", ps_hosts);
    if (s.ps.servers_per_host) ps.insert("servers_per_host", s.ps.servers_per_host);
    ps.insert("sync", s.ps.sync);
    ps.insert("partition_bytes", int64_t(s.ps.partition_bytes));
    if (!s.ps.optimizer.name.empty())
      ps.insert("optimizer", toml::table{{"name", s.ps.optimizer.name},
                                         {"lr", s.ps.optimizer.lr},
                                         {"momentum", s.ps.optimizer.momentum},
                                         {"weight_decay", s.ps.optimizer.weight_decay}});
    root.insert("ps", ps);
  }
  toml::table gpus;
  gpus.insert("per_proc", s.gpus.per_proc);
  gpus.insert("procs_per_gpu", s.gpus.procs_per_gpu);
  root.insert("gpus", gpus);
  toml::table logs;
  logs.insert("ranks", s.logs.ranks);
  logs.insert("prefix", s.logs.prefix);
  logs.insert("timestamps", s.logs.timestamps);
  root.insert("logs", logs);
  if (s.sync.enabled) {
    toml::table sync;
    if (!s.sync.src.empty()) sync.insert("src", s.sync.src);
    if (!s.sync.remote_dir.empty()) sync.insert("remote_dir", s.sync.remote_dir);
    toml::array ex, pull, files;
    for (const auto& e : s.sync.exclude) ex.push_back(e);
    for (const auto& e : s.sync.pull) pull.push_back(e);
    for (const auto& f : s.sync.files) files.push_back(toml::table{{"src", f.src}, {"dst", f.dst}});
    sync.insert("exclude", ex);
    if (!files.empty()) sync.insert("files", files);
    sync.insert("pull", pull);
    sync.insert("pull_from", s.sync.pull_from);
    root.insert("sync", sync);
  }
  if (!s.setup.command.empty()) {
    toml::table setup{{"command", s.setup.command}, {"when", s.setup.mode}};
    if (!s.setup.inputs.empty()) {
      toml::array inputs;
      for (const auto& i : s.setup.inputs) inputs.push_back(i);
      setup.insert("inputs", inputs);
    }
    root.insert("setup", setup);
  }
  if (s.k8s.present) {
    toml::table k8s;
    if (!s.k8s.image.empty()) k8s.insert("image", s.k8s.image);
    if (!s.k8s.namespace_name.empty()) k8s.insert("namespace", s.k8s.namespace_name);
    if (s.k8s.nodes) k8s.insert("nodes", s.k8s.nodes);
    if (s.k8s.gpus_per_pod >= 0) k8s.insert("gpus_per_pod", s.k8s.gpus_per_pod);
    if (!s.k8s.cpu.empty()) k8s.insert("cpu", s.k8s.cpu);
    if (!s.k8s.memory.empty()) k8s.insert("memory", s.k8s.memory);
    if (!s.k8s.service_account.empty()) k8s.insert("service_account", s.k8s.service_account);
    toml::table selector, k8s_env;
    for (const auto& [k, v] : s.k8s.node_selector) selector.insert(k, v);
    // A secret's value in [k8s] env never reaches a pod (export refers to a Secret instead), and
    // this text goes into run records: never write it.
    for (const auto& [k, v] : s.k8s.env) k8s_env.insert(k, secret::shown_value(k, v));
    if (!selector.empty()) k8s.insert("node_selector", selector);
    if (!k8s_env.empty()) k8s.insert("env", k8s_env);
    root.insert("k8s", k8s);
  }
  std::ostringstream os;
  os << root;
  return os.str();
}

}  // namespace mltrain::spec
