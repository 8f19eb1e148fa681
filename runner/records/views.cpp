#include "runner/records/views.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <thread>

#include "runner/common/color.h"
#include "runner/common/error.h"
#include "runner/common/regex.h"
#include "runner/common/status.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/records/find.h"
#include "runner/records/metrics.h"
#include "runner/records/records.h"
#include "runner/records/telemetry_log.h"
#include "runner/records/telemetry_view.h"

namespace mltrain::records {

namespace {

struct Follower {
  int rank = 0;
  std::string path;
  int fd = -1;
  off_t offset = 0;
  std::string partial;
  std::string prefix;
};

struct LineFilter {
  std::unique_ptr<text::Regex> re;
  bool terminal = false;  // stdout is a terminal: show what one shows of \r progress, escape the rest
};

// A line as printed: raw bytes into a pipe or file; on a terminal the final state of a \r
// progress line, with control bytes escaped, as the live console shows it.
std::string shown(std::string_view line, const LineFilter& lf) {
  if (!lf.terminal) return std::string(line);
  while (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (size_t cr = line.rfind('\r'); cr != std::string_view::npos) line.remove_prefix(cr + 1);
  return text::escape_console(line);
}

// Takes bytes of a rank file; appends its complete lines (and with `final` the rest) to `out`.
void take(Follower& f, std::string_view bytes, const LineFilter& lf, bool final, std::string& out) {
  f.partial.append(bytes);
  size_t start = 0, nl;
  auto line = [&](std::string_view l) {
    if (lf.re && !lf.re->search(l)) return;
    out += f.prefix;
    out += shown(l, lf);
    out += '\n';
  };
  while ((nl = f.partial.find('\n', start)) != std::string::npos) {
    line(std::string_view(f.partial).substr(start, nl - start));
    start = nl + 1;
  }
  f.partial.erase(0, start);
  if (final && !f.partial.empty()) {
    line(f.partial);
    f.partial.clear();
  }
}

void write_out(std::string& out) {
  std::fwrite(out.data(), 1, out.size(), stdout);
  out.clear();
}

// Reads the rank file from its offset up to `end` (EOF when unbounded); returns whether anything
// was read.
bool pump(Follower& f, const LineFilter& lf, bool final, uint64_t end = UINT64_MAX) {
  if (f.fd < 0) f.fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  bool any = false;
  std::string out;
  char buf[65536];
  while (f.fd >= 0 && uint64_t(f.offset) < end) {
    size_t want = size_t(std::min<uint64_t>(sizeof buf, end - uint64_t(f.offset)));
    ssize_t n = ::pread(f.fd, buf, want, f.offset);
    if (n <= 0) break;
    any = true;
    f.offset += n;
    take(f, std::string_view(buf, size_t(n)), lf, false, out);
    if (out.size() > (1 << 20)) write_out(out);
  }
  if (final) take(f, {}, lf, true, out);
  write_out(out);
  return any;
}

// The run's output.order, read entry by entry as it grows.
struct OrderReader {
  int fd = -1;
  off_t offset = 0;
  std::vector<OrderEntry> next(const std::string& path) {
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<OrderEntry> got;
    if (fd < 0) return got;
    OrderEntry buf[4096];
    while (true) {
      ssize_t n = ::pread(fd, buf, sizeof buf, offset);
      if (n <= 0) break;
      size_t whole = size_t(n) / sizeof(OrderEntry);  // a torn entry is read again next time
      got.insert(got.end(), buf, buf + whole);
      offset += off_t(whole * sizeof(OrderEntry));
      if (whole < std::size(buf)) break;
    }
    return got;
  }
  ~OrderReader() {
    if (fd >= 0) ::close(fd);
  }
};

// Prints what the entries order, each rank's lines as their bytes arrived; returns whether
// anything was printed.
bool pump_ordered(std::vector<Follower>& fs, const std::vector<int>& by_rank,
                  const std::vector<OrderEntry>& es, const LineFilter& lf) {
  bool any = false;
  for (const auto& e : es) {
    if (e.rank >= by_rank.size() || by_rank[e.rank] < 0) continue;
    Follower& f = fs[size_t(by_rank[e.rank])];
    if (e.end > uint64_t(f.offset)) any |= pump(f, lf, false, e.end);
  }
  return any;
}

// Where to start so that only the last `n` lines matching `re` are printed.
off_t grep_tail_offset(const std::string& path, int n, const text::Regex& re) {
  std::deque<off_t> starts;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::string partial;
  off_t partial_at = 0, pos = 0;
  char buf[65536];
  ssize_t got;
  auto line = [&](std::string_view l, off_t at) {
    if (!re.search(l)) return;
    starts.push_back(at);
    if (starts.size() > size_t(n)) starts.pop_front();
  };
  while ((got = ::read(fd, buf, sizeof buf)) > 0) {
    partial.append(buf, size_t(got));
    pos += got;
    size_t start = 0, nl;
    while ((nl = partial.find('\n', start)) != std::string::npos) {
      line(std::string_view(partial).substr(start, nl - start), partial_at + off_t(start));
      start = nl + 1;
    }
    partial.erase(0, start);
    partial_at += off_t(start);
  }
  ::close(fd);
  if (!partial.empty()) line(partial, partial_at);
  if (n == 0) return pos;
  return starts.size() == size_t(n) ? starts.front() : 0;
}

// Where to start so that only the last `n` lines are printed.
off_t tail_offset(const std::string& path, int n) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) {
    const int e = errno;
    ::close(fd);
    throw Error(sys_error_text("lseek", path, e), {}, exit_code::internal);
  }
  if (n == 0) {
    ::close(fd);
    return end;
  }
  off_t pos = end;
  int newlines = 0;
  char buf[65536];
  // The last byte is usually the newline of the last line: it does not start a line.
  bool first = true;
  while (pos > 0) {
    off_t chunk = std::min<off_t>(pos, sizeof buf);
    pos -= chunk;
    if (::pread(fd, buf, size_t(chunk), pos) != chunk) break;
    for (off_t i = chunk - 1; i >= 0; --i) {
      if (buf[i] != '\n') {
        first = false;
        continue;
      }
      if (first && pos + i == end - 1) {
        first = false;
        continue;
      }
      if (++newlines == n) {
        ::close(fd);
        return pos + i + 1;
      }
    }
  }
  ::close(fd);
  return 0;
}

std::string age(const std::string& iso) {
  return iso.size() >= 19 ? iso.substr(0, 10) + " " + iso.substr(11, 8) : iso;
}

std::string duration_of(const RunRecord& r) {
  if (live_status(r.status) || (r.status == "lost" && r.duration_s <= 0)) return "-";
  return text::format_duration(std::chrono::milliseconds(static_cast<long long>(r.duration_s * 1000)));
}

}  // namespace

int print_logs(const LogsOptions& o) {
  std::string id = resolve(o.id);
  RunRecord rec = load(id);
  LineFilter lf;
  lf.terminal = o.terminal;
  if (!o.grep.empty()) {
    std::string error;
    lf.re = text::Regex::compile(o.grep, error);
    if (!lf.re)
      throw Error("--grep '" + text::excerpt(o.grep, 80) + "' is not a valid regular expression: " + error,
                  "escape special characters (RE2's syntax: no back-references or look-around)");
  }
  if (o.ranks)
    for (int r : *o.ranks)
      if (r < 0 || size_t(r) >= rec.ranks.size())
        throw Error("run " + id + " has no rank " + std::to_string(r) + " (it has " +
                        std::to_string(rec.ranks.size()) + " ranks)",
                    "pick ranks from 0 to " + std::to_string(rec.ranks.size() - 1));
  std::vector<Follower> fs;
  std::vector<int> by_rank;  // rank -> index into fs, -1 when not shown
  for (const auto& k : rec.ranks) {
    if (size_t(k.rank) >= by_rank.size()) by_rank.resize(size_t(k.rank) + 1, -1);
    if (o.ranks && !o.ranks->count(k.rank)) continue;
    Follower f;
    f.rank = k.rank;
    f.path = run_dir(id) + "/rank-" + std::to_string(k.rank) + ".log";
    const std::string host = size_t(k.host) < rec.hosts.size() ? rec.hosts[size_t(k.host)].name : "";
    const int node = size_t(k.host) < rec.hosts.size() ? rec.hosts[size_t(k.host)].node_rank : 0;
    std::string p = o.prefix ? render_prefix(rec.log_prefix, k.rank, k.local_rank, node, host) : "";
    if (!p.empty()) f.prefix = o.color ? std::string(rank_color(k.rank)) + p + kColorReset + " " : p + " ";
    if (o.tail >= 0)
      f.offset = lf.re ? grep_tail_offset(f.path, o.tail, *lf.re) : tail_offset(f.path, o.tail);
    by_rank[size_t(k.rank)] = int(fs.size());
    fs.push_back(std::move(f));
  }
  struct Closer {
    std::vector<Follower>& fs;
    ~Closer() {
      for (auto& f : fs)
        if (f.fd >= 0) ::close(f.fd);
    }
  } closer{fs};

  // Merged in the order the output arrived (as the live console showed it), unless asked for
  // rank by rank or the run predates output.order.
  const std::string order_path = order_path_in(run_dir(id));
  const bool merged = !o.by_rank && (::access(order_path.c_str(), F_OK) == 0 || live_status(rec.status));
  OrderReader order;
  auto pump_all = [&](bool final) {
    bool any = merged && pump_ordered(fs, by_rank, order.next(order_path), lf);
    // By rank, or what the order file does not cover yet (the last bytes of a launcher that died).
    if (!merged || final)
      for (auto& f : fs) any |= pump(f, lf, final);
    std::fflush(stdout);
    return any;
  };
  // mltrain's own error (a run that failed before or beside its ranks), after their output.
  auto print_launcher_error = [&] {
    std::string shown_error;  // what mltrain printed, hosts' words in it included: line by line, escaped
    for (const auto& l : text::split(launcher_error(id), '\n')) shown_error += text::host_text(l) + "\n";
    shown_error.pop_back();
    std::fputs(shown_error.c_str(), stdout);
    std::fflush(stdout);
  };
  if (!o.follow) {
    pump_all(true);
    print_launcher_error();
    return 0;
  }

  // Follow until the launcher has written the final record (or died without doing so).
  while (true) {
    if (pump_all(false)) continue;
    RunRecord now = load(id);
    if (!live_status(now.status)) {
      pump_all(true);
      print_launcher_error();
      if (now.status == "lost")
        std::fprintf(stderr, "mltrain: the launcher of run %s is gone without recording an end\n",
                     id.c_str());
      return now.exit_code > 0 ? now.exit_code : 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
}

// Terminal columns of UTF-8 text: one per character.
size_t columns_of(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// The runs (oldest first) as a table of the given fields, newest first; cells escaped and cut at
// 48 columns.
void print_columns(const std::vector<RunRecord>& runs, const std::vector<std::string>& columns) {
  std::vector<std::vector<std::string>> rows;
  std::vector<size_t> width;
  std::vector<std::string> head;
  for (const auto& c : columns) {
    std::string h = c;
    for (char& ch : h) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    head.push_back(h);
    width.push_back(h.size());
  }
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
    RunFields f(*it);
    std::vector<std::string> row;
    for (size_t i = 0; i < columns.size(); ++i) {
      row.push_back(text::cut(text::host_text(cell_text(f.get(columns[i]))), 48));
      width[i] = std::max(width[i], columns_of(row.back()));
    }
    rows.push_back(std::move(row));
  }
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - columns_of(row[i]) + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  };
  print(head);
  for (const auto& row : rows) print(row);
}

void print_list(const ListOptions& o) {
  const Filter filter(o.where);
  const std::vector<std::string> columns =
      o.columns.empty() ? std::vector<std::string>{} : parse_columns(o.columns);
  const std::vector<RunRecord> all = list();
  std::vector<RunRecord> runs;  // oldest first, as list() gives them
  for (const auto& r : all)
    if (RunFields f(r); filter.matches(f)) runs.push_back(r);
  if (o.newest > 0 && runs.size() > size_t(o.newest)) runs.erase(runs.begin(), runs.end() - o.newest);
  if (o.json) {
    std::reverse(runs.begin(), runs.end());  // newest first, as the table
    std::printf("%s\n", list_to_json(runs).c_str());
    return;
  }
  if (o.jsonl) {
    for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
      RunFields f(*it);
      std::printf("%s\n", jsonl_row(f, columns).c_str());
    }
    return;
  }
  if (all.empty()) {
    std::printf("no runs yet in %s (start one with 'mltrain run')\n", runs_dir().c_str());
    return;
  }
  if (runs.empty()) {
    // A metric no run has is most often a misspelt one: say that, not only that nothing matched.
    std::vector<std::string> names;
    for (const auto& r : all)
      for (const auto& n : r.metrics.names)
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    for (const auto& field : filter.fields()) {
      if (field.rfind("metric.", 0) != 0) continue;
      std::string name = field.substr(7);
      for (const char* stat : {".first", ".min", ".max", ".last", ".count"})
        if (name.size() > std::strlen(stat) &&
            name.compare(name.size() - std::strlen(stat), std::string::npos, stat) == 0 &&
            std::find(names.begin(), names.end(), name) == names.end())
          name.resize(name.size() - std::strlen(stat));
      if (std::find(names.begin(), names.end(), name) == names.end())
        throw Error("--where: no run has a metric '" + text::host_text(name, 64) + "'" +
                        text::did_you_mean(name, names),
                    names.empty() ? "no run recorded a metric yet (docs/metrics.md)"
                                  : "the runs' metrics: " + text::host_text(text::join(names, ", "), 400));
    }
    std::printf("no run of the %zu recorded matches --where '%s'\n", all.size(),
                text::host_text(o.where, 200).c_str());
    return;
  }
  if (!columns.empty()) return print_columns(runs, columns);
  std::printf("%-34s %-12s %-4s %5s %5s %-19s %9s %4s\n", "ID", "STATUS", "KIND", "RANKS", "HOSTS", "STARTED",
              "DURATION", "EXIT");
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {  // newest first
    const RunRecord& r = *it;
    const std::string& status = r.status;
    std::printf("%-34s %-12s %-4s %5zu %5zu %-19s %9s %4s\n", r.id.c_str(), status.c_str(),
                r.kind == "exec" ? "exec" : "run", r.ranks.size(), r.hosts.size(), age(r.started_at).c_str(),
                duration_of(r).c_str(), r.exit_code >= 0 ? std::to_string(r.exit_code).c_str() : "-");
    if (!r.slurm_job_id.empty()) std::printf("%*s slurm job %s\n", 34, "", r.slurm_job_id.c_str());
  }
}

// `show`'s code line: what the tree was and what the store keeps of it.
static std::string code_line(const CodeSummary& c) {
  auto mib = [](uint64_t n) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1 << 20));
    return std::string(buf);
  };
  std::string line = std::to_string(c.files) + " file" + (c.files == 1 ? "" : "s") + ", " + mib(c.bytes);
  if (!c.kept && c.files == 0 && c.bytes == 0) return "not kept: " + c.skipped;
  if (!c.kept) return line + "; contents not kept: " + (c.skipped.empty() ? "no store" : c.skipped);
  line +=
      ", kept (" + (c.new_bytes ? mib(c.new_bytes) + " new in the store" : std::string("nothing new")) + ")";
  if (c.withheld)
    line += "; " + std::to_string(c.withheld) + " file" + (c.withheld == 1 ? "" : "s") +
            " withheld (code.json says why)";
  return line;
}

void print_show(const std::string& query, bool json, bool color) {
  std::string id = resolve(query);
  RunRecord r = load(id);
  size_t skipped = 0;
  const auto samples = read_telemetry(run_dir(r.id) + "/telemetry.jsonl", &skipped);
  const telemetry::Summary use = telemetry::summarize(samples);
  if (json) {
    // The run's record with its utilization summary (null without telemetry) as one more key.
    std::string doc = to_json(r, true);
    size_t end = doc.rfind('}');
    std::string util = samples.empty() ? "null" : utilization_json(use);
    const auto series = read_metrics(run_dir(r.id));
    std::string metrics = series.empty() ? "null" : metric_series_json(series);
    for (size_t at = 0; (at = metrics.find('\n', at)) != std::string::npos; at += 3)
      metrics.insert(at + 1, "  ");
    std::printf("%s,\n  \"utilization\": %s,\n  \"metric_series\": %s\n}\n",
                doc.substr(0, doc.find_last_not_of(" \n", end - 1) + 1).c_str(), util.c_str(),
                metrics.c_str());
    return;
  }
  // Every string of the record as text for a terminal: the record holds what hosts said.
  std::deque<std::string> keep;
  auto t = [&keep](const std::string& v) { return keep.emplace_back(text::host_text(v)).c_str(); };
  std::string status = r.status == "lost" ? "lost (the launcher died without recording an end)" : r.status;
  std::printf("run        %s\n", t(r.id));
  std::printf("name       %s\n", t(r.name));
  std::printf("status     %s", t(status));
  if (r.exit_code >= 0) std::printf(" (exit code %d)", r.exit_code);
  std::printf("\nstarted    %s\n", t(age(r.started_at)));
  if (r.status == "queued")
    std::printf("queued     waiting in the hosts' queue (mltrain queue shows its place)\n");
  if (r.queued_s > 0)
    std::printf(
        "queued     waited %s in the hosts' queue before its ranks started\n",
        t(text::format_duration(std::chrono::milliseconds(static_cast<long long>(r.queued_s * 1000)))));
  if (!r.ended_at.empty()) std::printf("ended      %s (%s)\n", t(age(r.ended_at)), duration_of(r).c_str());
  if (r.status == "lost" && r.duration_s > 0)
    std::printf("ran        at least %s (its last output; the end was never recorded)\n",
                duration_of(r).c_str());
  if (!r.rerun_of.empty()) std::printf("rerun of   %s\n", t(r.rerun_of));
  if (!r.spec_file.empty()) std::printf("spec       %s\n", t(r.spec_file));
  std::vector<std::string> argv;
  for (const auto& a : r.argv) argv.push_back(text::shell_quote(a));
  std::printf("command    %s\n", t(text::join(argv, " ")));
  std::printf("workdir    %s\n", t(r.workdir));
  if (!r.git_commit.empty())
    std::printf("git        %s%s\n", t(r.git_commit),
                r.code.dirty ? " + uncommitted changes (code.diff)" : "");
  if (r.code.recorded) std::printf("code       %s\n", t(code_line(r.code)));
  if (!r.slurm_job_id.empty()) std::printf("slurm job  %s\n", t(r.slurm_job_id));
  std::printf("master     %s:%d\n", t(r.master_addr), r.master_port);
  std::printf("restarts   %d of %d\n", r.restarts, r.max_restarts);
  std::printf("logs       %s\n", run_dir(r.id).c_str());
  // Each start of the gang, once it restarted: its hosts, and why the one before ended.
  if (r.generations.size() > 1) {
    std::printf("\ngenerations\n");
    for (const auto& g : r.generations) {
      const std::string when = g.started_at.size() >= 19 ? g.started_at.substr(11, 8) : g.started_at;
      std::printf("  %-3d %s  %d rank%s on %s\n", g.restart, t(when), g.world_size,
                  g.world_size == 1 ? "" : "s", t(text::join(g.hosts, ", ")));
      if (!g.why.empty()) std::printf("      after: %s\n", t(g.why));
    }
  }
  // What the hosts' agents found at preflight: one value where every host said the same.
  const auto environment = environment_rows(r);
  if (!environment.empty())
    std::printf("\nenvironment%s\n", r.hosts.size() > 1 ? " (every host, unless named)" : "");
  for (const auto& [k, v] : environment) std::printf("  %-11s %s\n", k.c_str(), t(v));
  if (r.pull) {
    std::printf("pulled     %llu file%s (%s) into %s/pulled%s\n", (unsigned long long)r.pull->files,
                r.pull->files == 1 ? "" : "s", human_bytes(r.pull->bytes).c_str(), run_dir(r.id).c_str(),
                r.pull->problems.empty() ? "" : "; not all of it:");
    for (const auto& p : r.pull->problems) std::printf("    %s\n", text::host_text(p).c_str());
  }
  // One row: the columns, and the rank's GPUs last when any rank has some (a line ends without blanks).
  auto row = [](const char* rank, const char* host, const char* local, const char* pid,
                const std::string& result, const std::string& gpus) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-6s %-20s %-6s %-8s %-12s%s", rank, host, local, pid, result.c_str(),
                  gpus.c_str());
    std::string line = buf;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::printf("%s\n", line.c_str());
  };
  const bool gpus =
      std::any_of(r.ranks.begin(), r.ranks.end(), [](const auto& k) { return !k.gpus.empty(); });
  std::printf("\n");
  row("RANK", "HOST", "LOCAL", "PID", "RESULT", gpus ? "GPUS" : "");
  for (const auto& k : r.ranks) {
    std::string host = size_t(k.host) < r.hosts.size() ? r.hosts[size_t(k.host)].name : "?";
    std::string result = k.exit_code < 0 ? (live_status(status) ? status : "-")
                         : k.signal      ? describe_status(k.signal)
                                         : "exit " + std::to_string(k.exit_code);
    std::vector<std::string> held;  // "0 (GPU-4049c22c-…)": the physical GPUs, leased for it
    for (const auto& g : k.gpus) held.push_back(std::to_string(g.index) + " (" + g.uuid + ")");
    row(std::to_string(k.rank).c_str(), t(host), std::to_string(k.local_rank).c_str(),
        std::to_string(k.pid).c_str(), result, t(text::join(held, ", ")));
  }
  if (!r.ps_servers.empty()) {
    std::printf("\n%-6s %-20s %-22s %10s %10s %9s %6s %s\n", "SERVER", "HOST", "ADDRESS", "IN", "OUT",
                "REQUESTS", "KEYS", "MAX QUEUE");
    for (const auto& s : r.ps_servers)
      std::printf("%-6d %-20s %-22s %10s %10s %9llu %6llu %u\n", s.server, t(s.host), t(s.address),
                  human_bytes(s.bytes_in).c_str(), human_bytes(s.bytes_out).c_str(), s.requests, s.keys,
                  s.max_queue_depth);
  }
  if (r.failure) {
    std::string message;  // its lines kept, each escaped
    for (const auto& l : text::split(r.failure->message, '\n'))
      message += (message.empty() ? "" : "\n") + text::host_text(l);
    std::printf("\nfirst failure: %s\n", message.c_str());
    for (const auto& l : r.failure->tail) std::printf("    %s\n", text::escape_console(l).c_str());
  }
  size_t bad_metrics = 0;
  const auto series = read_metrics(run_dir(r.id), &bad_metrics);
  std::printf("%s", format_metrics(series, utf8_locale(), color).c_str());
  if (bad_metrics) std::printf("(%zu lines of metrics.jsonl could not be read)\n", bad_metrics);
  if (r.metrics.dropped)
    std::printf("(%llu metric records or values were refused: not JSON, too long, or over a bound)\n",
                (unsigned long long)r.metrics.dropped);
  std::printf("%s", format_utilization(use).c_str());
  if (skipped) std::printf("(%zu lines of telemetry.jsonl could not be read)\n", skipped);
}

int stop_run(const std::string& query) {
  std::string id = resolve(query);
  RunRecord r = load(id);
  if (!live_status(r.status) && r.status != "lost") {
    std::printf("run %s already ended (%s)\n", id.c_str(), r.status.c_str());
    return 0;
  }
  if (!launcher_alive(r)) {
    std::printf("run %s has no live launcher (pid %d is gone); its agents stopped their ranks when it died\n",
                id.c_str(), r.launcher_pid);
    return 0;
  }
  if (::kill(r.launcher_pid, SIGTERM) != 0) {
    if (errno == ESRCH) {
      std::printf("run %s: its launcher (pid %d) ended just now\n", id.c_str(), r.launcher_pid);
      return 0;
    }
    throw_sys("kill", "SIGTERM launcher pid " + std::to_string(r.launcher_pid) + " of run " + id,
              "is the run someone else's? only its owner can stop it", exit_code::usage);
  }
  std::fprintf(stderr, "mltrain: stopping run %s (launcher pid %d)\n", id.c_str(), r.launcher_pid);
  // The launcher gives ranks their grace period; wait for it, then insist.
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    RunRecord now = load(id);
    if (!live_status(now.status)) {
      std::printf("run %s %s\n", id.c_str(), now.status.c_str());
      return 0;
    }
  }
  std::fprintf(stderr,
               "mltrain: the launcher did not stop within 60s; killing it (its agents stop the ranks)\n");
  if (::kill(r.launcher_pid, SIGKILL) != 0 && errno != ESRCH)
    throw_sys("kill", "SIGKILL launcher pid " + std::to_string(r.launcher_pid) + " of run " + id);
  return exit_code::stopped;
}

}  // namespace mltrain::records
