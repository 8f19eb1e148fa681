// The run's end: the run record's final state, mltrain's exit code and the summary on stderr.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace {

// The message torch's @record wrote to TORCHELASTIC_ERROR_FILE: {"message": {"message": "...",
// "extraInfo": {...}}} (or an older {"message": "..."}); "" when there is none. A small reader of
// the one string, rather than a JSON library in the supervisor.
std::string error_file_message(const std::string& j) {
  for (size_t at = j.find("\"message\""); at != std::string::npos; at = j.find("\"message\"", at + 1)) {
    size_t i = j.find_first_not_of(" \t\r\n", at + 9);
    if (i == std::string::npos || j[i] != ':') continue;
    i = j.find_first_not_of(" \t\r\n", i + 1);
    if (i == std::string::npos || j[i] != '"') continue;
    std::string out;
    for (++i; i < j.size() && j[i] != '"'; ++i) {
      if (j[i] != '\\' || i + 1 >= j.size()) {
        out += j[i];
        continue;
      }
      char e = j[++i];
      if (e == 'n')
        out += '\n';
      else if (e == 't')
        out += '\t';
      else if (e == 'u' && i + 4 < j.size()) {
        unsigned long cp = std::strtoul(j.substr(i + 1, 4).c_str(), nullptr, 16);
        out += cp < 0x80 ? char(cp) : '?';
        i += 4;
      } else
        out += e;
    }
    return out;
  }
  return {};
}

}  // namespace

// Nothing started: the record says why, and the error carries it to the command's exit code.
// The record of a run that started no rank, saved (and printed with --json) before the error.
void RunPlay::record_unstarted(const char* status, int code, const char* reason) {
  rec_.status = status;
  rec_.exit_code = code;
  rec_.failure = records::Failure{-1, "", code, 0, preflight_error_, {}, reason};
  rec_.ended_at = records::now_iso8601();
  rec_.duration_s = std::chrono::duration<double>(clock_.now() - job_start_).count();
  if (!records::save(rec_)) record_unsaved_ = true;
  if (opts_.json_summary) {
    std::fprintf(stdout, "%s\n", records::to_json(rec_, true).c_str());
    std::fflush(stdout);
  }
}

void RunPlay::finish_preflight_failed() {
  // A program or workdir missing (and nothing else wrong) is "could not start": 127, as a shell says.
  bool cannot_start = true;
  for (size_t i = 0; i < fleet_.size(); ++i)
    cannot_start &= fleet_[i].state() != HostState::failed || hosts_[i].cannot_start || plan_.hosts[i].spare;
  int code = cannot_start ? exit_code::cannot_start : exit_code::host_failure;
  record_unstarted(cannot_start ? "failed" : "host-failure", code, "preflight");
  const bool workdir = preflight_error_.find("workdir ") != std::string::npos;
  throw Error(preflight_error_,
              cannot_start && workdir && !opts_.workdir_hint.empty() ? opts_.workdir_hint
              : cannot_start ? "check the program and workdir on the hosts above, then run again"
                             : "fix the hosts above, then run again",
              code);
}

int RunPlay::finish() {
  out_->flush();
  log::info("supervise", "agents shut down");
  if (ending_ == Ending::preflight_failed) finish_preflight_failed();
  if (ending_ == Ending::busy) finish_busy();
  int code = 0;
  switch (ending_) {
    case Ending::none:
      code = 0;
      rec_.status = "succeeded";
      break;
    case Ending::failure:
      code = ending_code_;
      rec_.status = "failed";
      break;
    case Ending::host_failure:
      code = exit_code::host_failure;
      rec_.status = "host-failure";
      break;
    case Ending::interrupted:
      code = exit_code::interrupted;
      rec_.status = "interrupted";
      break;
    case Ending::stopped:
      code = 128 + stop_signal_;
      rec_.status = "stopped";
      break;
    case Ending::timeout:
      code = exit_code::timeout;
      rec_.status = "timeout";
      break;
    case Ending::preflight_failed:
    case Ending::busy:
      break;  // above
  }
  rec_.exit_code = code;
  rec_.ended_at = records::now_iso8601();
  rec_.duration_s = std::chrono::duration<double>(clock_.now() - job_start_).count();
  if (metrics_) {
    metrics_->flush();
    rec_.metrics = metrics_->summary();
  }
  if (!records::save(rec_)) record_unsaved_ = true;
  print_summary(code);
  // The job's outcome stands, but what it left behind is incomplete: say so loudly, and a job that
  // succeeded exits 74 so a script does not trust logs or a record that are cut.
  std::vector<std::string> cut = out_ ? out_->cut_logs() : std::vector<std::string>{};
  if (!cut.empty() || record_unsaved_) {
    for (const auto& c : cut) std::fprintf(stderr, "mltrain: warning: rank log cut: %s\n", c.c_str());
    if (record_unsaved_)
      std::fprintf(stderr,
                   "mltrain: warning: run.json of %s could not be written in full; it keeps an older state\n",
                   rec_.id.c_str());
    std::fprintf(stderr,
                 "mltrain: warning: free space in %s (MLTRAIN_HOME); the run's records are incomplete%s\n",
                 records::runs_dir().c_str(), code == 0 ? " (exit code 74)" : "");
    if (code == 0) code = exit_code::state;
  }
  return code;
}

void RunPlay::print_summary(int code) {
  char dur[32];
  std::snprintf(dur, sizeof dur, "%.1fs", rec_.duration_s);
  if (opts_.json_summary) {
    std::string j = records::to_json(rec_, true);
    std::fprintf(stdout, "%s\n", j.c_str());
    std::fflush(stdout);
  }
  if (code == 0 && rec_.kind == "exec") {  // one command per host: hosts are what the user counts
    std::fprintf(
        stderr,
        "mltrain: %s: succeeded on %zu host%s in %s (each host's output: mltrain logs %s --by-rank)\n",
        rec_.name.c_str(), ranks_.size(), ranks_.size() == 1 ? "" : "s", dur, rec_.id.c_str());
    return;
  }
  if (code == 0) {
    std::fprintf(stderr, "mltrain: %s: %zu rank%s succeeded in %s%s (logs: mltrain logs %s)\n",
                 rec_.name.c_str(), ranks_.size(), ranks_.size() == 1 ? "" : "s", dur,
                 restart_ > 0 ? (" after " + std::to_string(restart_) + " restart(s)").c_str() : "",
                 rec_.id.c_str());
    return;
  }
  if (rec_.failure) {
    const auto& f = *rec_.failure;
    if (f.rank >= 0) {
      // A rank's own exit 255 reads like mltrain's "host lost" code: say which it is.
      bool own_255 = f.signal == 0 && f.exit_code == exit_code::host_failure;
      std::fprintf(stderr, "mltrain: first failure: rank %d on %s: %s%s\n", f.rank, f.host.c_str(),
                   describe_status(f.signal ? f.signal : (f.exit_code << 8),
                                   size_t(f.rank) < ranks_.size() && ranks_[size_t(f.rank)].oom_killed)
                       .c_str(),
                   own_255 ? " (the rank's own exit code; its host was not lost)" : "");
      if (!f.tail.empty()) {
        std::fprintf(stderr, "mltrain: last lines of rank %d (%s):\n", f.rank,
                     out_->log_path(f.rank).c_str());
        for (const auto& l : f.tail) std::fprintf(stderr, "    %s\n", l.c_str());
      }
      if (size_t(f.rank) < plan_.ranks.size() && size_t(f.rank) < ranks_.size())
        for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, f.rank))
          if (k == "TORCHELASTIC_ERROR_FILE")
            if (std::string m = error_file_message(ranks_[size_t(f.rank)].error_file); !m.empty()) {
              std::fprintf(stderr, "mltrain: rank %d's error file (%s on %s):\n", f.rank, v.c_str(),
                           f.host.c_str());
              std::istringstream lines(m);
              for (std::string l; std::getline(lines, l);)
                std::fprintf(stderr, "    %s\n", text::host_text(l).c_str());  // the rank wrote it
            }
    } else {
      std::fprintf(stderr, "mltrain: first failure: %s%s\n", f.message.c_str(),
                   f.reason == "host_lost" ? " (host lost)" : "");
    }
  }
  std::fprintf(stderr, "mltrain: run %s %s after %s; exit code %d (logs: mltrain logs %s)\n", rec_.id.c_str(),
               rec_.status.c_str(), dur, code, rec_.id.c_str());
}

}  // namespace mltrain::supervise::detail
