// The spec's keys, one row each (detail/schema.h), and the readers of the keys no generic type
// covers. Messages and hints are what users see: test_spec.cpp and tests/e2e/test_spec_errors.py
// hold them.
#include "runner/spec/detail/schema.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"

namespace mltrain::spec::detail {
namespace {

namespace fs = std::filesystem;

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

// A host list: one string (items as in -H) or an array of them.
std::vector<std::string> get_host_list(const Load& l, const Value& v, const std::string& key) {
  if (v.is(Value::Kind::string)) return {v.str};
  return get_strings(l, v, key);
}

void read_profile(Load& l, const Value& v) {
  if (l.is_profile) l.fail(v.at, "a profile cannot name another profile");
  l.spec.profile = get_string(l, v, "profile");
}

void read_command(Load& l, const Value& v) {
  if (v.is(Value::Kind::array))
    l.fail(v.at, "'command' must be a string, not an array",
           "a list runs the program without a shell: write argv = [...] instead");
  l.spec.run.command = get_string(l, v, "command");
  l.spec.run.argv.clear();
}

void read_argv(Load& l, const Value& v) {
  l.spec.run.argv = get_strings(l, v, "argv");
  if (l.spec.run.argv.empty()) l.fail(v.at, "'argv' is empty", "give the program and its arguments");
  l.spec.run.command.reset();
}

void write_program(const JobSpec& s, Value& run) {
  if (s.run.command) return set_field(run, "command", string_value(*s.run.command));
  std::vector<Value> argv;
  for (const auto& a : s.run.argv) argv.push_back(string_value(a));
  set_field(run, "argv", array_value(std::move(argv)));
}

// Within one document both is a contradiction; a spec over a profile may switch.
void enter_run(Load& l, const Value& run) {
  const Value* command = run.find("command");
  if (const Value* argv = run.find("argv"); command && argv)
    l.fail(argv->at, "[run] has both 'command' (at " + l.doc.where(command->at) + ") and 'argv'",
           "keep one: 'command' runs through /bin/sh -c, 'argv' runs the program directly");
}

void read_hosts(Load& l, const Value& v) {
  l.spec.cluster.hosts = get_host_list(l, v, "hosts");
  l.spec.cluster.hostfile.clear();
}

void read_spares(Load& l, const Value& v) { l.spec.cluster.spares = get_host_list(l, v, "spares"); }

void read_hostfile(Load& l, const Value& v) {
  l.spec.cluster.hostfile = l.resolve(get_string(l, v, "hostfile"));
  l.spec.cluster.hosts.clear();
}

void read_master_port(Load& l, const Value& v) {
  if (v.is(Value::Kind::string)) {
    if (v.str != "auto")
      l.fail(v.at, "'master_port' is '" + v.str + "'", "write \"auto\" or a port number 1-65535");
    l.spec.comm.master_port = 0;
  } else {
    l.spec.comm.master_port = int(get_int(l, v, "master_port", 1, 65535));
  }
}

void write_master_port(const JobSpec& s, Value& comm) {
  set_field(comm, "master_port",
            s.comm.master_port ? integer_value(s.comm.master_port) : string_value("auto"));
}

// [comm] is visited first (keys come in order); an explicit allreduce beside [ps] in one file is a
// contradiction.
void enter_ps(Load& l, const Value& ps) {
  const Value* comm = l.doc.root.find("comm");
  const Value* mode = comm ? comm->find("mode") : nullptr;
  if (mode && mode->is(Value::Kind::string) && mode->str == "allreduce")
    l.fail(mode->at, "[comm] mode = \"allreduce\" contradicts the [ps] table at " + l.doc.where(ps.at),
           "a [ps] table makes the job parameter-server mode: remove mode, or remove [ps] to train with "
           "allreduce");
  l.spec.ps.present = true;
  l.spec.comm.mode = "ps";
}

void read_ps_hosts(Load& l, const Value& v) {
  l.spec.ps.hosts = get_host_list(l, v, "hosts");
  bool blank = true;
  for (const auto& h : l.spec.ps.hosts) blank = blank && h.find_first_not_of(" \t") == std::string::npos;
  if (blank)
    l.fail(v.at, "[ps] hosts is empty",
           "name the server hosts (items as in [cluster] hosts), or leave hosts out: then the hostfile's "
           "role=server/both hosts, else every worker host, run servers");
}

void enter_optimizer(Load& l, const Value&) {
  l.spec.ps.optimizer = {};
  l.spec.ps.optimizer.name = "sgd";
}

void read_strict_host_keys(Load& l, const Value& v) {
  if (v.is(Value::Kind::boolean))
    l.spec.ssh.strict_host_keys = v.boolean ? "yes" : "no";
  else
    l.spec.ssh.strict_host_keys = get_choice(l, v, "strict_host_keys", {"yes", "accept-new", "no"});
}

void read_ranks(Load& l, const Value& v) {
  std::string& ranks = l.spec.logs.ranks;
  if (v.is(Value::Kind::integer)) {
    ranks = std::to_string(get_int(l, v, "ranks", 0, 1 << 20));
  } else if (v.is(Value::Kind::array)) {
    std::vector<std::string> parts;
    for (const auto& e : v.items) parts.push_back(std::to_string(get_int(l, e, "ranks", 0, 1 << 20)));
    ranks = text::join(parts, ",");
  } else {
    ranks = get_string(l, v, "ranks");
    if (!ranks.empty() && !text::parse_int_list(ranks))
      l.fail(v.at, "'ranks' is '" + ranks + "', not a rank list", "write ranks like \"0,3-5\"");
  }
}

// Every "{word}" of a prefix template must be a placeholder mltrain fills in.
void check_prefix(const Load& l, Pos at, const std::string& tmpl) {
  if (tmpl == "auto") return;
  const auto& known = prefix_placeholders();
  for (size_t open = tmpl.find('{'); open != std::string::npos; open = tmpl.find('{', open + 1)) {
    size_t close = tmpl.find('}', open);
    std::string word =
        tmpl.substr(open + 1, close == std::string::npos ? std::string::npos : close - open - 1);
    if (close != std::string::npos && std::find(known.begin(), known.end(), word) != known.end()) continue;
    std::vector<std::string> braced;
    for (const auto& k : known) braced.push_back("{" + k + "}");
    std::string shown = close == std::string::npos ? tmpl.substr(open) : "{" + word + "}";
    auto near = text::closest(word, known);
    for (const auto& k : known)  // {hostname} means {host}, {node_rank} means {node}
      if (!near && word.rfind(k, 0) == 0) near = k;
    l.fail(at,
           "prefix '" + tmpl + "' has an unknown placeholder '" + shown + "'" +
               (near ? " (did you mean '{" + *near + "}'?)" : ""),
           "placeholders: " + text::join(braced, " "));
  }
}

void read_prefix(Load& l, const Value& v) {
  if (v.is(Value::Kind::boolean))
    l.spec.logs.prefix = v.boolean ? "auto" : "";
  else
    l.spec.logs.prefix = get_string(l, v, "prefix");
  check_prefix(l, v.at, l.spec.logs.prefix);
}

void enter_sync(Load& l, const Value&) { l.spec.sync.enabled = true; }

void read_remote_dir(Load& l, const Value& v) {
  std::string& dir = l.spec.sync.remote_dir;
  dir = get_string(l, v, "remote_dir");
  if (dir.empty() || (dir[0] != '/' && dir.rfind("~/", 0) != 0))
    l.fail(v.at, "'remote_dir' is '" + dir + "', not a path on the hosts",
           "give an absolute path, or one below the home folder like \"~/work/job\"");
}

SyncSection::File read_sync_file(Load& l, const Value& item) {
  SyncSection::File f;
  f.origin = l.doc.where(item.at);
  walk(l, as_table(l, item, "sync.files"), "sync.files", [&](const Key& k, const Value& x) {
    (k.name == "src" ? f.src : f.dst) = get_string(l, x, std::string(k.name));
    if (k.name == "src") f.src = l.resolve(f.src);
  });
  if (f.src.empty()) l.fail(item.at, "[[sync.files]] needs 'src'", "name a local file or folder");
  if (f.dst.empty()) f.dst = fs::path(f.src).filename().string();
  fs::path d = fs::path(f.dst).lexically_normal();
  if (d.is_absolute() || f.dst[0] == '~' || (!d.empty() && *d.begin() == ".."))
    l.fail(item.at, "[[sync.files]] dst '" + f.dst + "' is outside the synced folder",
           "give a path relative to the synced folder (remote_dir), like \"data/train.bin\"");
  f.dst = d.string();
  return f;
}

void read_sync_files(Load& l, const Value& v) {
  if (!v.is(Value::Kind::array))
    l.fail(v.at, "'files' must be an array of tables ([[sync.files]]), not " + type_of(v));
  l.spec.sync.files.clear();
  for (const auto& item : v.items) l.spec.sync.files.push_back(read_sync_file(l, item));
}

void write_sync_files(const JobSpec& s, Value& sync) {
  if (s.sync.files.empty()) return;
  std::vector<Value> files;
  for (const auto& f : s.sync.files) {
    Value t = table_value();
    set_field(t, "src", string_value(f.src));
    set_field(t, "dst", string_value(f.dst));
    files.push_back(std::move(t));
  }
  set_field(sync, "files", array_value(std::move(files)));
}

void enter_k8s(Load& l, const Value&) { l.spec.k8s.present = true; }

void read_image(Load& l, const Value& v) {
  std::string& image = l.spec.k8s.image;
  image = get_string(l, v, "image");
  if (image.empty() || image.find_first_of(" \t\n") != std::string::npos)
    l.fail(v.at, "'image' is '" + text::excerpt(image) + "', not an image name",
           "give the image the pods run, like \"ghcr.io/acme/train:1.4\"");
}

void read_namespace(Load& l, const Value& v) {
  std::string& name = l.spec.k8s.namespace_name;
  name = get_string(l, v, "namespace");
  if (!is_dns_label(name))
    l.fail(v.at, "'namespace' is '" + text::excerpt(name) + "', not a Kubernetes namespace name",
           "lowercase letters, digits and '-', at most 63, starting and ending with a letter or digit");
}

void read_service_account(Load& l, const Value& v) {
  std::string& name = l.spec.k8s.service_account;
  name = get_string(l, v, "service_account");
  if (name.empty()) l.fail(v.at, "'service_account' is empty", "name a service account, or remove it");
  if (!is_dns_subdomain(name))
    l.fail(v.at, "'service_account' is '" + text::excerpt(name) + "', not a Kubernetes service account name",
           "lowercase letters, digits, '-' and '.', starting and ending with a letter or digit (kubectl get "
           "serviceaccounts lists them)");
}

// [k8s] cpu or memory: a quantity string, or (cpu only) a number of cores.
std::string get_quantity(const Load& l, const Value& v, const std::string& key, const std::string& example) {
  std::string q;
  if (v.is(Value::Kind::integer)) {
    if (key == "memory")
      l.fail(v.at, "'memory' is " + std::to_string(v.integer) + ", a number of bytes",
             "write a quantity with its unit, like \"" + example + "\"");
    q = std::to_string(v.integer);
  } else if (v.is(Value::Kind::floating)) {
    std::ostringstream os;
    os << v.floating;
    q = os.str();
  } else {
    q = get_string(l, v, key);
  }
  if (!is_quantity(q))
    l.fail(v.at, "'" + key + "' is '" + text::excerpt(q) + "', not a Kubernetes quantity",
           "write it like \"" + example + "\" (suffixes: m, k, M, G, Ki, Mi, Gi, Ti)");
  // Kubernetes takes "100m" of memory as a tenth of a byte: a mebibyte typo.
  const char unit = q.back();
  if (key == "memory" && (unit == 'm' || unit == 'u' || unit == 'n'))
    l.fail(v.at,
           "'memory' is '" + q + "': '" + unit + "' means " +
               (unit == 'm'   ? "thousandths"
                : unit == 'u' ? "millionths"
                              : "billionths") +
               " of a byte to Kubernetes",
           "write mebibytes as \"" + q.substr(0, q.size() - 1) + "Mi\" (or gibibytes as \"...Gi\")");
  return q;
}

void read_cpu(Load& l, const Value& v) { l.spec.k8s.cpu = get_quantity(l, v, "cpu", "16"); }
void read_memory(Load& l, const Value& v) { l.spec.k8s.memory = get_quantity(l, v, "memory", "64Gi"); }

void read_node_selector(Load& l, const Value& v) {
  for (const auto& [k, at, val] : as_table(l, v, "k8s.node_selector").fields) {
    if (k.empty()) l.fail(at, "a node_selector label is empty");
    if (!is_label_key(k))
      l.fail(at, "node_selector '" + text::excerpt(k) + "' is not a Kubernetes label key",
             "an optional DNS prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and "
             "ending with a letter or digit (like \"nvidia.com/gpu.product\")");
    if (!val.is(Value::Kind::string))
      l.fail(val.at, "node_selector '" + text::excerpt(k) + "' must be a string, not " + type_of(val),
             "label values are strings: quote it");
    if (!val.str.empty() && !is_label_word(val.str))
      l.fail(
          val.at,
          "node_selector '" + text::excerpt(k) + "' is '" + text::excerpt(val.str) +
              "', not a Kubernetes label value",
          "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (kubectl "
          "get nodes --show-labels lists them)");
    set_pair(l.spec.k8s.node_selector, k, val.str);
  }
}

// A secret's value in [k8s] env never reaches a pod (export refers to a Secret instead), and this
// text goes into run records: never write it.
void write_k8s_env(const JobSpec& s, Value& k8s) {
  if (s.k8s.env.empty()) return;
  Value env = table_value();
  for (const auto& [k, v] : s.k8s.env) set_field(env, k, string_value(secret::shown_value(k, v)));
  set_field(k8s, "env", std::move(env));
}

bool ps_written(const JobSpec& s) { return s.ps.present; }
bool optimizer_written(const JobSpec& s) { return !s.ps.optimizer.name.empty(); }
bool never_written(const JobSpec&) { return false; }
bool sync_written(const JobSpec& s) { return s.sync.enabled; }
bool setup_written(const JobSpec& s) { return !s.setup.command.empty(); }
bool k8s_written(const JobSpec& s) { return s.k8s.present; }
bool metrics_written(const JobSpec& s) { return !s.metrics.patterns.empty(); }

// [sweep]: a trial's spec is written without it (it is the sweep's, not the run's).
void enter_sweep(Load& l, const Value&) { l.spec.sweep.present = true; }

std::string sweep_param_name(const Load& l, const std::string& name, Pos at) {
  bool ok = !name.empty() && name.size() <= 64 &&
            (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_');
  for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  if (!ok)
    l.fail(at, "'" + name + "' is not a parameter name",
           "letters, digits and '_', as {name} is written in the command");
  return name;
}

// A parameter's value as it is substituted: a string as written, a number as TOML would write it.
std::string sweep_value_text(const Load& l, const Value& v, const std::string& name) {
  if (v.is(Value::Kind::string)) return v.str;
  if (v.is(Value::Kind::integer)) return std::to_string(v.integer);
  if (v.is(Value::Kind::boolean)) return v.boolean ? "true" : "false";
  if (v.is(Value::Kind::floating) && std::isfinite(v.floating)) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v.floating);
    std::string t(buf, r.ptr);
    return t;
  }
  l.fail(v.at, "'" + name + "' takes strings, numbers or booleans, not " + type_of(v));
}

void read_sweep_grid(Load& l, const Value& v) {
  const Value& t = as_table(l, v, "sweep.grid");
  l.spec.sweep.grid.clear();
  for (const auto& f : t.fields) {
    const std::string name = sweep_param_name(l, f.key, f.at);
    if (!f.value.is(Value::Kind::array) || f.value.items.empty())
      l.fail(f.value.at, "[sweep.grid] '" + name + "' must be a non-empty array of values",
             "as in lr = [0.1, 0.01, 0.001]");
    std::vector<std::string> values;
    for (const auto& item : f.value.items) values.push_back(sweep_value_text(l, item, name));
    l.spec.sweep.grid.emplace_back(name, std::move(values));
  }
}

void read_sweep_random(Load& l, const Value& v) {
  const Value& t = as_table(l, v, "sweep.random");
  l.spec.sweep.random.clear();
  for (const auto& f : t.fields) {
    SweepRange r;
    r.name = sweep_param_name(l, f.key, f.at);
    const Value& range = f.value;
    if (!range.is(Value::Kind::table))
      l.fail(range.at, "[sweep.random] '" + r.name + "' must be a table",
             "as in lr = { min = 1e-4, max = 0.1, log = true }");
    bool has_min = false, has_max = false;
    for (const auto& g : range.fields) {
      if (g.key == "min")
        r.min = get_number(l, g.value, "min"), has_min = true;
      else if (g.key == "max")
        r.max = get_number(l, g.value, "max"), has_max = true;
      else if (g.key == "log")
        r.log = get_bool(l, g.value, "log");
      else if (g.key == "int")
        r.integer = get_bool(l, g.value, "int");
      else
        l.fail(g.at, "unknown key '" + g.key + "' in [sweep.random] '" + r.name + "'", "min, max, log, int");
    }
    if (!has_min || !has_max || !(r.min < r.max))
      l.fail(range.at, "[sweep.random] '" + r.name + "' needs min < max",
             "as in lr = { min = 1e-4, max = 0.1 }");
    if (r.log && r.min <= 0) l.fail(range.at, "[sweep.random] '" + r.name + "': log needs min > 0");
    l.spec.sweep.random.push_back(r);
  }
}

void read_sweep_list(Load& l, const Value& v) {
  if (!v.is(Value::Kind::array))
    l.fail(v.at, "'list' must be an array of tables ([[sweep.list]]), not " + type_of(v));
  l.spec.sweep.list.clear();
  for (const auto& item : v.items) {
    const Value& t = as_table(l, item, "sweep.list");
    std::vector<std::pair<std::string, std::string>> trial;
    for (const auto& f : t.fields)
      trial.emplace_back(sweep_param_name(l, f.key, f.at), sweep_value_text(l, f.value, f.key));
    if (trial.empty()) l.fail(item.at, "a [[sweep.list]] table is empty", "give each trial's parameters");
    l.spec.sweep.list.push_back(std::move(trial));
  }
}

// One pattern or an array of them, each checked where it is written.
void read_metric_patterns(Load& l, const Value& v) {
  std::vector<const Value*> items;
  if (v.is(Value::Kind::array))
    for (const auto& item : v.items) items.push_back(&item);
  else
    items.push_back(&v);
  std::vector<std::string> patterns;
  for (const Value* item : items) {
    std::string p = get_string(l, *item, "pattern"), error;
    std::vector<std::string> groups;
    if (metric_regex(p, groups, error).empty())
      l.fail(item->at, "[metrics] pattern '" + p + "': " + error,
             "Python's syntax: 'loss=(?P<loss>[-0-9.e+]+)'; a group named step is the step");
    patterns.push_back(std::move(p));
  }
  l.spec.metrics.patterns = std::move(patterns);
}

void write_metric_patterns(const JobSpec& s, Value& metrics) {
  const auto& p = s.metrics.patterns;
  if (p.size() == 1) return set_field(metrics, "pattern", string_value(p[0]));
  std::vector<Value> items;
  for (const auto& one : p) items.push_back(string_value(one));
  set_field(metrics, "pattern", array_value(std::move(items)));
}

bool record_written(const JobSpec& s) {
  const RecordSection fresh;
  return s.record.code != fresh.code || s.record.code_max != fresh.code_max;
}

using S = JobSpec;
constexpr auto kYear = std::chrono::hours(24 * 365);

std::vector<Key> top_keys() {
  return {
      {.name = "name",
       .type = Type::string,
       .member = member<&S::name>(),
       .doc = "the job's name in run ids and records; default: the file's name, made valid"},
      {.name = "profile",
       .type = Type::custom,
       .member = member<&S::profile>(),
       .doc = "a profile merged under this spec (see Profiles)",
       .emit = Emit::unless_default,
       .shown = "string",
       .read = read_profile},
  };
}

std::vector<Key> run_keys() {
  return {
      {.name = "run", .type = Type::section, .doc = "what each rank runs", .read = enter_run},
      {.section = "run",
       .name = "command",
       .type = Type::custom,
       .member = member<&S::run, &RunSection::command>(),
       .doc = "a shell command, run by /bin/sh -c",
       .emit = Emit::custom,
       .shown = "string",
       .read = read_command,
       .write = write_program},
      {.section = "run",
       .name = "argv",
       .type = Type::custom,
       .member = member<&S::run, &RunSection::argv>(),
       .doc = "or the program and its arguments, run directly (no shell)",
       .emit = Emit::never,
       .shown = "array of strings, not empty",
       .read = read_argv},
      {.section = "run",
       .name = "workdir",
       .type = Type::path,
       .member = member<&S::run, &RunSection::workdir>(),
       .doc = "the ranks' working folder; default: where mltrain runs (with [sync]: the synced folder)",
       .emit = Emit::unless_default},
      {.section = "run",
       .name = "env",
       .type = Type::env,
       .member = member<&S::run, &RunSection::env>(),
       .doc = "variables for every rank: strings, numbers, booleans (true: \"1\")"},
      {.section = "run",
       .name = "forward_env",
       .type = Type::strings,
       .member = member<&S::run, &RunSection::forward_env>(),
       .doc = "globs over the launcher's own environment"},
      {.section = "run",
       .name = "max_restarts",
       .type = Type::integer,
       .member = member<&S::run, &RunSection::max_restarts>(),
       .doc = "restart the whole gang up to this many times after a failure",
       .lo = 0,
       .hi = 1000},
      {.section = "run",
       .name = "timeout",
       .type = Type::duration,
       .member = member<&S::run, &RunSection::timeout>(),
       .doc = "stop the job after this long (exit 124); 0: none",
       .max_duration = kYear},
      {.section = "run",
       .name = "grace_period",
       .type = Type::duration,
       .member = member<&S::run, &RunSection::grace_period>(),
       .doc = "SIGTERM, then SIGKILL after this long",
       .max_duration = std::chrono::hours(24)},
      {.section = "run",
       .name = "python_path",
       .type = Type::boolean,
       .member = member<&S::run, &RunSection::python_path>(),
       .doc = "the delivered `mltrain` package first on PYTHONPATH (docs/python.md)"},
  };
}

std::vector<Key> cluster_keys() {
  return {
      {.name = "cluster", .type = Type::section, .doc = "the hosts and how many ranks each runs"},
      {.section = "cluster",
       .name = "hosts",
       .type = Type::custom,
       .member = member<&S::cluster, &ClusterSection::hosts>(),
       .doc = "host-list items, as in -H (docs/hostfile.md); replaces hostfile",
       .emit = Emit::unless_default,  // none is this machine; an empty list is refused on load
       .shown = "string or array of strings",
       .read = read_hosts},
      {.section = "cluster",
       .name = "hostfile",
       .type = Type::custom,
       .member = member<&S::cluster, &ClusterSection::hostfile>(),
       .doc = "a hostfile, relative to the spec; replaces hosts",
       .emit = Emit::unless_default,
       .shown = "path",
       .read = read_hostfile},
      {.section = "cluster",
       .name = "procs_per_host",
       .type = Type::integer,
       .member = member<&S::cluster, &ClusterSection::procs_per_host>(),
       .doc = "ranks on each host; default: each host's slots (1 when none)",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = 4096},
      {.section = "cluster",
       .name = "nprocs",
       .type = Type::integer,
       .member = member<&S::cluster, &ClusterSection::nprocs>(),
       .doc = "total ranks (-n), filled host by host, at most the slots",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = 1 << 20},
      {.section = "cluster",
       .name = "oversubscribe",
       .type = Type::boolean,
       .member = member<&S::cluster, &ClusterSection::oversubscribe>(),
       .doc = "allow nprocs above the slots (--oversubscribe)",
       .emit = Emit::unless_default},
      {.section = "cluster",
       .name = "include",
       .type = Type::string,
       .member = member<&S::cluster, &ClusterSection::include>(),
       .doc = "DeepSpeed-style filter: only these hosts (and slots)",
       .emit = Emit::unless_default},
      {.section = "cluster",
       .name = "exclude",
       .type = Type::string,
       .member = member<&S::cluster, &ClusterSection::exclude>(),
       .doc = "DeepSpeed-style filter: not these hosts (or slots)",
       .emit = Emit::unless_default},
      {.section = "cluster",
       .name = "launcher",
       .type = Type::choice,
       .member = member<&S::cluster, &ClusterSection::launcher>(),
       .doc = "how agents start: ssh, slurm (srun steps), or auto (slurm inside an allocation)",
       .emit = Emit::unless_default,
       .choices = {"auto", "ssh", "slurm"}},
      {.section = "cluster",
       .name = "exclusive",
       .type = Type::boolean,
       .member = member<&S::cluster, &ClusterSection::exclusive>(),
       .doc = "the hosts to this job alone: no other mltrain job runs on them meanwhile (docs/sharing.md)",
       .emit = Emit::unless_default},
      {.section = "cluster",
       .name = "queue",
       .type = Type::boolean,
       .member = member<&S::cluster, &ClusterSection::queue>(),
       .doc = "wait in the hosts' queue for free GPUs (--queue) instead of failing (docs/sharing.md)",
       .emit = Emit::unless_default},
      {.section = "cluster",
       .name = "queue_timeout",
       .type = Type::duration,
       .member = member<&S::cluster, &ClusterSection::queue_timeout>(),
       .doc = "give up a place in the queue after waiting this long (exit 75, nothing claimed); 0: none",
       .emit = Emit::unless_default,
       .max_duration = kYear},
      {.section = "cluster",
       .name = "min_hosts",
       .type = Type::integer,
       .member = member<&S::cluster, &ClusterSection::min_hosts>(),
       .doc = "elastic: a restart goes on without lost hosts while this many remain (docs/elastic.md)",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = spec::kMaxHosts},
      {.section = "cluster",
       .name = "spares",
       .type = Type::custom,
       .member = member<&S::cluster, &ClusterSection::spares>(),
       .doc = "hosts that take a lost host's place at a restart, items as in hosts (docs/elastic.md)",
       .emit = Emit::unless_default,
       .shown = "string or array of strings",
       .read = read_spares},
  };
}

std::vector<Key> comm_keys() {
  return {
      {.name = "comm", .type = Type::section, .doc = "how the ranks communicate"},
      {.section = "comm",
       .name = "mode",
       .type = Type::choice,
       .member = member<&S::comm, &CommSection::mode>(),
       .doc = "a [ps] table makes it ps",
       .choices = {"allreduce", "ps"}},
      {.section = "comm",
       .name = "backend",
       .type = Type::choice,
       .member = member<&S::comm, &CommSection::backend>(),
       .doc = "the comm library's backend",
       .choices = {"auto", "tcp", "nccl"}},
      {.section = "comm",
       .name = "master_port",
       .type = Type::custom,
       .member = member<&S::comm, &CommSection::master_port>(),
       .doc = "MASTER_PORT; auto: a free port",
       .emit = Emit::custom,
       .shown = "\"auto\" or 1-65535",
       .read = read_master_port,
       .write = write_master_port},
      {.section = "comm",
       .name = "num_servers",
       .type = Type::integer,
       .member = member<&S::comm, &CommSection::num_servers>(),
       .doc = "ps mode: servers in all, spread over the server hosts",
       .emit = Emit::unless_default,
       .lo = 0,
       .hi = 4096},
  };
}

std::vector<Key> ps_keys() {
  return {
      {.name = "ps",
       .type = Type::section,
       .doc = "parameter-server mode (see Parameter-server mode)",
       .read = enter_ps,
       .written = ps_written},
      {.section = "ps",
       .name = "hosts",
       .type = Type::custom,
       .member = member<&S::ps, &PsSection::hosts>(),
       .doc = "server hosts, items as in [cluster] hosts; default: role=server/both hosts, else every worker "
              "host",
       .emit = Emit::unless_default,
       .shown = "string or array of strings, not empty",
       .read = read_ps_hosts},
      {.section = "ps",
       .name = "servers_per_host",
       .type = Type::integer,
       .member = member<&S::ps, &PsSection::servers_per_host>(),
       .doc = "servers on each server host (default 1)",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = kMaxServersPerHost},
      {.section = "ps",
       .name = "sync",
       .type = Type::boolean,
       .member = member<&S::ps, &PsSection::sync>(),
       .doc = "false: asynchronous, each push applied at once by the server's optimizer"},
      {.section = "ps",
       .name = "partition_bytes",
       .type = Type::size,
       .member = member<&S::ps, &PsSection::partition_bytes>(),
       .doc = "a tensor larger than this is split across servers",
       .hi = int64_t(kMaxPartitionBytes),
       .range_hint = "1 GiB"},
      {.section = "ps",
       .name = "optimizer",
       .type = Type::section,
       .doc = "async only: the servers' optimizer",
       .read = enter_optimizer,
       .written = optimizer_written},
      {.section = "ps.optimizer",
       .name = "name",
       .type = Type::choice,
       .member = member<&S::ps, &PsSection::optimizer, &PsSection::Optimizer::name>(),
       .doc = "the only one",
       .choices = {"sgd"}},
      {.section = "ps.optimizer",
       .name = "lr",
       .type = Type::number,
       .member = member<&S::ps, &PsSection::optimizer, &PsSection::Optimizer::lr>(),
       .doc = "the learning rate",
       .range_hint = "give a learning rate above 0, like 0.01",
       .min = 0,
       .min_open = true},
      {.section = "ps.optimizer",
       .name = "momentum",
       .type = Type::number,
       .member = member<&S::ps, &PsSection::optimizer, &PsSection::Optimizer::momentum>(),
       .doc = "0: none",
       .range_hint = "use a value from 0 up to, not including, 1 (0: none)",
       .min = 0,
       .max = 1,
       .max_open = true},
      {.section = "ps.optimizer",
       .name = "weight_decay",
       .type = Type::number,
       .member = member<&S::ps, &PsSection::optimizer, &PsSection::Optimizer::weight_decay>(),
       .doc = "0: none",
       .range_hint = "use 0 (none) or a positive value",
       .min = 0},
  };
}

std::vector<Key> gpus_ssh_logs_keys() {
  return {
      {.name = "gpus", .type = Type::section, .doc = "GPUs per rank (see GPUs)"},
      {.section = "gpus",
       .name = "per_proc",
       .type = Type::integer,
       .member = member<&S::gpus, &GpuSection::per_proc>(),
       .doc = "each rank gets this many GPUs",
       .lo = 0,
       .hi = 64},
      {.section = "gpus",
       .name = "procs_per_gpu",
       .type = Type::integer,
       .member = member<&S::gpus, &GpuSection::procs_per_gpu>(),
       .doc = "or: this many ranks share one GPU",
       .lo = 0,
       .hi = 256},
      {.name = "ssh",
       .type = Type::section,
       .doc = "how hosts are reached (over the ssh config)",
       .written = never_written},
      {.section = "ssh",
       .name = "config",
       .type = Type::path,
       .member = member<&S::ssh, &SshSection::config>(),
       .doc = "an ssh config file"},
      {.section = "ssh",
       .name = "user",
       .type = Type::string,
       .member = member<&S::ssh, &SshSection::user>(),
       .doc = "the login on every host"},
      {.section = "ssh",
       .name = "port",
       .type = Type::integer,
       .member = member<&S::ssh, &SshSection::port>(),
       .doc = "sshd's port on every host",
       .lo = 1,
       .hi = 65535},
      {.section = "ssh",
       .name = "identity_file",
       .type = Type::path,
       .member = member<&S::ssh, &SshSection::identity_file>(),
       .doc = "the private key"},
      {.section = "ssh",
       .name = "known_hosts",
       .type = Type::path,
       .member = member<&S::ssh, &SshSection::known_hosts>(),
       .doc = "the known_hosts file"},
      {.section = "ssh",
       .name = "strict_host_keys",
       .type = Type::custom,
       .member = member<&S::ssh, &SshSection::strict_host_keys>(),
       .doc = "yes, accept-new or no (true: yes, false: no)",
       .shown = "choice or boolean",
       .read = read_strict_host_keys},
      {.section = "ssh",
       .name = "connect_timeout",
       .type = Type::duration,
       .member = member<&S::ssh, &SshSection::connect_timeout>(),
       .doc = "how long a host may take to connect",
       .max_duration = std::chrono::hours(1)},
      {.name = "logs", .type = Type::section, .doc = "what the console shows"},
      {.section = "logs",
       .name = "ranks",
       .type = Type::custom,
       .member = member<&S::logs, &LogsSection::ranks>(),
       .doc = "the ranks the console shows (\"0,3-5\"); rank files get every rank",
       .shown = "rank list, rank or array of ranks",
       .read = read_ranks},
      {.section = "logs",
       .name = "prefix",
       .type = Type::custom,
       .member = member<&S::logs, &LogsSection::prefix>(),
       .doc = "auto, false for none, or a template with {rank} {host} {local_rank} {node}",
       .shown = "string or boolean",
       .read = read_prefix},
      {.section = "logs",
       .name = "timestamps",
       .type = Type::boolean,
       .member = member<&S::logs, &LogsSection::timestamps>(),
       .doc = "start console lines with the time"},
  };
}

std::vector<Key> sync_and_setup_keys() {
  return {
      {.name = "sync",
       .type = Type::section,
       .doc = "a local folder mirrored to every host first (docs/sync.md)",
       .read = enter_sync,
       .written = sync_written},
      {.section = "sync",
       .name = "enabled",
       .type = Type::boolean,
       .member = member<&S::sync, &SyncSection::enabled>(),
       .doc = "false: no sync, though the table is there",
       .emit = Emit::never},
      {.section = "sync",
       .name = "src",
       .type = Type::path,
       .member = member<&S::sync, &SyncSection::src>(),
       .doc = "the local folder; default: the spec's folder",
       .emit = Emit::unless_default},
      {.section = "sync",
       .name = "remote_dir",
       .type = Type::custom,
       .member = member<&S::sync, &SyncSection::remote_dir>(),
       .doc = "the folder on the hosts; default: `~/.cache/mltrain/work/<folder>-<key>`",
       .emit = Emit::unless_default,
       .shown = "absolute path or ~/...",
       .read = read_remote_dir},
      {.section = "sync",
       .name = "exclude",
       .type = Type::strings,
       .member = member<&S::sync, &SyncSection::exclude>(),
       .doc = "patterns, as in .gitignore"},
      {.section = "sync",
       .name = "pull",
       .type = Type::strings,
       .member = member<&S::sync, &SyncSection::pull>(),
       .doc = "patterns brought back into the run's folder when the job ends"},
      {.section = "sync",
       .name = "pull_from",
       .type = Type::choice,
       .member = member<&S::sync, &SyncSection::pull_from>(),
       .doc = "every host, or rank 0's",
       .choices = {"all", "rank0"}},
      {.section = "sync",
       .name = "files",
       .type = Type::custom,
       .doc = "more files or folders ([[sync.files]])",
       .emit = Emit::custom,
       .shown = "array of tables",
       .read = read_sync_files,
       .write = write_sync_files},
      {.section = "sync.files",
       .name = "src",
       .type = Type::path,
       .doc = "a local file or folder (required)"},
      {.section = "sync.files",
       .name = "dst",
       .type = Type::string,
       .doc = "where it goes, inside the synced folder; default: src's name"},
      {.name = "setup",
       .type = Type::section,
       .doc = "a command run once per host before any rank",
       .written = setup_written},
      {.section = "setup",
       .name = "command",
       .type = Type::string,
       .member = member<&S::setup, &SetupSection::command>(),
       .doc = "run by /bin/sh -c on every host, not blank"},
      {.section = "setup",
       .name = "when",
       .type = Type::choice,
       .member = member<&S::setup, &SetupSection::mode>(),
       .doc = "auto: when it or its inputs changed",
       .choices = {"auto", "always", "never"}},
      {.section = "setup",
       .name = "inputs",
       .type = Type::strings,
       .member = member<&S::setup, &SetupSection::inputs>(),
       .doc = "with auto: only these synced files (and the command) rerun it",
       .emit = Emit::unless_default},
      {.name = "record",
       .type = Type::section,
       .doc = "what a run's record keeps besides its spec and logs (docs/records.md)",
       .written = record_written},
      {.section = "record",
       .name = "code",
       .type = Type::boolean,
       .member = member<&S::record, &RecordSection::code>(),
       .doc = "keep the synced tree's manifest and contents (false: neither)",
       .emit = Emit::unless_default},
      {.section = "record",
       .name = "code_max",
       .type = Type::size,
       .member = member<&S::record, &RecordSection::code_max>(),
       .doc = "a larger tree keeps its manifest only (default 1 GiB)",
       .emit = Emit::unless_default,
       .hi = int64_t(1) << 40,
       .range_hint = "1 TiB"},
      {.name = "sweep",
       .type = Type::section,
       .doc = "run the job once per trial: `mltrain sweep` (docs/sweep.md)",
       .read = enter_sweep,
       .written = never_written},
      {.section = "sweep",
       .name = "max_parallel",
       .type = Type::integer,
       .member = member<&S::sweep, &SweepSection::max_parallel>(),
       .doc = "trials running at once",
       .lo = 1,
       .hi = 1000},
      {.section = "sweep",
       .name = "metric",
       .type = Type::string,
       .member = member<&S::sweep, &SweepSection::metric>(),
       .doc = "the metric the trials are ranked by (docs/metrics.md)"},
      {.section = "sweep",
       .name = "goal",
       .type = Type::choice,
       .member = member<&S::sweep, &SweepSection::goal>(),
       .doc = "whether a lower or a higher metric is better",
       .choices = {"min", "max"}},
      {.section = "sweep",
       .name = "early_stop",
       .type = Type::choice,
       .member = member<&S::sweep, &SweepSection::early_stop>(),
       .doc = "median: stop a trial worse than the median of finished ones at the same step",
       .choices = {"none", "median"}},
      {.section = "sweep",
       .name = "min_steps",
       .type = Type::integer,
       .member = member<&S::sweep, &SweepSection::min_steps>(),
       .doc = "early stopping's warm-up: no trial stops before this step (default: a tenth of the longest "
              "finished trial's steps)",
       .emit = Emit::unless_default,
       .lo = 0,
       .hi = 2147483647},
      {.section = "sweep",
       .name = "min_trials",
       .type = Type::integer,
       .member = member<&S::sweep, &SweepSection::min_trials>(),
       .doc = "early stopping starts once this many trials finished",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = 100000},
      {.section = "sweep",
       .name = "trials",
       .type = Type::integer,
       .member = member<&S::sweep, &SweepSection::trials>(),
       .doc = "with [sweep.random]: draws (per grid point)",
       .lo = 0,
       .hi = 100000},
      {.section = "sweep",
       .name = "seed",
       .type = Type::integer,
       .member = member<&S::sweep, &SweepSection::seed>(),
       .doc = "the random draws' seed",
       .lo = 0,
       .hi = 2147483647},
      {.section = "sweep",
       .name = "grid",
       .type = Type::custom,
       .doc = "parameters as arrays of values: every combination is a trial",
       .shown = "table of arrays",
       .read = read_sweep_grid},
      {.section = "sweep",
       .name = "random",
       .type = Type::custom,
       .doc = "parameters as ranges: { min, max, log, int }, drawn `trials` times",
       .shown = "table of tables",
       .read = read_sweep_random},
      {.section = "sweep",
       .name = "list",
       .type = Type::custom,
       .doc = "trials as tables of their parameters ([[sweep.list]])",
       .shown = "array of tables",
       .read = read_sweep_list},
      {.name = "metrics",
       .type = Type::section,
       .doc = "scalars read from rank 0's output (docs/metrics.md)",
       .written = metrics_written},
      {.section = "metrics",
       .name = "pattern",
       .type = Type::custom,
       .member = member<&S::metrics, &MetricsSection::patterns>(),
       .doc = "regexes whose named groups are metrics; a group named step is the step",
       .emit = Emit::custom,
       .shown = "string or array of strings",
       .read = read_metric_patterns,
       .write = write_metric_patterns},
  };
}

std::vector<Key> k8s_keys() {
  return {
      {.name = "k8s",
       .type = Type::section,
       .doc = "what `mltrain export` needs (see [k8s])",
       .read = enter_k8s,
       .written = k8s_written},
      {.section = "k8s",
       .name = "image",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::image>(),
       .doc = "the container image (required for export)",
       .emit = Emit::unless_default,
       .shown = "string",
       .read = read_image},
      {.section = "k8s",
       .name = "namespace",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::namespace_name>(),
       .doc = "default: kubectl's current namespace",
       .emit = Emit::unless_default,
       .shown = "DNS label",
       .read = read_namespace},
      {.section = "k8s",
       .name = "nodes",
       .type = Type::integer,
       .member = member<&S::k8s, &K8sSection::nodes>(),
       .doc = "pods; default: the hosts the spec plans, else 1",
       .emit = Emit::unless_default,
       .lo = 1,
       .hi = kMaxHosts},
      {.section = "k8s",
       .name = "gpus_per_pod",
       .type = Type::integer,
       .member = member<&S::k8s, &K8sSection::gpus_per_pod>(),
       .doc = "nvidia.com/gpu; default: [gpus] per_proc x procs_per_host",
       .emit = Emit::unless_default,
       .lo = 0,
       .hi = 1024},
      {.section = "k8s",
       .name = "cpu",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::cpu>(),
       .doc = "requests = limits: a quantity or a number of cores",
       .emit = Emit::unless_default,
       .shown = "quantity or number",
       .read = read_cpu},
      {.section = "k8s",
       .name = "memory",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::memory>(),
       .doc = "a quantity (\"64GB\" and bare numbers are errors)",
       .emit = Emit::unless_default,
       .shown = "quantity",
       .read = read_memory},
      {.section = "k8s",
       .name = "service_account",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::service_account>(),
       .doc = "the pods' service account",
       .emit = Emit::unless_default,
       .shown = "DNS subdomain",
       .read = read_service_account},
      {.section = "k8s",
       .name = "node_selector",
       .type = Type::custom,
       .member = member<&S::k8s, &K8sSection::node_selector>(),
       .doc = "label -> value",
       .emit = Emit::unless_default,
       .shown = "table of strings",
       .read = read_node_selector},
      {.section = "k8s",
       .name = "env",
       .type = Type::env,
       .member = member<&S::k8s, &K8sSection::env>(),
       .doc = "over [run] env; secret-looking names come from Secret `<name>-env`",
       .emit = Emit::custom,
       .write = write_k8s_env},
  };
}

}  // namespace

const std::vector<Key>& keys() {
  static const std::vector<Key> all = [] {
    std::vector<Key> k;
    for (auto part : {top_keys, run_keys, cluster_keys, comm_keys, ps_keys, gpus_ssh_logs_keys,
                      sync_and_setup_keys, k8s_keys})
      for (auto& row : part()) k.push_back(std::move(row));
    return k;
  }();
  return all;
}

const Key* find_key(const std::string& path) {
  for (const auto& k : keys())
    if (k.path() == path) return &k;
  return nullptr;
}

}  // namespace mltrain::spec::detail
