#include "runner/sync/beneath.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

}  // namespace mltrain::sync
