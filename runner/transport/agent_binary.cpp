#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "runner/common/error.h"
#include "runner/common/state_home.h"
#include "runner/common/sys_check.h"
#include "runner/transport/transport.h"

// Provided by the generated agent_blob.S (.incbin of the built mltrain-agent).
extern "C" const char mltrain_agent_blob_start[];
extern "C" const char mltrain_agent_blob_end[];
extern "C" const char mltrain_agent_blob_hash[];

namespace mltrain::transport {

std::string_view agent_bytes() {
  std::string_view bytes{mltrain_agent_blob_start, size_t(mltrain_agent_blob_end - mltrain_agent_blob_start)};
  if (bytes.empty())
    throw Error("this mltrain was built without its agent (cmake -DMLTRAIN_EMBED_AGENT=OFF, for unit tests)",
                "build it with -DMLTRAIN_EMBED_AGENT=ON (the default)");
  return bytes;
}

std::string_view agent_hash() { return mltrain_agent_blob_hash; }

namespace {

// The agent in an anonymous memory file, for a state folder on a noexec (or read-only) mount:
// "/proc/self/fd/N" execs it in the child (the kernel opens it before closing the fd on exec).
std::string memfd_agent() {
  static std::string path = [] {
    int fd = ::memfd_create("mltrain-agent", MFD_CLOEXEC);
    if (fd < 0) return std::string();
    auto bytes = agent_bytes();
    for (size_t off = 0; off < bytes.size();) {
      ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ::close(fd);
        return std::string();
      }
      off += size_t(n);
    }
    return "/proc/self/fd/" + std::to_string(fd);  // kept open for the launcher's life
  }();
  return path;
}

bool noexec(const std::string& dir) {
  struct statvfs st {};
  return ::statvfs(dir.c_str(), &st) == 0 && (st.f_flag & (ST_NOEXEC | ST_RDONLY)) != 0;
}

}  // namespace

std::string local_agent_path() {
  std::string dir = state_home();
  std::string agents = dir + "/agent";
  make_private_dirs(dir, /*make_private=*/true);
  make_private_dirs(agents);
  std::string path = agents + "/mltrain-agent-" + std::string(agent_hash().substr(0, 16));
  if (noexec(agents))
    if (std::string m = memfd_agent(); !m.empty()) return m;
  if (::access(path.c_str(), X_OK) == 0) return path;

  // Write to a private name, then rename: concurrent launchers never see a half-written agent. The
  // name is private to the thread too: two local hosts of one job connect at once.
  static std::atomic<unsigned> installs{0};
  std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(installs++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0)
    throw Error("cannot write the agent to " + tmp + ": " + std::strerror(errno),
                "set MLTRAIN_HOME to a writable folder", exit_code::internal);
  auto bytes = agent_bytes();
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw Error("cannot write the agent to " + tmp + ": " + std::strerror(e), "free some disk space",
                  exit_code::internal);
    }
    off += size_t(n);
  }
  // close reports a write the file system deferred (NFS, quota): a short agent must not be installed.
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(sys_error_text("close", tmp, e), "free some disk space", exit_code::internal);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("cannot install the agent at " + path + ": " + std::strerror(e), {}, exit_code::internal);
  }
  return path;
}

}  // namespace mltrain::transport
