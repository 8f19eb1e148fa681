// The run's `[sync]` (the feed is syncs.cpp's) and `[setup]`: every host's folder mirrored before
// preflight, then the setup command where it must run. The files brought back after the ranks are
// pulls.cpp's.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "runner/common/error.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;

namespace {

constexpr size_t kSetupTail = 12;
constexpr size_t kSetupMaxLine = 64 << 10;  // a longer line of setup output is shown in pieces

// Where a host's setup output is kept in the run's folder.
std::string setup_log(const std::string& run_id, const std::string& host) {
  return records::run_dir(run_id) + "/setup-" + host + ".log";
}

}  // namespace

// ---- sync (syncs.cpp), glued to the preflight ----

void RunPlay::on(size_t i, uint32_t, msg::SyncWant& m) {
  if (fleet_[i].state() != HostState::syncing) return;
  if (std::string problem = syncs_->want(i, m); !problem.empty()) return fleet_.fail_link(i, problem);
  pump_sync(i);
}

void RunPlay::on(size_t i, uint32_t, msg::SyncWritten& m) {
  if (fleet_[i].state() != HostState::syncing) return;
  syncs_->written(i, m);
  pump_sync(i);
}

// Bytes went out to host i: while it syncs, its outbox takes more of the files it wants.
void RunPlay::on_sent(size_t i) {
  if (fleet_[i].state() == HostState::syncing) pump_sync(i);
}

void RunPlay::pump_sync(size_t i) {
  try {
    syncs_->pump(i);
  } catch (const Error& e) {  // a file of the tree could not be read
    fleet_.fail_link(i, e.what());
  }
}

void RunPlay::on(size_t i, uint32_t, msg::SyncDone& m) {
  if (fleet_[i].state() != HostState::syncing) return;
  if (std::string problem = syncs_->done(i, m); !problem.empty()) return fail_host(i, problem);
  next_step(i);  // first: the host is no longer syncing when the progress counts
  syncs_->progress(clock_.now());
  on_progress();
}

// ---- setup ----

void RunPlay::start_setup(size_t i) {
  RunHost& h = hosts_[i];
  fleet_.advance(i, HostState::setting_up);
  // Its output, kept with the run (empty when it says nothing; none when it is skipped).
  std::string path = setup_log(rec_.id, fleet_[i].name());
  h.setup.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  msg::Setup m;
  m.command = opts_.setup->command;
  m.cwd = syncs_ ? syncs_->on_host(i, opts_.setup->cwd) : opts_.setup->cwd;
  m.env = opts_.setup->env;
  m.key = opts_.setup->key;
  m.force = opts_.setup->force ? 1 : 0;
  fleet_.send(i, m);
}

void RunPlay::setup_output(size_t i, std::string_view bytes, bool end) {
  RunHost& h = hosts_[i];
  if (h.setup.log_fd >= 0 && !bytes.empty()) {
    [[maybe_unused]] ssize_t n = ::write(h.setup.log_fd, bytes.data(), bytes.size());
  }
  h.setup.partial.append(bytes);
  size_t start = 0;
  auto emit = [&](std::string line) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // The host's bytes, shown as rank output is (on stderr); the tail, for messages, escaped.
    const std::string shown = text::escape_console(line, ::isatty(2) == 1);
    out_->before_message();
    std::fprintf(stderr, "[%s] %s\n", fleet_[i].name().c_str(), shown.c_str());
    h.setup.tail.push_back(text::escape_console(line));
    if (h.setup.tail.size() > kSetupTail) h.setup.tail.erase(h.setup.tail.begin());
  };
  for (size_t nl; (nl = h.setup.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(h.setup.partial.substr(start, nl - start));
  h.setup.partial.erase(0, start);
  if (h.setup.partial.size() >= kSetupMaxLine) emit(std::exchange(h.setup.partial, {}));  // in pieces
  if (end && !h.setup.partial.empty()) emit(std::exchange(h.setup.partial, {}));
  if (end && h.setup.log_fd >= 0) ::close(h.setup.log_fd), h.setup.log_fd = -1;
}

void RunPlay::on(size_t i, uint32_t, msg::SetupDone& m) {
  RunHost& h = hosts_[i];
  const std::string& name = fleet_[i].name();
  if (fleet_[i].state() != HostState::setting_up) return;
  setup_output(i, {}, true);
  if (m.ran == 0) {
    h.setup.skipped = true;
    ::unlink(setup_log(rec_.id, name).c_str());
    out_->before_message();
    std::fprintf(
        stderr,
        "[%s] setup: skipped, nothing changed since it last succeeded here (--setup always runs it)\n",
        name.c_str());
  } else if (m.status != 0 || !m.message.empty()) {
    std::string why =
        !m.message.empty() ? "could not start: " + m.message : "failed with " + describe_status(m.status);
    std::string tail;
    for (const auto& l : h.setup.tail) tail += "\n      | " + l;
    fail_host(i, "setup `" + opts_.setup->command + "` " + why +
                     (tail.empty() ? std::string() : "; its last lines:" + tail) +
                     "\n      (its output: " + setup_log(rec_.id, name) + ")");
    return;
  }
  h.set_up = true;
  next_step(i);
  on_progress();
}

}  // namespace mltrain::supervise::detail
