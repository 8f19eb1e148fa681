// `mltrain rm` and `mltrain gc`: removing old run records. A running run's record is never removed.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace mltrain::records {

struct RunRecord;

struct GcOptions {
  std::optional<std::chrono::milliseconds> older_than;  // started longer ago than this
  std::optional<int> keep;                              // never the newest N runs
  bool dry_run = false;
};

// Which runs `gc` removes: those that ended (not running, launcher gone) and that every given
// condition selects: started longer ago than older_than, and not among the `keep` newest runs.
// `runs` oldest first (as list() returns them); returns ids newest first.
std::vector<std::string> gc_select(const std::vector<RunRecord>& runs, const GcOptions& o,
                                   std::chrono::system_clock::time_point now);

// Seconds since the epoch of an ISO 8601 time as records write it; nullopt when malformed.
std::optional<std::chrono::system_clock::time_point> parse_iso8601(const std::string& s);

// Removes the runs the queries name (record.h's resolve rule), after checking that every query
// resolves and names a run that is not running; prints each removed id and the space freed.
// Returns the exit code.
int remove_runs(const std::vector<std::string>& queries);
// Removes old runs as gc_select picks them (or, with dry_run, only lists them). Returns the exit code.
int gc_runs(const GcOptions& o);

}  // namespace mltrain::records
