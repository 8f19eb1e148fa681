// What a job claims of one host before its ranks start, and whether it may have it now: GPUs that
// no one leases and no foreign process computes on, the host to itself when exclusive, and its
// place in the host's first-come-first-served queue. Run by the host's agent; every lease taken
// here lives as long as the Claim (so as long as the agent, at most).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runner/lease/lease.h"

namespace mltrain::lease {

// One GPU of the host, as its inventory found it.
struct Gpu {
  int index = 0;         // NVML's
  std::string uuid;      // "GPU-…"
  bool foreign = false;  // a compute process runs on it that is not this job's
};

struct Ask {
  Space space;              // where the host's leases are (the default, but in tests)
  std::string run_id;       // the job's; names its presence lease job/<run_id>
  int gpus = 0;             // how many GPUs; 0: none
  std::vector<int> pinned;  // these GPUs (indices) exactly, when not empty ([gpus] ids)
  bool exclusive = false;   // the host to this job alone
  // The job's place in the queue ("" when it does not queue): a key that orders every job the
  // same way on every host (its launcher's clock, then its run id), so no two multi-host jobs can
  // each wait for the other.
  std::string order_key;
  Info info;  // who asks: run, user, launcher, since
};

// Someone in the way: a lease's holder (a GPU's, the exclusive one, or a job ahead in the queue).
struct InTheWay {
  std::string what;            // "gpu 2", "exclusive", "job", "queue", "foreign process on gpu 1"
  std::optional<Seen> holder;  // the lease's holder; none for a foreign process
  std::string lease;           // the lease's name, when it is one
};

// The claim a host's agent holds for its job. Granted: `gpus` are the job's (indices, in order),
// and the leases held keep them so until the claim ends. Not granted: nothing but the ticket is held
// (for a queued job), `in_the_way` says why, `ahead` how many queued jobs come before this one.
class Claim {
 public:
  Claim() = default;
  Claim(Claim&&) = default;
  Claim& operator=(Claim&&) = default;

  // Tries again (the first try too): takes the job's presence and ticket leases if it has none
  // yet, then what it asks for, all or nothing. `inventory` is the host's GPUs now.
  void attempt(const Ask& ask, const std::vector<Gpu>& inventory, std::chrono::milliseconds ask_timeout);

  bool granted() const { return granted_; }
  const std::vector<int>& gpus() const { return gpus_; }
  const std::vector<std::string>& gpu_uuids() const { return uuids_; }
  const std::vector<InTheWay>& in_the_way() const { return in_the_way_; }
  int ahead() const { return ahead_; }
  const std::string& error() const { return error_; }  // could not ask at all (no sockets, a bad name)
  // Holders seen in this attempt that proved nothing (lease::Seen::doubt): ignored, to be named.
  const std::vector<Seen>& squatters() const { return squatters_; }

  // Every lease the claim holds, so the agent's loop can answer their readers.
  std::vector<Lease*> leases();
  // Gives up what was granted (the job waits for another host), keeping its presence and ticket.
  void release_grant();
  // The queue place is not needed once the job runs.
  void leave_queue() { ticket_.reset(); }

 private:
  bool take_gpus(const Ask& ask, const std::vector<Gpu>& inventory, std::chrono::milliseconds t);
  void note_gpu_holders(const Ask& ask, const std::vector<Gpu>& inventory, std::chrono::milliseconds t);
  bool ahead_in_queue(const Ask& ask, std::chrono::milliseconds t);
  bool exclusive_ok(const Ask& ask, std::chrono::milliseconds t);
  bool squatter(const Seen& s);
  std::vector<Seen> others_holding(const Ask& ask, const std::string& base, std::chrono::milliseconds t,
                                   const std::string& also_mine = "");
  std::vector<std::string> held_names();
  std::optional<Lease> take_lease(const Ask& ask, const std::string& base, Info info,
                                  std::chrono::milliseconds t);

  std::optional<Lease> presence_, ticket_, exclusive_;
  std::vector<Lease> gpu_leases_;
  std::vector<int> gpus_;
  std::vector<std::string> uuids_;
  std::vector<InTheWay> in_the_way_;
  std::vector<Seen> squatters_;
  int ahead_ = 0;
  bool granted_ = false;
  std::string error_;
};

// The queue key for a job started at `wall_ns` (its launcher's clock) as `run_id`: sorts by time,
// then by run id, as text.
std::string order_key(int64_t wall_ns, const std::string& run_id);

}  // namespace mltrain::lease
