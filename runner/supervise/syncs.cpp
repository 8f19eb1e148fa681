// The run's `[sync]`: every host's folder mirrored before preflight, the manifest encoded once,
// then only the files a host lacks, as fast as its link takes them (each chunk read and compressed
// once for every host), with a progress line while bytes travel and a summary at the end.
#include "runner/supervise/detail/syncs.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/pulls.h"

namespace mltrain::supervise::detail {

namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;
using std::chrono::milliseconds;

namespace {

constexpr size_t kSyncOutbox = 1u << 20;  // refill a host's outbox below this
constexpr auto kSyncProgressEvery = std::chrono::seconds(5);
constexpr size_t kSyncNamedLargest = 5;  // files named after a sync (all of them with -v)

}  // namespace

Syncs::Syncs(Fleet& fleet, const SyncJob& job, Output& out, bool status_line)
    : fleet_(fleet), job_(job), out_(out), status_line_(status_line), hosts_(fleet.size()) {
  const sync::Tree& t = *job_.tree;
  for (size_t k = 0; k < t.entries.size() || k == 0; k += msg::kSyncEntriesPerFrame) {
    msg::SyncManifest m;
    m.dir = job_.dir;
    size_t end = std::min(t.entries.size(), k + msg::kSyncEntriesPerFrame);
    m.entries.assign(t.entries.begin() + long(k), t.entries.begin() + long(end));
    m.last = end == t.entries.size() ? 1 : 0;
    m.run_key = job_.run_key;
    proto::encode(manifest_frames_, m);
  }
  chunks_ = std::make_unique<sync::Chunks>(t);
  start_ = fleet_.clock().now();
  // Without a status line (not a colour terminal), a line every kSyncProgressEvery instead.
  if (!status_line_) next_status_ = start_ + kSyncProgressEvery;
}

Syncs::~Syncs() = default;

void Syncs::start(size_t i) {
  fleet_.advance(i, HostState::syncing);
  if (fleet_[i].open()) fleet_[i].outbox += manifest_frames_;
}

std::string Syncs::want(size_t i, msg::SyncWant& m) {
  HostSync& h = hosts_[i];
  if (m.dir.empty()) return "sync: " + text::join(bounded(std::move(m.problems)), "; ");
  // Each entry of the tree at most once, whatever the host asks for.
  std::vector<char> asked(job_.tree->entries.size(), 0);
  h.want.clear();
  h.want_bytes = 0;
  for (int32_t k : m.want)
    if (k >= 0 && size_t(k) < asked.size() && !asked[size_t(k)]) {
      asked[size_t(k)] = 1;
      h.want.push_back(k);
      h.want_bytes += job_.tree->entries[size_t(k)].size;
    }
  h.deleted = m.deleted;
  h.dir = m.dir;
  h.copy = m.copy <= 16 ? m.copy : 0;  // a host's word: only the copies an agent makes
  if (h.copy) {
    out_.before_message();
    std::fprintf(stderr, "mltrain: %s: %s is in use by an older run; this run syncs into %s@%u beside it\n",
                 fleet_[i].name().c_str(), job_.dir.c_str(), job_.dir.c_str(), unsigned(h.copy));
  }
  // A big file that travels is named once, however many hosts want it: it may be data that need not.
  for (int32_t k : h.want) {
    const auto& entries = job_.tree->entries;
    if (size_t(k) >= entries.size() || entries[size_t(k)].size < job_.warn_bytes ||
        !warned_.insert(size_t(k)).second)
      continue;
    out_.before_message();
    std::fprintf(stderr,
                 "mltrain: sync: %s is %s and travels to the hosts; leave it out with [sync] exclude or a "
                 ".mltrainignore line if it need not (MLTRAIN_SYNC_WARN_BYTES)\n",
                 entries[size_t(k)].path.c_str(), bytes_text(entries[size_t(k)].size).c_str());
  }
  for (const auto& p : bounded(std::move(m.problems))) {
    out_.before_message();
    std::fprintf(stderr, "mltrain: %s: sync: %s\n", fleet_[i].name().c_str(), p.c_str());
  }
  return {};
}

std::string Syncs::on_host(size_t i, const std::string& path) const {
  const uint32_t copy = hosts_[i].copy;
  if (!copy || path.compare(0, job_.dir.size(), job_.dir) != 0 ||
      (path.size() > job_.dir.size() && path[job_.dir.size()] != '/'))
    return path;
  return job_.dir + "@" + std::to_string(copy) + path.substr(job_.dir.size());
}

void Syncs::pump(size_t i) {
  HostSync& h = hosts_[i];
  if (fleet_[i].state() != HostState::syncing || h.data_sent || !fleet_[i].open() || h.dir.empty()) return;
  const sync::Tree& t = *job_.tree;
  // Paced by the host's work, not by bytes on the wire: 1 MiB of zeros on the wire is gigabytes
  // to decompress and write, and a heartbeat sent after it would wait for all of that.
  while (fleet_[i].outbox.size() < kSyncOutbox && h.raw_bytes - h.written < msg::kSyncAhead) {
    if (h.next >= h.want.size()) {
      fleet_.send(i, msg::SyncEnd{});
      h.data_sent = true;
      return;
    }
    size_t index = size_t(h.want[h.next]);
    if (index >= t.entries.size()) {
      ++h.next;
      continue;
    }
    auto chunk = chunks_->get(index, h.offset);
    fleet_.send(i, *chunk, uint32_t(index));
    h.raw_bytes += chunk->raw_size;
    h.wire_bytes += chunk->bytes.size();
    h.offset += chunk->raw_size;
    if (h.offset >= t.entries[index].size) ++h.next, h.offset = 0;
  }
}

void Syncs::written(size_t i, const msg::SyncWritten& m) {
  HostSync& h = hosts_[i];
  h.written = std::max(h.written, std::min(m.bytes, h.raw_bytes));  // a host's word: never beyond what went
}

std::string Syncs::done(size_t i, msg::SyncDone& m) {
  HostSync& h = hosts_[i];
  if (!m.problems.empty())
    return "sync into " + h.dir + " failed: " + text::join(bounded(std::move(m.problems)), "; ");
  h.done = true;
  return {};
}

// On a terminal, one status line while bytes travel; when every host is done, one summary line.
void Syncs::progress(Clock::time_point now) {
  if (reported_) return;
  size_t syncing = 0, done = 0;
  uint64_t raw = 0, want_files = 0, sent_files = 0;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    const HostSync& h = hosts_[i];
    if (fleet_[i].state() == HostState::syncing) ++syncing;
    if (h.done) ++done;
    raw += h.raw_bytes;
    want_files += h.want.size();
    sent_files += std::min(h.next, h.want.size());
  }
  double secs = std::chrono::duration<double>(now - start_).count();
  if (syncing > 0) {
    if (next_status_ && now < *next_status_) return;
    next_status_ = now + (status_line_ ? milliseconds(100) : kSyncProgressEvery);
    // "syncing 4 hosts: 1200/5000 files, 40.0/100.0 MiB, 80.1 MiB/s per host; h3 31%" (the slowest)
    uint64_t want_bytes = 0;
    const FleetHost* slowest = nullptr;
    double slow = 2;
    for (size_t i = 0; i < hosts_.size(); ++i) {
      const HostSync& h = hosts_[i];
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
    if (status_line_) {
      out_.set_status(line);
      out_.flush();
    } else {  // a log or a pipe: a line now and then
      out_.before_message();
      std::fprintf(stderr, "mltrain: %s\n", line.c_str());
    }
    return;
  }
  reported_ = true;
  out_.set_status("");
  out_.flush();
  if (done > 0) summary(secs);
}

// "synced ~/proj (120 files, 3.1 MiB) to ... on 4 hosts: 2 files sent to each (...) in 0.41s".
void Syncs::summary(double secs) {
  const sync::Tree& t = *job_.tree;
  size_t done = 0;
  for (const auto& h : hosts_) done += h.done ? 1 : 0;
  // Per host: hosts usually want the same, so say it once ("to each host").
  uint64_t fmin = UINT64_MAX, fmax = 0, bmax = 0, wmax = 0, dmin = UINT64_MAX, dmax = 0;
  for (const auto& h : hosts_)
    if (h.done) {
      fmin = std::min<uint64_t>(fmin, h.want.size()), fmax = std::max<uint64_t>(fmax, h.want.size());
      dmin = std::min<uint64_t>(dmin, h.deleted), dmax = std::max<uint64_t>(dmax, h.deleted);
      bmax = std::max(bmax, h.raw_bytes), wmax = std::max(wmax, h.wire_bytes);
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
  out_.before_message();
  std::fprintf(stderr, "mltrain: synced %s (%s, %s) to %s on %s: %s in %.2fs\n",
               text::host_text(job_.shown, 512).c_str(), plural(t.files, "file", "files").c_str(),
               bytes_text(t.bytes).c_str(), text::host_text(job_.dir, 512).c_str(),
               plural(done, "host", "hosts").c_str(), sent.c_str(), secs);
  // What travelled, by name: the largest few, or (-v) every one.
  std::set<size_t> travelled;
  for (const auto& h : hosts_)
    if (h.done)
      for (int32_t k : h.want)
        if (size_t(k) < t.entries.size()) travelled.insert(size_t(k));
  if (travelled.empty()) return;
  std::vector<size_t> order(travelled.begin(), travelled.end());
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return t.entries[a].size > t.entries[b].size; });
  const bool all = log::enabled(log::Level::info);
  std::vector<std::string> names;
  for (size_t k = 0; k < order.size() && (all || k < kSyncNamedLargest); ++k)
    // The laptop's own file names, yet any bytes a name may hold (ESC too): escaped for the terminal.
    names.push_back(text::host_text(t.entries[order[k]].path, 512) + " (" +
                    bytes_text(t.entries[order[k]].size) + ")");
  if (all) {
    for (const auto& n : names) std::fprintf(stderr, "mltrain: sync: sent %s\n", n.c_str());
  } else {
    std::fprintf(stderr, "mltrain: sync: %s %s%s\n",
                 order.size() > names.size() ? "the largest sent:" : "sent:", text::join(names, ", ").c_str(),
                 order.size() > names.size() ? " (-v names every one)" : "");
  }
}

}  // namespace mltrain::supervise::detail
