#include "runner/common/status.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "runner/common/error.h"

namespace mltrain {

int exit_code_of(int status) {
  if (status < 0) return exit_code::host_failure;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return exit_code::internal;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_status(int status, bool oom_killed) {
  if (status < 0) return "its host was lost";
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string s = signal_name(sig);
    if (sig == SIGKILL && oom_killed)  // only on the kernel's word: a SIGKILL has many senders
      s += " (killed by the kernel: out of memory)";
    else if (sig == SIGSEGV || sig == SIGBUS)
      s += " (crashed)";
    return s;
  }
  return "wait status " + std::to_string(status);
}

}  // namespace mltrain
