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
#include "runner/common/state_home.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/plan/plan.h"

namespace mltrain::records {

using json = nlohmann::ordered_json;

namespace {

void make_dirs(const std::string& path) {
  std::string cur;
  for (const auto& part : text::split(path, '/')) {
    cur += part + "/";
    if (part.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST)
      throw Error("cannot create " + cur + ": " + std::strerror(errno),
                  "set MLTRAIN_HOME to a writable folder", exit_code::internal);
  }
}

std::string read_all(const std::string& path, bool& ok) {
  std::ifstream in(path, std::ios::binary);
  ok = bool(in);
  std::ostringstream ss;
  if (ok) ss << in.rdbuf();
  return ss.str();
}

json failure_json(const Failure& f) {
  return json{{"rank", f.rank},       {"host", f.host}, {"exit_code", f.exit_code}, {"signal", f.signal},
              {"message", f.message}, {"tail", f.tail}, {"reason", f.reason}};
}

RunRecord from_json(const json& j) {
  RunRecord r;
  r.id = j.value("id", "");
  r.name = j.value("name", "");
  r.status = j.value("status", "unknown");
  r.exit_code = j.value("exit_code", -1);
  r.launcher_pid = j.value("launcher_pid", 0);
  r.launcher_start = j.value("launcher_start", 0ULL);
  r.started_at = j.value("started_at", "");
  r.ended_at = j.value("ended_at", "");
  r.duration_s = j.value("duration_s", 0.0);
  r.spec_file = j.value("spec_file", "");
  r.spec_toml = j.value("spec", "");
  r.workdir = j.value("workdir", "");
  r.git_commit = j.value("git_commit", "");
  r.master_addr = j.value("master_addr", "");
  r.master_port = j.value("master_port", 0);
  r.argv = j.value("argv", std::vector<std::string>{});
  r.restarts = j.value("restarts", 0);
  r.max_restarts = j.value("max_restarts", 0);
  r.detached = j.value("detached", false);
  for (const auto& h : j.value("hosts", json::array()))
    r.hosts.push_back({h.value("name", ""), h.value("address", ""), h.value("node_rank", 0)});
  for (const auto& k : j.value("ranks", json::array())) {
    RankRecord rr;
    rr.rank = k.value("rank", 0);
    rr.host = k.value("host", 0);
    rr.local_rank = k.value("local_rank", 0);
    rr.pid = k.value("pid", 0);
    rr.exit_code = k.value("exit_code", -1);
    rr.signal = k.value("signal", 0);
    rr.host_lost = k.value("host_lost", false);
    rr.env = k.value("env", std::map<std::string, std::string>{});
    r.ranks.push_back(rr);
  }
  if (j.contains("failure") && j["failure"].is_object()) {
    const auto& f = j["failure"];
    r.failure =
        Failure{f.value("rank", -1),  f.value("host", ""),    f.value("exit_code", 0),
                f.value("signal", 0), f.value("message", ""), f.value("tail", std::vector<std::string>{}),
                f.value("reason", "")};
  }
  return r;
}

json to_json_value(const RunRecord& r) {
  json hosts = json::array();
  for (const auto& h : r.hosts)
    hosts.push_back({{"name", h.name}, {"address", h.address}, {"node_rank", h.node_rank}});
  json ranks = json::array();
  for (const auto& k : r.ranks)
    ranks.push_back({{"rank", k.rank},
                     {"host", k.host},
                     {"local_rank", k.local_rank},
                     {"pid", k.pid},
                     {"exit_code", k.exit_code},
                     {"signal", k.signal},
                     {"host_lost", k.host_lost},
                     {"env", k.env}});
  json j{{"id", r.id},
         {"name", r.name},
         {"status", r.status},
         {"exit_code", r.exit_code},
         {"launcher_pid", r.launcher_pid},
         {"launcher_start", r.launcher_start},
         {"started_at", r.started_at},
         {"ended_at", r.ended_at},
         {"duration_s", r.duration_s},
         {"spec_file", r.spec_file},
         {"workdir", r.workdir},
         {"git_commit", r.git_commit},
         {"argv", r.argv},
         {"master_addr", r.master_addr},
         {"master_port", r.master_port},
         {"restarts", r.restarts},
         {"max_restarts", r.max_restarts},
         {"detached", r.detached},
         {"hosts", hosts},
         {"ranks", ranks},
         {"failure", r.failure ? failure_json(*r.failure) : json(nullptr)},
         {"spec", r.spec_toml}};
  return j;
}

}  // namespace

std::string runs_dir() { return mltrain::state_home() + "/runs"; }
std::string run_dir(const std::string& id) { return runs_dir() + "/" + id; }

std::string create_run(const std::string& name) {
  make_dirs(runs_dir());
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[8];
    std::snprintf(suffix, sizeof suffix, "%04x", unsigned(rd() & 0xffff));
    std::string id = std::string(stamp) + "-" + (name.empty() ? "job" : name) + "-" + suffix;
    if (::mkdir(run_dir(id).c_str(), 0755) == 0) return id;
    if (errno != EEXIST)
      throw Error("cannot create " + run_dir(id) + ": " + std::strerror(errno),
                  "set MLTRAIN_HOME to a writable folder", exit_code::internal);
  }
  throw Error("cannot find a free run id in " + runs_dir(), {}, exit_code::internal);
}

void fill_from_plan(RunRecord& r, const plan::Plan& p) {
  r.hosts.clear();
  for (const auto& h : p.hosts)
    r.hosts.push_back({h.host.name, h.local ? "127.0.0.1" : h.host.name, h.node_rank});
  r.ranks.clear();
  for (const auto& k : p.ranks) {
    RankRecord rr;
    rr.rank = k.rank;
    rr.host = k.host;
    rr.local_rank = k.local_rank;
    for (const auto& [key, v] : k.env)
      if (key != "MLTRAIN_TOKEN") rr.env[key] = v;  // the job's secret stays out of records
    r.ranks.push_back(rr);
  }
  r.argv = p.argv;
  r.workdir = p.workdir;
  r.master_addr = p.master_addr;
  r.master_port = p.master_port;
}

void save(const RunRecord& r) {
  std::string dir = run_dir(r.id);
  std::string tmp = dir + "/.run.json.tmp";
  // Env values are bytes; a record shows invalid UTF-8 as U+FFFD rather than failing the run.
  std::string data = to_json_value(r).dump(2, ' ', false, json::error_handler_t::replace) + "\n";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    log::warn("records", "cannot write " + tmp + ": " + std::strerror(errno));
    return;
  }
  // A record that cannot be written is a warning, never the end of the run; a short one is not
  // renamed over the last good one.
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      log::warn("records", sys_error_text("write", tmp));
      ::close(fd);
      return;
    }
    off += size_t(n);
  }
  if (::close(fd) != 0) {
    log::warn("records", sys_error_text("close", tmp));
    return;
  }
  if (::rename(tmp.c_str(), (dir + "/run.json").c_str()) != 0)
    log::warn("records", sys_error_text("rename", tmp + " to run.json"));
}

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
  // A launcher that died without writing the end leaves "running" behind: say what it is.
  if (r.status == "running" && !launcher_alive(r)) r.status = "lost";
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

std::string resolve(const std::string& query, bool unique) {
  auto runs = list();
  if (runs.empty()) throw Error("no runs recorded in " + runs_dir(), "start one with 'mltrain run'");
  if (query.empty() || query == "latest" || query == "last") return runs.back().id;
  std::vector<std::string> exact, prefix, sub;
  for (const auto& r : runs) {
    if (r.id == query)
      exact.push_back(r.id);
    else if (text::starts_with(r.id, query))
      prefix.push_back(r.id);
    else if (r.id.find(query) != std::string::npos)
      sub.push_back(r.id);
  }
  if (!exact.empty()) return exact.front();
  for (auto* set : {&prefix, &sub}) {
    if (set->size() == 1) return set->front();
    if (set->size() > 1) {
      // Several runs of the same name: to read, the newest is what people mean ("logs hello");
      // to act on one (stop), guessing is not allowed.
      if (!unique) return set->back();
      std::vector<std::string> shown(set->end() - std::min<long>(long(set->size()), 5), set->end());
      throw Error(
          "'" + query + "' matches " + std::to_string(set->size()) + " runs: " + text::join(shown, ", "),
          "give more of the id");
    }
  }
  std::vector<std::string> ids;
  for (const auto& r : runs) ids.push_back(r.id);
  throw Error("no run matches '" + query + "'" + text::did_you_mean(query, ids),
              "list runs with 'mltrain ls'");
}

std::string to_json(const RunRecord& r, bool pretty) {
  return to_json_value(r).dump(pretty ? 2 : -1, ' ', false, json::error_handler_t::replace);
}

std::string list_to_json(const std::vector<RunRecord>& runs) {
  json a = json::array();
  for (const auto& r : runs) {
    json j = to_json_value(r);
    j.erase("spec");
    for (auto& k : j["ranks"]) k.erase("env");
    a.push_back(j);
  }
  return a.dump(2, ' ', false, json::error_handler_t::replace);
}

std::string plan_to_json(const plan::Plan& p) {
  json hosts = json::array();
  for (const auto& h : p.hosts)
    hosts.push_back({{"name", h.host.name},
                     {"user", h.host.user},
                     {"port", h.host.port},
                     {"local", h.local},
                     {"node_rank", h.node_rank},
                     {"ranks", h.ranks}});
  json ranks = json::array();
  for (const auto& r : p.ranks) {
    json env = json::object();
    for (const auto& [k, v] : r.env) env[k] = k == "MLTRAIN_TOKEN" ? std::string("<secret>") : v;
    ranks.push_back({{"rank", r.rank},
                     {"host", p.hosts[size_t(r.host)].host.name},
                     {"local_rank", r.local_rank},
                     {"env", env}});
  }
  json j{{"run_id", p.run_id},
         {"name", p.name},
         {"argv", p.argv},
         {"workdir", p.workdir},
         {"master_addr", p.master_addr},
         {"master_port", p.master_port},
         {"store_addr", p.store_addr},
         {"world_size", p.ranks.size()},
         {"hosts", hosts},
         {"ranks", ranks}};
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

}  // namespace mltrain::records
