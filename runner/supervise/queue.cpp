// `mltrain queue`: every host's agent asked for its leases (detail/ask_play.h), and their table.
#include "runner/supervise/queue.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/lease/lease.h"
#include "runner/supervise/detail/ask_play.h"

namespace mltrain::supervise {

namespace plays::ask {

Phase next(Phase p, Event e) {
  static constexpr Transition<Phase, Event> kTable[] = {
      {Phase::connecting, Event::greeted, Phase::asking},  // every host is asked the question
      {Phase::connecting, Event::signalled, Phase::done}, {Phase::asking, Event::signalled, Phase::done},
      {Phase::asking, Event::answered, Phase::closing},  // every host answered, or failed
      {Phase::closing, Event::closed, Phase::done},
  };
  return lookup(kTable, p, e);
}

}  // namespace plays::ask

int run_queue(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
              const std::string& space, const std::string& nvml_library, std::vector<HostLeases>& hosts) {
  detail::Fleet fleet(plan, opts, transport_for);
  detail::AskPlay<agent::msg::LeaseQuery, agent::msg::LeaseList> play(fleet, {space, nvml_library},
                                                                      "list its leases");
  const int code = play.run();
  for (size_t i = 0; i < fleet.size(); ++i) {
    HostLeases h;
    h.host = fleet[i].name();
    h.ok = play.answer(i).has_value();
    if (h.ok) {
      h.list = std::move(*play.answer(i));
      if (h.list.leases.size() > 4096) h.list.leases.resize(4096);  // a host's word: bounded
    } else {
      h.problem = play.problem(i);
    }
    hosts.push_back(std::move(h));
  }
  return code;
}

namespace {

using nlohmann::json;

// One lease as a host listed it: the kernel's facts (name, uid, pid, account) and the holder's
// own words, every field escaped and cut (the holder may be anyone on the host).
struct Held {
  std::string name, run, user, launcher, account;
  int64_t since = 0, uid = -1, pid = 0, gpus = 0;
  std::string hosts;
  std::string doubt;  // why the agent holds it for no mltrain agent (lease::Seen::doubt)
  bool answered = false;
};

Held parse(const std::string& entry) {
  lease::Info info = lease::decode(entry);
  auto get = [&](const char* k, size_t max = 80) {
    auto it = info.find(k);
    return it == info.end() ? std::string() : text::host_text(it->second, max);
  };
  auto num = [&](const char* k) { return text::parse_int_in(get(k, 24), 0, INT64_MAX).value_or(0); };
  Held h;
  h.name = get("name", lease::kMaxName);
  h.run = get("run"), h.user = get("user", 40), h.launcher = get("launcher", 64),
  h.account = get("account", 40);
  h.since = num("since"), h.pid = num("pid"), h.gpus = num("gpus");
  h.uid = info.count("uid") ? num("uid") : -1;
  h.hosts = get("hosts", 120);
  h.answered = get("answered", 2) == "1";
  h.doubt = get("doubt", 120);
  return h;
}

// Who holds it: what it says (user@launcher), and the account the kernel says it runs as when that
// is another name ("alice@laptop as mlstr12"): a holder's own word is never the only one shown.
std::string who(const Held& h) {
  const std::string account = h.account.empty() && h.uid >= 0 ? "uid " + std::to_string(h.uid) : h.account;
  if (h.run.empty() || h.user.empty()) return account;
  std::string u = h.user + (h.launcher.empty() ? "" : "@" + h.launcher);
  return account.empty() || account == h.user ? u : u + " as " + account;
}

// The RUN column: the run it names, or why it is no run at all.
std::string run_cell(const Held& h, const std::string& fallback = "?") {
  if (!h.doubt.empty()) return "(ignored: " + h.doubt + ")";
  return h.run.empty() ? fallback : h.run;
}

std::string age(int64_t since, int64_t now) {
  if (since <= 0 || now < since) return "-";
  return text::format_duration(std::chrono::milliseconds((now - since) * 1000));
}

json held_json(const Held& h) {
  return json{{"run", h.run.empty() ? json(nullptr) : json(h.run)},
              {"user", h.user.empty() ? json(nullptr) : json(h.user)},
              {"launcher", h.launcher.empty() ? json(nullptr) : json(h.launcher)},
              {"since", h.since > 0 ? json(h.since) : json(nullptr)},
              {"uid", h.uid >= 0 ? json(h.uid) : json(nullptr)},
              {"account", h.account.empty() ? json(nullptr) : json(h.account)},
              {"pid", h.pid > 0 ? json(h.pid) : json(nullptr)},
              {"answered", h.answered},
              {"ignored", h.doubt.empty() ? json(nullptr) : json(h.doubt)}};
}

// One host's leases, by kind.
struct HostView {
  std::map<std::string, Held> gpu_by_uuid, jobs;  // jobs by run id (from job/<run>)
  std::optional<Held> exclusive;
  std::vector<Held> queue;
  std::vector<Held> ignored;  // squatters on names other than the GPUs' and the exclusive one
};

// A believed holder wins over a squatter on the same thing (a job then holds "gpu/<uuid>/<run>");
// the squatter still gets a row of its own.
void keep(std::optional<Held>& slot, const Held& held, std::vector<Held>& ignored) {
  if (!slot || (!slot->doubt.empty() && held.doubt.empty())) {
    if (slot) ignored.push_back(*slot);
    slot = held;
  } else if (!held.doubt.empty()) {
    ignored.push_back(held);
  }
}

HostView view_of(const HostLeases& h) {
  HostView v;
  for (const auto& e : h.list.leases) {
    Held held = parse(e);
    const std::string& n = held.name;
    if (n.rfind("gpu/", 0) == 0) {
      const std::string uuid =
          n.substr(4, n.find('/', 4) == std::string::npos ? std::string::npos : n.find('/', 4) - 4);
      std::optional<Held> slot;
      if (auto it = v.gpu_by_uuid.find(uuid); it != v.gpu_by_uuid.end()) slot = it->second;
      keep(slot, held, v.ignored);
      v.gpu_by_uuid[uuid] = *slot;
    } else if (n == "exclusive" || n.rfind("exclusive/", 0) == 0) {
      keep(v.exclusive, held, v.ignored);
    } else if (!held.doubt.empty()) {
      v.ignored.push_back(held);
    } else if (n.rfind("job/", 0) == 0) {
      v.jobs[n.substr(4)] = held;
    } else if (n.rfind("queue/", 0) == 0) {
      v.queue.push_back(held);
    }
  }
  return v;
}

std::string format_json(const std::vector<HostLeases>& hosts, int64_t) {
  json out = json::array();
  for (const auto& h : hosts) {
    json host{{"host", h.host}, {"ok", h.ok}, {"problem", h.ok ? json(nullptr) : json(h.problem)}};
    HostView v = view_of(h);
    json gpus = json::array();
    for (size_t k = 0; k < h.list.gpus.size(); ++k) {
      const auto& g = h.list.gpus[k];
      auto held = v.gpu_by_uuid.find(g.uuid);
      int util = k < h.list.util_percent.size() ? h.list.util_percent[k] : -1;
      gpus.push_back({{"index", g.index},
                      {"uuid", text::host_text(g.uuid, 64)},
                      {"name", text::host_text(g.name, 64)},
                      {"util_percent", util >= 0 ? json(util) : json(nullptr)},
                      {"busy", k < h.list.busy.size() && h.list.busy[k] != 0},
                      {"held_by", held == v.gpu_by_uuid.end() ? json(nullptr) : held_json(held->second)}});
    }
    host["gpus"] = gpus;
    json jobs = json::array();
    for (const auto& [run, j] : v.jobs) jobs.push_back(held_json(j));
    host["jobs"] = jobs;
    host["exclusive"] = v.exclusive ? held_json(*v.exclusive) : json(nullptr);
    json queue = json::array();
    for (const auto& q : v.queue) {
      json e = held_json(q);
      e["key"] = q.name.substr(6);
      e["gpus"] = q.gpus;
      queue.push_back(e);
    }
    host["queue"] = queue;
    out.push_back(host);
  }
  return json{{"hosts", out}}.dump(2) + "\n";
}

// The GPU rows of one host: consecutive GPUs with the same holder (or free) in one row.
void gpu_rows(const HostLeases& h, const HostView& v, int64_t now,
              std::vector<std::vector<std::string>>& rows) {
  const auto& gpus = h.list.gpus;
  for (size_t k = 0; k < gpus.size();) {
    auto holder = [&](size_t i) {  // one row for a job's GPUs: the same run (or pid, when it did not say)
      auto it = v.gpu_by_uuid.find(gpus[i].uuid);
      return it == v.gpu_by_uuid.end() ? std::string()
                                       : it->second.run + "/" + std::to_string(it->second.pid);
    };
    size_t end = k + 1;
    const bool busy_k = k < h.list.busy.size() && h.list.busy[k];
    while (end < gpus.size() && holder(end) == holder(k) &&
           (end < h.list.busy.size() && h.list.busy[end]) == busy_k)
      ++end;
    std::vector<int> idx;
    std::vector<std::string> utils;
    for (size_t i = k; i < end; ++i) {
      idx.push_back(gpus[i].index);
      int u = i < h.list.util_percent.size() ? h.list.util_percent[i] : -1;
      utils.push_back(u >= 0 ? std::to_string(u) + "%" : "-");
    }
    auto it = v.gpu_by_uuid.find(gpus[k].uuid);
    if (it != v.gpu_by_uuid.end())
      rows.push_back({h.host, text::int_ranges(idx), run_cell(it->second), who(it->second),
                      age(it->second.since, now), text::join(utils, ",")});
    else
      rows.push_back({h.host, text::int_ranges(idx), busy_k ? "(a process not mltrain's)" : "(free)", "", "",
                      text::join(utils, ",")});
    k = end;
  }
}

std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c)
      width.resize(std::max(width.size(), r.size())), width[c] = std::max(width[c], r[c].size());
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c)
      line += c + 1 < r.size() ? r[c] + std::string(width[c] - r[c].size() + 2, ' ') : r[c];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

std::string format_queue(const std::vector<HostLeases>& hosts, bool json_out, int64_t now) {
  if (json_out) return format_json(hosts, now);
  std::vector<std::vector<std::string>> rows = {{"HOST", "GPU", "RUN", "USER", "SINCE", "UTIL"}};
  std::map<std::string, std::pair<Held, std::vector<std::string>>> waiting;  // by queue key
  std::string problems;
  for (const auto& h : hosts) {
    if (!h.ok) {
      problems += "mltrain: " + text::named(h.host, h.problem) + "\n";
      continue;
    }
    HostView v = view_of(h);
    gpu_rows(h, v, now, rows);
    std::set<std::string> shown;  // jobs with GPUs, and those waiting, have rows of their own
    for (const auto& [uuid, g] : v.gpu_by_uuid) shown.insert(g.run);
    for (const auto& q : v.queue) shown.insert(q.run);
    for (const auto& [run, j] : v.jobs)
      if (!shown.count(j.run))
        rows.push_back({h.host, "-", j.run.empty() ? run : j.run, who(j), age(j.since, now),
                        v.exclusive && v.exclusive->run == j.run ? "(the host alone)" : ""});
    // The host's exclusive holder, unless its job row above says so (one with GPUs has GPU rows).
    const bool said_alone = v.exclusive && v.exclusive->doubt.empty() && !shown.count(v.exclusive->run) &&
                            std::any_of(v.jobs.begin(), v.jobs.end(),
                                        [&](const auto& j) { return j.second.run == v.exclusive->run; });
    if (v.exclusive && !said_alone)
      rows.push_back({h.host, "-", run_cell(*v.exclusive), who(*v.exclusive), age(v.exclusive->since, now),
                      "(the host alone)"});
    for (const auto& x : v.ignored)
      rows.push_back({h.host, "-", run_cell(x), who(x), "", "(" + x.name + ")"});
    if (h.list.gpus.empty() && v.jobs.empty() && !v.exclusive && v.ignored.empty())
      rows.push_back({h.host, "-", "(no job)", "", "", ""});
    for (const auto& q : v.queue) {
      auto& w = waiting[q.name];
      w.first = q;
      w.second.push_back(h.host);
    }
  }
  std::string out = table(rows);
  if (!waiting.empty()) {
    std::vector<std::vector<std::string>> q = {{"QUEUE", "RUN", "USER", "WANTS", "WAITING"}};
    int n = 0;
    for (const auto& [key, w] : waiting)
      q.push_back(
          {std::to_string(++n), w.first.run, who(w.first),
           (w.first.gpus > 0 ? std::to_string(w.first.gpus) + (w.first.gpus == 1 ? " GPU on " : " GPUs on ")
                             : std::string("")) +
               text::compact_names(w.second),
           age(w.first.since, now)});
    out += "\n" + table(q);
  }
  return out + problems;
}

}  // namespace mltrain::supervise
