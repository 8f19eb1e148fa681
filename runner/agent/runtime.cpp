// The comm runtime the agent carries (runtime_blob.S, written by runtime.cmake): libmltrain-comm,
// the benchmark linked to it, the Python package. Unpacked into runtime-<hash> next to the agent
// before the first rank starts, and checked byte for byte every time, so a damaged or half-written
// copy (disk full, a killed agent, a user's edit) is repaired by the next job. Each file is written
// to a private name and renamed: a rank never sees part of a file.
#include "runner/agent/runtime.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "knobs/registry.h"
#include "runner/tree/atomic_file.h"

namespace {
struct RuntimeFile {
  const char* name;
  const char* begin;
  const char* end;
  uint64_t mode;
};
}  // namespace

extern "C" const RuntimeFile mltrain_runtime_files[];
extern "C" const char mltrain_runtime_hash[];

namespace mltrain::agent {

namespace {

std::string sys_text(const char* what, const std::string& path) {
  return std::string(what) + " " + path + ": " + std::strerror(errno);
}

// mkdir -p, private to the user (the agent's own folder already is).
bool make_dirs(const std::string& dir, std::string& why) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    std::string part = dir.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) {
      why = sys_text("mkdir", part);
      return false;
    }
  }
  return true;
}

// True when `path` is a regular file with exactly these bytes and permission bits.
bool intact(const std::string& path, std::string_view bytes, mode_t mode) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && size_t(st.st_size) == bytes.size() &&
            (st.st_mode & 07777) == mode;
  char buf[64 * 1024];
  for (size_t off = 0; ok && off < bytes.size();) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || size_t(n) > bytes.size() - off || std::memcmp(buf, bytes.data() + off, size_t(n)) != 0)
      ok = false;
    off += n > 0 ? size_t(n) : 0;
  }
  ::close(fd);
  return ok;
}

bool write_file(const std::string& path, std::string_view bytes, mode_t mode, std::string& why) {
  // close reports what the file system deferred (NFS, quota): a short file is never installed.
  sync::AtomicFile f(AT_FDCWD, path, mode);
  if (f.write(bytes) && f.commit(false)) return true;
  why = "cannot install " + path + " (" + f.error() + ")";
  return false;
}

// The folder the agent lives in; $HOME/.cache/mltrain when it runs from memory (a noexec home).
std::string base_dir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0 && buf[0] == '/' && std::strncmp(buf, "/memfd:", 7) != 0 && std::strncmp(buf, "/proc/", 6) != 0) {
    std::string exe(buf, size_t(n));
    return exe.substr(0, exe.rfind('/'));
  }
  const std::string home = knobs::get_string("HOME");
  return (home.empty() ? std::string("/tmp") : home) + "/.cache/mltrain";
}

}  // namespace

std::string unpack_runtime(std::string& why) {
  const std::string dir = base_dir() + "/runtime-" + std::string(mltrain_runtime_hash).substr(0, 16);
  for (const RuntimeFile* f = mltrain_runtime_files; f->name; ++f) {
    const std::string path = dir + "/" + f->name;
    const std::string_view bytes(f->begin, size_t(f->end - f->begin));
    const mode_t mode = mode_t(f->mode);
    if (intact(path, bytes, mode)) continue;
    if (!make_dirs(path.substr(0, path.rfind('/')), why) || !write_file(path, bytes, mode, why)) return {};
  }
  return dir;
}

int print_runtime_dir() {
  std::string why;
  const std::string dir = unpack_runtime(why);
  if (dir.empty()) {
    std::fprintf(stderr, "mltrain-agent: cannot unpack the mltrain runtime: %s\n", why.c_str());
    return 1;
  }
  std::printf("%s\n", dir.c_str());
  return 0;
}

}  // namespace mltrain::agent
