#include "runner/tree/atomic_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace mltrain::sync {

namespace {
std::atomic<unsigned> g_made{0};  // temporaries made by this process: two threads never share one

// Hosts that share a home (NFS) may run processes of the same pid: a random part keeps their
// temporaries apart.
unsigned random_part() {
  unsigned r = 0;
  if (::getrandom(&r, sizeof r, GRND_NONBLOCK) != ssize_t(sizeof r)) r = unsigned(::time(nullptr));
  return r;
}
}  // namespace

AtomicFile::AtomicFile(int dir, std::string name, mode_t mode)
    : dir_(dir), name_(std::move(name)), mode_(mode) {
  const size_t slash = name_.rfind('/');
  const std::string folder = slash == std::string::npos ? "" : name_.substr(0, slash + 1);
  const std::string leaf = slash == std::string::npos ? name_ : name_.substr(slash + 1);
  char unique[48];
  std::snprintf(unique, sizeof unique, ".tmp.%d.%u.%08x", int(::getpid()), g_made++, random_part());
  tmp_ = folder + "." + leaf + unique;
  fd_ = ::openat(dir_, tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) error_ = "open " + tmp_ + ": " + std::strerror(errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlinkat(dir_, tmp_.c_str(), 0);
}

bool AtomicFile::fail(const char* call, const std::string& what, int err) {
  error_ = std::string(call) + " " + what + ": " + std::strerror(err);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlinkat(dir_, tmp_.c_str(), 0);
  return false;
}

bool AtomicFile::write(std::string_view bytes) {
  while (fd_ >= 0 && !bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return fail("write", tmp_, n == 0 ? ENOSPC : errno);
    bytes.remove_prefix(size_t(n));
  }
  return fd_ >= 0;
}

bool AtomicFile::commit(bool durable) {
  if (fd_ < 0) return false;
  if (::fchmod(fd_, mode_) != 0) return fail("fchmod", tmp_, errno);
  if (durable && ::fsync(fd_) != 0) return fail("fsync", tmp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    error_ = "close " + tmp_ + ": " + std::strerror(errno);
    ::unlinkat(dir_, tmp_.c_str(), 0);
    return false;
  }
  if (::renameat(dir_, tmp_.c_str(), dir_, name_.c_str()) != 0) {
    error_ = "rename " + tmp_ + " to " + name_ + ": " + std::strerror(errno);
    ::unlinkat(dir_, tmp_.c_str(), 0);
    return false;
  }
  return true;
}

bool write_atomically(int dir, const std::string& name, std::string_view data, mode_t mode, bool durable,
                      std::string& error) {
  AtomicFile f(dir, name, mode);
  if (f.write(data) && f.commit(durable)) return true;
  error = f.error();
  return false;
}

}  // namespace mltrain::sync
