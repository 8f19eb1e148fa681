// The agent's side of `pull` (a run's [sync] pull, `mltrain cp`): the files asked for, listed
// below the folder within bounds (count, time, no pseudo file system), sent back in pieces as the
// launcher reads them.
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/tree/hash.h"
#include "runner/tree/ignore.h"

namespace mltrain::agent::detail {

using sync::mtime_ns;

namespace {

// What one pull lists at most: the agent answers nothing while it lists (`cp RUN:/` would list
// the whole machine), so past either bound the rest is left behind and said.
constexpr size_t kMaxPullFiles = 1'000'000;
constexpr int64_t kMaxListMs = 5000;

// A file system of the kernel's own, not of files: /proc, /sys, cgroups, tracing, ... (`cp
// RUN:/` walked /proc for minutes, where reading a file may block or never end).
bool pseudo_file_system(const std::string& path) {
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) != 0) return false;
  switch (static_cast<unsigned long>(fs.f_type)) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEBUGFS_MAGIC:
    case TRACEFS_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
    case SECURITYFS_MAGIC:
    case BPF_FS_MAGIC:
    case PSTOREFS_MAGIC:
    case EFIVARFS_MAGIC:
    case DEVPTS_SUPER_MAGIC:
    case 0x65735543:  // fusectl
    case BINFMTFS_MAGIC:
    case 0x62656570:  // configfs
    case 0x19800202:  // mqueue
    case 0x0187:      // autofs: looking in may mount
      return true;
    default:
      return false;
  }
}

// What `root` holds below `rel_dir` that the rules ask for (every file when `all`), until
// `clock` passes `deadline_ms` or kMaxPullFiles are listed (`cut` then). Folders on a pseudo file
// system are left out, named in `pseudo`.
void collect(const std::string& root, const std::string& rel_dir, const sync::Rules& rules, bool all,
             std::vector<std::string>& out, const Clock& clock, int64_t deadline_ms, bool& cut,
             std::vector<std::string>& pseudo) {
  if (cut || out.size() >= kMaxPullFiles || clock.now_ms() >= deadline_ms) {
    cut = true;
    return;
  }
  std::string dir = rel_dir.empty() ? root : root + "/" + rel_dir;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {  // listed all the same: its open says why it cannot be read, not "nothing matched"
    out.push_back(rel_dir);  // (a folder below may hold what was asked for: past PATH_MAX, unreadable)
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    if (out.size() >= kMaxPullFiles) {
      cut = true;
      return;
    }
    std::string rel = rel_dir.empty() ? n : rel_dir + "/" + n;
    if (rel == kState) continue;
    struct stat st {};
    if (::lstat((root + "/" + rel).c_str(), &st) != 0) {
      // As above: what cannot be looked at (past PATH_MAX) may be, or hold, what was asked for.
      if (all || errno != ENOENT || rules.check(rel, false) == sync::Rules::excluded) out.push_back(rel);
      continue;
    }
    bool hit = all || rules.check(rel, S_ISDIR(st.st_mode)) == sync::Rules::excluded;
    if (S_ISDIR(st.st_mode) && pseudo_file_system(root + "/" + rel))
      pseudo.push_back(rel);
    else if (S_ISDIR(st.st_mode))
      collect(root, rel, rules, hit, out, clock, deadline_ms, cut, pseudo);
    else if (S_ISREG(st.st_mode) && hit)
      out.push_back(rel);
  }
}

}  // namespace

void Agent::on(uint32_t, const msg::Pull& m) {
  pull_ = PullState{};
  pull_.active = true;
  pull_.dir = expand_home(m.dir);
  pull_.max_bytes = m.max_bytes;
  sync::Rules rules;  // a path "excluded" by these rules is one asked for
  for (const auto& p : m.patterns) rules.add(p);
  struct stat st {};
  if (::stat(pull_.dir.c_str(), &st) != 0) {
    pull_.problems.push_back(errno_text("cannot read", pull_.dir));
  } else if (!S_ISDIR(st.st_mode)) {
    pull_.files.push_back("");  // the one file the Pull names
    pull_.single_file = true;
  } else {
    bool cut = false;
    std::vector<std::string> pseudo;
    if (pseudo_file_system(pull_.dir))
      pull_.problems.push_back(pull_.dir +
                               " is a pseudo file system (the kernel's, not files); nothing sent");
    else
      collect(pull_.dir, "", rules, m.patterns.empty(), pull_.files, clock_, clock_.now_ms() + kMaxListMs,
              cut, pseudo);
    if (!pseudo.empty()) {
      std::string names;
      const std::string dir = pull_.dir.back() == '/' ? pull_.dir : pull_.dir + "/";
      for (size_t k = 0; k < pseudo.size() && k < 5; ++k) names += (k ? ", " : "") + dir + pseudo[k];
      if (pseudo.size() > 5) names += " and " + std::to_string(pseudo.size() - 5) + " more";
      pull_.problems.push_back("left out " + names + ": pseudo file systems (the kernel's, not files)");
    }
    if (cut)
      pull_.problems.push_back("listed " + std::to_string(pull_.files.size()) + " files in " + pull_.dir +
                               " and stopped there (at most " + std::to_string(kMaxPullFiles) + " files, " +
                               std::to_string(kMaxListMs / 1000) + " s); the rest was left behind");
  }
  pump_pull();
}

// Sends the next pieces while the outbox has room; the loop calls it again as the launcher reads.
void Agent::pump_pull() {
  while (pull_.active && outbox_.size() - outbox_pos_ < kOutboxHighWater / 2) {
    if (pull_.fd < 0) {
      if (pull_.next >= pull_.files.size() || (pull_.max_bytes && pull_.bytes >= pull_.max_bytes)) {
        if (pull_.next < pull_.files.size())
          pull_.problems.push_back(std::to_string(pull_.files.size() - pull_.next) +
                                   " files left behind: past the limit of " +
                                   std::to_string(pull_.max_bytes >> 20) + " MiB");
        send(msg::PullDone{pull_.sent, pull_.bytes, std::move(pull_.problems), pull_.single_file ? 1u : 0u});
        pull_ = PullState{};
        return;
      }
      const std::string& rel = pull_.files[pull_.next++];
      std::string full = rel.empty() ? pull_.dir : pull_.dir + "/" + rel;
      // Below the folder a link is never followed (collect() lists files, one may become a link).
      int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (rel.empty() ? 0 : O_NOFOLLOW));
      struct stat st {};
      const bool read = fd >= 0 && ::fstat(fd, &st) == 0;
      if (!read || !S_ISREG(st.st_mode)) {
        pull_.problems.push_back(read ? full + " is not a plain file (it changed while listed); not sent"
                                      : errno_text("cannot read", full));
        if (fd >= 0) ::close(fd);
        continue;
      }
      pull_.fd = fd;
      pull_.left = uint64_t(st.st_size);
      ++pull_.id;
      std::string name = rel.empty() ? pull_.dir.substr(pull_.dir.rfind('/') + 1) : rel;
      send(msg::PullFile{name, uint32_t(st.st_mode & 07777), pull_.left, mtime_ns(st)}, pull_.id);
      ++pull_.sent;
    }
    char buf[kReadChunk * 4];
    size_t want = size_t(std::min<uint64_t>(sizeof buf, pull_.left));
    ssize_t n = want ? ::read(pull_.fd, buf, want) : 0;
    if (n > 0) {
      pull_.left -= uint64_t(n);
      pull_.bytes += uint64_t(n);
      send(msg::PullData{std::string(buf, size_t(n))}, pull_.id);
    }
    if (n <= 0 || pull_.left == 0) {
      if (pull_.left > 0)  // it shrank while read: the launcher sees it short and says so
        pull_.problems.push_back(pull_.files[pull_.next - 1] + " shrank while it was read");
      ::close(pull_.fd);
      pull_.fd = -1;
    }
  }
}

}  // namespace mltrain::agent::detail
