// Errors a user can act on, and the exit codes they map to (docs/exit-codes.md).
#pragma once

#include <stdexcept>
#include <string>

namespace mltrain {

// Documented process exit codes of the `mltrain` binary. A failed rank's own exit code (1-255,
// or 128+signal) is passed through unchanged and is not listed here.
namespace exit_code {
inline constexpr int ok = 0;
inline constexpr int usage = 2;      // bad command line, spec, hostfile or profile
inline constexpr int internal = 70;  // a broken invariant inside mltrain (a bug)
inline constexpr int state = 74;     // the state folder cannot be written: records or logs incomplete
inline constexpr int busy = 75;      // what the job needs is held by other jobs (no --queue): nothing started
inline constexpr int timeout = 124;  // the job ran past [run] timeout
inline constexpr int cannot_start = 127;  // a rank's program or workdir is missing
inline constexpr int interrupted = 130;   // stopped by Ctrl-C
inline constexpr int stopped = 143;       // stopped by `mltrain stop` or SIGTERM
inline constexpr int host_failure = 255;  // a host could not be reached, or stopped answering
}  // namespace exit_code

// The one recoverable error type: an expected failure (bad input, unreachable host, ...).
// `what()` is one line that says what was wrong and where; `hint` says what to do about it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, std::string hint = {}, int code = exit_code::usage)
      : std::runtime_error(message), hint_(std::move(hint)), code_(code) {}
  const std::string& hint() const { return hint_; }
  int code() const { return code_; }

 private:
  std::string hint_;
  int code_;
};

}  // namespace mltrain
