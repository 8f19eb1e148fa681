// mltrain's own error for a run, beside its record: a run that failed before (or without) any
// rank output still tells `logs` why.
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "runner/records/records.h"

namespace mltrain::records {

namespace {
std::string error_path(const std::string& id) { return run_dir(id) + "/launcher-error.txt"; }
}  // namespace

void save_launcher_error(const std::string& id, const std::string& text) {
  // Best effort: the error itself is what the user must see; failing to keep a copy is not news.
  int fd = ::open(error_path(id).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return;
  std::string line = text.empty() || text.back() == '\n' ? text : text + "\n";
  for (size_t off = 0; off < line.size();) {
    ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n <= 0) break;
    off += size_t(n);
  }
  ::close(fd);
}

std::string launcher_error(const std::string& id) {
  std::ifstream in(error_path(id), std::ios::binary);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void end_with_launcher_error(const std::string& id, int exit_code, const std::string& message,
                             const std::string& text) {
  save_launcher_error(id, text);
  try {
    RunRecord r = load(id);
    if (!live_status(r.status)) return;
    r.status = "failed";
    r.exit_code = exit_code;
    r.ended_at = now_iso8601();
    if (!r.failure) r.failure = Failure{-1, "", exit_code, 0, message, {}, "launcher"};
    (void)save(r);  // it warns; the error text above is kept either way
  } catch (const std::exception&) {
    // Best effort, as above: the record stays "running" and `ls` shows it lost once we exit.
  }
}

}  // namespace mltrain::records
