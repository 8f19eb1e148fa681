// The run's `[sync]` feed: the tree's manifest to every host, then the files each one wants, as
// fast as its link takes them, with the console told how it goes. Internal to supervise/.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runner/supervise/detail/fleet.h"

namespace mltrain::supervise::detail {

// One host's sync: the files it wants, how far their bytes went, what it said at the end.
struct HostSync {
  std::vector<int32_t> want;
  size_t next = 0;      // into want
  uint64_t offset = 0;  // within want[next]
  uint64_t raw_bytes = 0, wire_bytes = 0;
  uint64_t written = 0;     // raw bytes it says it handled: at most kSyncAhead more are on their way
  uint64_t want_bytes = 0;  // of the files it wants
  uint32_t deleted = 0;
  bool data_sent = false;  // SyncEnd is on its way
  bool done = false;
  std::string dir;    // as the agent resolved it
  uint32_t copy = 0;  // 0: the folder asked for; N: "<it>@N" (an older run uses it)
};

class Syncs {
 public:
  // Encodes the manifest once for every host. `status_line`: progress on the console's status line
  // (a colour terminal); else a line every few seconds.
  Syncs(Fleet& fleet, const SyncJob& job, Output& out, bool status_line);
  ~Syncs();
  void start(size_t i);  // host i syncs: its manifest goes out
  // What host i wants: "" or the problem that fails it.
  std::string want(size_t i, agent::msg::SyncWant& m);
  // More of its files while its outbox has room and it is not kSyncAhead raw bytes behind in
  // writing them; throws Error when a file cannot be read.
  void pump(size_t i);
  // Host i handled this many raw bytes (SyncWritten).
  void written(size_t i, const agent::msg::SyncWritten& m);
  // Host i's end: "" (synced) or the problem that fails it.
  std::string done(size_t i, agent::msg::SyncDone& m);
  bool synced(size_t i) const { return hosts_[i].done; }
  // `path` (the folder asked for, or below it) as host i has it: in its own copy when it made one.
  std::string on_host(size_t i, const std::string& path) const;
  // While bytes travel, the progress; once no host syncs, the summary (once).
  void progress(Clock::time_point now);
  std::optional<Clock::time_point> next_status() const { return next_status_; }

 private:
  void summary(double secs);

  Fleet& fleet_;
  const SyncJob& job_;
  Output& out_;
  const bool status_line_;
  std::vector<HostSync> hosts_;
  std::string manifest_frames_;           // the tree's manifest, encoded once
  std::unique_ptr<sync::Chunks> chunks_;  // ... and its files' bytes
  Clock::time_point start_{};
  std::optional<Clock::time_point> next_status_;
  bool reported_ = false;
  std::set<size_t> warned_;  // big files named already
};

}  // namespace mltrain::supervise::detail
