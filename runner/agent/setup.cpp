// The agent's side of `[setup]`: the command runs when what it depends on changed since it last
// succeeded on this machine (a stamp per host under ~/.cache/mltrain/setup), its output streamed
// back as the setup's own.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "runner/agent/detail/agent_impl.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/hash.h"

namespace mltrain::agent::detail {

using sync::canonical;
using sync::hex;

namespace {

// Which machine this is, for the setup's stamp: a home shared by several hosts (NFS) holds one
// stamp per host, or a setup that installs into the host (apt, /scratch, a local venv) ran on one
// host only and was "skipped, nothing changed" on the others. The machine id and the host name
// (clones share a machine id; the test cluster's hosts share /etc).
std::string machine_identity() {
  std::string id;
  if (FILE* f = std::fopen("/etc/machine-id", "r")) {
    char buf[128];
    size_t n = std::fread(buf, 1, sizeof buf, f);
    id.assign(buf, n);
    std::fclose(f);
  }
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) id += '\n' + std::string(host);
  return id;
}

}  // namespace

void Agent::on(uint32_t, msg::Setup& m) {
  std::string cwd = expand_home(m.cwd);
  std::string dir = expand_home("~/.cache/mltrain/setup");
  const std::string where = cwd + '\0' + machine_identity();
  setup_stamp_ = dir + "/" + hex(canonical(XXH3_128bits(where.data(), where.size())));
  setup_key_ = m.key;
  if (!m.force) {
    FILE* f = std::fopen(setup_stamp_.c_str(), "r");
    std::string got;
    if (f) {
      char buf[512];
      size_t n = std::fread(buf, 1, sizeof buf, f);
      got.assign(buf, n);
      std::fclose(f);
    }
    if (got == m.key + "\n") {
      send(msg::SetupDone{0, 0, {}});
      return;
    }
  }
  mkdirs(dir, 0700);
  ::unlink(setup_stamp_.c_str());  // a setup that fails or is cut short runs again next time
  msg::Spawn s;
  s.cwd = cwd;
  s.argv = {"/bin/sh", "-c", m.command};
  s.env = std::move(m.env);
  s.one_stream = 1;  // shown and kept as one stream: in the order it was written
  setup_running_ = true;
  on(kSetupId, s);
}

void Agent::setup_exited(int status) {
  setup_running_ = false;
  if (status == 0) {
    std::string error;  // a stamp not written: the setup runs again next time
    (void)sync::write_atomically(AT_FDCWD, setup_stamp_, setup_key_ + "\n", 0600, false, error);
  }
  send(msg::SetupDone{1, status, {}});
}

}  // namespace mltrain::agent::detail
