// The run's `[sync]` and `[setup]`: every host's folder mirrored before preflight (the manifest
// once, then only the files a host lacks, as fast as its link takes them), then the setup command
// where it must run. The files brought back after the ranks are pulls.cpp's.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;
using std::chrono::milliseconds;

namespace {

constexpr size_t kSyncOutbox = 1u << 20;  // refill a host's outbox below this
constexpr auto kSyncProgressEvery = std::chrono::seconds(5);
constexpr size_t kSyncNamedLargest = 5;  // files named after a sync (all of them with -v)
constexpr size_t kSetupTail = 12;
constexpr size_t kSetupMaxLine = 64 << 10;  // a longer line of setup output is shown in pieces

// Where a host's setup output is kept in the run's folder.
std::string setup_log(const std::string& run_id, const std::string& host) {
  return records::run_dir(run_id) + "/setup-" + host + ".log";
}

}  // namespace

// ---- sync ----

void RunPlay::start_sync_all() {
  const sync::Tree& t = *opts_.sync->tree;
  for (size_t k = 0; k < t.entries.size() || k == 0; k += msg::kSyncEntriesPerFrame) {
    msg::SyncManifest m;
    m.dir = opts_.sync->dir;
    size_t end = std::min(t.entries.size(), k + msg::kSyncEntriesPerFrame);
    m.entries.assign(t.entries.begin() + long(k), t.entries.begin() + long(end));
    m.last = end == t.entries.size() ? 1 : 0;
    proto::encode(manifest_frames_, m);
  }
  chunks_ = std::make_unique<sync::Chunks>(t);
  sync_start_ = clock_.now();
  // Without a status line (not a colour terminal), a line every kSyncProgressEvery instead.
  if (!out_->terminal() || !opts_.console.color) next_sync_status_ = sync_start_ + kSyncProgressEvery;
}

void RunPlay::start_sync(size_t i) {
  fleet_.advance(i, HostState::syncing);
  if (fleet_[i].open()) fleet_[i].outbox += manifest_frames_;
}

void RunPlay::on(size_t i, uint32_t, msg::SyncWant& m) {
  RunHost& h = hosts_[i];
  if (fleet_[i].state() != HostState::syncing) return;
  if (m.dir.empty()) {
    fleet_.fail(i, "sync: " + text::join(bounded(std::move(m.problems)), "; "));
    fleet_[i].link->kill();
    on_progress();
    return;
  }
  // Each entry of the tree at most once, whatever the host asks for.
  std::vector<char> asked(opts_.sync->tree->entries.size(), 0);
  h.sync.want.clear();
  h.sync.want_bytes = 0;
  for (int32_t k : m.want)
    if (k >= 0 && size_t(k) < asked.size() && !asked[size_t(k)]) {
      asked[size_t(k)] = 1;
      h.sync.want.push_back(k);
      h.sync.want_bytes += opts_.sync->tree->entries[size_t(k)].size;
    }
  h.sync.deleted = m.deleted;
  h.sync.dir = m.dir;
  // A big file that travels is named once, however many hosts want it: it may be data that need not.
  for (int32_t k : h.sync.want) {
    const auto& entries = opts_.sync->tree->entries;
    if (size_t(k) >= entries.size() || entries[size_t(k)].size < opts_.sync->warn_bytes ||
        !sync_warned_.insert(size_t(k)).second)
      continue;
    out_->before_message();
    std::fprintf(stderr,
                 "mltrain: sync: %s is %s and travels to the hosts; leave it out with [sync] exclude or a "
                 ".mltrainignore line if it need not (MLTRAIN_SYNC_WARN_BYTES)\n",
                 entries[size_t(k)].path.c_str(), bytes_text(entries[size_t(k)].size).c_str());
  }
  for (const auto& p : bounded(std::move(m.problems))) {
    out_->before_message();
    std::fprintf(stderr, "mltrain: %s: sync: %s\n", fleet_[i].name().c_str(), p.c_str());
  }
  pump_sync(i);
}

// Bytes went out to host i: while it syncs, its outbox takes more of the files it wants.
void RunPlay::on_sent(size_t i) {
  if (fleet_[i].state() == HostState::syncing) pump_sync(i);
}

void RunPlay::pump_sync(size_t i) {
  RunHost& h = hosts_[i];
  if (fleet_[i].state() != HostState::syncing || h.sync.data_sent || !fleet_[i].open() || h.sync.dir.empty())
    return;
  const sync::Tree& t = *opts_.sync->tree;
  try {
    while (fleet_[i].outbox.size() < kSyncOutbox) {
      if (h.sync.next >= h.sync.want.size()) {
        fleet_.send(i, msg::SyncEnd{});
        h.sync.data_sent = true;
        return;
      }
      size_t index = size_t(h.sync.want[h.sync.next]);
      if (index >= t.entries.size()) {
        ++h.sync.next;
        continue;
      }
      auto chunk = chunks_->get(index, h.sync.offset);
      fleet_.send(i, *chunk, uint32_t(index));
      h.sync.raw_bytes += chunk->raw_size;
      h.sync.wire_bytes += chunk->bytes.size();
      h.sync.offset += chunk->raw_size;
      if (h.sync.offset >= t.entries[index].size) ++h.sync.next, h.sync.offset = 0;
    }
  } catch (const Error& e) {
    fleet_.fail(i, e.what());
    fleet_[i].link->kill();
    on_progress();
  }
}

void RunPlay::on(size_t i, uint32_t, msg::SyncDone& m) {
  RunHost& h = hosts_[i];
  if (fleet_[i].state() != HostState::syncing) return;
  if (!m.problems.empty()) {
    fail_host(i, "sync into " + h.sync.dir + " failed: " + text::join(bounded(std::move(m.problems)), "; "));
    return;
  }
  h.sync.done = true;
  h.synced = true;
  next_step(i);  // first: the host is no longer syncing when the progress counts
  sync_progress(clock_.now());
  on_progress();
}

// On a terminal, one status line while bytes travel; when every host is done, one summary line.
void RunPlay::sync_progress(Clock::time_point now) {
  if (!opts_.sync || sync_reported_) return;
  size_t syncing = 0, done = 0;
  uint64_t raw = 0, want_files = 0, sent_files = 0;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    const HostSync& h = hosts_[i].sync;
    if (fleet_[i].state() == HostState::syncing) ++syncing;
    if (h.done) ++done;
    raw += h.raw_bytes;
    want_files += h.want.size();
    sent_files += std::min(h.next, h.want.size());
  }
  double secs = std::chrono::duration<double>(now - sync_start_).count();
  if (syncing > 0) {
    const bool status_line = out_->terminal() && opts_.console.color;
    if (next_sync_status_ && now < *next_sync_status_) return;
    next_sync_status_ = now + (status_line ? milliseconds(100) : kSyncProgressEvery);
    // "syncing 4 hosts: 1200/5000 files, 40.0/100.0 MiB, 80.1 MiB/s per host; h3 31%" (the slowest)
    uint64_t want_bytes = 0;
    const FleetHost* slowest = nullptr;
    double slow = 2;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      const HostSync& h = hosts_[i].sync;
      want_bytes += h.want_bytes;
      if (fleet_[i].state() != HostState::syncing || h.want_bytes == 0) continue;
      double f = double(h.raw_bytes) / double(h.want_bytes);
      if (f < slow) slow = f, slowest = &fleet_[i];
    }
    const double n = double(std::max<size_t>(1, syncing + done));
    char text[160];
    std::snprintf(text, sizeof text, "%llu/%llu files, %.1f/%.1f MiB, %.1f MiB/s%s",
                  (unsigned long long)(double(sent_files) / n), (unsigned long long)(double(want_files) / n),
                  double(raw) / n / (1 << 20), double(want_bytes) / n / (1 << 20),
                  secs > 0 ? double(raw) / n / (1 << 20) / secs : 0.0, n > 1 ? " per host" : "");
    std::string line = "syncing " + plural(syncing, "host", "hosts") + ": " + text;
    if (slowest && syncing > 1) line += "; " + slowest->name() + " " + std::to_string(int(slow * 100)) + "%";
    if (status_line) {
      out_->set_status(line);
      out_->flush();
    } else {  // a log or a pipe: a line now and then
      out_->before_message();
      std::fprintf(stderr, "mltrain: %s\n", line.c_str());
    }
    return;
  }
  sync_reported_ = true;
  out_->set_status("");
  out_->flush();
  if (done > 0) sync_summary(secs);
}

// "synced ~/proj (120 files, 3.1 MiB) to ... on 4 hosts: 2 files sent to each (...) in 0.41s".
void RunPlay::sync_summary(double secs) {
  const sync::Tree& t = *opts_.sync->tree;
  size_t done = 0;
  for (const auto& h : hosts_) done += h.sync.done ? 1 : 0;
  // Per host: hosts usually want the same, so say it once ("to each host").
  uint64_t fmin = UINT64_MAX, fmax = 0, bmax = 0, wmax = 0, dmin = UINT64_MAX, dmax = 0;
  for (const auto& h : hosts_)
    if (h.sync.done) {
      fmin = std::min<uint64_t>(fmin, h.sync.want.size()),
      fmax = std::max<uint64_t>(fmax, h.sync.want.size());
      dmin = std::min<uint64_t>(dmin, h.sync.deleted), dmax = std::max<uint64_t>(dmax, h.sync.deleted);
      bmax = std::max(bmax, h.sync.raw_bytes), wmax = std::max(wmax, h.sync.wire_bytes);
    }
  const bool each = done > 1;
  std::string sent;
  if (fmax == 0 && dmax == 0) {
    sent = "nothing changed";
  } else {
    sent = (fmin == fmax ? plural(fmax, "file", "files")
                         : std::to_string(fmin) + "-" + std::to_string(fmax) + " files") +
           " sent" + (each ? fmin == fmax ? " to each" : " per host" : "") + " (" + bytes_text(bmax) +
           (wmax < bmax ? ", " + bytes_text(wmax) + " compressed" : std::string()) + ")";
    if (dmax > 0)
      sent += ", " +
              (dmin == dmax ? std::to_string(dmax) : std::to_string(dmin) + "-" + std::to_string(dmax)) +
              " removed" + (each ? dmin == dmax ? " on each" : " per host" : "");
  }
  out_->before_message();
  std::fprintf(stderr, "mltrain: synced %s (%s, %s) to %s on %s: %s in %.2fs\n", opts_.sync->shown.c_str(),
               plural(t.files, "file", "files").c_str(), bytes_text(t.bytes).c_str(), opts_.sync->dir.c_str(),
               plural(done, "host", "hosts").c_str(), sent.c_str(), secs);
  // What travelled, by name: the largest few, or (-v) every one.
  std::set<size_t> travelled;
  for (const auto& h : hosts_)
    if (h.sync.done)
      for (int32_t k : h.sync.want)
        if (size_t(k) < t.entries.size()) travelled.insert(size_t(k));
  if (travelled.empty()) return;
  std::vector<size_t> order(travelled.begin(), travelled.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return t.entries[a].size > t.entries[b].size; });
  const bool all = log::enabled(log::Level::info);
  std::vector<std::string> names;
  for (size_t k = 0; k < order.size() && (all || k < kSyncNamedLargest); ++k)
    names.push_back(t.entries[order[k]].path + " (" + bytes_text(t.entries[order[k]].size) + ")");
  if (all) {
    for (const auto& n : names) std::fprintf(stderr, "mltrain: sync: sent %s\n", n.c_str());
  } else {
    std::fprintf(stderr, "mltrain: sync: %s %s%s\n",
                 order.size() > names.size() ? "the largest sent:" : "sent:", text::join(names, ", ").c_str(),
                 order.size() > names.size() ? " (-v names every one)" : "");
  }
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
  m.cwd = opts_.setup->cwd;
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
