#include "runner/records/records.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/secret.h"
#include "runner/common/state_home.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/plan/plan.h"
#include "runner/records/cleanup.h"
#include "runner/tree/atomic_file.h"

namespace mltrain::records {

using json = nlohmann::ordered_json;

namespace {

std::string read_all(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = bool(in);
  std::ostringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
}

// Unknown values are null in every JSON document (docs/json.md); in memory they are -1, 0 or "".
json or_null(int v, int unknown) { return v == unknown ? json(nullptr) : json(v); }
json or_null(const std::string& v) { return v.empty() ? json(nullptr) : json(v); }

// A field that may be null or absent (records of older versions wrote -1, 0 or "" instead).
template <class T>
T get(const json& j, const char* key, T unknown) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return unknown;
  return it->template get<T>();
}

json failure_json(const Failure& f) {
  return json{{"rank", or_null(f.rank, -1)},    {"host", or_null(f.host)}, {"exit_code", f.exit_code},
              {"signal", or_null(f.signal, 0)}, {"message", f.message},    {"tail", f.tail},
              {"reason", or_null(f.reason)}};
}

RunRecord from_json(const json& j) {
  RunRecord r;
  r.id = get<std::string>(j, "id", "");
  r.name = get<std::string>(j, "name", "");
  r.status = get<std::string>(j, "status", "unknown");
  r.exit_code = get(j, "exit_code", -1);
  r.launcher_pid = get(j, "launcher_pid", 0);
  r.launcher_start = get(j, "launcher_start", 0ULL);
  r.started_at = get<std::string>(j, "started_at", "");
  r.ended_at = get<std::string>(j, "ended_at", "");
  r.duration_s = get(j, "duration_s", 0.0);
  r.queued_s = get(j, "queued_s", 0.0);
  r.spec_file = get<std::string>(j, "spec_file", "");
  // "spec" in records written before it was called spec_text (issue 47: one name, one meaning).
  r.spec_toml = get<std::string>(j, "spec_text", get<std::string>(j, "spec", ""));
  r.workdir = get<std::string>(j, "workdir", "");
  r.git_commit = get<std::string>(j, "git_commit", "");
  r.master_addr = get<std::string>(j, "master_addr", "");
  r.master_port = get(j, "master_port", 0);
  r.argv = get(j, "argv", std::vector<std::string>{});
  r.restarts = get(j, "restarts", 0);
  r.max_restarts = get(j, "max_restarts", 0);
  for (const auto& g : get(j, "generations", json::array())) {
    if (!g.is_object()) continue;
    r.generations.push_back({get(g, "restart", 0), get<std::string>(g, "started_at", ""),
                             get(g, "hosts", std::vector<std::string>{}), get(g, "world_size", 0),
                             get<std::string>(g, "why", "")});
  }
  r.detached = get(j, "detached", false);
  r.slurm_job_id = get<std::string>(j, "slurm_job_id", "");
  r.kind = get<std::string>(j, "kind", "run");
  r.ssh_config = get<std::string>(j, "ssh_config", "");
  r.log_prefix = get<std::string>(j, "log_prefix", "[{rank}]");
  r.rerun_of = get<std::string>(j, "rerun_of", "");
  if (j.contains("sweep") && j["sweep"].is_object()) {
    r.sweep_id = get<std::string>(j["sweep"], "id", "");
    r.sweep_trial = get(j["sweep"], "trial", -1);
  }
  for (const auto& h : get(j, "hosts", json::array())) {
    r.hosts.push_back(
        {get<std::string>(h, "name", ""),
         get<std::string>(h, "address", ""),
         get(h, "node_rank", 0),
         h.contains("workdir") && h["workdir"].is_string() ? h["workdir"].get<std::string>() : "",
         {}});
    if (h.contains("environment") && h["environment"].is_object())
      for (const auto& [k, v] : h["environment"].items())
        if (v.is_string()) r.hosts.back().environment.emplace_back(k, v.get<std::string>());
  }
  for (const auto& k : get(j, "ranks", json::array())) {
    RankRecord rr;
    rr.rank = get(k, "rank", 0);
    // The host: its name (schema 1), or an index into hosts (records written before it).
    if (auto h = k.find("host"); h != k.end() && h->is_string()) {
      for (size_t i = 0; i < r.hosts.size(); ++i)
        if (r.hosts[i].name == h->get<std::string>()) rr.host = int(i);
    } else {
      rr.host = get(k, "host", 0);
    }
    rr.local_rank = get(k, "local_rank", 0);
    rr.pid = get(k, "pid", 0);
    rr.exit_code = get(k, "exit_code", -1);
    rr.signal = get(k, "signal", 0);
    rr.host_lost = get(k, "host_lost", false);
    rr.env = get(k, "env", std::map<std::string, std::string>{});
    for (const auto& g : get(k, "gpus", json::array()))
      rr.gpus.push_back({get(g, "index", 0), get<std::string>(g, "uuid", "")});
    r.ranks.push_back(rr);
  }
  for (const auto& p : get(j, "ps_servers", json::array())) {
    PsServerRecord s;
    s.server = get(p, "server", 0);
    s.host = get<std::string>(p, "host", "");
    s.address = get<std::string>(p, "address", "");
    s.bytes_in = get(p, "bytes_in", 0ULL), s.bytes_out = get(p, "bytes_out", 0ULL);
    s.requests = get(p, "requests", 0ULL), s.keys = get(p, "keys", 0ULL);
    s.max_queue_depth = get(p, "max_queue_depth", 0U);
    r.ps_servers.push_back(s);
  }
  if (j.contains("failure") && j["failure"].is_object()) {
    const auto& f = j["failure"];
    r.failure = Failure{get(f, "rank", -1),
                        get<std::string>(f, "host", ""),
                        get(f, "exit_code", 0),
                        get(f, "signal", 0),
                        get<std::string>(f, "message", ""),
                        get(f, "tail", std::vector<std::string>{}),
                        get<std::string>(f, "reason", "")};
  }
  if (j.contains("pull") && j["pull"].is_object()) {
    const auto& p = j["pull"];
    r.pull = PullRecord{get(p, "files", 0ULL), get(p, "bytes", 0ULL),
                        get(p, "problems", std::vector<std::string>{})};
  }
  if (j.contains("code") && j["code"].is_object()) {
    const auto& c = j["code"];
    r.code.recorded = true;
    r.code.kept = get(c, "kept", false);
    r.code.files = get(c, "files", 0ULL), r.code.bytes = get(c, "bytes", 0ULL);
    r.code.new_bytes = get(c, "new_bytes", 0ULL), r.code.withheld = get(c, "withheld", 0ULL);
    r.code.dirty = get(c, "dirty", false);
    r.code.skipped = get<std::string>(c, "skipped", "");
  }
  if (j.contains("metrics") && j["metrics"].is_object()) {
    const auto& m = j["metrics"];
    r.metrics.names = get(m, "names", std::vector<std::string>{});
    r.metrics.records = get(m, "records", 0ULL), r.metrics.dropped = get(m, "dropped", 0ULL);
  }
  return r;
}

json to_json_value(const RunRecord& r) {
  json hosts = json::array();
  for (const auto& h : r.hosts) {
    json environment = json::object();
    for (const auto& [k, v] : h.environment) environment[k] = v;
    hosts.push_back({{"name", h.name},
                     {"address", h.address},
                     {"node_rank", h.node_rank},
                     {"workdir", h.workdir.empty() ? json(nullptr) : json(h.workdir)},
                     {"environment", h.environment.empty() ? json(nullptr) : environment}});
  }
  json generations = json::array();
  for (const auto& g : r.generations)
    generations.push_back({{"restart", g.restart},
                           {"started_at", g.started_at},
                           {"hosts", g.hosts},
                           {"world_size", g.world_size},
                           {"why", or_null(g.why)}});
  json ranks = json::array();
  for (const auto& k : r.ranks) {
    json gpus = json::array();
    for (const auto& g : k.gpus) gpus.push_back({{"index", g.index}, {"uuid", g.uuid}});
    ranks.push_back(
        {{"rank", k.rank},
         {"host", size_t(k.host) < r.hosts.size() ? json(r.hosts[size_t(k.host)].name) : json(nullptr)},
         {"node_rank",
          size_t(k.host) < r.hosts.size() ? json(r.hosts[size_t(k.host)].node_rank) : json(nullptr)},
         {"local_rank", k.local_rank},
         {"pid", or_null(k.pid, 0)},
         {"exit_code", or_null(k.exit_code, -1)},
         {"signal", or_null(k.signal, 0)},
         {"host_lost", k.host_lost},
         {"env", k.env},
         {"gpus", gpus}});
  }
  json ps = json::array();
  for (const auto& s : r.ps_servers)
    ps.push_back({{"server", s.server},
                  {"host", s.host},
                  {"address", s.address},
                  {"bytes_in", s.bytes_in},
                  {"bytes_out", s.bytes_out},
                  {"requests", s.requests},
                  {"keys", s.keys},
                  {"max_queue_depth", s.max_queue_depth}});
  const bool ended = !live_status(r.status) && r.status != "lost";
  json j{
      {"schema", kJsonSchema},
      {"id", r.id},
      {"name", r.name},
      {"status", r.status},
      {"exit_code", or_null(r.exit_code, -1)},
      {"launcher_pid", or_null(r.launcher_pid, 0)},
      {"launcher_start", r.launcher_start ? json(r.launcher_start) : json(nullptr)},
      {"started_at", or_null(r.started_at)},
      {"ended_at", or_null(r.ended_at)},
      {"duration_s", ended || (r.status == "lost" && r.duration_s > 0) ? json(r.duration_s) : json(nullptr)},
      {"spec_file", or_null(r.spec_file)},
      {"workdir", r.workdir},
      {"git_commit", or_null(r.git_commit)},
      {"argv", r.argv},
      {"master_addr", r.master_addr},
      {"master_port", or_null(r.master_port, 0)},
      {"restarts", r.restarts},
      {"max_restarts", r.max_restarts},
      {"generations", generations},
      {"detached", r.detached},
      {"queued_s", r.queued_s > 0 ? json(r.queued_s) : json(nullptr)},
      {"slurm_job_id", or_null(r.slurm_job_id)},
      {"kind", r.kind},
      {"ssh_config", or_null(r.ssh_config)},
      {"log_prefix", r.log_prefix},
      {"rerun_of", or_null(r.rerun_of)},
      {"sweep", r.sweep_id.empty() ? json(nullptr) : json{{"id", r.sweep_id}, {"trial", r.sweep_trial}}},
      {"hosts", hosts},
      {"ranks", ranks},
      {"ps_servers", r.ps_servers.empty() ? json(nullptr) : ps},
      {"failure", r.failure ? failure_json(*r.failure) : json(nullptr)},
      {"pull", r.pull ? json{{"files", r.pull->files},
                             {"bytes", r.pull->bytes},
                             {"complete", r.pull->problems.empty()},
                             {"problems", r.pull->problems}}
                      : json(nullptr)},
      {"code", r.code.recorded ? json{{"kept", r.code.kept},
                                      {"files", r.code.files},
                                      {"bytes", r.code.bytes},
                                      {"new_bytes", r.code.new_bytes},
                                      {"withheld", r.code.withheld},
                                      {"dirty", r.code.dirty},
                                      {"skipped", or_null(r.code.skipped)}}
                               : json(nullptr)},
      {"metrics",
       r.metrics.records || r.metrics.dropped
           ? json{{"names", r.metrics.names}, {"records", r.metrics.records}, {"dropped", r.metrics.dropped}}
           : json(nullptr)},
      {"spec_text", r.spec_toml}};
  return j;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> environment_rows(const RunRecord& r) {
  static const char* const kOrder[] = {"os",         "kernel", "arch", "glibc",  "cpus",  "gpus",
                                       "gpu_driver", "cuda",   "nccl", "python", "torch", "mltrain"};
  std::vector<std::pair<std::string, std::string>> rows;
  for (const char* key : kOrder) {
    std::vector<std::pair<std::string, std::vector<std::string>>> values;  // value -> its hosts
    bool any = false;
    for (const auto& h : r.hosts) {
      std::string v = "-";
      for (const auto& [k, val] : h.environment)
        if (k == key) v = val, any = true;
      auto it = std::find_if(values.begin(), values.end(), [&](const auto& p) { return p.first == v; });
      if (it == values.end()) values.push_back({v, {}}), it = values.end() - 1;
      it->second.push_back(h.name);
    }
    if (!any) continue;
    if (values.size() == 1) {
      rows.emplace_back(key, values[0].first);
      continue;
    }
    std::string text;
    for (const auto& [v, hosts] : values) {
      std::string names;
      for (const auto& n : hosts) names += (names.empty() ? "" : ", ") + n;
      text += (text.empty() ? "" : "; ") + v + " (" + names + ")";
    }
    rows.emplace_back(key, text);
  }
  return rows;
}

std::string runs_dir() { return mltrain::state_home() + "/runs"; }
std::string run_dir(const std::string& id) { return runs_dir() + "/" + id; }

namespace {
bool save_in(const std::string& dir, const RunRecord& r);
}

std::string create_run(const std::string& name) {
  make_private_dirs(state_home(), /*make_private=*/true);
  make_private_dirs(runs_dir(), /*make_private=*/true);
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  // The folder is born with its run.json: made under a hidden name (`list` skips it), the record
  // written, then renamed into place. A launcher killed at any moment (Ctrl-C while the code is
  // being kept) leaves a run `ls` shows as lost, never a folder without a record.
  // Ctrl-C (or TERM, HUP) waits the few milliseconds (an fsync) until the folder is in place:
  // a launcher killed between the hidden folder and the rename would leave the run nowhere.
  struct HoldSignals {
    sigset_t old{};
    HoldSignals() {
      sigset_t hold;
      ::sigemptyset(&hold);
      for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaddset(&hold, sig);
      ::pthread_sigmask(SIG_BLOCK, &hold, &old);
    }
    ~HoldSignals() { ::pthread_sigmask(SIG_SETMASK, &old, nullptr); }
  } hold;
  RunRecord first;
  first.name = name;
  first.started_at = now_iso8601();
  first.launcher_pid = ::getpid();
  first.launcher_start = process_start_time(first.launcher_pid);
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[8];
    std::snprintf(suffix, sizeof suffix, "%04x", unsigned(rd() & 0xffff));
    first.id = std::string(stamp) + "-" + (name.empty() ? "job" : name) + "-" + suffix;
    const std::string staging = runs_dir() + "/." + first.id + ".new";
    if (::mkdir(staging.c_str(), 0700) != 0) {
      if (errno == EEXIST) continue;
      throw Error("cannot create " + staging + ": " + std::strerror(errno),
                  "set MLTRAIN_HOME to a writable folder", exit_code::state);
    }
    ::chmod(staging.c_str(), 0700);  // whatever the umask: the owner reads and writes it
    if (!save_in(staging, first)) {
      ::rmdir(staging.c_str());
      throw Error("cannot write the run's record in " + runs_dir(),
                  "free some space there, or set MLTRAIN_HOME to a writable folder", exit_code::state);
    }
    // rename(2) onto a folder that is not empty fails: every run folder is born holding run.json.
    if (::rename(staging.c_str(), run_dir(first.id).c_str()) == 0) return first.id;
    const int err = errno;
    ::unlink((staging + "/run.json").c_str());
    ::rmdir(staging.c_str());
    if (err != EEXIST && err != ENOTEMPTY)
      throw Error("cannot create " + run_dir(first.id) + ": " + std::strerror(err),
                  "set MLTRAIN_HOME to a writable folder", exit_code::state);
  }
  throw Error("cannot find a free run id in " + runs_dir(), {}, exit_code::internal);
}

std::string workdir_of(const RunRecord& r, int host) {
  if (host >= 0 && size_t(host) < r.hosts.size() && !r.hosts[size_t(host)].workdir.empty())
    return r.hosts[size_t(host)].workdir;
  return r.workdir;
}

void fill_from_plan(RunRecord& r, const plan::Plan& p) {
  r.hosts.clear();
  for (const auto& h : p.hosts)
    r.hosts.push_back({h.host.name, h.local ? "127.0.0.1" : h.host.name, h.node_rank, "", {}});
  r.argv = p.argv;
  r.workdir = p.workdir;
  fill_ranks(r, p);
}

void fill_ranks(RunRecord& r, const plan::Plan& p) {
  for (size_t i = 0; i < p.hosts.size() && i < r.hosts.size(); ++i)
    r.hosts[i].node_rank = p.hosts[i].node_rank;
  r.ranks.clear();
  for (const auto& k : p.ranks) {
    RankRecord rr;
    rr.rank = k.rank;
    rr.host = k.host;
    rr.local_rank = k.local_rank;
    for (const auto& [key, v] : plan::rank_env(p, p.runtime, k.rank))
      if (key != "MLTRAIN_TOKEN") rr.env[key] = secret::shown_value(key, v);  // the job's secret stays out
    r.ranks.push_back(rr);
  }
  r.master_addr = p.master_addr;
  r.master_port = p.master_port;
}

bool save(const RunRecord& r) { return save_in(run_dir(r.id), r); }

namespace {

bool save_in(const std::string& dir, const RunRecord& r) {
  // Env values are bytes; a record shows invalid UTF-8 as U+FFFD rather than failing the run.
  std::string data = to_json_value(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  // A record that cannot be written whole is a warning, never the end of the run: only a record
  // fully written and on disk (fsync) replaces the last good one.
  std::string error;
  if (sync::write_atomically(AT_FDCWD, dir + "/run.json", data, 0600, true, error)) return true;
  log::warn("records", error + "; run.json keeps its last state");
  return false;
}

}  // namespace

namespace {

// Seconds from the run's start to the newest write in its folder (a rank's log, telemetry,
// run.json); 0 when unknown.
double last_sign_of_life(const RunRecord& r) {
  auto started = parse_iso8601(r.started_at);
  if (!started) return 0;
  double start = double(std::chrono::system_clock::to_time_t(*started));
  if (auto dot = r.started_at.find('.', 19); dot != std::string::npos)
    start += std::atof(("0" + r.started_at.substr(dot, 4)).c_str());
  const std::string dir = run_dir(r.id);
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  double last = 0;
  while (dirent* e = ::readdir(d)) {
    struct stat st {};
    if (e->d_name[0] == '.' || ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    last = std::max(last, double(st.st_mtim.tv_sec) + double(st.st_mtim.tv_nsec) / 1e9);
  }
  ::closedir(d);
  return last > start ? last - start : 0;
}

}  // namespace

RunRecord load(const std::string& id) {
  std::string path = run_dir(id) + "/run.json";
  bool ok = false;
  std::string data = read_all(path, ok);
  if (!ok)
    throw Error(path + ": cannot read run record: " + std::strerror(errno), "list runs with 'mltrain ls'");
  RunRecord r;
  try {
    r = from_json(json::parse(data));
  } catch (const json::exception& e) {
    throw Error(path + ": corrupt run record: " + e.what(), "remove the folder, or restore run.json");
  }
  if (r.id != id)
    throw Error(path + ": corrupt run record: its id is '" + r.id + "'",
                "remove the folder, or restore run.json");
  // A launcher that died without writing the end leaves "running" behind: say what it is, and
  // how long it ran as far as its folder knows (the last file written there).
  if (live_status(r.status) && !launcher_alive(r)) {
    r.status = "lost";
    r.duration_s = last_sign_of_life(r);
  }
  return r;
}

std::vector<RunRecord> list() {
  std::vector<RunRecord> out;
  DIR* d = ::opendir(runs_dir().c_str());
  if (!d) {
    if (errno == ENOENT) return out;  // no run yet
    throw_sys("opendir", runs_dir(), "set MLTRAIN_HOME to a readable folder");
  }
  std::vector<std::string> ids;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ids.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(ids.begin(), ids.end());
  for (const auto& id : ids) {
    try {
      out.push_back(load(id));
    } catch (const Error& e) {
      log::debug("records", std::string("skipping ") + e.what());
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const RunRecord& a, const RunRecord& b) { return a.started_at < b.started_at; });
  return out;
}

std::vector<std::string> half_made_runs() {
  std::vector<std::string> out;
  const int dir = ::open(runs_dir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir < 0) return out;
  DIR* d = ::fdopendir(dir);
  if (!d) {
    ::close(dir);
    return out;
  }
  static constexpr std::string_view kNew = ".new";
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() <= 1 + kNew.size() || n[0] != '.' ||
        n.compare(n.size() - kNew.size(), kNew.size(), kNew) != 0)
      continue;
    struct stat st {};
    if (::fstatat(dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::getuid())
      continue;
    const std::string id = n.substr(1, n.size() - 1 - kNew.size());
    bool ok = false;
    const std::string data = read_all(runs_dir() + "/" + n + "/run.json", ok);
    if (!ok) {  // killed before its record was written, or a launcher writing it this moment
      if (errno == ENOENT && std::time(nullptr) - st.st_mtime > 60) out.push_back(n);
      continue;
    }
    try {
      const RunRecord r = from_json(json::parse(data));
      if (r.id == id && !launcher_alive(r)) out.push_back(n);
    } catch (const json::exception&) {
    }
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve(const std::string& query) {
  auto runs = list();
  if (runs.empty()) throw Error("no runs recorded in " + runs_dir(), "start one with 'mltrain run'");
  if (query.empty() || query == "latest" || query == "last") return runs.back().id;
  std::vector<std::string> prefix, part;
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {  // newest first
    if (it->id == query) return it->id;
    if (text::starts_with(it->id, query))
      prefix.push_back(it->id);
    else if (it->id.find(query) != std::string::npos)
      part.push_back(it->id);
  }
  // One rule for every command: a query that names several runs is refused, never guessed.
  const auto& matches = prefix.empty() ? part : prefix;
  if (matches.size() == 1) return matches.front();
  if (matches.size() > 1) {
    const size_t shown = std::min<size_t>(matches.size(), 10);
    std::string list;
    for (size_t i = 0; i < shown; ++i) list += "\n  " + matches[i];
    if (shown < matches.size()) list += "\n  ... and " + std::to_string(matches.size() - shown) + " more";
    throw Error("'" + query + "' matches " + std::to_string(matches.size()) + " runs (newest first):" + list,
                "give more of the id, or 'latest' for the newest run");
  }
  std::vector<std::string> ids = {"latest"};
  for (const auto& r : runs) ids.push_back(r.id);
  throw Error("no run matches '" + text::host_text(query, 80) + "'" + text::did_you_mean(query, ids),
              "list runs with 'mltrain ls'");
}

std::string to_json(const RunRecord& r, bool pretty) {
  return to_json_value(r).dump(pretty ? 2 : -1, ' ', false, json::error_handler_t::replace);
}

std::string list_to_json(const std::vector<RunRecord>& runs) {
  json a = json::array();
  for (const auto& r : runs) {
    json j = to_json_value(r);
    j.erase("schema");
    j.erase("spec_text");
    for (auto& k : j["ranks"]) k.erase("env");
    a.push_back(j);
  }
  json doc{{"schema", kJsonSchema}, {"runs", a}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string plan_to_json(const plan::Plan& p) {
  json hosts = json::array();
  for (const auto& h : p.hosts)
    hosts.push_back({{"name", h.host.name},
                     {"user", or_null(h.host.user)},  // null: from the ssh config
                     {"port", or_null(h.host.port, 0)},
                     {"local", h.local},
                     {"node_rank", h.node_rank},
                     {"ranks", h.ranks},
                     {"ps_servers", h.ps_servers}});
  json ranks = json::array();
  for (const auto& r : p.ranks) {
    json env = json::object();
    for (const auto& [k, v] : plan::rank_env(p, p.runtime, r.rank)) env[k] = secret::shown_value(k, v);
    ranks.push_back({{"rank", r.rank},
                     {"host", p.hosts[size_t(r.host)].host.name},
                     {"node_rank", p.hosts[size_t(r.host)].node_rank},
                     {"local_rank", r.local_rank},
                     {"env", env}});
  }
  json j{{"schema", kJsonSchema},
         {"id", p.run_id},
         {"name", p.name},
         {"argv", p.argv},
         {"workdir", p.workdir},
         {"python_path", p.python_path},
         {"master_addr", p.master_addr},
         {"master_port", p.master_port},
         {"store_addr", p.store_addr},
         {"world_size", p.ranks.size()},
         {"hosts", hosts},
         {"ranks", ranks},
         {"ps", p.ps_mode ? json{{"servers", p.ps.servers},
                                 {"sync", p.ps.sync},
                                 {"partition_bytes", p.ps.partition_bytes},
                                 {"optimizer", or_null(p.ps.optimizer)},
                                 {"lr", p.ps.lr},
                                 {"momentum", p.ps.momentum},
                                 {"weight_decay", p.ps.weight_decay}}
                          : json(nullptr)}};
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

unsigned long long process_start_time(int pid) {
  bool ok = false;
  std::string stat = read_all("/proc/" + std::to_string(pid) + "/stat", ok);
  if (!ok) return 0;
  auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream in(stat.substr(close_paren + 2));
  std::string field;
  // Field 22 (starttime); we are now at field 3.
  for (int i = 3; i < 22 && in >> field; ++i) {
  }
  unsigned long long start = 0;
  in >> start;
  return start;
}

bool launcher_alive(const RunRecord& r) {
  if (r.launcher_pid <= 0) return false;
  if (::kill(r.launcher_pid, 0) != 0 && errno == ESRCH) return false;
  bool ok = false;
  std::string stat = read_all("/proc/" + std::to_string(r.launcher_pid) + "/stat", ok);
  auto paren = stat.rfind(')');
  if (!ok || paren == std::string::npos || paren + 2 >= stat.size()) return false;
  if (stat[paren + 2] == 'Z' || stat[paren + 2] == 'X') return false;  // dead, not yet reaped
  return process_start_time(r.launcher_pid) == r.launcher_start;
}

std::string now_iso8601() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03lldZ", buf, static_cast<long long>(ms));
  return out;
}

std::string order_path_in(const std::string& dir) { return dir + "/output.order"; }

std::string prefix_template(const std::string& tmpl, bool multi_host) {
  if (tmpl != "auto") return tmpl;
  return multi_host ? "[{host}:{rank}]" : "[{rank}]";
}

std::string render_prefix(const std::string& tmpl, int rank, int local_rank, int node,
                          const std::string& host) {
  std::string s = tmpl;
  auto replace_all = [&s](std::string_view what, const std::string& with) {
    for (size_t pos = 0; (pos = s.find(what, pos)) != std::string::npos; pos += with.size())
      s.replace(pos, what.size(), with);
  };
  replace_all("{rank}", std::to_string(rank));
  replace_all("{local_rank}", std::to_string(local_rank));
  replace_all("{node}", std::to_string(node));
  replace_all("{host}", host);
  return s;
}

}  // namespace mltrain::records
