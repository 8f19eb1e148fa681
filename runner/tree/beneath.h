// Paths that come from elsewhere (a manifest, a host's file names, a user's copy source) walked
// below one open folder, one part at a time with O_NOFOLLOW: no part may be a link, "." or "..",
// so nothing outside the folder can be named, written or removed, whatever links or renames the
// other side (a job, a host, another user) made meanwhile. libc only: the launcher and the agent
// both link it.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <utility>

namespace mltrain::sync {

// An fd that closes when it goes.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Whether `rel` is a path below a folder: not empty, not absolute, no empty, "." or ".." part
// ("a//b" and a trailing "/" are refused too), no NUL.
bool is_below(std::string_view rel);

// An fd of the folder holding `rel`'s last part (put in `leaf`), walked from `root` without
// following any link; with `make`, missing folders on the way are made with `mode`. -1 with errno
// set when `rel` is not below (EINVAL), a part is a link or not a folder (ENOTDIR, or ELOOP), or
// open/mkdir fail. The caller closes the fd.
int open_parent(int root, std::string_view rel, std::string& leaf, bool make = false, mode_t mode = 0700);

// Removes the entry `name` of the folder `dir` and, for a folder, everything in it, never
// following a link (a link is removed, not what it points to). 0, or -1 with errno of the first
// entry that could not be removed (the rest is still tried).
int remove_tree_at(int dir, const char* name);

// The work folder of one operation (a sync's, in .mltrain-sync; a cp's, beside its destination):
// <prefix><random> in `parent`, private, and held by flock on its `lock` file while the operation
// runs, so a concurrent one (another run, another host sharing the folder) never takes it, and
// one left by an operation that was killed is removed by the next (sweep_work_folders). It goes,
// with what is left in it, when the WorkFolder does.
class WorkFolder {
 public:
  WorkFolder() = default;
  WorkFolder(WorkFolder&&) = default;
  WorkFolder& operator=(WorkFolder&& o) noexcept;
  ~WorkFolder() { remove(); }
  // False with errno set when it cannot be made.
  bool make(int parent, const std::string& prefix);
  int fd() const { return dir_.get(); }
  const std::string& name() const { return name_; }
  explicit operator bool() const { return bool(dir_); }

 private:
  void remove();
  Fd parent_, dir_, lock_;
  std::string name_;
};

// Removes the entries <prefix>* of `parent` that are this user's and that no operation holds
// (older versions' leftovers of that name too); returns how many went.
size_t sweep_work_folders(int parent, const std::string& prefix);

}  // namespace mltrain::sync
