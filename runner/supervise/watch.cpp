#include "runner/supervise/watch.h"

#include <algorithm>

#include "runner/supervise/detail/gang.h"

namespace mltrain::supervise {

namespace detail {

namespace msg = mltrain::agent::msg;

// Each host starts sampling as soon as its agent greets us: a slow host delays no other.
void Gang::start_watching(size_t i) {
  Host& h = hosts_[i];
  msg::TelemetryStart m;
  m.interval_ms = uint32_t(std::clamp<int64_t>(watch_->interval.count(), 1, UINT32_MAX));
  m.nvml_library = watch_->nvml_library;
  m.watch = 1;
  send_to(h, m);
  h.state = HostState::ready;
}

void Gang::watch_problem(size_t i, const std::string& problem) {
  if (watch_->on_problem) watch_->on_problem(hosts_[i].plan->host.name, problem);
  if (phase_ == Phase::watching &&
      std::none_of(hosts_.begin(), hosts_.end(), [](const Host& h) { return h.open(); }))
    enter(Phase::done);
}

int Gang::run_watch(const WatchOptions& w) {
  watch_ = &w;
  loop();
  return stop_signal_ ? 128 + stop_signal_ : 0;
}

}  // namespace detail

int run_watch(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
              const WatchOptions& w) {
  records::RunRecord unused;  // watching records nothing
  detail::Gang g(plan, unused, opts, transport_for);
  return g.run_watch(w);
}

}  // namespace mltrain::supervise
