// The plays the fleet runs, one per command, each a table: its phases, the events that move it,
// and `next(phase, event)`, the one place its next phase is decided (as torchelastic's agent loop
// reads a state and decides in one place). An event a phase does not list leaves it where it is.
// The plays themselves (supervise/detail/*_play.h) raise events and act on entering a phase.
#pragma once

#include <cstddef>

namespace mltrain::supervise::plays {

// One row of a play's table: in phase `from`, event `on` leads to phase `to`.
template <class Phase, class Event>
struct Transition {
  Phase from;
  Event on;
  Phase to;
};

// The row's `to` for (p, e); p itself when the table has no such row.
template <class Phase, class Event, size_t N>
constexpr Phase lookup(const Transition<Phase, Event> (&table)[N], Phase p, Event e) {
  for (const auto& t : table)
    if (t.from == p && t.on == e) return t.to;
  return p;
}

// Moves `phase` where the play's table says for `e`: the one writer of every play's phase. True
// when it changed; the play then does what entering the new phase does.
template <class Phase, class Event>
bool follow_table(Phase& phase, Event e, Phase (*next)(Phase, Event)) {
  const Phase to = next(phase, e);
  if (to == phase) return false;
  phase = to;
  return true;
}

// `mltrain run` and `exec`: the gang.
namespace run {
enum class Phase {
  connecting,
  preflight,
  claiming,
  queued,
  running,
  stopping,
  restarting,
  pulling,
  closing,
  done
};
enum class Event {
  greeted,           // every host answered hello, or failed
  signalled,         // a signal before any rank started
  preflight_passed,  // every host ready: the job claims them (or the ranks start, with no claim)
  preflight_failed,  // ... and one or more failed: nothing starts
  granted,           // every host granted the claim: the ranks start
  busy,              // something is held by another job, and the job waits in the queue
  refused,           // ... and it does not wait (or a claim failed): nothing starts
  retry,             // a waiting job asks again
  stop,              // a failure, a timeout or a signal: the ranks are told to stop
  restart,           // every rank ended after a failure, and max_restarts allows another go
  restarted,         // the restart is announced: the ranks start again
  ranks_ended,       // every rank ended; nothing to bring back
  results,           // every rank ended; [sync] pull brings files back first
  pulled,            // the pull is over (done, stopped or cut short)
  closed,            // every agent said goodbye, or the wait for them ran out
};
Phase next(Phase p, Event e);
inline const char* phase_name(Phase p) {
  static constexpr const char* kNames[] = {"connecting", "preflight",  "claiming", "queued",  "running",
                                           "stopping",   "restarting", "pulling",  "closing", "done"};
  return kNames[size_t(p)];
}
}  // namespace run

// `mltrain doctor`: a ping and a probe of every host.
namespace doctor {
enum class Phase { connecting, probing, closing, done };
enum class Event {
  greeted,    // every host answered hello, or failed
  probed,     // every host answered the probe, or failed
  signalled,  // before every host was checked
  closed,
};
Phase next(Phase p, Event e);
}  // namespace doctor

// `mltrain top` on hosts: every agent samples its host until the viewer stops.
namespace watch {
enum class Phase { connecting, watching, closing, done };
enum class Event {
  watching,  // every host samples, or failed
  stop,      // the viewer or a signal says stop
  deserted,  // no host is left to watch
  closed,
};
Phase next(Phase p, Event e);
}  // namespace watch

// `mltrain cp`: files brought back from one host.
namespace pull {
enum class Phase { connecting, pulling, closing, done };
enum class Event {
  greeted,    // the host answered hello, or failed
  signalled,  // while connecting (a signal while pulling ends the pull: pulled)
  pulled,     // every file came, or the pull stopped (a bound, a stall, a signal, a lost host)
  closed,
};
Phase next(Phase p, Event e);
}  // namespace pull

// One question to every host's agent, each answer kept: `mltrain queue` (its leases), `mltrain
// gc --hosts` (its synced folders) (detail/ask_play.h).
namespace ask {
enum class Phase { connecting, asking, closing, done };
enum class Event {
  greeted,    // every host answered hello, or failed
  answered,   // every host answered, or failed
  signalled,  // before every host answered
  closed,
};
Phase next(Phase p, Event e);
}  // namespace ask

}  // namespace mltrain::supervise::plays
