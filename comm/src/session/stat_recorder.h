// Writes the counters (comm_stats.h) around each collective, cheaply: a 4 KiB allreduce on 2 ranks
// takes 1-1.5 us. On a 2.4 GHz EPYC (bench/comm_stats_cost.sh) clock_gettime costs ~33 ns, the
// TSC ~13 ns, converting ticks to ns ~5 ns. So on x86-64, where the kernel keeps time with the TSC
// (it found it constant and in step across CPUs), the rank stores raw TSC ticks and publishes
// their scale, measured against CLOCK_MONOTONIC again about once a second, so readers convert
// within a millisecond of it whatever NTP's slewing (at most 500 ppm).
// Two TSC reads per call still cost 17-29 ns there (1.1-1.9%). So once 64 timed calls in a row
// each came less than 5 us after the one before (a tight loop, where timing every call would
// cost over 0.5%), it times one call in 16 at random and counts each timed call's time for the
// untimed ones since, capped at the time that passed: comm_ns stays right on average (5-8 ns a
// call), and timing every call resumes as soon as a timed call finds more time passed. The
// price: a long wait in the first untimed calls after a pause in such a loop goes uncounted.
#pragma once

#include <algorithm>
#include <cstdint>

#include "mltrain/comm_stats.h"

namespace mltrain::comm::detail {

std::uint64_t monotonic_ns();

// One writer: a relaxed load and store, no read-modify-write (docs: comm_stats.h).
inline void stat_set(std::uint64_t& field, std::uint64_t v) { __atomic_store_n(&field, v, __ATOMIC_RELAXED); }
inline void stat_add(std::uint64_t& field, std::uint64_t v) {
  __atomic_store_n(&field, __atomic_load_n(&field, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

class StatRecorder {
 public:
  // A first (ticks, ns) pair; start() takes the scale from the span since.
  void begin();
  // Publishes the clock and started_ns in `s` (waiting until 1 ms has passed since begin()).
  void start(mltrain_comm_stats& s);
  // A collective begins (inline: every call pays for it).
  void enter(mltrain_comm_stats& s) {
    timed_ = !sampling_ || next_random() % kOneIn == 0;
    if (timed_) {
      t0_ = ticks();
      stat_set(s.entered_ns, t0_);
    } else {
      ++untimed_;
      stat_set(s.entered_ns, last_exit_);  // open since then at the latest
    }
  }
  // It ends.
  void leave(mltrain_comm_stats& s, std::uint64_t bytes) {
    stat_add(s.calls, 1);
    stat_add(s.bytes, bytes);
    if (!timed_) {
      stat_set(s.entered_ns, 0);
      return;
    }
    const std::uint64_t t1 = ticks();
    const std::uint64_t took = t1 > t0_ ? t1 - t0_ : 0;  // 0: two CPUs' TSCs a few ticks apart
    const std::uint64_t since = t0_ > last_exit_ ? t0_ - last_exit_ : 0;  // the untimed calls and gaps
    stat_add(s.comm_ns, took + std::min(took * untimed_, since));
    stat_set(s.last_exit_ns, t1);
    stat_set(s.entered_ns, 0);
    const bool tight = since + took < short_ticks_ * (untimed_ + 1);
    in_a_row_ = tight ? in_a_row_ + 1 : 0;
    sampling_ = in_a_row_ >= kInARow;
    untimed_ = 0;
    last_exit_ = t1;
    if (t1 - base_.tsc >= rescale_ticks_) keep_up(s, t1);
  }

 private:
  static constexpr std::uint64_t kShortNs = 5000;  // per call and the gap before it
  static constexpr std::uint32_t kInARow = 64, kOneIn = 16;

  struct Pair {
    std::uint64_t tsc = 0, ns = 0;
  };
  std::uint64_t ticks() const {
#if defined(__x86_64__)
    if (tsc_) return __builtin_ia32_rdtsc();
#endif
    return monotonic_ns();
  }
  std::uint32_t next_random() {  // xorshift32: sampling at random, not in step with a loop's pattern
    random_ ^= random_ << 13;
    random_ ^= random_ >> 17;
    random_ ^= random_ << 5;
    return random_;
  }
  // Measures the scale again once a second of ticks has passed.
  [[gnu::noinline, gnu::cold]] void keep_up(mltrain_comm_stats& s, std::uint64_t t);
  static Pair pair();
  void rescale(Pair p);
  void publish(mltrain_comm_stats& s) const;

  // The clock.
  bool tsc_ = false;
  Pair base_;
  std::uint64_t scale_ = 0;  // ns per tick, << 32
  std::uint64_t rescale_ticks_ = ~std::uint64_t(0);
  std::uint64_t short_ticks_ = 0;
  // The calls.
  std::uint64_t t0_ = 0, last_exit_ = 0;  // of the last timed call
  std::uint64_t untimed_ = 0;             // calls since it
  std::uint32_t in_a_row_ = 0;            // tight timed calls in a row
  std::uint32_t random_ = 1;
  bool sampling_ = false, timed_ = true;
};

}  // namespace mltrain::comm::detail
