// Waiting until links can make progress, so algorithms never touch descriptors: the engine names
// the links it waits to write to and to read from, and the wait picks how. TCP links alone: poll
// their sockets. Shared-memory links alone: sleep on this rank's bell, which their peers ring.
// Both at once: poll the sockets briefly and look at the rings again, backing off to 1 ms.
#pragma once

#include <poll.h>

#include <span>
#include <vector>

#include "transport/link.h"

namespace mltrain::comm::detail {

class ProgressWait {
 public:
  // Progress was made: the next mixed wait starts short again.
  void reset() { mixed_wait_us_ = 20; }
  // Blocks until a wanted link may move or cap_ms passes (sooner in a mixed wait). tx[i] / rx[i]:
  // the link channel i waits to write to / read from, or nullptr. bell: this rank's (may be null
  // without shared-memory links). Throws Error(peer_closed) naming a wanted link whose peer's
  // process is gone with nothing left to read from it (or no room to write to it); a peer that
  // exited after sending its last bytes is fine.
  void wait(std::span<Link* const> tx, std::span<Link* const> rx, Bell* bell, int cap_ms);

 private:
  // Adds l's socket to the poll set (false: l has none, it rings the bell instead).
  bool add(Link* l, short events);

  std::vector<pollfd> fds_;  // at most one per link waited on
  long mixed_wait_us_ = 20;
};

}  // namespace mltrain::comm::detail
