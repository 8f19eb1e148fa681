// How a process ended, in words and as mltrain's exit code: shared by the supervisor, the run
// records' views and the CLI.
#pragma once

#include <string>

namespace mltrain {

// The exit code a wait status maps to: the code itself, or 128 + signal; a negative status (the
// rank's host was lost) maps to exit_code::host_failure.
int exit_code_of(int wait_status);

// "exit code 3", "SIGKILL", "its host was lost", ...; with `oom_killed` (the host's kernel
// recorded an OOM kill of it: runner/agent/oom.h) "SIGKILL (killed by the kernel: out of memory)".
std::string describe_status(int wait_status, bool oom_killed = false);

// "SIGTERM", or "signal 70" for a number without a name.
std::string signal_name(int sig);

}  // namespace mltrain
