// Joining a job through the store: agreeing on the session (what links prove in their hello and
// what every shared-memory name starts with), then trading PeerRecords.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rendezvous/records.h"
#include "rendezvous/store.h"

namespace mltrain::comm::detail {

struct JobSession {
  std::uint64_t id = 0;
  std::string shm_base;  // "/mltrain-<run id>-<session>": the start of every shared memory name
};

// Rank 0 draws the session and publishes it; the others wait for it until `deadline`.
JobSession agree_session(StoreClient& store, int rank, const std::string& run_id, Deadline deadline);

// The run id as it may appear in a shared memory name: its first 100 characters, anything but
// letters, digits, '-', '_' and '.' made '_'.
std::string shm_safe(const std::string& run_id);

// Publishes `mine` as rank/<rank> and returns every rank's record, by rank. `me` names this rank in
// errors: Error(timeout) naming the first rank that did not join by `deadline`, Error(store) for a
// record that does not decode.
std::vector<PeerRecord> exchange_records(StoreClient& store, int rank, int world, const PeerRecord& mine,
                                         Deadline deadline, std::chrono::milliseconds timeout,
                                         const std::string& me);

}  // namespace mltrain::comm::detail
