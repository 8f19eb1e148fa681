#include "runner/supervise/events.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runner/common/error.h"

namespace mltrain::supervise {
namespace {

class SteadyClock final : public Clock {
 public:
  time_point now() const override { return std::chrono::steady_clock::now(); }
};

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  // A full pipe drops the signal: hundreds are pending then, and one is as good as many.
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

class ProcessSignals final : public SignalSource {
 public:
  ProcessSignals() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("cannot create the signal pipe: ") + std::strerror(errno), {},
                  exit_code::internal);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : {SIGINT, SIGTERM, SIGHUP, SIGTSTP})
      if (::sigaction(s, &sa, nullptr) != 0)
        throw Error(std::string("sigaction: ") + std::strerror(errno), {}, exit_code::internal);
    ::signal(SIGPIPE, SIG_IGN);
  }
  int fd() const override { return g_signal_pipe[0]; }
  void stop_self() override {
    struct sigaction dfl {
    }, ours{};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    ::sigaction(SIGTSTP, &dfl, &ours);
    ::raise(SIGTSTP);  // stops here until SIGCONT
    ::sigaction(SIGTSTP, &ours, nullptr);
  }
  std::vector<int> take() override {
    std::vector<int> sigs;
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0) sigs.insert(sigs.end(), buf, buf + n);
    return sigs;
  }
};

}  // namespace

Clock& steady_clock() {
  static SteadyClock c;
  return c;
}

SignalSource& process_signals() {
  static ProcessSignals s;
  return s;
}

}  // namespace mltrain::supervise
