// The watch play (`mltrain top` on hosts): connecting, then every agent samples until the viewer
// or a signal says stop, then goodbye.
#include "runner/supervise/watch.h"

#include <poll.h>

#include <algorithm>

#include "runner/supervise/detail/fleet.h"
#include "runner/supervise/plays.h"

namespace mltrain::supervise {

namespace plays::watch {

Phase next(Phase p, Event e) {
  static constexpr Transition<Phase, Event> kTable[] = {
      {Phase::connecting, Event::watching, Phase::watching},  // each host samples from its greeting on
      {Phase::connecting, Event::stop, Phase::closing},       // the viewer, a signal
      {Phase::watching, Event::stop, Phase::closing},
      {Phase::watching, Event::deserted, Phase::done},  // no host left: no goodbye to wait for
      {Phase::closing, Event::closed, Phase::done},
  };
  return lookup(kTable, p, e);
}

}  // namespace plays::watch

namespace detail {

namespace msg = mltrain::agent::msg;

class WatchPlay final : public Play {
 public:
  using Phase = plays::watch::Phase;
  using Event = plays::watch::Event;
  WatchPlay(Fleet& fleet, const WatchOptions& w) : Play(fleet), w_(w) {}

  // Returns 0, or 128 + the signal that stopped it.
  int run() {
    fleet_.connect_all(true);
    fleet_.drive(*this);
    return stop_signal_ ? 128 + stop_signal_ : 0;
  }

  bool finished() const override { return phase_ == Phase::done; }

  void on_timers(Clock::time_point now) override {
    if (phase_ == Phase::watching)
      fleet_.heartbeats(now);
    else if (phase_ == Phase::connecting && fleet_.connecting_timers(now))
      on_progress();
    else if (phase_ == Phase::closing && fleet_.goodbyes_done(now))
      step(Event::closed);
  }

  std::optional<Clock::time_point> next_deadline() const override {
    Soonest s;
    if (phase_ == Phase::connecting) s.take(fleet_.connect_deadline()), s.take(fleet_.next_ping());
    if (phase_ == Phase::watching) s.take(fleet_.heartbeat_deadline());
    if (phase_ == Phase::closing) s.take(fleet_.goodbye_deadline());
    return s.t;
  }

  // Nothing of the user's runs here: say goodbye to the agents.
  void on_signal(int sig) override {
    stop_signal_ = sig;
    step(Event::stop);
  }

  void on_progress() override {
    if (phase_ == Phase::connecting && fleet_.all(HostState::ready)) step(Event::watching);
  }

  // Each host starts sampling as soon as its agent greets us: a slow host delays no other.
  void on_greeted(size_t i) override {
    msg::TelemetryStart m;
    m.interval_ms = uint32_t(std::clamp<int64_t>(w_.interval.count(), 1, UINT32_MAX));
    m.nvml_library = w_.nvml_library;
    m.watch = 1;
    fleet_.send(i, m);
    fleet_.advance(i, HostState::ready);
  }

  void on_failed(size_t i) override { problem(i, fleet_[i].problem); }
  void on_agent_error(size_t i, const std::string& message) override { problem(i, "agent: " + message); }

  void on_lost(size_t i, const std::string& why) override {
    if (!fleet_[i].open()) return;
    if (phase_ != Phase::connecting && phase_ != Phase::watching) return fleet_.lose(i);
    fleet_.fail_link(i, why);
  }

  void on_frame(size_t i, uint32_t, agent::Message& m) override {
    if (auto* t = std::get_if<msg::Telemetry>(&m)) {
      if (phase_ != Phase::closing && !w_.on_sample(fleet_[i].name(), t->sample)) step(Event::stop);
      return;
    }
    std::visit([&](const auto& x) { fleet_.unexpected(i, std::decay_t<decltype(x)>::kType); }, m);
  }

  // The viewer wants to stop (its descriptor turned readable).
  int extra_fd() const override {
    return phase_ == Phase::connecting || phase_ == Phase::watching ? w_.stop_fd : -1;
  }
  void on_extra(short revents) override {
    if (revents & (POLLIN | POLLHUP)) step(Event::stop);
  }

 private:
  void step(Event e) {
    if (!plays::follow_table(phase_, e, plays::watch::next)) return;
    if (phase_ == Phase::closing) fleet_.say_goodbye();
  }

  // A host that cannot be watched, once per host; with none left, the watch is over.
  void problem(size_t i, const std::string& text) {
    if (w_.on_problem) w_.on_problem(fleet_[i].name(), text);
    if (phase_ == Phase::watching && !fleet_.any_open()) step(Event::deserted);
  }

  const WatchOptions& w_;
  Phase phase_ = Phase::connecting;
  int stop_signal_ = 0;
};

}  // namespace detail

int run_watch(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
              const WatchOptions& w) {
  detail::Fleet fleet(plan, opts, transport_for);
  detail::WatchPlay play(fleet, w);
  return play.run();
}

}  // namespace mltrain::supervise
