// One host's state in the fleet. It only moves forward, as a connection's does (gloo's pair state):
//
//   connecting ─► greeting ─► greeted ─► [syncing ─► setting_up ─►] preparing ─► ready
//        └───────────┴───────────┴────────────┴──────────┴──────────────┴───────────┴─► failed | lost |
//        closed
//
// connecting: its transport is opening; greeting: hello sent; greeted: it answered; syncing and
// setting_up ([sync], [setup]); preparing: preflight (or doctor's probe) asked; ready. failed: a
// problem before the ranks ran; lost: its link went after; closed: it said goodbye. The last three
// end a host: nothing moves out of them.
#pragma once

namespace mltrain::supervise {

enum class HostState {
  connecting,
  greeting,
  greeted,
  syncing,
  setting_up,
  preparing,
  ready,
  failed,
  lost,
  closed
};

const char* host_state_name(HostState s);

// Whether a host may go from `from` to `to`: later in the order above, and never out of an end.
bool moves_forward(HostState from, HostState to);

class HostStatus {
 public:
  HostState get() const { return state_; }
  bool ended() const {
    return state_ == HostState::failed || state_ == HostState::lost || state_ == HostState::closed;
  }
  // A step that is not forward is a broken invariant: throws std::logic_error naming both states.
  void advance(HostState to);

 private:
  HostState state_ = HostState::connecting;
};

}  // namespace mltrain::supervise
