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
};

// Prints the run's rank logs, each line prefixed "[rank] "; with follow, keeps printing new lines
// until the run ends. Returns the process exit code.
int print_logs(const LogsOptions& o);
void print_list(bool json);
void print_show(const std::string& id, bool json);
// Asks the run's launcher to stop (SIGTERM) and waits for it to finish. Returns the exit code.
int stop_run(const std::string& id);

}  // namespace mltrain::records
