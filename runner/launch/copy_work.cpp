// `mltrain cp`'s work folder and how a copy is moved into place: nothing outside the folder it
// made is removed, and nothing is written through a link.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "knobs/registry.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"

namespace mltrain::launch::detail {

namespace {

constexpr const char* kPrefix = ".mltrain-cp-";    // a work folder
constexpr const char* kFresh = ".mltrain-cpnew-";  // one being made
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
constexpr size_t kShownProblems = 20;

std::string random_id() {
  unsigned char b[8] = {};
  if (::getrandom(b, sizeof b, 0) != ssize_t(sizeof b))
    throw Error(std::string("cp: getrandom: ") + std::strerror(errno), {}, exit_code::internal);
  char out[17];
  for (size_t i = 0; i < sizeof b; ++i) std::snprintf(out + 2 * i, 3, "%02x", b[i]);
  return out;
}

std::vector<std::string> names_in(int dir) {
  std::vector<std::string> names;
  int fd = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) ::close(fd);
    return names;
  }
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

// Moves every entry of `from` into `to`: folders merged, files (and links, as links) renamed over
// files of the same name; a folder in the way of a file, or a link or file in the way of a folder,
// is kept and named.
void merge(int from, int to, const std::string& shown, std::vector<std::string>& problems) {
  for (const auto& n : names_in(from)) {
    struct stat src {
    }, dst{};
    if (::fstatat(from, n.c_str(), &src, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool there = ::fstatat(to, n.c_str(), &dst, AT_SYMLINK_NOFOLLOW) == 0;
    const std::string path = shown + "/" + n;
    if (S_ISDIR(src.st_mode)) {
      if (there && !S_ISDIR(dst.st_mode)) {
        problems.push_back(path + " is " + (S_ISLNK(dst.st_mode) ? "a link" : "a file") +
                           " here, not a folder: kept, and what came for it not placed");
        continue;
      }
      if (!there && ::renameat(from, n.c_str(), to, n.c_str()) == 0) continue;
      sync::Fd a(::openat(from, n.c_str(), kDirFlags)), b(::openat(to, n.c_str(), kDirFlags));
      if (a && b)
        merge(a.get(), b.get(), path, problems);
      else
        problems.push_back(path + ": " + std::strerror(errno));
      continue;
    }
    if (there && S_ISDIR(dst.st_mode)) {
      problems.push_back(path + " is a folder here: kept, and the file that came for it not placed");
      continue;
    }
    if (::renameat(from, n.c_str(), to, n.c_str()) != 0)
      problems.push_back(path + ": " + std::strerror(errno));
  }
}

}  // namespace

void pull_limits(supervise::PullJob& job) {
  try {
    job.max_bytes = knobs::get_bytes("MLTRAIN_PULL_MAX_BYTES");
    job.stall_timeout = knobs::get_duration("MLTRAIN_PULL_STALL_TIMEOUT");
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "set it like the default (see 'mltrain knobs')", exit_code::usage);
  }
  if (job.stall_timeout.count() <= 0)
    throw Error("MLTRAIN_PULL_STALL_TIMEOUT must be more than 0", "set it like 60s", exit_code::usage);
}

CopyWork::CopyWork(const std::string& parent) {
  parent_.reset(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!parent_)
    throw Error("cp: cannot open " + parent + ": " + std::strerror(errno), "check the destination",
                exit_code::usage);
  // Work folders of earlier copies that no cp holds: left by a cp that was killed.
  size_t swept = 0;
  for (const auto& n : names_in(parent_.get())) {
    struct stat st {};
    if (n.rfind(kPrefix, 0) != 0 || ::fstatat(parent_.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;
    sync::Fd d(::openat(parent_.get(), n.c_str(), kDirFlags));
    if (d && ::flock(d.get(), LOCK_EX | LOCK_NB) == 0 && sync::remove_tree_at(parent_.get(), n.c_str()) == 0)
      ++swept;
  }
  if (swept)
    std::fprintf(stderr, "mltrain: cp: removed %zu unfinished cop%s left in %s by a cp that was killed\n",
                 swept, swept == 1 ? "y" : "ies", parent.c_str());
  // Made and locked under a name no sweep takes, then renamed to its own.
  const std::string id = random_id();
  const std::string fresh = kFresh + id;
  name_ = kPrefix + id;
  if (::mkdirat(parent_.get(), fresh.c_str(), 0700) != 0)
    throw Error("cp: cannot make a folder in " + parent + ": " + std::strerror(errno),
                "check that you can write there", exit_code::usage);
  dir_.reset(::openat(parent_.get(), fresh.c_str(), kDirFlags));
  if (!dir_ || ::flock(dir_.get(), LOCK_EX | LOCK_NB) != 0 ||
      ::renameat(parent_.get(), fresh.c_str(), parent_.get(), name_.c_str()) != 0) {
    int e = errno;
    sync::remove_tree_at(parent_.get(), fresh.c_str());
    throw Error("cp: cannot make a folder in " + parent + ": " + std::strerror(e), {}, exit_code::internal);
  }
  path_ = parent + (parent.size() && parent.back() == '/' ? "" : "/") + name_;
}

CopyWork::~CopyWork() {
  if (!placed_ && parent_) sync::remove_tree_at(parent_.get(), name_.c_str());
}

void CopyWork::place(const std::string& name, const std::string& dest, bool merge_into) {
  // What came: an entry of the work folder (a file) or the work folder itself.
  const int from_dir = name.empty() ? parent_.get() : dir_.get();
  const std::string from = name.empty() ? name_ : name;
  struct stat got {};
  if (::fstatat(from_dir, from.c_str(), &got, AT_SYMLINK_NOFOLLOW) != 0)
    throw Error("cp: nothing arrived to place at " + dest, "run it again", 1);
  if (name.empty()) {  // a folder: as the umask would make it
    mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(dir_.get(), 0777 & ~mask);
  }
  if (!merge_into) {
    if (::renameat2(from_dir, from.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) != 0)
      throw Error("cp: cannot move the copy to " + dest + ": " + std::strerror(errno),
                  errno == EEXIST ? "it appeared meanwhile: give another destination, or --force"
                                  : "check the destination",
                  1);
    placed_ = name.empty();
    return;
  }
  struct stat there {};
  if (::lstat(dest.c_str(), &there) != 0)
    throw Error("cp: " + dest + ": " + std::strerror(errno), "give another destination", 1);
  if (S_ISDIR(got.st_mode) != S_ISDIR(there.st_mode) || S_ISLNK(there.st_mode))
    throw Error("cp: " + dest + " exists and is " +
                    (S_ISLNK(there.st_mode)   ? "a link"
                     : S_ISDIR(there.st_mode) ? "a folder"
                                              : "a file") +
                    ", not " + (S_ISDIR(got.st_mode) ? "a folder" : "a file") + " like what came",
                "give another destination", exit_code::usage);
  if (!S_ISDIR(got.st_mode)) {  // a file over a file
    if (::renameat(from_dir, from.c_str(), AT_FDCWD, dest.c_str()) != 0)
      throw Error("cp: cannot move the copy to " + dest + ": " + std::strerror(errno),
                  "check the destination", 1);
    return;
  }
  sync::Fd to(::open(dest.c_str(), kDirFlags));
  if (!to) throw Error("cp: cannot open " + dest + ": " + std::strerror(errno), "check the destination", 1);
  std::vector<std::string> problems;
  merge(dir_.get(), to.get(), dest, problems);
  if (problems.empty()) return;
  const size_t n = problems.size();
  if (n > kShownProblems) {
    problems.resize(kShownProblems);
    problems.push_back("... and " + std::to_string(n - kShownProblems) + " more");
  }
  throw Error("cp: merged into " + dest + " but for " + std::to_string(n) + " entr" + (n == 1 ? "y" : "ies") +
                  ":\n  " + text::join(problems, "\n  "),
              "move those out of the way and copy again", 1);
}

}  // namespace mltrain::launch::detail
