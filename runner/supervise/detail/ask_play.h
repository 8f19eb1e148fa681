// A play that asks every host's agent one question and keeps each answer: `mltrain queue` (its
// leases) and `mltrain gc --hosts` (its synced folders). Internal to supervise/.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runner/supervise/detail/fleet.h"
#include "runner/supervise/plays.h"

namespace mltrain::supervise::detail {

template <class Ask, class Answer>
class AskPlay final : public Play {
 public:
  using Phase = plays::ask::Phase;
  using Event = plays::ask::Event;
  // `what`: the question in words, for a host that does not answer ("list its leases").
  AskPlay(Fleet& fleet, Ask ask, std::string what)
      : Play(fleet), ask_(std::move(ask)), what_(std::move(what)), answers_(fleet.size()) {}

  // Connects, asks, waits for every answer (or failure), says goodbye: 0, or 128 + the signal
  // that cut it short.
  int run() {
    fleet_.connect_all(false);
    fleet_.drive(*this);
    return stop_signal_ ? 128 + stop_signal_ : 0;
  }
  std::optional<Answer>& answer(size_t i) { return answers_[i]; }
  std::string problem(size_t i) const {
    return fleet_[i].problem.empty() ? "not asked (interrupted)" : fleet_[i].problem;
  }

  bool finished() const override { return phase_ == Phase::done; }

  void on_timers(Clock::time_point now) override {
    if (phase_ == Phase::connecting) {
      if (fleet_.connecting_timers(now)) on_progress();
    } else if (phase_ == Phase::asking && now >= deadline_) {
      for (size_t i = 0; i < fleet_.size(); ++i)
        if (fleet_[i].state() == HostState::preparing)
          fleet_.fail(i, "the agent did not " + what_ + " in time");
      on_progress();
    } else if (phase_ == Phase::closing && fleet_.goodbyes_done(now)) {
      step(Event::closed);
    }
  }

  std::optional<Clock::time_point> next_deadline() const override {
    if (phase_ == Phase::connecting) return fleet_.connect_deadline();
    if (phase_ == Phase::asking) return deadline_;
    if (phase_ == Phase::closing) return fleet_.goodbye_deadline();
    return std::nullopt;
  }

  void on_signal(int sig) override {
    if (phase_ != Phase::connecting && phase_ != Phase::asking) return;
    stop_signal_ = sig;
    step(Event::signalled);
  }

  void on_progress() override {
    if (phase_ == Phase::connecting && fleet_.all(HostState::greeted))
      step(Event::greeted);
    else if (phase_ == Phase::asking && fleet_.all(HostState::ready))
      step(Event::answered);
  }

  void on_lost(size_t i, const std::string& why) override {
    if (!fleet_[i].open()) return;
    if (phase_ == Phase::closing || phase_ == Phase::done) return fleet_.lose(i);
    fleet_.fail_link(i, why);
  }

  void on_frame(size_t i, uint32_t, agent::Message& m) override {
    auto* a = std::get_if<Answer>(&m);
    if (!a) {
      std::visit([&](const auto& x) { fleet_.unexpected(i, std::decay_t<decltype(x)>::kType); }, m);
      return;
    }
    if (phase_ != Phase::asking || fleet_[i].state() != HostState::preparing) return;
    answers_[i] = std::move(*a);
    fleet_.advance(i, HostState::ready);
    on_progress();
  }

 private:
  void step(Event e) {
    if (!plays::follow_table(phase_, e, plays::ask::next)) return;
    if (phase_ == Phase::asking) {
      deadline_ = fleet_.clock().now() + fleet_.opts().preflight_timeout;
      for (size_t i = 0; i < fleet_.size(); ++i)
        if (fleet_[i].state() == HostState::greeted) {
          fleet_.advance(i, HostState::preparing);
          fleet_.send(i, ask_);
        }
      on_progress();
    } else if (phase_ == Phase::closing) {
      fleet_.say_goodbye();
    }
  }

  const Ask ask_;
  const std::string what_;
  Phase phase_ = Phase::connecting;
  Clock::time_point deadline_{};
  int stop_signal_ = 0;
  std::vector<std::optional<Answer>> answers_;
};

}  // namespace mltrain::supervise::detail
