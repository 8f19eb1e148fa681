// Runs a vendor tool (nvidia-smi) and takes what it prints, bounded in time and bytes: the one way
// the GPU inventory and the telemetry sampler run one. libc and the standard library only: the
// agent compiles it.
#pragma once

#include <cstddef>
#include <string>

namespace mltrain::gpu {

inline constexpr int kToolNotStarted = -1;  // errno says why
inline constexpr int kToolTimedOut = -2;    // killed with SIGKILL at the deadline, then reaped

// Runs argv (argv[0] a path, the list ending with nullptr) with stdin from /dev/null, stdout and
// stderr into `out` (replaced; at most about `max_output` bytes kept), every signal unblocked and
// the usual ones at their defaults (the agent blocks some for its signalfd), for at most
// `timeout_ms`. Returns the wait status, kToolNotStarted or kToolTimedOut.
int run_tool(const char* const* argv, int timeout_ms, std::size_t max_output, std::string& out);

// The exit code a wait status stands for (128 + the signal for a signal); a negative status as is.
int tool_exit_code(int status);

}  // namespace mltrain::gpu
