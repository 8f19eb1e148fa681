// What `mltrain logs`, `ls`, `show` and `stop` print, read from run records.
#pragma once

#include <optional>
#include <set>
#include <string>

namespace mltrain::records {

struct LogsOptions {
  std::string id;  // as the user wrote it ("" = latest)
  bool follow = false;
  std::optional<std::set<int>> ranks;
  std::string grep;  // ECMAScript regex; "" = every line
  int tail = -1;     // last N lines per rank; -1 = all
  bool color = false;
  bool prefix = true;
  bool by_rank = false;   // each rank's lines together, rank by rank, instead of merged by arrival
  bool terminal = false;  // stdout is a terminal: escape control bytes, show \r progress's final state
};

// Prints the run's rank logs with the live console's prefix ("[h1:0] "), merged in the order
// they arrived (or rank by rank); with follow, keeps printing new lines until the run ends.
// Returns the process exit code: 0, or with follow the run's own exit code.
int print_logs(const LogsOptions& o);
struct ListOptions {
  bool json = false;    // one JSON document (docs/json.md)
  bool jsonl = false;   // one JSON object per line
  std::string where;    // a filter (records/find.h)
  std::string columns;  // "" = the default table
  int newest = 0;       // -n: only the newest N that pass `where` (0: all)
};
// `mltrain ls`: the runs, newest first, that pass `where`.
void print_list(const ListOptions& o);
// `color`: the metric charts' dots coloured.
void print_show(const std::string& id, bool json, bool color = false);
// `mltrain diff A B`: the two records side by side (differing rows marked *), the spec's and the
// code's unified diffs (from the code store); with as_json one document (docs/json.md, "diff").
int print_diff(const std::string& a, const std::string& b, bool as_json, bool terminal, bool color = false);
// Asks the run's launcher to stop (SIGTERM) and waits for it to finish. Returns the exit code.
int stop_run(const std::string& id);

}  // namespace mltrain::records
