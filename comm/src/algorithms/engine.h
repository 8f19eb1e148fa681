// The progress engine every algorithm runs on: a list of steps, each sending one buffer on one
// link and receiving (copying or reducing) one buffer from another. Send and receive streams
// advance independently and in pieces, so a ring pipelines send, receive and reduce; a send may
// depend byte-for-byte on an earlier step's receive (send_dep), which is what chains ring steps.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/reduce.h"
#include "transport/link.h"

namespace mltrain::comm::detail {

struct Step {
  Link* tx = nullptr;
  const void* send = nullptr;
  std::size_t send_bytes = 0;
  int send_dep = -1;  // index of the step whose received bytes this step sends on
  // While send_dep is receiving: bytes sendable = its received bytes + lead (negative: this send
  // starts further into that receive; positive: a prefix is already there).
  std::int64_t send_dep_lead = 0;

  Link* rx = nullptr;
  void* recv = nullptr;
  const void* own = nullptr;  // reduce: recv = own op incoming
  std::size_t recv_bytes = 0;
  int recv_dep = -1;  // index of the step whose sent bytes this step's receive may overwrite
  bool reduce = false;
  bool finalize = false;  // apply the finalizer (avg) to each reduced piece
  bool align = false;     // pad both streams to 8 bytes first (headers start collectives)
  bool header = false;    // call on_header when received
};

struct EngineConfig {
  std::size_t elem = 1;
  ReduceFn reduce = nullptr;
  std::function<void(void*, std::size_t)> finalize;
  std::size_t piece = 128u << 10;
  int spin_us = 50;
  Bell* bell = nullptr;
  std::chrono::milliseconds timeout{300000};  // longest stretch without progress
};

// Runs step lists (channels) to completion, round-robin, each with its own send and receive
// cursor (and dependencies by index within its own list); throws Error(timeout / peer_closed)
// naming the peer. Channels must not share a link direction: two channels may use one link only
// if one sends on it and the other receives from it. on_header gets (channel, step) as each
// header step's receive completes.
void run_channels(std::vector<std::vector<Step>>& channels, const EngineConfig& config,
                  const std::function<void(std::size_t, std::size_t)>& on_header = {});

}  // namespace mltrain::comm::detail
