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
#include "runner/tree/atomic_file.h"

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

  // Written whole under a private name, then renamed: concurrent launchers (two local hosts of one
  // job connect at once) never see a half-written agent. close() reports a write the file system
  // deferred (NFS, quota): a short agent is never installed.
  sync::AtomicFile f(AT_FDCWD, path, 0755);
  if (!f.write(agent_bytes()) || !f.commit(false))
    throw Error("cannot install the agent at " + path + ": " + f.error(),
                "free some disk space, or set MLTRAIN_HOME to a writable folder", exit_code::internal);
  return path;
}

}  // namespace mltrain::transport
