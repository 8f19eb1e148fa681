// `mltrain sweep` (docs/sweep.md): a trial per combination of [sweep]'s parameters, each an
// ordinary run (a child `mltrain run` of the trial's spec, linked to the sweep in its record), at
// most max_parallel at once; a live table of the trials; median stopping; the table sorted by the
// metric at the end, with the best trial's rerun line. The sweep's state lives in
// <state home>/sweeps/<id>/sweep.json, so `--resume` runs only the trials that did not finish.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "runner/common/error.h"
#include "runner/common/state_home.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/records/records.h"
#include "runner/tree/atomic_file.h"

extern char** environ;

namespace mltrain::launch {

namespace {

using json = nlohmann::ordered_json;
using Params = std::vector<std::pair<std::string, std::string>>;

std::atomic<int> g_signal{0};
void on_signal(int sig) { g_signal = sig; }

struct Trial {
  int n = 0;
  Params params;
  std::string state = "pending";  // pending | running | succeeded | failed | early-stopped | interrupted
  std::string run_id;
  std::optional<double> metric;  // its latest value of the sweep's metric (rank 0's)
  int64_t step = -1;             // ... at this step
  int exit_code = -1;
  // Not kept in sweep.json: the live trial.
  pid_t pid = -1;
  std::map<int64_t, double> curve;  // the metric by step, for median stopping
  uint64_t offset = 0;              // how much of its metrics.jsonl was read
  std::string orphan;               // loaded "running": the run its killed sweep left (adopt_orphans)
  bool finished() const { return state == "succeeded" || state == "failed" || state == "early-stopped"; }
};

struct Sweep {
  std::string id, dir, spec_file, name, metric, goal = "min", early_stop = "none";
  int max_parallel = 1;
  int min_steps = -1, min_trials = 2;  // the stopping rule's warm-up (spec::SweepSection)
  bool queue = false;                  // the trials wait for GPUs other jobs hold (--queue)
  sync::Fd fd;                         // `dir`, walked without following a link (open_sweep_dir)
  std::vector<Trial> trials;
};

std::string number_text(double v, bool integer) {
  if (integer) return std::to_string(std::llround(v));
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

constexpr int kMaxTrials = 100'000;  // as [sweep] trials' own bound (docs/sweep.md)

// One value of a [sweep.random] parameter: uniform (or log-uniform) in [min, max]; an integer one
// is each integer of [ceil(min), floor(max)] alike (a log-uniform one rounded, kept inside).
std::string draw(const spec::SweepRange& r, std::mt19937_64& rng) {
  if (r.integer && !r.log)
    return std::to_string(std::uniform_int_distribution<long long>(std::llround(std::ceil(r.min)),
                                                                   std::llround(std::floor(r.max)))(rng));
  std::uniform_real_distribution<double> u(r.log ? std::log(r.min) : r.min, r.log ? std::log(r.max) : r.max);
  const double x = r.log ? std::exp(u(rng)) : u(rng);
  if (!r.integer) {
    // Four significant digits (0.003275, not 0.0032745629120937): a learning rate needs no more,
    // and the table and the trial's command read as a person would write them. More only where
    // rounding would leave [min, max].
    for (int digits = 4; digits < 17; ++digits) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.*g", digits, x);
      const double y = std::strtod(buf, nullptr);
      if (y >= r.min && y <= r.max) return number_text(y, false);
    }
    return number_text(x, false);
  }
  return std::to_string(
      std::clamp(std::llround(x), std::llround(std::ceil(r.min)), std::llround(std::floor(r.max))));
}

// Every trial [sweep] names: its list, else every grid combination (each with `trials` random
// draws when [sweep.random] is given), else `trials` random draws. Errors name the place in `file`
// (the spec) that the setting came from.
std::vector<Params> expand(const spec::JobSpec& job, const std::string& file) {
  const spec::SweepSection& s = job.sweep;
  auto at = [&](const char* key) { return job.origin(key, file) + ": "; };
  std::vector<Params> out;
  if (!s.list.empty() && (!s.grid.empty() || !s.random.empty()))
    throw Error(
        at("sweep.list") +
            "[[sweep.list]] is given with [sweep.grid] or [sweep.random]: a sweep is one or the other",
        "list every trial in [[sweep.list]], or drop it for the grid and the draws");
  for (const auto& t : s.list) out.push_back(t);
  if (!s.list.empty()) return out;
  // Counted before anything is made: a grid of 10^7 points would fill the memory first.
  double count = std::max(1, s.random.empty() ? 1 : s.trials);
  for (const auto& [name, values] : s.grid) count *= double(values.size());
  if (count > double(kMaxTrials))
    throw Error(at(s.grid.empty() ? "sweep.random" : "sweep.grid") + "[sweep] makes " +
                    number_text(count, true) + " trials, more than " + std::to_string(kMaxTrials),
                "narrow [sweep.grid] (or [sweep] trials), or run it as several sweeps");
  std::vector<Params> points{{}};
  for (const auto& [name, values] : s.grid) {
    std::vector<Params> next;
    for (const auto& p : points)
      for (const auto& v : values) {
        Params q = p;
        q.emplace_back(name, v);
        next.push_back(std::move(q));
      }
    points = std::move(next);
  }
  if (s.random.empty()) {
    if (s.grid.empty())
      throw Error(at("sweep") + "[sweep] names no parameter",
                  "give [sweep.grid], [sweep.random] or [[sweep.list]]");
    return points;
  }
  if (s.trials < 1)
    throw Error(at("sweep.random") + "[sweep.random] needs [sweep] trials = N, how many draws",
                "as in trials = 8");
  for (const auto& r : s.random)
    if (r.integer && std::ceil(r.min) > std::floor(r.max))
      throw Error(at("sweep.random") + "[sweep.random] " + r.name + ": no integer lies between min = " +
                      number_text(r.min, false) + " and max = " + number_text(r.max, false),
                  "widen the range, or drop int = true");
  std::mt19937_64 rng(uint64_t(s.seed));
  for (const auto& p : points)
    for (int i = 0; i < s.trials; ++i) {
      Params q = p;
      for (const auto& r : s.random) q.emplace_back(r.name, draw(r, rng));
      out.push_back(std::move(q));
    }
  return out;
}

// Each `{name}` becomes the value: in a shell command as one word (quoted when it needs to be:
// a value "0.1; touch X" ran the touch), elsewhere (an argv element, an env value) as it is;
// `{name!raw}` splices it into a command unquoted, for the rare user who means that.
std::string substitute(std::string text, const Params& params, bool shell) {
  for (const auto& [name, value] : params) {
    const std::string raw = "{" + name + "!raw}", word = shell ? text::shell_quote(value) : value;
    for (size_t at = 0; (at = text.find(raw, at)) != std::string::npos; at += value.size())
      text.replace(at, raw.size(), value);
    const std::string key = "{" + name + "}";
    for (size_t at = 0; (at = text.find(key, at)) != std::string::npos; at += word.size())
      text.replace(at, key.size(), word);
  }
  return text;
}

// A parameter no `{name}` of [run] uses would run every trial alike: most often a typo, as
// {learning_rate} for lr. Katib refuses such a trial template too.
void check_used(const spec::JobSpec& job, const std::vector<Params>& trials, const std::string& file) {
  std::string text = job.run.command.value_or("");
  for (const auto& a : job.run.argv) text += "\n" + a;
  for (const auto& [k, v] : job.run.env) text += "\n" + v;
  std::vector<std::string> names;  // every trial's, in order
  for (const auto& params : trials)
    for (const auto& [name, value] : params)
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  // A [[sweep.list]] trial without a parameter another one has would run with `{name}` as it is.
  for (size_t i = 0; i < trials.size(); ++i)
    for (const auto& name : names)
      if (std::none_of(trials[i].begin(), trials[i].end(), [&](const auto& p) { return p.first == name; }))
        throw Error(job.origin("sweep.list", file) + ": [[sweep.list]] trial " + std::to_string(i) +
                        " has no " + name + ", which another trial has",
                    "give every trial of [[sweep.list]] the same parameters");
  std::vector<std::string> unused;
  for (const auto& name : names)
    if (text.find("{" + name + "}") == std::string::npos &&
        text.find("{" + name + "!raw}") == std::string::npos)
      unused.push_back(name);
  if (unused.empty()) return;
  const bool one = unused.size() == 1;
  const auto& grid = job.sweep.grid;
  const auto& random = job.sweep.random;
  const char* table =
      std::any_of(grid.begin(), grid.end(), [&](const auto& g) { return g.first == unused[0]; })
          ? "sweep.grid"
      : std::any_of(random.begin(), random.end(), [&](const auto& r) { return r.name == unused[0]; })
          ? "sweep.random"
      : !job.sweep.list.empty() ? "sweep.list"
                                : "sweep";
  throw Error(job.origin(table, file) + ": [sweep] parameter" + (one ? " " : "s ") +
                  text::join(unused, ", ") + (one ? " appears" : " appear") +
                  " nowhere in [run]: every trial would run the same job",
              "write {" + unused[0] +
                  "} in run.command, run.argv or a [run.env] value (to run one job several times, "
                  "pass the repeat's number anyway, as [run.env] REPEAT = \"{" +
                  unused[0] + "}\")");
}

// Every trial of the spec's [sweep], each check made (`mltrain sweep` and `validate` alike).
std::vector<Params> trials_of(const spec::JobSpec& job, const std::string& file) {
  std::vector<Params> trials = expand(job, file);
  if (job.sweep.early_stop == "median" && job.sweep.metric.empty())
    throw Error(job.origin("sweep.early_stop", file) + ": [sweep] early_stop = \"median\" needs a metric",
                "name it: metric = \"loss\"");
  check_used(job, trials, file);
  return trials;
}

std::string params_text(const Params& p) {
  std::string out;
  for (const auto& [k, v] : p)
    out += (out.empty() ? "" : " ") + k + "=" + text::host_text(v);  // to a terminal
  return out;
}

void write_atomic(const std::string& path, const std::string& text) {
  std::string error;
  if (!sync::write_atomically(AT_FDCWD, path, text, 0600, false, error))
    throw Error("cannot write " + path + " (" + error + ")", "free space in the state folder");
}

void save(const Sweep& s) {
  json trials = json::array();
  for (const auto& t : s.trials) {
    json params = json::object();
    for (const auto& [k, v] : t.params) params[k] = v;
    trials.push_back({{"trial", t.n},
                      {"params", params},
                      {"state", t.state},
                      {"run", t.run_id.empty() ? json(nullptr) : json(t.run_id)},
                      {"metric", t.metric ? json(*t.metric) : json(nullptr)},
                      {"step", t.step < 0 ? json(nullptr) : json(t.step)},
                      {"exit_code", t.exit_code < 0 ? json(nullptr) : json(t.exit_code)}});
  }
  json doc{{"schema", 1},
           {"id", s.id},
           {"name", s.name},
           {"spec_file", s.spec_file},
           {"metric", s.metric},
           {"goal", s.goal},
           {"early_stop", s.early_stop},
           {"min_steps", s.min_steps},
           {"min_trials", s.min_trials},
           {"max_parallel", s.max_parallel},
           {"queue", s.queue},
           {"trials", trials}};
  write_atomic(s.dir + "/sweep.json", doc.dump(2) + "\n");
}

// A trial's files in the sweep's folder: its output ("log") and its run's id ("run", written by
// the trial's launcher: note_sweep_trial).
std::string trial_file(int n, const char* what) { return "trial-" + std::to_string(n) + "." + what; }

// Trial n's run id, once its launcher wrote it ("" before).
std::string run_id_of(const Sweep& s, int n) {
  std::ifstream f(s.dir + "/" + trial_file(n, "run"));
  std::string id;
  std::getline(f, id);
  return id;
}

Sweep load(const std::string& query) {
  const std::string root = state_home() + "/sweeps";
  std::string id = query;
  // An id names a folder of <state home>/sweeps, never a path beside or above it.
  const bool plain = !id.empty() && id.find('/') == std::string::npos && id != "." && id != "..";
  if (!plain || !std::filesystem::is_directory(root + "/" + id)) {
    std::vector<std::string> hits;  // a unique part of an id, or "latest"
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(root, ec))
      if (query == "latest" || e.path().filename().string().find(query) != std::string::npos)
        hits.push_back(e.path().filename());
    std::sort(hits.begin(), hits.end());
    if (query == "latest" && !hits.empty()) hits = {hits.back()};
    if (hits.size() != 1)
      throw Error(
          hits.empty() ? "no sweep matches '" + query + "'" : "'" + query + "' matches several sweeps",
          "the sweeps are in " + root);
    id = hits[0];
  }
  Sweep s;
  s.id = id;
  s.dir = root + "/" + id;
  std::ifstream in(s.dir + "/sweep.json");
  json doc = json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.is_object())
    throw Error(s.dir + "/sweep.json cannot be read", "remove the sweep's folder");
  s.name = doc.value("name", "");
  s.spec_file = doc.value("spec_file", "");
  s.metric = doc.value("metric", "");
  s.goal = doc.value("goal", "min");
  s.early_stop = doc.value("early_stop", "none");
  s.min_steps = doc.value("min_steps", -1);
  s.min_trials = doc.value("min_trials", 2);
  s.max_parallel = doc.value("max_parallel", 1);
  s.queue = doc.value("queue", false);
  for (const auto& t : doc["trials"]) {
    Trial x;
    x.n = t.value("trial", 0);
    for (const auto& [k, v] : t["params"].items()) x.params.emplace_back(k, v.get<std::string>());
    x.state = t.value("state", "pending");
    if (t["run"].is_string()) x.run_id = t["run"].get<std::string>();
    if (t["metric"].is_number()) x.metric = t["metric"].get<double>();
    if (t["step"].is_number_integer()) x.step = t["step"].get<int64_t>();
    if (t["exit_code"].is_number_integer()) x.exit_code = t["exit_code"].get<int>();
    if (x.state == "running" && x.run_id.empty())  // the sweep ended before it heard the run's id
      x.run_id = run_id_of(s, x.n);
    if (!x.finished()) {
      x.orphan = x.state == "running" ? x.run_id : "";
      x.state = "pending", x.run_id.clear(), x.metric.reset(), x.step = -1, x.exit_code = -1;
    }
    s.trials.push_back(std::move(x));
  }
  return s;
}

std::string new_sweep_id(const std::string& name) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  char tail[8];
  std::snprintf(tail, sizeof tail, "%04x", unsigned(rd() & 0xffff));
  return std::string(stamp) + "-" + name + "-" + tail;
}

// Reads what the trial's run added to its metrics.jsonl: rank 0's values of the metric.
void read_progress(const Sweep& s, Trial& t) {
  if (t.run_id.empty()) t.run_id = run_id_of(s, t.n);
  if (t.run_id.empty()) return;
  std::ifstream in(records::run_dir(t.run_id) + "/" + records::kMetricsFile);
  if (!in) return;
  in.seekg(std::streamoff(t.offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a line still being written: read again next time
    t.offset += line.size() + 1;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("rank", -1) != 0) continue;
    auto v = j.find(s.metric);
    if (v == j.end() || !v->is_number() || !j["step"].is_number_integer()) continue;
    const int64_t step = j["step"].get<int64_t>();
    t.curve[step] = v->get<double>();
    if (step >= t.step) t.step = step, t.metric = v->get<double>();
  }
}

// The trial's run ended "stopped" by the sweep's SIGTERM: its record says why, so `ls`, `show` and
// `--where status=...` tell a pruned trial from one a person stopped.
void mark_early_stopped(const Trial& t) {
  if (t.run_id.empty()) return;
  try {
    records::RunRecord r = records::load(t.run_id);
    if (r.status != "stopped") return;  // it ended otherwise first (succeeded, failed)
    r.status = "early-stopped";
    if (!records::save(r))
      std::fprintf(stderr, "mltrain: sweep: run %s stays 'stopped' in its record (it could not be written)\n",
                   t.run_id.c_str());
  } catch (const Error&) {
  }
}

// A sweep killed with SIGKILL leaves its trials "running" in sweep.json while their runs go on
// without it. At --resume, a run that ended keeps its result (it is not run twice); one that
// still runs makes the resume wait for it: started again, it would run twice at once.
void adopt_orphans(Sweep& s) {
  std::vector<std::string> still;
  for (auto& t : s.trials) {
    if (t.orphan.empty()) continue;
    records::RunRecord r;
    try {
      r = records::load(t.orphan);
    } catch (const Error&) {
      continue;  // gone: run it again
    }
    if (records::live_status(r.status)) {
      still.push_back("trial " + std::to_string(t.n) + " (run " + t.orphan + ")");
    } else if (r.status == "succeeded" || r.status == "failed" || r.status == "early-stopped") {
      t.state = r.status;
      t.exit_code = r.exit_code;
      t.run_id = t.orphan;
      read_progress(s, t);
    }
  }
  if (!still.empty())
    throw Error("sweep " + s.id + ": " + text::join(still, ", ") +
                    " still running, left by the mltrain sweep "
                    "that was killed",
                "wait for " + std::string(still.size() == 1 ? "it" : "them") +
                    " to end (mltrain ls), or stop " + (still.size() == 1 ? "it" : "them") +
                    " with mltrain stop RUN; then resume again");
}

bool better(const Sweep& s, double a, double b) { return s.goal == "max" ? a > b : a < b; }

// The median stopping rule (Golovin et al., Google Vizier; Katib's "medianstop"): a running trial
// whose best value up to its step s is worse than the median of the finished trials' running
// averages up to s (each the mean of its values at steps <= s), once min_trials trials have one,
// and never before the warm-up step (min_steps; by default a tenth of the longest finished
// trial's steps: it stopped trials at step 2 of 40).
bool should_stop(const Sweep& s, const Trial& t) {
  if (s.early_stop != "median" || !t.metric || s.metric.empty() || t.curve.empty()) return false;
  std::vector<double> others;
  int64_t longest = 0;
  for (const auto& o : s.trials) {
    if (o.state != "succeeded") continue;
    if (!o.curve.empty()) longest = std::max(longest, o.curve.rbegin()->first);
    double sum = 0;
    size_t n = 0;
    for (auto it = o.curve.begin(); it != o.curve.end() && it->first <= t.step; ++it) sum += it->second, ++n;
    if (n) others.push_back(sum / double(n));
  }
  if (others.size() < size_t(std::max(s.min_trials, 1))) return false;
  const int64_t warm_up = s.min_steps >= 0 ? s.min_steps : (longest + 9) / 10;
  if (t.step < warm_up) return false;
  std::sort(others.begin(), others.end());
  const size_t m = others.size();
  const double median = m % 2 ? others[m / 2] : (others[m / 2 - 1] + others[m / 2]) / 2;
  double best = t.curve.begin()->second;
  for (const auto& [step, v] : t.curve)
    if (step <= t.step && better(s, v, best)) best = v;
  return better(s, median, best);
}

// The sweep's folder, walked from the state home without following a link: a trial's files are
// made, truncated and removed in it alone (docs/security.md).
sync::Fd open_sweep_dir(const std::string& id) {
  sync::Fd home(::open(state_home().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  std::string leaf;
  sync::Fd dir(home ? sync::open_parent(home.get(), "sweeps/" + id + "/sweep.json", leaf) : -1);
  if (!dir)
    throw Error(
        "cannot open the sweep's folder " + state_home() + "/sweeps/" + id + ": " + std::strerror(errno),
        "it must be a folder of mltrain's, not a link");
  return dir;
}

pid_t start_trial(const Sweep& s, Trial& t) {
  const std::string log = trial_file(t.n, "log");
  // An earlier attempt's run id must not be read as this one's before the child writes its own.
  ::unlinkat(s.fd.get(), trial_file(t.n, "run").c_str(), 0);
  t.run_id.clear();
  std::vector<std::string> args = {"mltrain",
                                   "run",
                                   s.spec_file,
                                   "--name",
                                   s.name + "-t" + std::to_string(t.n),
                                   "--sweep-trial",
                                   s.id + "/" + std::to_string(t.n)};
  if (s.queue) args.push_back("--queue");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const sync::Fd out(
      ::openat(s.fd.get(), log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out)
    throw Error("cannot write " + s.dir + "/" + log + ": " + std::strerror(errno),
                "see the state folder's space");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, out.get(), 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0)
    throw Error(std::string("cannot start a trial: ") + std::strerror(rc), "see the state folder's space");
  t.pid = pid;
  t.state = "running";
  t.offset = 0;
  t.curve.clear();
  return pid;
}

// Why a trial failed, as its launcher said it (the last "mltrain: error:" line of its log).
std::string failure_of(const Sweep& s, const Trial& t) {
  std::ifstream in(s.dir + "/" + trial_file(t.n, "log"));
  std::string line, last;
  while (std::getline(in, line))
    if (line.rfind("mltrain: error: ", 0) == 0) last = line.substr(16);
  return text::host_text(last, 300);
}

std::string metric_text(const Trial& t) {
  if (!t.metric) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", *t.metric);
  return buf;
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string table(const Sweep& s, const std::vector<const Trial*>& order) {
  std::optional<double> best;
  for (const auto& t : s.trials)
    if (t.metric && t.state != "failed" && (!best || better(s, *t.metric, *best))) best = t.metric;
  size_t pw = 6;
  for (const auto& t : s.trials) pw = std::max(pw, params_text(t.params).size());
  pw = std::min<size_t>(pw, 48);
  char line[512];
  std::snprintf(line, sizeof line, "%-5s %-*s %-13s %12s %7s  %s\n", "TRIAL", int(pw), "PARAMS", "STATE",
                s.metric.empty() ? "METRIC" : upper(text::cut(s.metric, 12)).c_str(), "STEP", "RUN");
  std::string out = line;
  for (const Trial* t : order) {
    const std::string m =
        metric_text(*t) + (t->metric && t->state != "failed" && best && *t->metric == *best ? " *" : "");
    std::snprintf(line, sizeof line, "%-5d %-*s %-13s %12s %7s  %s\n", t->n, int(pw),
                  text::cut(params_text(t->params), pw).c_str(), t->state.c_str(), m.c_str(),
                  t->step < 0 ? "-" : std::to_string(t->step).c_str(),
                  t->run_id.empty() ? "-" : t->run_id.c_str());
    out += line;
  }
  return out;
}

// Runs the trials not finished, at most max_parallel at once; Ctrl-C stops them (130).
int drive(Sweep& s) {
  const bool tty = ::isatty(1) == 1;
  g_signal = 0;
  struct sigaction sa {
  }, old_int{}, old_term{}, old_hup{};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);  // the terminal or the SSH session closed: as Ctrl-C
  int drawn = 0;
  auto show = [&](bool force) {
    if (!tty && !force) return;
    std::vector<const Trial*> order;
    for (const auto& t : s.trials) order.push_back(&t);
    std::string text = table(s, order);
    if (tty && drawn) std::printf("\033[%dA\033[J", drawn);
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
    drawn = int(std::count(text.begin(), text.end(), '\n'));
  };
  auto say = [&](const Trial& t, const std::string& what) {
    if (tty) return;
    std::printf("trial %d (%s): %s\n", t.n, params_text(t.params).c_str(), what.c_str());
    std::fflush(stdout);
  };
  bool stopping = false;
  for (;;) {
    if (g_signal && !stopping) {
      stopping = true;
      for (auto& t : s.trials)
        if (t.pid > 0) ::kill(t.pid, SIGTERM);
    }
    int running = 0;
    for (auto& t : s.trials) {
      if (t.pid <= 0) continue;
      read_progress(s, t);
      int status = 0;
      if (::waitpid(t.pid, &status, WNOHANG) == t.pid) {
        t.pid = -1;
        read_progress(s, t);
        t.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (t.state != "early-stopped")
          t.state = t.exit_code == 0 ? "succeeded"
                    : stopping       ? "interrupted"
                                     : "failed";  // it may end as Ctrl-C comes
        else
          mark_early_stopped(t);
        const std::string why = t.state == "failed" ? failure_of(s, t) : "";
        say(t, t.state + (t.metric ? ", " + s.metric + " " + metric_text(t) : "") +
                   (t.run_id.empty() ? "" : " (run " + t.run_id + ")") + (why.empty() ? "" : ": " + why));
        save(s);
        continue;
      }
      ++running;
      if (t.state == "running" && should_stop(s, t)) {
        t.state = "early-stopped";
        ::kill(t.pid, SIGTERM);
        say(t, "stopped early at step " + std::to_string(t.step) + ": its best " + s.metric +
                   " so far is worse than the median of the finished trials' running averages there");
        save(s);
      }
    }
    if (!stopping)
      for (auto& t : s.trials) {
        if (running >= s.max_parallel) break;
        if (t.state != "pending") continue;
        start_trial(s, t);
        ++running;
        say(t, "started");
        save(s);
      }
    show(false);
    if (running == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigaction(SIGHUP, &old_hup, nullptr);
  if (tty && drawn) std::printf("\033[%dA\033[J", drawn);
  return stopping ? 130 : 0;
}

}  // namespace

namespace detail {

size_t check_sweep(const spec::JobSpec& s, const std::string& file) { return trials_of(s, file).size(); }

void apply_sweep_trial(spec::JobSpec& s, const std::string& trial) {
  const size_t slash = trial.find('/');
  const std::string id = trial.substr(0, slash);
  const int n = slash == std::string::npos ? -1 : std::atoi(trial.c_str() + slash + 1);
  Sweep sw = load(id);
  auto it = std::find_if(sw.trials.begin(), sw.trials.end(), [&](const Trial& t) { return t.n == n; });
  if (it == sw.trials.end())
    throw Error("sweep " + id + " has no trial " + std::to_string(n), "see its sweep.json");
  if (s.run.command) *s.run.command = substitute(*s.run.command, it->params, true);
  for (auto& a : s.run.argv) a = substitute(a, it->params, false);
  for (auto& [k, v] : s.run.env) v = substitute(v, it->params, false);
  s.sweep = {};
}

}  // namespace detail

int sweep(const SweepRequest& req) {
  Sweep s;
  if (!req.resume.empty()) {
    s = load(req.resume);
    // The spec as it is now: broken or gone, every trial would fail on it (and stay failed).
    JobRequest jr;
    jr.specs = {s.spec_file};
    std::vector<Params> trials;
    for (const auto& t : s.trials) trials.push_back(t.params);
    check_used(resolve_spec(jr), trials, s.spec_file);
  } else {
    JobRequest jr;
    jr.specs = {req.spec};
    const spec::JobSpec base = resolve_spec(jr);
    if (!base.sweep.present)
      throw Error(req.spec + " has no [sweep]",
                  "add [sweep] with [sweep.grid] (docs/sweep.md), or use mltrain run");
    const std::vector<Params> combos = trials_of(base, req.spec);
    s.name = base.name;
    s.spec_file = std::filesystem::absolute(req.spec).string();
    s.metric = base.sweep.metric;
    s.goal = base.sweep.goal;
    s.early_stop = base.sweep.early_stop;
    s.min_steps = base.sweep.min_steps;
    s.min_trials = base.sweep.min_trials;
    s.max_parallel = base.sweep.max_parallel;
    s.queue = base.gpus.per_proc > 0 || base.gpus.procs_per_gpu > 0;
    s.id = new_sweep_id(base.name);
    s.dir = state_home() + "/sweeps/" + s.id;
    make_private_dirs(s.dir);
    for (size_t i = 0; i < combos.size(); ++i) {
      Trial t;
      t.n = int(i);
      t.params = combos[i];
      s.trials.push_back(std::move(t));
    }
    save(s);
  }
  // One driver a sweep: a second --resume while it runs would start its trials twice.
  s.fd = open_sweep_dir(s.id);
  const int lock = ::openat(s.fd.get(), "lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0 || ::flock(lock, LOCK_EX | LOCK_NB) != 0)
    throw Error("sweep " + s.id + " is being run by another mltrain sweep",
                "wait for it to end, or stop it with Ctrl-C");
  if (!req.resume.empty()) adopt_orphans(s);
  if (req.max_parallel > 0) s.max_parallel = req.max_parallel;
  size_t todo = 0;
  for (const auto& t : s.trials) todo += !t.finished();
  std::fprintf(stderr,
               "mltrain: sweep %s: %zu trial%s (%zu to run), at most %d at once; resume with: mltrain sweep "
               "--resume %s\n",
               s.id.c_str(), s.trials.size(), s.trials.size() == 1 ? "" : "s", todo, s.max_parallel,
               s.id.c_str());
  const int code = drive(s);
  save(s);
  // The table sorted by the metric (trials without one last), and the best trial's rerun line.
  std::vector<const Trial*> order;
  for (const auto& t : s.trials) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [&](const Trial* a, const Trial* b) {
    const bool ma = a->metric && a->state != "failed", mb = b->metric && b->state != "failed";
    if (ma != mb) return ma;
    return ma && better(s, *a->metric, *b->metric);
  });
  std::fputs(table(s, order).c_str(), stdout);
  // A metric no trial reported is most often a name the ranks spell otherwise: say so, not just `-`.
  const bool ended =
      std::any_of(s.trials.begin(), s.trials.end(), [](const Trial& t) { return t.finished(); });
  const bool reported =
      std::any_of(s.trials.begin(), s.trials.end(), [](const Trial& t) { return t.metric; });
  if (!s.metric.empty() && ended && !reported)
    std::fprintf(
        stderr,
        "mltrain: no trial reported %s (rank 0's), so the trials are not ranked by it; a rank reports "
        "it with mltrain.log(%s=...) or a [metrics] pattern (docs/metrics.md), and mltrain show RUN "
        "lists what a trial reported\n",
        text::host_text(s.metric).c_str(), text::host_text(s.metric).c_str());
  const Trial* best = nullptr;
  for (const Trial* t : order)
    if (t->state == "succeeded" &&
        (!best || (t->metric && (!best->metric || better(s, *t->metric, *best->metric)))))
      best = t;
  if (best)
    std::printf("best: trial %d (%s)%s\n  mltrain rerun %s\n", best->n, params_text(best->params).c_str(),
                best->metric ? (": " + s.metric + " " + metric_text(*best)).c_str() : "",
                best->run_id.c_str());
  if (code) {
    std::fprintf(stderr, "mltrain: sweep %s interrupted; go on with: mltrain sweep --resume %s\n",
                 s.id.c_str(), s.id.c_str());
    return code;
  }
  return best ? 0 : 1;
}

}  // namespace mltrain::launch
