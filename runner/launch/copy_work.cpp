// `mltrain cp`'s work folder and how a copy is moved into place: nothing outside the folder it
// made is removed, and nothing is written through a link.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"

namespace mltrain::launch::detail {

namespace {

constexpr const char* kPrefix = ".mltrain-cp-";  // a cp's work folder
constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
constexpr size_t kShownProblems = 20;

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
    job.max_bytes = knobs::mltrain_pull_max_bytes.get();
    job.stall_timeout = knobs::mltrain_pull_stall_timeout.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "set it like the default (see 'mltrain knobs')", exit_code::usage);
  }
  if (job.stall_timeout.count() <= 0)
    throw Error("MLTRAIN_PULL_STALL_TIMEOUT must be more than 0", "set it like 60s", exit_code::usage);
}

supervise::Options supervise_defaults() {
  supervise::Options o;
  try {
    o.heartbeat_interval = knobs::mltrain_heartbeat_interval.get();
    o.heartbeat_timeout = knobs::mltrain_heartbeat_timeout.get();
  } catch (const knobs::BadValue& e) {
    throw Error(e.what(), "set it like the default (see 'mltrain knobs')", exit_code::usage);
  }
  if (o.heartbeat_interval.count() <= 0 || o.heartbeat_timeout <= o.heartbeat_interval)
    throw Error(
        "MLTRAIN_HEARTBEAT_TIMEOUT must be more than MLTRAIN_HEARTBEAT_INTERVAL, and that more than 0",
        "set them like 10s and 2s (the defaults)", exit_code::usage);
  // The agents get the timeout as 32-bit milliseconds in their hello.
  if (o.heartbeat_timeout > std::chrono::hours(24))
    throw Error("MLTRAIN_HEARTBEAT_TIMEOUT is over 24h", "set it like 10s (the default)", exit_code::usage);
  return o;
}

CopyWork::CopyWork(const std::string& parent) {
  sync::Fd dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir)
    throw Error("cp: cannot open " + parent + ": " + std::strerror(errno), "check the destination",
                exit_code::usage);
  if (size_t swept = sync::sweep_work_folders(dir.get(), kPrefix))
    std::fprintf(stderr, "mltrain: cp: removed %zu unfinished cop%s left in %s by a cp that was killed\n",
                 swept, swept == 1 ? "y" : "ies", parent.c_str());
  if (!work_.make(dir.get(), kPrefix) || ::mkdirat(work_.fd(), "data", 0700) != 0 ||
      !(data_ = sync::Fd(::openat(work_.fd(), "data", kDirFlags))))
    throw Error("cp: cannot make a folder in " + parent + ": " + std::strerror(errno),
                "check that you can write there", exit_code::usage);
  path_ = parent + (parent.size() && parent.back() == '/' ? "" : "/") + work_.name() + "/data";
}

void CopyWork::place(const std::string& name, const std::string& dest, bool merge_into) {
  // What came: an entry of data/ (a file), or data/ itself.
  const int from_dir = name.empty() ? work_.fd() : data_.get();
  const std::string from = name.empty() ? "data" : name;
  struct stat got {};
  if (::fstatat(from_dir, from.c_str(), &got, AT_SYMLINK_NOFOLLOW) != 0)
    throw Error("cp: nothing arrived to place at " + dest, "run it again", 1);
  if (name.empty()) {  // a folder: as the umask would make it
    mode_t mask = ::umask(0);
    ::umask(mask);
    ::fchmod(data_.get(), 0777 & ~mask);
  }
  if (!merge_into) {
    if (::renameat2(from_dir, from.c_str(), AT_FDCWD, dest.c_str(), RENAME_NOREPLACE) != 0) {
      const int e = errno;
      throw Error("cp: cannot move the copy to " + dest + ": " + std::strerror(e),
                  e == EEXIST ? "it appeared meanwhile: give another destination, or --force"
                              : "check the destination",
                  1);
    }
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
  merge(data_.get(), to.get(), dest, problems);
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
