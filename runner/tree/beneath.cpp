#include "runner/tree/beneath.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

namespace mltrain::sync {

bool is_below(std::string_view rel) {
  if (rel.empty() || rel[0] == '/' || rel.find('\0') != std::string_view::npos) return false;
  for (size_t p = 0; p <= rel.size();) {
    size_t q = std::min(rel.find('/', p), rel.size());
    std::string_view part = rel.substr(p, q - p);
    if (part.empty() || part == "." || part == "..") return false;
    p = q + 1;
  }
  return true;
}

int open_parent(int root, std::string_view rel, std::string& leaf, bool make, mode_t mode) {
  if (!is_below(rel)) {
    errno = EINVAL;
    return -1;
  }
  int dir = ::fcntl(root, F_DUPFD_CLOEXEC, 0);
  if (dir < 0) return -1;
  size_t p = 0;
  for (size_t q; (q = rel.find('/', p)) != std::string_view::npos; p = q + 1) {
    const std::string part(rel.substr(p, q - p));
    int next = ::openat(dir, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && make) {
      if (::mkdirat(dir, part.c_str(), mode) != 0 && errno != EEXIST) {
        int e = errno;
        ::close(dir);
        errno = e;
        return -1;
      }
      next = ::openat(dir, part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    int e = errno;
    ::close(dir);
    if (next < 0) {
      // A link or a file on the way: ENOTDIR (O_DIRECTORY) or ELOOP (O_NOFOLLOW).
      errno = e;
      return -1;
    }
    dir = next;
  }
  leaf.assign(rel.substr(p));
  return dir;
}

int remove_tree_at(int dir, const char* name) {
  struct stat st {};
  if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
  if (!S_ISDIR(st.st_mode)) return ::unlinkat(dir, name, 0) == 0 || errno == ENOENT ? 0 : -1;
  int sub = ::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (sub < 0) return -1;
  int first_error = 0;
  if (DIR* d = ::fdopendir(sub)) {
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
    for (const auto& n : names)
      if (remove_tree_at(::dirfd(d), n.c_str()) != 0 && !first_error) first_error = errno;
    ::closedir(d);  // closes sub
  } else {
    first_error = errno;
    ::close(sub);
  }
  if (::unlinkat(dir, name, AT_REMOVEDIR) != 0 && errno != ENOENT && !first_error) first_error = errno;
  if (first_error) errno = first_error;
  return first_error ? -1 : 0;
}

namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
constexpr const char* kMaking = "new-";  // after the prefix: being made, not yet locked
constexpr time_t kMakingOldS = 600;

std::string random_hex() {
  unsigned char b[8] = {};
  if (::getrandom(b, sizeof b, GRND_NONBLOCK) != ssize_t(sizeof b)) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t v = uint64_t(ts.tv_nsec) ^ (uint64_t(ts.tv_sec) << 20) ^ (uint64_t(::getpid()) << 44);
    std::memcpy(b, &v, sizeof b);
  }
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) out += d[c >> 4], out += d[c & 15];
  return out;
}

}  // namespace

WorkFolder& WorkFolder::operator=(WorkFolder&& o) noexcept {
  if (this != &o) {
    remove();
    parent_ = std::move(o.parent_), dir_ = std::move(o.dir_), lock_ = std::move(o.lock_);
    name_ = std::move(o.name_);
  }
  return *this;
}

bool WorkFolder::make(int parent, const std::string& prefix) {
  remove();
  // Made and locked under a name no sweep takes, then renamed to its own.
  const std::string id = random_hex(), making = prefix + kMaking + id;
  Fd p(::fcntl(parent, F_DUPFD_CLOEXEC, 0));
  if (!p || ::mkdirat(p.get(), making.c_str(), 0700) != 0) return false;
  Fd dir(::openat(p.get(), making.c_str(), kDirFlags));
  Fd lock(dir ? ::openat(dir.get(), "lock", O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600) : -1);
  if (!lock || ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0 ||
      ::renameat(p.get(), making.c_str(), p.get(), (prefix + id).c_str()) != 0) {
    int e = errno;
    remove_tree_at(p.get(), making.c_str());
    errno = e;
    return false;
  }
  parent_ = std::move(p), dir_ = std::move(dir), lock_ = std::move(lock);
  name_ = prefix + id;
  return true;
}

void WorkFolder::remove() {
  if (parent_ && !name_.empty()) remove_tree_at(parent_.get(), name_.c_str());
  dir_.reset(), lock_.reset(), parent_.reset();
  name_.clear();
}

size_t sweep_work_folders(int parent, const std::string& prefix) {
  std::vector<std::string> names;
  if (int fd = ::fcntl(parent, F_DUPFD_CLOEXEC, 0); fd >= 0) {
    if (DIR* d = ::fdopendir(fd)) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) names.emplace_back(e->d_name);
      ::closedir(d);
    } else {
      ::close(fd);
    }
  }
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  size_t removed = 0;
  for (const auto& n : names) {
    struct stat st {};
    if (::fstatat(parent, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || st.st_uid != ::getuid()) continue;
    if (S_ISDIR(st.st_mode)) {
      const bool making = n.compare(prefix.size(), std::strlen(kMaking), kMaking) == 0;
      if (making && now.tv_sec - st.st_mtim.tv_sec < kMakingOldS) continue;  // being made right now
      Fd dir(::openat(parent, n.c_str(), kDirFlags));
      if (!dir) continue;
      Fd lock(::openat(dir.get(), "lock", O_RDWR | O_NOFOLLOW | O_CLOEXEC));
      if (lock && ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) continue;  // its operation still runs
    }
    if (remove_tree_at(parent, n.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace mltrain::sync
