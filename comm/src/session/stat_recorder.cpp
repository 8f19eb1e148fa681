#include "session/stat_recorder.h"

#include <time.h>

#include "core/sys_check.h"

namespace mltrain::comm::detail {

std::uint64_t monotonic_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

void StatRecorder::begin() {
#if defined(__x86_64__)
  tsc_ = first_line("/sys/devices/system/clocksource/clocksource0/current_clocksource") == "tsc";
#endif
  if (tsc_) base_ = pair();
}

void StatRecorder::start(mltrain_comm_stats& s) {
  if (tsc_) {
    Pair p = pair();
    while (p.ns - base_.ns < 1000000u) p = pair();
    rescale(p);
    // Slower than 1 GHz (scale above 2^32) or not counting up: not a TSC to trust.
    if (scale_ == 0 || scale_ > (std::uint64_t(1) << 32)) tsc_ = false;
  }
  if (!tsc_) base_ = {0, 0}, scale_ = std::uint64_t(1) << 32, rescale_ticks_ = ~std::uint64_t(0);
  publish(s);
  short_ticks_ = (std::uint64_t(kShortNs) << 32) / scale_;
  last_exit_ = ticks();
  random_ = static_cast<std::uint32_t>(last_exit_) | 1u;
  stat_set(s.started_ns, last_exit_);
}

void StatRecorder::keep_up(mltrain_comm_stats& s, std::uint64_t t) {
  if (t <= base_.tsc) return;
  rescale(pair());
  publish(s);
}

// The tightest of a few tries: a rank preempted between the reads would skew the scale.
StatRecorder::Pair StatRecorder::pair() {
  Pair best;
#if defined(__x86_64__)
  std::uint64_t best_width = ~std::uint64_t(0);
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t a = __builtin_ia32_rdtsc();
    const std::uint64_t ns = monotonic_ns();
    const std::uint64_t width = __builtin_ia32_rdtsc() - a;
    if (width < best_width) best = {a + width / 2, ns}, best_width = width;
  }
#endif
  return best;
}

void StatRecorder::rescale(Pair p) {
  if (p.tsc > base_.tsc && p.ns > base_.ns)
    scale_ = static_cast<std::uint64_t>((static_cast<unsigned __int128>(p.ns - base_.ns) << 32) /
                                        (p.tsc - base_.tsc));
  base_ = p;
  rescale_ticks_ = scale_ ? (std::uint64_t(1000000000u) << 32) / scale_ : ~std::uint64_t(0);
}

// A seqlock: readers retry while clock_seq is odd or changed (mltrain_comm_stats_read_clock).
void StatRecorder::publish(mltrain_comm_stats& s) const {
  const std::uint64_t seq = __atomic_load_n(&s.clock_seq, __ATOMIC_RELAXED);
  stat_set(s.clock_seq, seq + 1);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  stat_set(s.clock_ticks, base_.tsc);
  stat_set(s.clock_ns, base_.ns);
  stat_set(s.clock_scale, scale_);
  __atomic_store_n(&s.clock_seq, seq + 2, __ATOMIC_RELEASE);
}

}  // namespace mltrain::comm::detail
