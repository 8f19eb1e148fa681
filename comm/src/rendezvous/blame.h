// Which rank a failed collective is blamed on, agreed through the store. The rank that fails
// first publishes why (the abort record) before it closes its links; ranks that only saw a closed
// link or a silent peer report that root cause. A rank that timed out waiting on a peer records
// whom it waits on and follows the chain to the rank that stopped (the one waiting on nobody).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "mltrain/comm.hpp"
#include "rendezvous/records.h"
#include "rendezvous/store.h"

namespace mltrain::comm::detail {

struct Verdict {
  int culprit = -1;
  std::string culprit_host;
  std::string detail;  // the local error, with the wait chain when one was followed
  std::string first;   // the job's first failure, when another rank reported it ("" otherwise)
};

class Blame {
 public:
  // hosts: every rank's host, by rank. timeout: the collectives' (MLTRAIN_COMM_TIMEOUT); the
  // store is asked for at most 2 s of it, the peers given at most 1 s to report.
  Blame(StoreClient* store, int rank, std::vector<std::string> hosts, std::chrono::milliseconds timeout);
  // The verdict on `e`, which ended `what` ("allreduce #3") on this rank. Never throws: without
  // the store (gone with rank 0?) the local error is all there is.
  Verdict settle(const Error& e, const std::string& what) const;

 private:
  std::string label(int rank) const;
  std::optional<AbortRecord> read_abort(Deadline dl) const;
  // Reads the abort record every `step` until one is there or `until` passes.
  std::optional<AbortRecord> poll_abort(Clock::time_point until, std::chrono::milliseconds step,
                                        Deadline dl) const;
  // Records whom this rank waits on and follows the others' records to the rank that stopped.
  void follow_wait_chain(int waited_on, Verdict& v, Deadline dl) const;
  // Publishes this rank's failure as the job's first, unless another rank claimed it first.
  std::optional<AbortRecord> claim_first(const Verdict& v, const std::string& what, Deadline dl) const;

  StoreClient* store_;
  int rank_;
  std::vector<std::string> hosts_;
  std::chrono::milliseconds timeout_;
};

}  // namespace mltrain::comm::detail
