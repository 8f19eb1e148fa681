// A vendor tool run with a timeout (runner/gpu/run_tool.h).
#include "runner/gpu/run_tool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

extern char** environ;

namespace mltrain::gpu {
namespace {

int64_t monotonic_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Spawns argv with its stdout and stderr on `write_fd`; the pid, or -1 with errno set.
pid_t spawn(const char* const* argv, int write_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, write_fd, 1);
  ::posix_spawn_file_actions_adddup2(&actions, write_fd, 2);
  ::posix_spawnattr_init(&attr);
  // The agent blocks signals for its signalfd and may ignore SIGPIPE: the child gets neither.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, sig);
  ::posix_spawnattr_setsigmask(&attr, &none);
  ::posix_spawnattr_setsigdefault(&attr, &defaults);
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attr, const_cast<char* const*>(argv), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

// Reads `fd` into `out` until EOF or the deadline; true when the deadline came first.
bool read_until(int fd, int64_t deadline, std::size_t max_output, std::string& out) {
  char buf[4096];
  while (true) {
    const int64_t left = deadline - monotonic_ms();
    if (left <= 0) return true;
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, int(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r == 0;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (out.size() < max_output) out.append(buf, size_t(n));
  }
}

}  // namespace

int run_tool(const char* const* argv, int timeout_ms, std::size_t max_output, std::string& out) {
  out.clear();
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return kToolNotStarted;
  const pid_t pid = spawn(argv, fds[1]);
  const int spawn_errno = errno;
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    errno = spawn_errno;
    return kToolNotStarted;
  }
  const bool timed_out = read_until(fds[0], monotonic_ms() + timeout_ms, max_output, out);
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return timed_out ? kToolTimedOut : status;
}

int tool_exit_code(int status) {
  return status < 0 ? status : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace mltrain::gpu
