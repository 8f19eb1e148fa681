// The local transport: the agent as a child process over two pipes.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/transport/detail/child_link.h"
#include "runner/transport/transport.h"

namespace mltrain::transport {
namespace {

class LocalLink : public AgentLink {
 public:
  LocalLink(pid_t pid, int rfd, int wfd, std::string describe = "localhost",
            std::string address = "127.0.0.1")
      : pid_(pid), rfd_(rfd), wfd_(wfd), describe_(std::move(describe)), address_(std::move(address)) {}
  ~LocalLink() override {
    if (rfd_ >= 0) ::close(rfd_);
    if (wfd_ >= 0) ::close(wfd_);
    // The agent sees EOF and stops its ranks within its grace period; reap it so it is no zombie.
    for (int i = 0; i < 200; ++i) {
      int status;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) return;
      ::usleep(50'000);
    }
    log::warn("transport",
              describe_ + ": the agent's process did not exit within 10s of its stream closing; killing it");
    if (::kill(pid_, SIGKILL) != 0 && errno != ESRCH)
      log::warn("transport", sys_error_text("kill", "SIGKILL local agent pid " + std::to_string(pid_)));
    else if (::waitpid(pid_, nullptr, 0) < 0 && errno != ECHILD)
      log::warn("transport", sys_error_text("waitpid", "local agent pid " + std::to_string(pid_)));
  }
  int read_fd() const override { return rfd_; }
  int write_fd() const override { return wfd_; }
  std::string describe() const override { return describe_; }
  std::string address() const override { return address_; }
  // Closing our end is the agent's signal to stop its ranks; killing it would orphan them.
  void kill() override {
    if (wfd_ >= 0) ::close(wfd_);
    wfd_ = -1;
  }

 private:
  pid_t pid_;
  int rfd_, wfd_;
  std::string describe_, address_;
};

class LocalTransport : public Transport {
 public:
  std::unique_ptr<AgentLink> connect(const plan::HostPlan&) override {
    std::string agent = local_agent_path();
    int to_agent[2], from_agent[2];
    check_sys(::pipe2(to_agent, O_CLOEXEC), "pipe2", "for the local agent", {}, exit_code::host_failure);
    if (::pipe2(from_agent, O_CLOEXEC) != 0) {
      const int e = errno;
      ::close(to_agent[0]);
      ::close(to_agent[1]);
      throw Error(sys_error_text("pipe2", "for the local agent", e), {}, exit_code::host_failure);
    }
    // MLTRAIN_LOCAL_AGENT_WRAPPER: a program (and its words) the agent runs under, its path last;
    // a program without a '/' is looked for on PATH.
    std::vector<std::string> argv;
    for (const auto& w : text::split(knobs::mltrain_local_agent_wrapper.get(), ' '))
      if (!w.empty()) argv.push_back(w);
    argv.push_back(agent);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_agent[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_agent[1], 1);
    pid_t pid = -1;
    const int rc = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(to_agent[0]);
    ::close(from_agent[1]);
    if (rc != 0) {
      ::close(to_agent[1]);
      ::close(from_agent[0]);
      if (argv.size() > 1)
        throw Error("MLTRAIN_LOCAL_AGENT_WRAPPER: cannot start '" + argv[0] + "': " + std::strerror(rc),
                    "give its full path, or unset it", exit_code::usage);
      throw Error("cannot start the local agent " + agent + ": " + std::strerror(rc),
                  "check that " + agent + " is executable (MLTRAIN_HOME on a noexec mount?)",
                  exit_code::host_failure);
    }
    // The link owns the fds and the child from here: if a step below throws, it closes and reaps.
    auto link = std::make_unique<LocalLink>(pid, from_agent[0], to_agent[1]);
    for (int fd : {from_agent[0], to_agent[1]}) {
      const int flags = check_sys(::fcntl(fd, F_GETFL), "fcntl(F_GETFL)", "on the local agent's pipe");
      check_sys(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(F_SETFL, O_NONBLOCK)",
                "on the local agent's pipe");
    }
    log::debug("transport", "local agent pid " + std::to_string(pid));
    return link;
  }
};

}  // namespace

std::unique_ptr<AgentLink> make_child_link(pid_t pid, int read_fd, int write_fd, std::string describe,
                                           std::string address) {
  return std::make_unique<LocalLink>(pid, read_fd, write_fd, std::move(describe), std::move(address));
}

std::unique_ptr<Transport> make_local_transport() { return std::make_unique<LocalTransport>(); }

int Transport::interactive(const plan::HostPlan& host, const std::string& script) {
  if (!host.local)
    throw Error(host.host.name + ": this transport cannot open a shell there", {}, exit_code::internal);
  // This terminal is the shell's: it is in our foreground process group, so Ctrl-C reaches it;
  // we wait, ignoring what the terminal sends us meanwhile.
  struct sigaction ign {
  }, old_int{}, old_quit{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGINT, &ign, &old_int);
  ::sigaction(SIGQUIT, &ign, &old_quit);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::sigaction(SIGINT, &old_int, nullptr);
    ::sigaction(SIGQUIT, &old_quit, nullptr);
    ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  while (pid > 0 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int e = errno;
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(e), {}, exit_code::internal);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace mltrain::transport
