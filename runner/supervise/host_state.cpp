#include "runner/supervise/host_state.h"

#include <cstddef>
#include <stdexcept>
#include <string>

namespace mltrain::supervise {

const char* host_state_name(HostState s) {
  static constexpr const char* kNames[] = {"connecting", "greeting", "greeted", "syncing", "setting_up",
                                           "preparing",  "ready",    "failed",  "lost",    "closed"};
  return kNames[size_t(s)];
}

bool moves_forward(HostState from, HostState to) {
  const bool ended = from == HostState::failed || from == HostState::lost || from == HostState::closed;
  return !ended && int(to) > int(from);
}

void HostStatus::advance(HostState to) {
  if (!moves_forward(state_, to))
    throw std::logic_error(std::string("a host's state may only move forward, not from ") +
                           host_state_name(state_) + " to " + host_state_name(to));
  state_ = to;
}

}  // namespace mltrain::supervise
