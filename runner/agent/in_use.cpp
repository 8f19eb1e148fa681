// Which runs use a synced folder (docs/sync.md, "Two runs of one project"): each agent of a run
// that syncs into a folder holds a shared flock on `.mltrain-sync/in-use/<run key>` there for as
// long as it lives, so the kernel drops it with the agent, and flock works for hosts that share
// an NFS home. A sync that finds the folder held by an earlier run (keys sort by start) leaves it
// alone and syncs into a folder of its own beside it (`<folder>@2`, `@3`, ...), its unchanged files
// hard links to the earlier run's, so that run's ranks keep every file they run.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "runner/agent/detail/agent_impl.h"
#include "runner/tree/hash.h"

namespace mltrain::agent::detail {
namespace {

constexpr const char* kInUse = "in-use";
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// A run key as a file name: what mltrain makes ([A-Za-z0-9._-], not starting with a dot).
bool run_file_name(const std::string& run) {
  if (run.empty() || run.size() > 200 || run[0] == '.') return false;
  for (char c : run)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
      return false;
  return true;
}

}  // namespace

int hold_in_use(int state, const std::string& run) {
  if (!run_file_name(run)) return -1;
  if (::mkdirat(state, kInUse, 0700) != 0 && errno != EEXIST) return -1;
  sync::Fd dir(::openat(state, kInUse, kDirFlags));
  if (!dir) return -1;
  int fd = ::openat(dir.get(), run.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string used_by_older(int state, const std::string& run) { return held_by(state, run, true); }

std::string held_by(int state, const std::string& run, bool older_only) {
  sync::Fd dir(::openat(state, kInUse, kDirFlags));
  if (!dir) return {};
  int scan = ::dup(dir.get());
  DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr;
  if (!d) {
    if (scan >= 0) ::close(scan);
    return {};
  }
  std::string older;
  while (dirent* e = ::readdir(d)) {
    const std::string other = e->d_name;
    if (other == run || !run_file_name(other)) continue;
    int fd = ::openat(dir.get(), other.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    const bool file = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (file && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      ::unlinkat(dir.get(), other.c_str(), 0);  // no one holds it: a run that ended
    } else if (file && errno == EWOULDBLOCK && (!older_only || other < run) &&
               (older.empty() || other < older)) {
      older = other;  // (a newer run that holds it moves aside itself)
    }
    ::close(fd);
  }
  ::closedir(d);
  return older;
}

// A file of the manifest that the folder this run took over from has, unchanged: linked in,
// not sent (its inode is shared, so its mode and time must already be what the manifest says).
bool Agent::link_from_base(size_t i, int parent, const std::string& leaf) {
  const SyncEntry& e = sync_.entries[i];
  auto it = sync_.base_index.find(e.path);
  if (!sync_.base_root || it == sync_.base_index.end() || it->second.kind != 'f' || it->second.hash != e.hash)
    return false;
  std::string base_leaf;
  sync::Fd bp(sync::open_parent(sync_.base_root.get(), e.path, base_leaf));
  struct stat st {};
  if (!bp || ::fstatat(bp.get(), base_leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
      uint64_t(st.st_size) != e.size || uint64_t(st.st_ino) != it->second.ino ||
      sync::mtime_ns(st) != it->second.mtime_ns || sync::mtime_ns(st) != e.mtime_ns ||
      (st.st_mode & 07777) != e.mode)
    return false;
  const std::string tmp = "h-" + std::to_string(i);
  if (::linkat(bp.get(), base_leaf.c_str(), sync_.work.fd(), tmp.c_str(), 0) != 0) return false;
  if (::renameat(sync_.work.fd(), tmp.c_str(), parent, leaf.c_str()) != 0) {
    ::unlinkat(sync_.work.fd(), tmp.c_str(), 0);
    return false;
  }
  sync_.index[e.path] = SyncIndexEntry{'f', e.hash, e.size, e.mtime_ns, uint64_t(st.st_ino)};
  return true;
}

}  // namespace mltrain::agent::detail
