#include "runner/common/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "runner/common/sys_check.h"

namespace mltrain {

bool replace_file(const std::string& path, std::string_view data, bool durable, std::string& error) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  const std::string tmp = dir + "." + path.substr(slash == std::string::npos ? 0 : slash + 1) + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    error = sys_error_text("open", tmp);
    return false;
  }
  auto failed = [&](const char* call, int err) {
    error = sys_error_text(call, tmp, err);
    ::close(fd);
    ::unlink(tmp.c_str());
    return false;
  };
  if (::fchmod(fd, 0600) != 0) return failed("fchmod", errno);
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return failed("write", n == 0 ? ENOSPC : errno);
    data.remove_prefix(size_t(n));
  }
  if (durable && ::fsync(fd) != 0) return failed("fsync", errno);
  if (::close(fd) != 0) {
    error = sys_error_text("close", tmp);
    ::unlink(tmp.c_str());
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    error = sys_error_text("rename", tmp + " to " + path);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace mltrain
