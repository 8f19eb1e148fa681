// What a server says about the connections it refuses (a wrong token, not an mltrain peer, no
// hello in time), bounded: anyone who can reach the port makes these, so a flood must not grow a
// log without bound. The first few of each window are said in full; the rest are counted and
// summarised in one line when the window is over. The store and the PS servers share this.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

namespace mltrain::comm::detail {

class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr int kBurst = 5;                                      // said in full per window
  static constexpr Clock::duration kWindow = std::chrono::seconds(10);  // then one summary line

  // `say` gets one line (no newline) at a time, on the caller's thread.
  explicit RefusalLog(std::function<void(const std::string&)> say) : say_(std::move(say)) {}
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // One refused connection; `line` says who and why.
  void refused(const std::string& line, Clock::time_point now = Clock::now()) {
    tick(now);
    if (said_ < kBurst) {
      ++said_;
      say_(said_ == kBurst
               ? line + " (further refusals are counted, and summarised every " +
                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kWindow).count()) + " s)"
               : line);
      return;
    }
    ++held_;
    last_ = line;
  }
  // Says the summary once the window is over. Call it from the server's loop.
  void tick(Clock::time_point now = Clock::now()) {
    if (now - window_start_ < kWindow) return;
    summarise();
    window_start_ = now;
    said_ = 0;
  }
  // When the next summary is due (Clock::time_point::max(): none is pending), for a poll timeout.
  Clock::time_point due() const { return held_ ? window_start_ + kWindow : Clock::time_point::max(); }
  // Says what is held back now (the server is stopping).
  void summarise() {
    if (held_ == 0) return;
    say_(std::to_string(held_) + " more refused connection" + (held_ == 1 ? "" : "s") +
         " (the last: " + last_ + ")");
    held_ = 0;
    last_.clear();
  }

 private:
  std::function<void(const std::string&)> say_;
  Clock::time_point window_start_{};
  int said_ = 0;
  std::uint64_t held_ = 0;
  std::string last_;
};

}  // namespace mltrain::comm::detail
