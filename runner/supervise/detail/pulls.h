// Files brought back from hosts (`[sync] pull` after the ranks, `mltrain cp`): each host's files
// written below the destination through temporary names, every host-sent name walked from the
// folder's fd, each host held to its own bounds. Internal to supervise/.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runner/supervise/detail/fleet.h"
#include "runner/tree/beneath.h"

namespace mltrain::supervise::detail {

// What went wrong, kept up to a bound: a host may send any number of problems.
struct Problems {
  static constexpr size_t kKept = 20, kTextBytes = 512;
  std::vector<std::string> items;
  uint64_t more = 0;  // past kKept: counted only
  void add(std::string text);
  bool empty() const { return items.empty(); }
  std::vector<std::string> lines() const;  // the items, then "... and N more"
};

// "12.5 MiB", and "3 files" / "1 file": how sizes and counts read in messages.
std::string bytes_text(uint64_t b);
std::string plural(uint64_t n, const char* one, const char* many);

// A host's list of problems as it is shown: the first Problems::kKept, then a count.
std::vector<std::string> bounded(std::vector<std::string> all);

struct HostPull {
  bool active = false, done = false;
  bool single_file = false;  // what was asked for is one file
  sync::Fd root;             // where this host's files land: the pull's folder, or its <host>/ in there
  sync::Fd parent;           // the folder of the file arriving
  int fd = -1;               // that file, under a temporary name in `parent`
  std::string tmp, leaf, rel;
  int64_t mtime_ns = 0;
  uint64_t size = 0, left = 0;    // the file arriving
  uint64_t files = 0, bytes = 0;  // placed whole
  uint64_t received = 0;          // every byte written (and each entry's block), for the bounds
  uint64_t entries = 0;           // files offered
  uint64_t next_tmp = 0, next_space_check = 0;
  Clock::time_point last_progress{};
  Problems problems;
};

// How a pull ended: what came, and what did not.
struct PullResult {
  uint64_t files = 0, bytes = 0;
  std::vector<std::string> problems;  // each "host: problem"
};

class Pulls {
 public:
  Pulls(Fleet& fleet, const PullJob& job);
  ~Pulls();
  // Asks every host of the job that is still open; false when none was.
  bool start();
  void on(size_t i, agent::msg::PullFile& m);
  void on(size_t i, agent::msg::PullData& m);
  void on(size_t i, agent::msg::PullDone& m);
  // A host that still answers heartbeats but sends nothing of the pull for stall_timeout is done.
  void stalls(Clock::time_point now);
  std::optional<Clock::time_point> stall_deadline() const;
  bool over() const;  // no open host is still sending
  // Ends it: a host still sending is cut short (`stop_signal` says why when non-zero).
  PullResult finish(int stop_signal);
  bool single_file(size_t i) const { return hosts_[i].single_file; }

 private:
  void end_file(size_t i);
  void stop(size_t i, std::string why);
  bool charge(size_t i, uint64_t n);

  Fleet& fleet_;
  const PullJob& job_;
  std::vector<HostPull> hosts_;
};

}  // namespace mltrain::supervise::detail
