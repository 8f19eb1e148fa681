#include "runner/records/views.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <regex>
#include <thread>

#include "runner/common/color.h"
#include "runner/common/error.h"
#include "runner/common/status.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/records/records.h"

namespace mltrain::records {

namespace {

struct Follower {
  int rank = 0;
  std::string path;
  off_t offset = 0;
  std::string partial;
  std::string prefix;
};

// Reads new bytes of a rank file and prints whole lines; returns whether anything was read.
bool pump(Follower& f, const std::optional<std::regex>& re, bool final) {
  int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool any = false;
  char buf[65536];
  std::string out;
  while (true) {
    ssize_t n = ::pread(fd, buf, sizeof buf, f.offset);
    if (n <= 0) break;
    any = true;
    f.offset += n;
    f.partial.append(buf, size_t(n));
    size_t start = 0, nl;
    while ((nl = f.partial.find('\n', start)) != std::string::npos) {
      std::string_view line(f.partial.data() + start, nl - start);
      if (!re || std::regex_search(line.begin(), line.end(), *re)) {
        out += f.prefix;
        out.append(line);
        out += '\n';
      }
      start = nl + 1;
    }
    f.partial.erase(0, start);
    if (out.size() > (1 << 20)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  ::close(fd);
  if (final && !f.partial.empty()) {
    if (!re || std::regex_search(f.partial, *re)) out += f.prefix + f.partial + "\n";
    f.partial.clear();
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return any;
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
  if (r.status == "running") return "-";
  return text::format_duration(std::chrono::milliseconds(static_cast<long long>(r.duration_s * 1000)));
}

}  // namespace

int print_logs(const LogsOptions& o) {
  std::string id = resolve(o.id);
  RunRecord rec = load(id);
  std::optional<std::regex> re;
  if (!o.grep.empty()) {
    try {
      re.emplace(o.grep, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw Error("--grep '" + o.grep + "' is not a valid regular expression: " + e.what(),
                  "escape special characters");
    }
  }
  std::vector<Follower> fs;
  for (const auto& k : rec.ranks) {
    if (o.ranks && !o.ranks->count(k.rank)) continue;
    Follower f;
    f.rank = k.rank;
    f.path = run_dir(id) + "/rank-" + std::to_string(k.rank) + ".log";
    if (o.prefix) {
      std::string p = "[" + std::to_string(k.rank) + "]";
      f.prefix = o.color ? std::string(rank_color(k.rank)) + p + kColorReset + " " : p + " ";
    }
    if (o.tail >= 0 && !re) f.offset = tail_offset(f.path, o.tail);
    fs.push_back(std::move(f));
  }
  if (o.ranks)
    for (int r : *o.ranks)
      if (r < 0 || size_t(r) >= rec.ranks.size())
        throw Error("run " + id + " has no rank " + std::to_string(r) + " (it has " +
                        std::to_string(rec.ranks.size()) + " ranks)",
                    "pick ranks from 0 to " + std::to_string(rec.ranks.size() - 1));
  if (o.tail >= 0 && re) {
    // The last N matching lines: filter the whole file, keep a window of N.
    for (auto& f : fs) {
      std::string collected;
      std::deque<std::string> last;
      int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        char buf[65536];
        ssize_t n;
        std::string partial;
        auto take = [&](std::string_view line) {
          if (!std::regex_search(line.begin(), line.end(), *re)) return;
          last.emplace_back(line);
          if (last.size() > size_t(o.tail)) last.pop_front();
        };
        while ((n = ::read(fd, buf, sizeof buf)) > 0) {
          f.offset += n;
          partial.append(buf, size_t(n));
          size_t start = 0, nl;
          while ((nl = partial.find('\n', start)) != std::string::npos) {
            take(std::string_view(partial).substr(start, nl - start));
            start = nl + 1;
          }
          partial.erase(0, start);
        }
        ::close(fd);
        if (o.follow)
          f.partial = partial;
        else if (!partial.empty())
          take(partial);
      }
      for (const auto& l : last) collected += f.prefix + l + "\n";
      std::fwrite(collected.data(), 1, collected.size(), stdout);
    }
  } else {
    for (auto& f : fs) pump(f, re, !o.follow);
  }
  // mltrain's own error (a run that failed before or beside its ranks), after their output.
  auto print_launcher_error = [&] { std::fputs(launcher_error(id).c_str(), stdout); };
  if (!o.follow) print_launcher_error();
  std::fflush(stdout);
  if (!o.follow) return 0;

  // Follow until the launcher has written the final record (or died without doing so).
  while (true) {
    bool any = false;
    for (auto& f : fs) any |= pump(f, re, false);
    std::fflush(stdout);
    if (!any) {
      RunRecord now = load(id);
      if (now.status != "running") {
        for (auto& f : fs) pump(f, re, true);
        print_launcher_error();
        std::fflush(stdout);
        if (now.status == "lost")
          std::fprintf(stderr, "mltrain: the launcher of run %s is gone without recording an end\n",
                       id.c_str());
        return now.exit_code > 0 ? now.exit_code : 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
    }
  }
}

void print_list(bool json) {
  auto runs = list();
  if (json) {
    std::reverse(runs.begin(), runs.end());  // newest first, as the table
    std::printf("%s\n", list_to_json(runs).c_str());
    return;
  }
  if (runs.empty()) {
    std::printf("no runs yet in %s (start one with 'mltrain run')\n", runs_dir().c_str());
    return;
  }
  std::printf("%-34s %-12s %5s %5s %-19s %9s %4s\n", "ID", "STATUS", "RANKS", "HOSTS", "STARTED", "DURATION",
              "EXIT");
  for (auto it = runs.rbegin(); it != runs.rend(); ++it) {  // newest first
    const RunRecord& r = *it;
    const std::string& status = r.status;
    std::printf("%-34s %-12s %5zu %5zu %-19s %9s %4s\n", r.id.c_str(), status.c_str(), r.ranks.size(),
                r.hosts.size(), age(r.started_at).c_str(), duration_of(r).c_str(),
                r.exit_code >= 0 ? std::to_string(r.exit_code).c_str() : "-");
  }
}

void print_show(const std::string& query, bool json) {
  std::string id = resolve(query);
  RunRecord r = load(id);
  if (json) {
    std::printf("%s\n", to_json(r, true).c_str());
    return;
  }
  std::string status = r.status == "lost" ? "lost (the launcher died without recording an end)" : r.status;
  std::printf("run        %s\n", r.id.c_str());
  std::printf("name       %s\n", r.name.c_str());
  std::printf("status     %s", status.c_str());
  if (r.exit_code >= 0) std::printf(" (exit code %d)", r.exit_code);
  std::printf("\nstarted    %s\n", age(r.started_at).c_str());
  if (!r.ended_at.empty())
    std::printf("ended      %s (%s)\n", age(r.ended_at).c_str(), duration_of(r).c_str());
  if (!r.spec_file.empty()) std::printf("spec       %s\n", r.spec_file.c_str());
  std::vector<std::string> argv;
  for (const auto& a : r.argv) argv.push_back(text::shell_quote(a));
  std::printf("command    %s\n", text::join(argv, " ").c_str());
  std::printf("workdir    %s\n", r.workdir.c_str());
  if (!r.git_commit.empty()) std::printf("git        %s\n", r.git_commit.c_str());
  std::printf("master     %s:%d\n", r.master_addr.c_str(), r.master_port);
  std::printf("restarts   %d of %d\n", r.restarts, r.max_restarts);
  std::printf("logs       %s\n", run_dir(r.id).c_str());
  std::printf("\n%-6s %-20s %-6s %-8s %s\n", "RANK", "HOST", "LOCAL", "PID", "RESULT");
  for (const auto& k : r.ranks) {
    std::string host = size_t(k.host) < r.hosts.size() ? r.hosts[size_t(k.host)].name : "?";
    std::string result = k.exit_code < 0 ? (status == "running" ? "running" : "-")
                         : k.signal      ? describe_status(k.signal)
                                         : "exit " + std::to_string(k.exit_code);
    std::printf("%-6d %-20s %-6d %-8d %s\n", k.rank, host.c_str(), k.local_rank, k.pid, result.c_str());
  }
  if (r.failure) {
    std::printf("\nfirst failure: %s\n", r.failure->message.c_str());
    for (const auto& l : r.failure->tail) std::printf("    %s\n", l.c_str());
  }
}

int stop_run(const std::string& query) {
  std::string id = resolve(query);
  RunRecord r = load(id);
  if (r.status != "running" && r.status != "lost") {
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
    if (now.status != "running") {
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
