// `mltrain diff A B`: what changed between two runs, on one screen (docs/records.md, "Diff").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/records/code.h"
#include "runner/records/metrics.h"
#include "runner/records/records.h"
#include "runner/records/telemetry_log.h"
#include "runner/records/views.h"
#include "runner/telemetry/analysis.h"

namespace mltrain::records {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxText = 1u << 20;  // a larger file is compared by its hash only
constexpr size_t kMaxPatch = 4u << 20;   // of the whole code diff; the rest is cut, and says so

bool is_text(const std::string& s) { return s.find('\0') == std::string::npos; }

bool write_all(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) break;
    off += size_t(n);
  }
  ::close(fd);
  return off == data.size();
}

// `diff -u` of two texts, labelled a/<label> and b/<label>; "" when they are the same.
std::string unified(const std::string& label, const std::string& a, const std::string& b) {
  if (a == b) return {};
  std::string dir = (std::filesystem::temp_directory_path() / "mltrain-diff-XXXXXX").string();
  if (!::mkdtemp(dir.data())) return "diff of " + label + ": no temporary folder\n";
  const std::string fa = dir + "/a", fb = dir + "/b";
  std::string out;
  if (write_all(fa, a) && write_all(fb, b)) {
    std::string cmd = "diff -u --label " + text::shell_quote("a/" + label) + " --label " +
                      text::shell_quote("b/" + label) + " " + fa + " " + fb + " 2>&1";
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[65536];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
  }
  ::unlink(fa.c_str());
  ::unlink(fb.c_str());
  ::rmdir(dir.c_str());
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

struct CodeDiff {
  std::string missing;  // why the code cannot be compared ("" when it can)
  std::vector<std::string> added, removed, changed, withheld;
  std::string patch;
};

// A file's text for a diff: its content, or nullopt when it is binary, large, withheld or gone.
std::optional<std::string> text_of(const CodeEntry& e, const std::set<std::string>& held) {
  if (e.kind == CodeEntry::symlink) return "-> " + e.target + "\n";
  if (e.kind != CodeEntry::file || held.count(e.path) || e.size > kMaxText) return std::nullopt;
  auto c = stored_content(e.hash, kMaxText);
  if (!c || !is_text(*c)) return std::nullopt;
  return c;
}

CodeDiff diff_code(const RunRecord& a, const RunRecord& b) {
  CodeDiff d;
  auto ma = code_manifest(a.id), mb = code_manifest(b.id);
  if (!ma || !mb) {
    d.missing = "run " + (!ma ? a.id : b.id) + " kept no code (docs/records.md)";
    return d;
  }
  std::map<std::string, const CodeEntry*> in_a, in_b;
  for (const auto& e : ma->entries) in_a[e.path] = &e;
  for (const auto& e : mb->entries) in_b[e.path] = &e;
  std::set<std::string> held(ma->withheld.begin(), ma->withheld.end());
  held.insert(mb->withheld.begin(), mb->withheld.end());
  std::set<std::string> paths;
  for (const auto& [p, e] : in_a) paths.insert(p);
  for (const auto& [p, e] : in_b) paths.insert(p);
  const CodeEntry none;
  for (const auto& p : paths) {
    const CodeEntry* ea = in_a.count(p) ? in_a[p] : nullptr;
    const CodeEntry* eb = in_b.count(p) ? in_b[p] : nullptr;
    if (ea && eb && ea->kind == eb->kind && ea->hash == eb->hash && ea->mode == eb->mode &&
        ea->target == eb->target)
      continue;
    (ea && eb ? d.changed : ea ? d.removed : d.added).push_back(p);
    if ((ea ? *ea : *eb).kind == CodeEntry::dir) continue;
    if (held.count(p)) {
      d.withheld.push_back(p);
      continue;
    }
    std::optional<std::string> ta = ea ? text_of(*ea, held) : std::string();
    std::optional<std::string> tb = eb ? text_of(*eb, held) : std::string();
    std::string piece;
    if (ta && tb)
      piece = unified(p, *ta, *tb);
    else if (ea && eb && ea->hash != eb->hash)
      piece = "Binary or large files a/" + p + " and b/" + p + " differ\n";
    if (ea && eb && ea->mode != eb->mode && piece.empty()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "mode %o -> %o", ea->mode, eb->mode);
      piece = p + ": " + buf + "\n";
    }
    if (d.patch.size() + piece.size() > kMaxPatch) {
      if (d.patch.find("[mltrain: the code diff is cut") == std::string::npos)
        d.patch += "[mltrain: the code diff is cut at 4 MiB]\n";
      continue;
    }
    d.patch += piece;
  }
  return d;
}

std::string status_of(const RunRecord& r) {
  return r.status + (r.exit_code >= 0 ? " (exit " + std::to_string(r.exit_code) + ")" : "");
}

std::string gpus_of(const RunRecord& r) {
  std::vector<std::string> out;
  for (const auto& k : r.ranks) {
    if (k.gpus.empty()) continue;
    std::vector<std::string> ids;
    for (const auto& g : k.gpus) ids.push_back(std::to_string(g.index));
    const std::string host = size_t(k.host) < r.hosts.size() ? r.hosts[size_t(k.host)].name : "?";
    out.push_back(std::to_string(k.rank) + ":" + host + "/" + text::join(ids, "+"));
  }
  return out.empty() ? "-" : text::join(out, " ");
}

// Utilization over the run from its telemetry: the hosts' CPU and the GPUs' mean ("-": none).
std::pair<std::string, std::string> utilization_of(const RunRecord& r) {
  const telemetry::Summary s = telemetry::summarize(read_telemetry(run_dir(r.id) + "/telemetry.jsonl"));
  auto pct = [](std::optional<double> v) {
    if (!v) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof buf, "mean %.0f%%", *v);
    return std::string(buf);
  };
  telemetry::Stat gpu;
  for (const auto& g : s.gpus)
    if (auto m = g.util.mean()) gpu.add(*m);
  return {s.samples ? pct(s.host_cpu.mean()) : "-", s.gpus.empty() ? "-" : pct(gpu.mean())};
}

// The rows both runs have, as name -> (A's, B's).
std::vector<std::pair<std::string, std::pair<std::string, std::string>>> rows(const RunRecord& a,
                                                                              const RunRecord& b) {
  auto hosts = [](const RunRecord& r) {
    std::vector<std::string> n;
    for (const auto& h : r.hosts) n.push_back(h.name);
    return text::join(n, ",");
  };
  auto argv = [](const RunRecord& r) {
    std::vector<std::string> q;
    for (const auto& w : r.argv) q.push_back(text::shell_quote(w));
    return text::join(q, " ");
  };
  auto code = [](const RunRecord& r) {
    return r.code.recorded
               ? std::to_string(r.code.files) + " files, " + std::to_string(r.code.bytes) + " bytes"
               : std::string("-");
  };
  auto dur = [](const RunRecord& r) {
    return live_status(r.status)
               ? std::string("-")
               : text::format_duration(std::chrono::milliseconds((long long)(r.duration_s * 1000)));
  };
  auto or_dash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::vector<std::pair<std::string, std::pair<std::string, std::string>>> out = {
      {"run", {a.id, b.id}},
      {"name", {a.name, b.name}},
      {"status", {status_of(a), status_of(b)}},
      {"started", {a.started_at, b.started_at}},
      {"duration", {dur(a), dur(b)}},
      {"command", {argv(a), argv(b)}},
      {"hosts", {hosts(a), hosts(b)}},
      {"ranks", {std::to_string(a.ranks.size()), std::to_string(b.ranks.size())}},
      {"gpus", {gpus_of(a), gpus_of(b)}},
      {"restarts", {std::to_string(a.restarts), std::to_string(b.restarts)}},
      {"git",
       {or_dash(a.git_commit) + (a.code.dirty ? " + changes" : ""),
        or_dash(b.git_commit) + (b.code.dirty ? " + changes" : "")}},
      {"code", {code(a), code(b)}},
      {"rerun of", {or_dash(a.rerun_of), or_dash(b.rerun_of)}}};
  const auto ua = utilization_of(a), ub = utilization_of(b);
  out.push_back({"cpu use", {ua.first, ub.first}});
  out.push_back({"gpu use", {ua.second, ub.second}});
  // Then the hosts' environment, each fact either run has.
  const auto ea = environment_rows(a), eb = environment_rows(b);
  auto value = [&](const std::vector<std::pair<std::string, std::string>>& rows, const std::string& k) {
    for (const auto& [key, v] : rows)
      if (key == k) return v;
    return std::string("-");
  };
  for (const auto* side : {&ea, &eb})
    for (const auto& [k, v] : *side)
      if (std::none_of(out.begin(), out.end(), [&](const auto& row) { return row.first == k; }))
        out.push_back({k, {value(ea, k), value(eb, k)}});
  return out;
}

// Per metric either run reported: its final, min (and step) and count in A and in B (null: none).
json metrics_json(const std::vector<MetricSeries>& a, const std::vector<MetricSeries>& b) {
  json out = json::object();
  auto side = [](const MetricSeries& s) {
    const MetricStats st = stats_of(s);
    return json{{"final", st.last}, {"min", st.min}, {"min_step", st.min_step}, {"count", st.count}};
  };
  for (const auto* all : {&a, &b})
    for (const auto& s : *all)
      if (!out.contains(s.name)) out[s.name] = {{"a", nullptr}, {"b", nullptr}};
  for (const auto& s : a) out[s.name]["a"] = side(s);
  for (const auto& s : b) out[s.name]["b"] = side(s);
  return out;
}

void print_text(std::string s, bool terminal) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  for (const auto& line : text::split(s, '\n')) {
    std::string shown = text::escape_console(line, terminal);
    std::printf("%s\n", shown.c_str());
  }
}

}  // namespace

int print_diff(const std::string& query_a, const std::string& query_b, bool as_json, bool terminal,
               bool color) {
  const RunRecord a = load(resolve(query_a)), b = load(resolve(query_b));
  const auto table = rows(a, b);
  const std::string spec_patch = unified("spec.toml", a.spec_toml, b.spec_toml);
  const CodeDiff code = diff_code(a, b);
  const auto metrics_a = read_metrics(run_dir(a.id)), metrics_b = read_metrics(run_dir(b.id));
  if (as_json) {
    json fields = json::object();
    for (const auto& [k, v] : table)
      fields[k] = {{"a", v.first}, {"b", v.second}, {"same", v.first == v.second}};
    json c = nullptr;
    if (code.missing.empty())
      c = {{"added", code.added},
           {"removed", code.removed},
           {"changed", code.changed},
           {"withheld", code.withheld},
           {"diff", code.patch}};
    json doc{{"schema", kJsonSchema},
             {"a", a.id},
             {"b", b.id},
             {"fields", fields},
             {"spec_diff", spec_patch.empty() ? json(nullptr) : json(spec_patch)},
             {"code", c},
             {"code_missing", code.missing.empty() ? json(nullptr) : json(code.missing)},
             {"metrics", metrics_json(metrics_a, metrics_b)}};
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  size_t width = 0;
  for (const auto& [k, v] : table) width = std::max(width, v.first.size());
  width = std::min<size_t>(width, 48);
  std::printf("  %-10s %-*s  %s\n", "", int(width), "A", "B");
  for (const auto& [k, v] : table) {
    const bool same = v.first == v.second;
    std::printf("%s %-10s %-*s  %s\n", same ? " " : "*", k.c_str(), int(width),
                text::host_text(v.first).c_str(), same ? "=" : text::host_text(v.second).c_str());
  }
  std::printf("%s", format_metrics_diff(metrics_a, metrics_b, utf8_locale(), color).c_str());
  std::printf("\nspec: %s\n", spec_patch.empty() ? "the same" : "changed");
  if (!spec_patch.empty()) print_text(spec_patch, terminal);
  if (!code.missing.empty()) {
    std::printf("\ncode: not compared: %s\n", code.missing.c_str());
    return 0;
  }
  if (code.added.empty() && code.removed.empty() && code.changed.empty()) {
    std::printf("\ncode: the same\n");
    return 0;
  }
  std::printf("\ncode: %zu changed, %zu added, %zu removed\n", code.changed.size(), code.added.size(),
              code.removed.size());
  for (const auto& p : code.changed) std::printf("  changed  %s\n", text::host_text(p).c_str());
  for (const auto& p : code.added) std::printf("  added    %s\n", text::host_text(p).c_str());
  for (const auto& p : code.removed) std::printf("  removed  %s\n", text::host_text(p).c_str());
  for (const auto& p : code.withheld)
    std::printf("  (%s: withheld from the store, not shown)\n", text::host_text(p).c_str());
  if (!code.patch.empty()) {
    std::printf("\n");
    print_text(code.patch, terminal);
  }
  return 0;
}

}  // namespace mltrain::records
