#include "runner/supervise/host_state.h"

#include <stdexcept>
#include <string>

namespace mltrain::supervise {

const char* host_state_name(HostState s) {
  switch (s) {
    case HostState::connecting:
      return "connecting";
    case HostState::greeting:
      return "greeting";
    case HostState::greeted:
      return "greeted";
    case HostState::syncing:
      return "syncing";
    case HostState::setting_up:
      return "setting_up";
    case HostState::preparing:
      return "preparing";
    case HostState::ready:
      return "ready";
    case HostState::failed:
      return "failed";
    case HostState::lost:
      return "lost";
    case HostState::closed:
      return "closed";
  }
  return "?";
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
