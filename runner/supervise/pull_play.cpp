// The pull play (`mltrain cp`): connecting, then the host's files brought back, then goodbye.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/pulls.h"
#include "runner/supervise/plays.h"

namespace mltrain::supervise {

namespace plays::pull {

Phase next(Phase p, Event e) {
  static constexpr Transition<Phase, Event> kTable[] = {
      {Phase::connecting, Event::greeted, Phase::pulling},
      {Phase::connecting, Event::signalled, Phase::done},
      {Phase::pulling, Event::pulled, Phase::closing},
      {Phase::closing, Event::closed, Phase::done},
  };
  return lookup(kTable, p, e);
}

}  // namespace plays::pull

namespace detail {

namespace msg = mltrain::agent::msg;

class PullPlay final : public Play {
 public:
  using Phase = plays::pull::Phase;
  using Event = plays::pull::Event;
  PullPlay(Fleet& fleet, const PullJob& job) : Play(fleet), job_(job) {}

  // The files that came; `unreachable` gets the hosts that could not be reached, `problems` what
  // could not be copied.
  uint64_t run(std::vector<std::string>& unreachable, std::vector<std::string>& problems, bool& single_file) {
    fleet_.connect_all(true);
    fleet_.drive(*this);
    single_file = fleet_.size() > 0 && pulls_ && pulls_->single_file(0);
    for (const auto& h : fleet_.hosts())
      if (h.state() == HostState::failed || h.state() == HostState::lost) {
        const std::string& n = h.name();  // a transport's error names its host already
        unreachable.push_back(h.problem.compare(0, n.size() + 2, n + ": ") == 0 ? h.problem
                                                                                : n + ": " + h.problem);
      }
    for (const auto& p : result_.problems) problems.push_back(p);
    if (stop_signal_ && problems.empty()) problems.push_back("stopped by " + signal_name(stop_signal_));
    return result_.files;
  }

  bool finished() const override { return phase_ == Phase::done; }

  void on_timers(Clock::time_point now) override {
    if (phase_ == Phase::pulling) {
      fleet_.heartbeats(now);
      pulls_->stalls(now);
      if (phase_ == Phase::pulling && pulls_->over()) pull_finished();
    } else if (phase_ == Phase::closing) {
      if (fleet_.goodbyes_done(now)) step(Event::closed);
    } else if (phase_ == Phase::connecting && fleet_.connecting_timers(now)) {
      on_progress();
    }
  }

  std::optional<Clock::time_point> next_deadline() const override {
    Soonest s;
    if (phase_ == Phase::connecting) s.take(fleet_.connect_deadline()), s.take(fleet_.next_ping());
    if (phase_ == Phase::pulling) s.take(fleet_.heartbeat_deadline()), s.take(pulls_->stall_deadline());
    if (phase_ == Phase::closing) s.take(fleet_.goodbye_deadline());
    return s.t;
  }

  void on_signal(int sig) override {
    if (phase_ == Phase::connecting) {
      // Nothing has come yet: stop here, at once, without waiting for a slow host.
      stop_signal_ = sig;
      std::fprintf(stderr, "\nmltrain: %s during connecting; no rank was started\n",
                   signal_name(sig).c_str());
      step(Event::signalled);
    } else if (phase_ == Phase::pulling) {  // stop pulling, say goodbye
      std::fprintf(stderr,
                   "\nmltrain: %s while copying; the copy is dropped (one cut short leaves nothing)\n",
                   signal_name(sig).c_str());
      if (!stop_signal_) stop_signal_ = sig;
      pull_finished();
    }
  }

  void on_progress() override {
    if (phase_ == Phase::connecting && fleet_.all(HostState::greeted)) step(Event::greeted);
  }

  void on_lost(size_t i, const std::string& why) override {
    FleetHost& h = fleet_[i];
    if (!h.open()) return;
    h.problem = why;
    if (phase_ != Phase::connecting) return fleet_.lose(i);
    fleet_.fail_link(i, why);
  }

  void on_frame(size_t i, uint32_t, agent::Message& m) override {
    std::visit(
        [&](auto& x) {
          using M = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<M, msg::PullFile> || std::is_same_v<M, msg::PullData> ||
                        std::is_same_v<M, msg::PullDone>) {
            if (!pulls_) return;
            pulls_->on(i, x);
            if (pulls_->over()) pull_finished();
          } else {
            fleet_.unexpected(i, M::kType);
          }
        },
        m);
  }

 private:
  void step(Event e) {
    if (!plays::follow_table(phase_, e, plays::pull::next)) return;
    if (phase_ == Phase::pulling) {
      pulls_ = std::make_unique<Pulls>(fleet_, job_);
      if (!pulls_->start()) pull_finished();
    } else if (phase_ == Phase::closing) {
      fleet_.say_goodbye();
    }
  }

  void pull_finished() {
    if (phase_ != Phase::pulling) return;
    result_ = pulls_->finish(stop_signal_);
    step(Event::pulled);
  }

  const PullJob& job_;
  Phase phase_ = Phase::connecting;
  std::unique_ptr<Pulls> pulls_;
  PullResult result_;
  int stop_signal_ = 0;
};

}  // namespace detail

uint64_t pull_files(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
                    bool* single_file) {
  detail::Fleet fleet(plan, opts, transport_for);
  detail::PullPlay play(fleet, *opts.pull);
  std::vector<std::string> unreachable, problems;
  bool single = false;
  uint64_t files = play.run(unreachable, problems, single);
  if (single_file) *single_file = single;
  if (!unreachable.empty())
    throw Error(text::join(unreachable, "\n  "), "check the host with 'mltrain doctor'",
                exit_code::host_failure);
  if (!problems.empty()) throw Error(text::join(problems, "\n  "), "", 1);
  return files;
}

}  // namespace mltrain::supervise
