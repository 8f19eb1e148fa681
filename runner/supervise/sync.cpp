// The gang's part in `[sync]`, `[setup]` and `pull`: every host's folder mirrored before preflight
// (the manifest once, then only the files a host lacks, as fast as its link takes them), the setup
// command where it must run, and after the ranks the files asked for, brought back.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/gang.h"

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

std::string bytes_text(uint64_t b) {
  char buf[32];
  if (b < 10 * 1024)
    std::snprintf(buf, sizeof buf, "%llu B", (unsigned long long)b);
  else if (b < 10ull << 20)
    std::snprintf(buf, sizeof buf, "%.1f KiB", double(b) / 1024);
  else if (b < 10ull << 30)
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(b) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(b) / (1u << 30));
  return buf;
}

// Where a host's setup output is kept in the run's folder.
std::string setup_log(const std::string& run_id, const std::string& host) {
  return records::run_dir(run_id) + "/setup-" + host + ".log";
}

std::string plural(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// A host's list of problems as it is shown: the first Problems::kKept, then a count.
std::vector<std::string> bounded(std::vector<std::string> all) {
  Problems p;
  for (auto& x : all) p.add(std::move(x));
  return p.lines();
}

}  // namespace

// ---- sync ----

void Gang::start_sync_all() {
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

void Gang::start_sync(size_t i) {
  Host& h = hosts_[i];
  h.state = HostState::syncing;
  if (h.open()) h.outbox += manifest_frames_;
}

void Gang::on(size_t i, uint32_t, msg::SyncWant& m) {
  Host& h = hosts_[i];
  if (h.state != HostState::syncing) return;
  if (m.dir.empty()) {
    host_failed(i, "sync: " + text::join(bounded(std::move(m.problems)), "; "));
    h.link->kill();
    check_progress();
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
    std::fprintf(stderr, "mltrain: %s: sync: %s\n", h.plan->host.name.c_str(), p.c_str());
  }
  pump_sync(i);
}

void Gang::pump_sync(size_t i) {
  Host& h = hosts_[i];
  if (h.state != HostState::syncing || h.sync.data_sent || !h.open() || h.sync.dir.empty()) return;
  const sync::Tree& t = *opts_.sync->tree;
  try {
    while (h.outbox.size() < kSyncOutbox) {
      if (h.sync.next >= h.sync.want.size()) {
        send_to(h, msg::SyncEnd{});
        h.sync.data_sent = true;
        return;
      }
      size_t index = size_t(h.sync.want[h.sync.next]);
      if (index >= t.entries.size()) {
        ++h.sync.next;
        continue;
      }
      auto chunk = chunks_->get(index, h.sync.offset);
      send_to(h, *chunk, uint32_t(index));
      h.sync.raw_bytes += chunk->raw_size;
      h.sync.wire_bytes += chunk->bytes.size();
      h.sync.offset += chunk->raw_size;
      if (h.sync.offset >= t.entries[index].size) ++h.sync.next, h.sync.offset = 0;
    }
  } catch (const Error& e) {
    host_failed(i, e.what());
    h.link->kill();
    check_progress();
  }
}

void Gang::on(size_t i, uint32_t, msg::SyncDone& m) {
  Host& h = hosts_[i];
  if (h.state != HostState::syncing) return;
  if (!m.problems.empty()) {
    host_failed(i,
                "sync into " + h.sync.dir + " failed: " + text::join(bounded(std::move(m.problems)), "; "));
    check_progress();
    return;
  }
  h.sync.done = true;
  h.synced = true;
  h.state = HostState::greeted;
  sync_progress(clock_.now());
  next_step(i);
  check_progress();
}

// On a terminal, one status line while bytes travel; when every host is done, one summary line.
void Gang::sync_progress(Clock::time_point now) {
  if (!opts_.sync || sync_reported_) return;
  const sync::Tree& t = *opts_.sync->tree;
  size_t syncing = 0, done = 0;
  uint64_t raw = 0, want_files = 0, sent_files = 0;
  for (const auto& h : hosts_) {
    if (h.state == HostState::syncing) ++syncing;
    if (h.sync.done) ++done;
    raw += h.sync.raw_bytes;
    want_files += h.sync.want.size();
    sent_files += std::min(h.sync.next, h.sync.want.size());
  }
  double secs = std::chrono::duration<double>(now - sync_start_).count();
  if (syncing > 0) {
    const bool status_line = out_->terminal() && opts_.console.color;
    if (next_sync_status_ && now < *next_sync_status_) return;
    next_sync_status_ = now + (status_line ? milliseconds(100) : kSyncProgressEvery);
    // "syncing 4 hosts: 1200/5000 files, 40.0/100.0 MiB, 80.1 MiB/s per host; h3 31%" (the slowest)
    uint64_t want_bytes = 0;
    const Host* slowest = nullptr;
    double slow = 2;
    for (const auto& h : hosts_) {
      want_bytes += h.sync.want_bytes;
      if (h.state != HostState::syncing || h.sync.want_bytes == 0) continue;
      double f = double(h.sync.raw_bytes) / double(h.sync.want_bytes);
      if (f < slow) slow = f, slowest = &h;
    }
    const double n = double(std::max<size_t>(1, syncing + done));
    char text[160];
    std::snprintf(text, sizeof text, "%llu/%llu files, %.1f/%.1f MiB, %.1f MiB/s%s",
                  (unsigned long long)(double(sent_files) / n), (unsigned long long)(double(want_files) / n),
                  double(raw) / n / (1 << 20), double(want_bytes) / n / (1 << 20),
                  secs > 0 ? double(raw) / n / (1 << 20) / secs : 0.0, n > 1 ? " per host" : "");
    std::string line = "syncing " + plural(syncing, "host", "hosts") + ": " + text;
    if (slowest && syncing > 1)
      line += "; " + slowest->plan->host.name + " " + std::to_string(int(slow * 100)) + "%";
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
  if (done == 0) return;
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

void Gang::start_setup(size_t i) {
  Host& h = hosts_[i];
  h.state = HostState::setting_up;
  // Its output, kept with the run (empty when it says nothing; none when it is skipped).
  std::string path = setup_log(rec_.id, h.plan->host.name);
  h.setup.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  msg::Setup m;
  m.command = opts_.setup->command;
  m.cwd = opts_.setup->cwd;
  m.env = opts_.setup->env;
  m.key = opts_.setup->key;
  m.force = opts_.setup->force ? 1 : 0;
  send_to(h, m);
}

void Gang::setup_output(size_t i, std::string_view bytes, bool end) {
  Host& h = hosts_[i];
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
    std::fprintf(stderr, "[%s] %s\n", h.plan->host.name.c_str(), shown.c_str());
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

void Gang::on(size_t i, uint32_t, msg::SetupDone& m) {
  Host& h = hosts_[i];
  if (h.state != HostState::setting_up) return;
  setup_output(i, {}, true);
  if (m.ran == 0) {
    h.setup.skipped = true;
    ::unlink(setup_log(rec_.id, h.plan->host.name).c_str());
    out_->before_message();
    std::fprintf(
        stderr,
        "[%s] setup: skipped, nothing changed since it last succeeded here (--setup always runs it)\n",
        h.plan->host.name.c_str());
  } else if (m.status != 0 || !m.message.empty()) {
    std::string why =
        !m.message.empty() ? "could not start: " + m.message : "failed with " + describe_status(m.status);
    std::string tail;
    for (const auto& l : h.setup.tail) tail += "\n      | " + l;
    host_failed(i, "setup `" + opts_.setup->command + "` " + why +
                       (tail.empty() ? std::string() : "; its last lines:" + tail) +
                       "\n      (its output: " + setup_log(rec_.id, h.plan->host.name) + ")");
    check_progress();
    return;
  }
  h.set_up = true;
  h.state = HostState::greeted;
  next_step(i);
  check_progress();
}

// ---- pull ----

void Problems::add(std::string text) {
  if (items.size() >= kKept) {
    ++more;
    return;
  }
  if (text.size() > kTextBytes) text = text.substr(0, kTextBytes) + "...";
  items.push_back(std::move(text));
}

std::vector<std::string> Problems::lines() const {
  std::vector<std::string> out = items;
  if (more) out.push_back("... and " + plural(more, "more problem", "more problems"));
  return out;
}

namespace {

constexpr size_t kMaxPullPath = 4096;            // a longer name from a host is refused, and so is one
constexpr long kMaxPullDepth = 256;              // this many folders deep (each one an fd while walked)
constexpr uint64_t kMinFreeBytes = 1ull << 30;   // a pull stops before the disk has less free
constexpr uint64_t kMinFreeInodes = 10000;       // ... or fewer files free
constexpr uint64_t kEntryCost = 4096;            // what a file or folder costs of the cap, at least
constexpr uint64_t kMaxPullFiles = 1'000'000;    // files from one host (as many as an agent lists)
constexpr uint64_t kSpaceCheckEvery = 64 << 20;  // bytes between two looks at the free space

}  // namespace

void Gang::start_pull() {
  const PullJob& p = *opts_.pull;
  msg::Pull m;
  m.dir = p.dir;
  m.patterns = p.patterns;
  m.max_bytes = p.max_bytes;
  // The folder every file lands below: made if missing, opened once, walked only through fds.
  std::error_code ec;
  std::filesystem::create_directories(p.dest, ec);
  sync::Fd dest(::open(p.dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  size_t asked = 0;
  for (size_t i : p.hosts) {
    if (i >= hosts_.size() || !hosts_[i].open()) continue;
    HostPull& hp = hosts_[i].pull;
    hp.active = true;
    hp.last_progress = clock_.now();
    const std::string& name = hosts_[i].plan->host.name;
    if (!dest) {
      hp.problems.add("cannot open " + p.dest + ": " + std::strerror(errno));
    } else if (!p.per_host_folders) {
      hp.root.reset(::fcntl(dest.get(), F_DUPFD_CLOEXEC, 0));
    } else if (sync::is_below(name) && name.find('/') == std::string::npos &&
               (::mkdirat(dest.get(), name.c_str(), 0700) == 0 || errno == EEXIST)) {
      hp.root.reset(::openat(dest.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!hp.root) hp.problems.add("cannot open " + p.dest + "/" + name + ": " + std::strerror(errno));
    } else {
      hp.problems.add("cannot make a folder for it in " + p.dest);
    }
    send_to(hosts_[i], m);
    ++asked;
  }
  if (asked == 0) pull_finished();
}

void Gang::end_pull(size_t i) {
  HostPull& p = hosts_[i].pull;
  if (p.fd < 0) return;
  bool whole = p.left == 0;
  if (whole) {  // the file's time as it was on the host
    timespec ts[2] = {{time_t(p.mtime_ns / 1'000'000'000), long(p.mtime_ns % 1'000'000'000)},
                      {time_t(p.mtime_ns / 1'000'000'000), long(p.mtime_ns % 1'000'000'000)}};
    ::futimens(p.fd, ts);
  }
  bool ok = ::close(p.fd) == 0 && whole;
  p.fd = -1;
  if (ok && ::renameat(p.parent.get(), p.tmp.c_str(), p.parent.get(), p.leaf.c_str()) == 0) {
    ++p.files;
    p.bytes += p.size;
  } else {
    int e = errno;
    ::unlinkat(p.parent.get(), p.tmp.c_str(), 0);
    p.problems.add(p.rel + (whole ? ": " + std::string(std::strerror(e)) : ": arrived short"));
  }
  p.parent.reset();
}

// This host's pull ends here: what came stays, the rest of what it sends is dropped.
void Gang::stop_pull(size_t i, std::string why) {
  HostPull& p = hosts_[i].pull;
  if (!p.active) return;
  if (p.fd >= 0) {
    ::close(p.fd);
    p.fd = -1;
    ::unlinkat(p.parent.get(), p.tmp.c_str(), 0);
    p.parent.reset();
  }
  p.problems.add(std::move(why));
  p.active = false;
  p.done = true;
  if (std::none_of(hosts_.begin(), hosts_.end(), [](const Host& x) { return x.pull.active && x.open(); }))
    pull_finished();
}

void Gang::on(size_t i, uint32_t, msg::PullFile& m) {
  Host& h = hosts_[i];
  HostPull& p = h.pull;
  if (!p.active) return;
  end_pull(i);
  // A name that is not a plain path below the folder ("..", ".", "//", a leading "/", a NUL) or
  // leads through a link is refused: nothing lands outside the pull's folder.
  std::string leaf;
  if (m.path.size() > kMaxPullPath || std::count(m.path.begin(), m.path.end(), '/') >= kMaxPullDepth ||
      !sync::is_below(m.path) || !p.root) {
    p.problems.add("refused the path '" + m.path.substr(0, 200) + "'");
    return;
  }
  // Every file (and each folder its name may make) costs a block of the cap: empty files and
  // folders are not free, and there are at most kMaxPullFiles.
  if (++p.entries > kMaxPullFiles)
    return stop_pull(i, "stopped past " + std::to_string(kMaxPullFiles) +
                            " files from this host; the rest was left behind");
  if (!charge(i, kEntryCost * (1 + uint64_t(std::count(m.path.begin(), m.path.end(), '/'))))) return;
  p.parent.reset(sync::open_parent(p.root.get(), m.path, leaf, true, 0777));
  if (!p.parent) {
    p.problems.add(m.path + ": " +
                   (errno == ELOOP || errno == ENOTDIR
                        ? std::string("a folder on its way is a link or a file")
                        : std::string(std::strerror(errno))));
    return;
  }
  p.rel = m.path;
  p.leaf = std::move(leaf);
  p.tmp = ".mltrain-tmp-" + std::to_string(p.next_tmp++);
  p.fd = ::openat(p.parent.get(), p.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                  mode_t(m.mode & 0777) | 0600);
  if (p.fd < 0) {
    p.problems.add(p.rel + ": " + std::strerror(errno));
    p.parent.reset();
    return;
  }
  p.size = p.left = m.size;
  p.mtime_ns = m.mtime_ns;
  p.last_progress = clock_.now();  // progress: a file accepted
  if (m.size == 0) end_pull(i);
}

// Counts `n` more bytes against this host's bounds (the cap, the destination's free space and
// inodes); false, with the pull stopped, past them.
bool Gang::charge(size_t i, uint64_t n) {
  HostPull& p = hosts_[i].pull;
  const PullJob& job = *opts_.pull;
  if (p.received + n > job.max_bytes) {
    stop_pull(i, "stopped past the limit of " + bytes_text(job.max_bytes) +
                     " from this host (MLTRAIN_PULL_MAX_BYTES); the rest was left behind");
    return false;
  }
  p.received += n;
  if (p.received >= p.next_space_check) {
    p.next_space_check = p.received + kSpaceCheckEvery;
    struct statvfs v {};
    const bool known = ::fstatvfs(p.root.get(), &v) == 0;
    if (known &&
        (uint64_t(v.f_bavail) * v.f_frsize < kMinFreeBytes || (v.f_files && v.f_favail < kMinFreeInodes))) {
      stop_pull(i, "stopped: the disk of " + job.dest + " has under " + bytes_text(kMinFreeBytes) + " or " +
                       std::to_string(kMinFreeInodes) + " files free; the rest was left behind");
      return false;
    }
  }
  return true;
}

void Gang::on(size_t i, uint32_t, msg::PullData& m) {
  HostPull& p = hosts_[i].pull;
  if (!p.active || p.fd < 0) return;
  size_t n = size_t(std::min<uint64_t>(p.left, m.bytes.size()));
  if (n == 0 || !charge(i, n)) return;
  p.last_progress = clock_.now();  // progress: bytes of a file accepted
  for (size_t done = 0; done < n;) {
    ssize_t w = ::write(p.fd, m.bytes.data() + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      p.problems.add(p.rel + ": " + std::strerror(errno));
      ::close(p.fd);
      ::unlinkat(p.parent.get(), p.tmp.c_str(), 0);
      p.fd = -1;
      p.parent.reset();
      return;
    }
    done += size_t(w);
  }
  p.left -= n;
  if (p.left == 0) end_pull(i);
}

void Gang::on(size_t i, uint32_t, msg::PullDone& m) {
  Host& h = hosts_[i];
  if (!h.pull.active) return;
  end_pull(i);
  h.pull.active = false;
  h.pull.done = true;
  h.pull.single_file = m.single_file != 0;
  for (auto& p : m.problems) h.pull.problems.add(std::move(p));
  if (std::none_of(hosts_.begin(), hosts_.end(), [](const Host& x) { return x.pull.active && x.open(); }))
    pull_finished();
}

// A host that still answers heartbeats but sends nothing of the pull for stall_timeout is done.
void Gang::pull_stalls(Clock::time_point now) {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    HostPull& p = hosts_[i].pull;
    if (p.active && hosts_[i].open() && now >= p.last_progress + opts_.pull->stall_timeout)
      stop_pull(i, "sent nothing for " + text::format_duration(opts_.pull->stall_timeout) +
                       " (MLTRAIN_PULL_STALL_TIMEOUT); what came is kept");
  }
}

void Gang::pull_finished() {
  if (pulled_) return;
  pulled_ = true;
  const PullJob& job = *opts_.pull;
  uint64_t files = 0, bytes = 0;
  std::vector<std::string> problems, none;
  for (size_t i : job.hosts) {
    if (i >= hosts_.size()) continue;
    Host& h = hosts_[i];
    if (h.pull.active) {
      end_pull(i);
      h.pull.problems.add(stop_signal_ ? "stopped by " + signal_name(stop_signal_) + " before every file came"
                                       : std::string("the host was lost before every file came"));
    }
    files += h.pull.files;
    bytes += h.pull.bytes;
    for (const auto& p : h.pull.problems.lines())
      problems.push_back(h.plan->host.name + ": " + text::host_text(p));
    if (h.pull.done && h.pull.files == 0) none.push_back(h.plan->host.name);
  }
  pulled_files_ = files;
  if (!none.empty() && files == 0 && !job.patterns.empty() && problems.empty())
    problems.push_back("nothing matched " + text::join(job.patterns, " ") + " in " + job.dir + " on " +
                       text::join(none, ", "));
  pull_problems_ = problems;
  rec_.pull = records::PullRecord{files, bytes, problems};
  if (!pull_only_) {
    if (out_) out_->flush(), out_->before_message();
    std::fprintf(stderr, "mltrain: pulled %s (%s) into %s\n", plural(files, "file", "files").c_str(),
                 bytes_text(bytes).c_str(), job.dest.c_str());
    for (const auto& p : problems) std::fprintf(stderr, "mltrain: pull: %s\n", p.c_str());
  }
  if (phase_ == Phase::pulling) enter(Phase::closing);
}

uint64_t Gang::run_pull(std::vector<std::string>& unreachable, std::vector<std::string>& problems,
                        bool& single_file) {
  pull_only_ = true;
  ranks_started_ = true;
  loop();
  single_file = !hosts_.empty() && hosts_[0].pull.single_file;
  for (const auto& h : hosts_)
    if (h.state == HostState::failed || h.state == HostState::lost) {
      const std::string& n = h.plan->host.name;  // a transport's error names its host already
      unreachable.push_back(h.problem.compare(0, n.size() + 2, n + ": ") == 0 ? h.problem
                                                                              : n + ": " + h.problem);
    }
  for (const auto& p : pull_problems_) problems.push_back(p);
  if (stop_signal_ && problems.empty()) problems.push_back("stopped by " + signal_name(stop_signal_));
  return pulled_files_;
}

}  // namespace mltrain::supervise::detail

namespace mltrain::supervise {

uint64_t pull_files(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
                    bool* single_file) {
  records::RunRecord unused;  // cp records no run
  detail::Gang g(plan, unused, opts, transport_for);
  std::vector<std::string> unreachable, problems;
  bool single = false;
  uint64_t files = g.run_pull(unreachable, problems, single);
  if (single_file) *single_file = single;
  if (!unreachable.empty())
    throw Error(text::join(unreachable, "\n  "), "check the host with 'mltrain doctor'",
                exit_code::host_failure);
  if (!problems.empty()) throw Error(text::join(problems, "\n  "), "", 1);
  return files;
}

}  // namespace mltrain::supervise
