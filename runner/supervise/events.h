// What the gang waits on besides its agents: the clock and signals. Both are interfaces so the
// supervisor's tests drive time and deliver signals instead of sleeping and raising.
#pragma once

#include <chrono>
#include <vector>

namespace mltrain::supervise {

class Clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual time_point now() const = 0;
  // A descriptor that becomes readable when now() jumps (a fake clock advanced); -1 for a real one.
  virtual int wake_fd() const { return -1; }
  virtual void drain_wake() {}
};

class SignalSource {
 public:
  virtual ~SignalSource() = default;
  // Readable when a signal is pending.
  virtual int fd() const = 0;
  // The signals that arrived since the last call, in order.
  virtual std::vector<int> take() = 0;
  // SIGTSTP came and the launcher is ready to stop: stop this process as the default action
  // would, until SIGCONT. Fakes do nothing.
  virtual void stop_self() {}
};

// std::chrono::steady_clock.
Clock& steady_clock();

// SIGINT, SIGTERM, SIGHUP and SIGTSTP of this process through a self-pipe (handlers installed on first
// use; SIGPIPE is ignored from then on).
SignalSource& process_signals();

}  // namespace mltrain::supervise
