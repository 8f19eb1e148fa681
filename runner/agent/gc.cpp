// `mltrain gc --hosts`: the synced folders this user has on the host (~/.cache/mltrain/work/*, the
// default place of [sync]) that no run uses any more and none synced lately go. Only folders a sync
// made (they hold .mltrain-sync) and this user owns; each walked from its fd, never through a link.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/lease/lease.h"
#include "runner/tree/beneath.h"

namespace mltrain::agent::detail {
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
constexpr size_t kMaxFolders = 10000;
constexpr size_t kMaxWalk = 1000000;  // entries counted for a folder's size, at most

// The bytes of the regular files below `dir` (a hard link counted where it is met), bounded.
uint64_t bytes_below(int dir, size_t& budget) {
  uint64_t total = 0;
  int scan = ::dup(dir);
  DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr;
  if (!d) {
    if (scan >= 0) ::close(scan);
    return 0;
  }
  while (dirent* e = ::readdir(d)) {
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..") || budget == 0) continue;
    --budget;
    struct stat st {};
    if (::fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      total += uint64_t(st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
      sync::Fd sub(::openat(dir, e->d_name, kDirFlags));
      if (sub) total += bytes_below(sub.get(), budget);
    }
  }
  ::closedir(d);
  return total;
}

std::vector<std::string> folder_names(int dir) {
  std::vector<std::string> names;
  int scan = ::dup(dir);
  DIR* d = scan >= 0 ? ::fdopendir(scan) : nullptr;
  if (!d) {
    if (scan >= 0) ::close(scan);
    return names;
  }
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..") && names.size() < kMaxFolders)
      names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// Whether a sync into the folder is under way now: its work folder's lock is held.
bool sync_under_way(int state) {
  for (const auto& name : folder_names(state)) {
    if (name.rfind("tmp-", 0) != 0 && name.rfind("new-", 0) != 0) continue;
    sync::Fd work(::openat(state, name.c_str(), kDirFlags));
    sync::Fd lock(work ? ::openat(work.get(), "lock", O_RDWR | O_NOFOLLOW | O_CLOEXEC) : -1);
    if (lock && ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) return true;
  }
  return false;
}

}  // namespace

void Agent::on(uint32_t id, const msg::GcWork& m) {
  msg::GcDone out;
  const std::string work = expand_home("~/.cache/mltrain/work");
  sync::Fd dir(::open(work.c_str(), kDirFlags));
  if (!dir) {
    if (errno != ENOENT) out.problems.push_back("cannot open " + work + ": " + std::strerror(errno));
    send(out, id);
    return;
  }
  const int64_t now = int64_t(std::time(nullptr));
  for (const auto& name : folder_names(dir.get())) {
    sync::Fd root(::openat(dir.get(), name.c_str(), kDirFlags));  // a link or a file: not a sync's
    struct stat st {};
    if (!root || ::fstat(root.get(), &st) != 0 || st.st_uid != ::getuid()) continue;
    sync::Fd state(::openat(root.get(), ".mltrain-sync", kDirFlags));
    if (!state) continue;  // not made by a sync: not ours to remove
    lease::Info info{{"name", name}};
    struct stat index {};
    const int64_t synced = ::fstatat(state.get(), "index", &index, 0) == 0 ? index.st_mtime : st.st_mtime;
    info["age_s"] = std::to_string(std::max<int64_t>(0, now - synced));
    size_t budget = kMaxWalk;
    info["bytes"] = std::to_string(bytes_below(root.get(), budget));
    if (std::string run = held_by(state.get(), "", false); !run.empty()) {
      info["state"] = "in_use";
      // The key sorts runs by their start ("<19 digits of ns>-<run id>"): the run is what follows.
      info["run"] = run.size() > 20 && run[19] == '-' ? run.substr(20) : run;
    } else if (sync_under_way(state.get())) {
      info["state"] = "in_use";
      info["run"] = "(a sync)";
    } else if (now - synced < int64_t(m.older_than_s)) {
      info["state"] = "recent";
    } else if (m.dry_run) {
      info["state"] = "would_remove";
    } else {
      state.reset(), root.reset();
      const bool gone = sync::remove_tree_at(dir.get(), name.c_str()) == 0;
      info["state"] = gone ? "removed" : "failed";
      if (!gone) out.problems.push_back("cannot remove " + work + "/" + name + ": " + std::strerror(errno));
    }
    out.folders.push_back(lease::encode(info));
  }
  send(out, id);
}

}  // namespace mltrain::agent::detail
