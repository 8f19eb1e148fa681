// Files brought back from hosts, for `[sync] pull` and `mltrain cp`.
#include "runner/supervise/detail/pulls.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runner/common/status.h"
#include "runner/common/text.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;

namespace {

constexpr size_t kMaxPullPath = 4096;            // a longer name from a host is refused, and so is one
constexpr long kMaxPullDepth = 256;              // this many folders deep (each one an fd while walked)
constexpr uint64_t kMinFreeBytes = 1ull << 30;   // a pull stops before the disk has less free
constexpr uint64_t kMinFreeInodes = 10000;       // ... or fewer files free
constexpr uint64_t kEntryCost = 4096;            // what a file or folder costs of the cap, at least
constexpr uint64_t kMaxPullFiles = 1'000'000;    // files from one host (as many as an agent lists)
constexpr uint64_t kSpaceCheckEvery = 64 << 20;  // bytes between two looks at the free space

}  // namespace

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

std::string plural(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

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

std::vector<std::string> bounded(std::vector<std::string> all) {
  Problems p;
  for (auto& x : all) p.add(std::move(x));
  return p.lines();
}

Pulls::Pulls(Fleet& fleet, const PullJob& job) : fleet_(fleet), job_(job), hosts_(fleet.size()) {}

Pulls::~Pulls() {
  for (auto& p : hosts_)
    if (p.fd >= 0) ::close(p.fd);
}

bool Pulls::start() {
  msg::Pull m;
  m.dir = job_.dir;
  m.patterns = job_.patterns;
  m.max_bytes = job_.max_bytes;
  // The folder every file lands below: made if missing, opened once, walked only through fds.
  std::error_code ec;
  std::filesystem::create_directories(job_.dest, ec);
  sync::Fd dest(::open(job_.dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  size_t asked = 0;
  for (size_t i : job_.hosts) {
    if (i >= hosts_.size() || !fleet_[i].open()) continue;
    HostPull& hp = hosts_[i];
    hp.active = true;
    hp.last_progress = fleet_.clock().now();
    const std::string& name = fleet_[i].name();
    if (!dest) {
      hp.problems.add("cannot open " + job_.dest + ": " + std::strerror(errno));
    } else if (!job_.per_host_folders) {
      hp.root.reset(::fcntl(dest.get(), F_DUPFD_CLOEXEC, 0));
    } else if (sync::is_below(name) && name.find('/') == std::string::npos &&
               (::mkdirat(dest.get(), name.c_str(), 0700) == 0 || errno == EEXIST)) {
      hp.root.reset(::openat(dest.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!hp.root) hp.problems.add("cannot open " + job_.dest + "/" + name + ": " + std::strerror(errno));
    } else {
      hp.problems.add("cannot make a folder for it in " + job_.dest);
    }
    if (i < job_.host_dirs.size()) m.dir = job_.host_dirs[i];
    fleet_.send(i, m);
    ++asked;
  }
  return asked > 0;
}

void Pulls::end_file(size_t i) {
  HostPull& p = hosts_[i];
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
void Pulls::stop(size_t i, std::string why) {
  HostPull& p = hosts_[i];
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
}

void Pulls::on(size_t i, msg::PullFile& m) {
  HostPull& p = hosts_[i];
  if (!p.active) return;
  end_file(i);
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
    return stop(i, "stopped past " + std::to_string(kMaxPullFiles) +
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
  p.last_progress = fleet_.clock().now();  // progress: a file accepted
  if (m.size == 0) end_file(i);
}

// Counts `n` more bytes against this host's bounds (the cap, the destination's free space and
// inodes); false, with the pull stopped, past them.
bool Pulls::charge(size_t i, uint64_t n) {
  HostPull& p = hosts_[i];
  if (p.received + n > job_.max_bytes) {
    stop(i, "stopped past the limit of " + bytes_text(job_.max_bytes) +
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
      stop(i, "stopped: the disk of " + job_.dest + " has under " + bytes_text(kMinFreeBytes) + " or " +
                  std::to_string(kMinFreeInodes) + " files free; the rest was left behind");
      return false;
    }
  }
  return true;
}

void Pulls::on(size_t i, msg::PullData& m) {
  HostPull& p = hosts_[i];
  if (!p.active || p.fd < 0) return;
  size_t n = size_t(std::min<uint64_t>(p.left, m.bytes.size()));
  if (n == 0 || !charge(i, n)) return;
  p.last_progress = fleet_.clock().now();  // progress: bytes of a file accepted
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
  if (p.left == 0) end_file(i);
}

void Pulls::on(size_t i, msg::PullDone& m) {
  HostPull& p = hosts_[i];
  if (!p.active) return;
  end_file(i);
  p.active = false;
  p.done = true;
  p.single_file = m.single_file != 0;
  for (auto& x : m.problems) p.problems.add(std::move(x));
}

void Pulls::stalls(Clock::time_point now) {
  for (size_t i = 0; i < hosts_.size(); ++i) {
    HostPull& p = hosts_[i];
    if (p.active && fleet_[i].open() && now >= p.last_progress + job_.stall_timeout)
      stop(i, "sent nothing for " + text::format_duration(job_.stall_timeout) +
                  " (MLTRAIN_PULL_STALL_TIMEOUT), after " + std::to_string(p.files) + " whole file" +
                  (p.files == 1 ? "" : "s") +
                  (p.fd >= 0 ? " and part of " + text::host_text(p.rel, 200) : ""));
  }
}

std::optional<Clock::time_point> Pulls::stall_deadline() const {
  std::optional<Clock::time_point> t;
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].active && fleet_[i].open() && (!t || hosts_[i].last_progress + job_.stall_timeout < *t))
      t = hosts_[i].last_progress + job_.stall_timeout;
  return t;
}

bool Pulls::over() const {
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].active && fleet_[i].open()) return false;
  return true;
}

PullResult Pulls::finish(int stop_signal) {
  PullResult r;
  std::vector<std::string> none;
  for (size_t i : job_.hosts) {
    if (i >= hosts_.size()) continue;
    HostPull& p = hosts_[i];
    if (p.active) {
      end_file(i);
      p.problems.add(stop_signal ? "stopped by " + signal_name(stop_signal) + " before every file came"
                                 : std::string("the host was lost before every file came"));
      p.active = false;  // what it sends from here on is dropped
    }
    r.files += p.files;
    r.bytes += p.bytes;
    for (const auto& x : p.problems.lines())
      r.problems.push_back(fleet_[i].name() + ": " + text::host_text(x));
    if (p.done && p.files == 0) none.push_back(fleet_[i].name());
  }
  if (!none.empty() && r.files == 0 && !job_.patterns.empty() && r.problems.empty())
    r.problems.push_back("nothing matched " + text::join(job_.patterns, " ") + " in " + job_.dir + " on " +
                         text::join(none, ", "));
  return r;
}

}  // namespace mltrain::supervise::detail
