// The Slurm transport: inside an allocation, each node's agent is one `srun --overlap -N1 -n1 -w
// NODE` whose stdin and stdout are the agent's byte stream (SSH between nodes is often blocked
// there). The step runs the same bootstrap script as over SSH (ssh_bootstrap.h): the agent cached
// by content hash in the node's ~/.cache/mltrain, else sent down the step's stdin first. Ending
// the stream ends the agent and its ranks, and with them the step; `scancel` ends them all.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/transport/detail/child_link.h"
#include "runner/transport/ssh_bootstrap.h"
#include "runner/transport/transport.h"

extern char** environ;

namespace mltrain::transport {
namespace {

class SlurmTransport : public Transport {
 public:
  explicit SlurmTransport(SlurmOptions o) : o_(std::move(o)) {}

  std::unique_ptr<AgentLink> connect(const plan::HostPlan& host) override {
    const std::string& node = host.host.name;
    const std::string name = node + " (slurm)";
    auto bytes = agent_bytes();
    std::string hash(agent_hash());
    std::vector<std::string> argv = {o_.srun,
                                     "--overlap",
                                     "--nodes=1",
                                     "--ntasks=1",
                                     "--nodelist=" + node,
                                     "--unbuffered",
                                     "--quiet",
                                     "--kill-on-bad-exit=1",
                                     "--job-name=mltrain-agent",
                                     "/bin/sh",
                                     "-c",
                                     agent_bootstrap_script(hash, bytes.size(), kAgentArch)};
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0)
      throw Error(name + ": pipe2: " + std::strerror(errno), {}, exit_code::host_failure);
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]), ::close(in[1]);
      throw Error(name + ": pipe2: " + std::strerror(errno), {}, exit_code::host_failure);
    }
    // srun's own messages ("Unable to create step", "Invalid node name") are read back on failure.
    FILE* err = std::tmpfile();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    if (err) posix_spawn_file_actions_adddup2(&fa, ::fileno(err), 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    // Its own process group: the terminal's Ctrl-C is the launcher's to pass on (srun would take
    // two of them as "abort the step").
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, &attr, args.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    ::close(in[0]);
    ::close(out[1]);
    if (rc != 0) {
      ::close(in[1]), ::close(out[0]);
      if (err) std::fclose(err);
      throw Error(name + ": cannot run " + o_.srun + ": " + std::strerror(rc),
                  "install Slurm's client (srun) here, or run with --launcher ssh", exit_code::host_failure);
    }
    auto link = make_child_link(pid, out[0], in[1], name, node);
    auto srun_said = [&] {
      if (!err) return std::string();
      std::fflush(err);
      std::rewind(err);
      char buf[2048];
      size_t n = std::fread(buf, 1, sizeof buf, err);
      return text::trim(std::string(buf, n));
    };
    auto fail = [&](const std::string& what, const std::string& hint) {
      ::kill(pid, SIGTERM);
      std::string said = srun_said();
      if (err) std::fclose(err);
      throw Error(name + ": " + what + (said.empty() ? "" : ": " + text::excerpt(said, 400)), hint,
                  exit_code::host_failure);
    };
    std::string line;
    if (!read_marker(out[0], line))
      fail("the agent's step did not start", "check the allocation (squeue, sinfo)");
    if (line == kMarkerAgentMissing) {
      for (size_t off = 0; off < bytes.size();) {
        ssize_t n = ::write(in[1], bytes.data() + off, bytes.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("cannot send the agent to the node", "check the allocation");
        off += size_t(n);
      }
      if (!read_marker(out[0], line)) fail("the agent did not start after it was sent", "check the node");
      if (line == kMarkerAgentOk)
        log::info("transport", name + ": agent sent (" + std::to_string(bytes.size()) + " bytes)");
    }
    if (line.rfind(kMarkerArch, 0) == 0)
      fail("the node's architecture is " + line.substr(std::string(kMarkerArch).size()) +
               "; this mltrain carries an agent for " + kAgentArch,
           "run mltrain built for that architecture");
    if (line != kMarkerAgentOk)
      fail("the agent did not start (" + text::excerpt(line) + ")",
           "check free space and permissions of ~/.cache/mltrain on the node");
    if (err) std::fclose(err);  // srun keeps its copy of the descriptor
    for (int fd : {out[0], in[1]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    return link;
  }

 private:
  // One marker line from the step, read a byte at a time: the agent's stream starts right after
  // it (the agent says nothing before the launcher's hello, but the bytes must stay in the pipe).
  bool read_marker(int fd, std::string& line) {
    MarkerScanner scan;
    const auto deadline = std::chrono::steady_clock::now() + o_.start_timeout;
    while (!scan.found()) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      int r = ::poll(&p, 1, int(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      char c;
      ssize_t n = ::read(fd, &c, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      scan.feed(std::string_view(&c, 1));
    }
    line = scan.marker();
    return true;
  }

  SlurmOptions o_;
};

}  // namespace

std::unique_ptr<Transport> make_slurm_transport(SlurmOptions o) {
  return std::make_unique<SlurmTransport>(std::move(o));
}

}  // namespace mltrain::transport
