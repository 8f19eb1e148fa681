#include "runner/records/cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <string_view>
#include <vector>

#include "runner/common/error.h"
#include "runner/records/code.h"
#include "runner/records/records.h"

namespace mltrain::records {

namespace fs = std::filesystem;

namespace {

bool is_running(const RunRecord& r) { return live_status(r.status) && launcher_alive(r); }

// Bytes a folder's files use on disk.
unsigned long long folder_bytes(const std::string& dir) {
  unsigned long long total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) total += it->file_size(ec);
  return total;
}

std::string human_bytes(unsigned long long n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", n);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

// Removes one run folder; returns the bytes freed.
unsigned long long remove_one(const std::string& id) {
  const std::string dir = run_dir(id);
  unsigned long long bytes = folder_bytes(dir);
  std::error_code ec;
  fs::remove_all(reruns_dir() + "/" + id, ec);  // the tree `rerun` restored from it, if any
  fs::remove_all(dir, ec);
  if (ec)
    throw Error("cannot remove " + dir + ": " + ec.message(), "check the folder's permissions",
                exit_code::internal);
  return bytes;
}

void print_removed(const std::vector<std::pair<std::string, unsigned long long>>& done, bool dry_run,
                   uint64_t code_freed = 0) {
  unsigned long long total = 0;
  for (const auto& [id, bytes] : done) {
    std::printf("%s %s (%s)\n", dry_run ? "would remove" : "removed", id.c_str(), human_bytes(bytes).c_str());
    total += bytes;
  }
  std::printf("%s %zu run%s, %s %s\n", dry_run ? "would remove" : "removed", done.size(),
              done.size() == 1 ? "" : "s", human_bytes(total).c_str(), dry_run ? "to free" : "freed");
  if (code_freed > 0)
    std::printf("removed the code no run keeps any more, %s freed\n", human_bytes(code_freed).c_str());
}

// The folders half_made_runs() names: only the run.json the launcher wrote there (or its temporary
// file) is removed, then the folder; one that holds anything else stays, and is not named.
void remove_half_made(bool dry_run) {
  const int runs = ::open(runs_dir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (runs < 0) return;
  for (const auto& name : half_made_runs()) {
    if (!dry_run) {
      const int dir = ::openat(runs, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (dir < 0) continue;
      // The record, or its write cut short (sync::AtomicFile's ".run.json.tmp.*").
      std::vector<std::string> ours = {"run.json"};
      if (DIR* d = ::fdopendir(::dup(dir))) {
        while (dirent* e = ::readdir(d))
          if (std::string_view(e->d_name).rfind(".run.json.tmp", 0) == 0) ours.emplace_back(e->d_name);
        ::closedir(d);
      }
      bool removed = true;
      for (const auto& file : ours)
        removed = removed && (::unlinkat(dir, file.c_str(), 0) == 0 || errno == ENOENT);
      ::close(dir);
      if (!removed) continue;
      if (::unlinkat(runs, name.c_str(), AT_REMOVEDIR) != 0) continue;
    }
    std::printf("%s %s (a run folder its launcher, killed, left half made)\n",
                dry_run ? "would remove" : "removed", name.c_str());
  }
  ::close(runs);
}

}  // namespace

std::optional<std::chrono::system_clock::time_point> parse_iso8601(const std::string& s) {
  std::tm tm{};
  const char* end = ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return std::nullopt;
  return std::chrono::system_clock::from_time_t(::timegm(&tm));
}

std::vector<std::string> gc_select(const std::vector<RunRecord>& runs, const GcOptions& o,
                                   std::chrono::system_clock::time_point now) {
  std::vector<std::string> out;
  int newer = 0;  // runs newer than the one looked at
  for (auto it = runs.rbegin(); it != runs.rend(); ++it, ++newer) {
    if (is_running(*it)) continue;
    if (o.keep && newer < *o.keep) continue;
    if (o.older_than) {
      auto started = parse_iso8601(it->started_at);
      if (!started || now - *started < *o.older_than) continue;
    }
    out.push_back(it->id);
  }
  return out;
}

int remove_runs(const std::vector<std::string>& queries) {
  if (queries.empty()) throw Error("rm needs at least one run id", "list runs with 'mltrain ls'");
  // Every query must resolve, and none may name a running run, before anything is removed.
  std::vector<std::string> ids;
  std::set<std::string> seen;
  for (const auto& q : queries) {
    std::string id = resolve(q);
    RunRecord r = load(id);
    if (is_running(r))
      throw Error("run " + id + " is running (launcher pid " + std::to_string(r.launcher_pid) +
                      "); its record is not removed",
                  "stop it first with 'mltrain stop " + id + "'");
    if (seen.insert(id).second) ids.push_back(id);
  }
  std::vector<std::pair<std::string, unsigned long long>> done;
  for (const auto& id : ids) done.emplace_back(id, remove_one(id));
  print_removed(done, false, sweep_code_store());
  return 0;
}

int gc_runs(const GcOptions& o) {
  if (!o.older_than && !o.keep)
    throw Error("gc needs --older-than, --keep or both", "e.g. 'mltrain gc --older-than 7d --keep 20'");
  auto ids = gc_select(list(), o, std::chrono::system_clock::now());
  std::vector<std::pair<std::string, unsigned long long>> done;
  for (const auto& id : ids) done.emplace_back(id, o.dry_run ? folder_bytes(run_dir(id)) : remove_one(id));
  print_removed(done, o.dry_run, o.dry_run ? 0 : sweep_code_store());
  remove_half_made(o.dry_run);
  return 0;
}

}  // namespace mltrain::records
