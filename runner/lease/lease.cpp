#include "runner/lease/lease.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace mltrain::lease {
namespace {

constexpr size_t kMaxFields = 32;

// The abstract address of `name`: a leading NUL, then the prefixed name (no trailing NUL: the
// length says where it ends).
socklen_t address_of(const Space& space, std::string_view name, sockaddr_un& a) {
  std::memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  std::string full = space.prefix() + std::string(name);
  std::memcpy(a.sun_path + 1, full.data(), full.size());
  return socklen_t(offsetof(sockaddr_un, sun_path) + 1 + full.size());
}

bool key_ok(std::string_view k) {
  return !k.empty() && k.size() <= 32 &&
         std::all_of(k.begin(), k.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
}

int64_t ms_left(std::chrono::steady_clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max<int64_t>(0, left.count());
}

// A reader's connection: the holder's credentials at once, its answer when it comes.
struct Asking {
  Seen seen;
  int fd = -1;
  std::string got;
};

// Connects to `name`'s holder; false when nobody holds it.
bool connect_to(const Space& space, std::string_view name, Asking& a) {
  sockaddr_un addr;
  socklen_t len = address_of(space, name, addr);
  a.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (a.fd < 0) return false;
  // A listener's backlog takes the connection even while its holder is busy (or stopped).
  if (::connect(a.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS &&
      errno != EAGAIN) {
    ::close(a.fd);
    a.fd = -1;
    return false;
  }
  ucred cred{};
  socklen_t clen = sizeof cred;
  if (::getsockopt(a.fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0) {
    a.seen.uid = cred.uid;
    a.seen.pid = cred.pid;
  }
  a.seen.name = std::string(name);
  return true;
}

// Reads every connection's answer until each has ended or the deadline passed.
void read_answers(std::vector<Asking>& asks, std::chrono::steady_clock::time_point deadline) {
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Asking*> owners;
    for (auto& a : asks)
      if (a.fd >= 0) fds.push_back({a.fd, POLLIN, 0}), owners.push_back(&a);
    if (fds.empty()) return;
    int64_t left = ms_left(deadline);
    if (left == 0) break;
    int n = ::poll(fds.data(), fds.size(), int(left));
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Asking& a = *owners[i];
      char buf[1024];
      ssize_t r = ::read(a.fd, buf, sizeof buf);
      if (r > 0 && a.got.size() < kMaxInfoBytes)
        a.got.append(buf, std::min(size_t(r), kMaxInfoBytes - a.got.size()));
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || a.got.size() >= kMaxInfoBytes) {
        a.seen.answered = r == 0;
        ::close(a.fd);
        a.fd = -1;
      }
    }
  }
  for (auto& a : asks)
    if (a.fd >= 0) ::close(a.fd), a.fd = -1;
}

std::string read_proc_net_unix(size_t max_bytes) {
  int fd = ::open("/proc/net/unix", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buf[65536];
  ssize_t r;
  while (text.size() < max_bytes && (r = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, size_t(r));
  ::close(fd);
  return text;
}

}  // namespace

bool valid_space(std::string_view name) {
  return name.size() <= 32 && std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
         });
}

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxName) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == ':' || c == '/' || c == '-';
  });
}

std::string encode(const Info& info) {
  std::string out;
  size_t n = 0;
  for (const auto& [k, v] : info) {
    if (!key_ok(k) || ++n > kMaxFields) continue;
    std::string value = v;
    std::replace(value.begin(), value.end(), '\n', ' ');
    out += k + "=" + value + "\n";
  }
  if (out.size() > kMaxInfoBytes) out.resize(kMaxInfoBytes);
  return out;
}

Info decode(std::string_view text) {
  Info info;
  if (text.size() > kMaxInfoBytes) text = text.substr(0, kMaxInfoBytes);
  while (!text.empty() && info.size() < kMaxFields) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    size_t eq = line.find('=');
    if (eq == std::string_view::npos || !key_ok(line.substr(0, eq))) continue;
    info.emplace(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
  }
  return info;
}

Lease::Lease(int fd, std::string name, Info info) : fd_(fd), name_(std::move(name)), answer_(encode(info)) {}

Lease::Lease(Lease&& o) noexcept : fd_(o.fd_), name_(std::move(o.name_)), answer_(std::move(o.answer_)) {
  o.fd_ = -1;
}

Lease& Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_, name_ = std::move(o.name_), answer_ = std::move(o.answer_);
    o.fd_ = -1;
  }
  return *this;
}

Lease::~Lease() {
  if (fd_ >= 0) ::close(fd_);
}

void Lease::set_info(Info info) { answer_ = encode(info); }

void Lease::answer() {
  while (fd_ >= 0) {
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) return;  // EAGAIN: nobody else waits
    // One short write into an empty socket buffer: it fits; a reader that does not read loses it.
    (void)::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(c);
  }
}

std::optional<Lease> take(const Space& space, std::string_view name, Info info, std::string* error) {
  if (!valid_name(name) || !valid_space(space.name)) {
    if (error) *error = "'" + std::string(name) + "' is not a lease name";
    return std::nullopt;
  }
  // CLOEXEC: the ranks the agent starts never hold its leases past its own end.
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    if (error) *error = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  sockaddr_un addr;
  socklen_t len = address_of(space, name, addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int e = errno;
    ::close(fd);
    if (e != EADDRINUSE && error)
      *error = "cannot take the lease " + std::string(name) + ": " + std::strerror(e);
    return std::nullopt;
  }
  if (::listen(fd, 64) != 0) {
    if (error) *error = std::string("listen: ") + std::strerror(errno);
    ::close(fd);
    return std::nullopt;
  }
  return Lease(fd, std::string(name), std::move(info));
}

namespace detail {

std::vector<std::string> names_in_proc_net_unix(std::string_view text, const Space& space,
                                                std::string_view prefix, size_t max) {
  std::vector<std::string> names;
  const std::string own = space.prefix();
  const std::string want = "@" + own + std::string(prefix);
  while (!text.empty() && names.size() < max) {
    size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    // "Num: RefCount Protocol Flags Type St Inode Path": a listener has __SO_ACCEPTCON (0x10000).
    size_t at = line.find(" @");
    if (at == std::string_view::npos) continue;
    std::string_view path = line.substr(at + 1);
    if (path.substr(0, want.size()) != want) continue;
    std::string_view head = line.substr(0, at);
    size_t colon = head.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view fields = head.substr(colon + 1);
    char flags[16] = {};
    unsigned refcount = 0, protocol = 0;
    if (std::sscanf(std::string(fields).c_str(), "%x %x %15s", &refcount, &protocol, flags) != 3) continue;
    if ((std::strtoul(flags, nullptr, 16) & 0x10000u) == 0) continue;
    std::string name(path.substr(1 + own.size()));
    if (valid_name(name)) names.push_back(std::move(name));
  }
  return names;
}

}  // namespace detail

std::vector<Seen> list(const Space& space, std::string_view prefix, std::chrono::milliseconds timeout,
                       size_t max, const std::vector<std::string>& skip) {
  if (!valid_space(space.name)) return {};
  std::vector<std::string> names =
      detail::names_in_proc_net_unix(read_proc_net_unix(64u << 20), space, prefix, max);
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  names.erase(
      std::remove_if(names.begin(), names.end(),
                     [&](const std::string& n) { return std::count(skip.begin(), skip.end(), n) > 0; }),
      names.end());
  return holders(space, names, timeout);
}

std::vector<Seen> holders(const Space& space, const std::vector<std::string>& names,
                          std::chrono::milliseconds timeout) {
  if (!valid_space(space.name)) return {};
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<Asking> asks;
  for (const auto& n : names) {
    Asking a;
    if (valid_name(n) && connect_to(space, n, a)) asks.push_back(std::move(a));
  }
  read_answers(asks, deadline);
  std::vector<Seen> out;
  for (auto& a : asks) {
    a.seen.info = decode(a.got);
    a.seen.doubt = doubt_of(a.seen, proc_facts(a.seen.pid));
    out.push_back(std::move(a.seen));
  }
  return out;
}

namespace {

std::string read_small(const std::string& path, size_t max) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text(max, '\0');
  ssize_t r = ::read(fd, text.data(), max);
  ::close(fd);
  text.resize(r > 0 ? size_t(r) : 0);
  return text;
}

// The host's boot time (seconds since the epoch), from /proc/stat's btime.
int64_t boot_time_s() {
  static const int64_t boot = [] {
    std::string stat = read_small("/proc/stat", 64 * 1024);
    size_t at = stat.find("\nbtime ");
    return at == std::string::npos ? int64_t(0) : int64_t(std::strtoll(stat.c_str() + at + 7, nullptr, 10));
  }();
  return boot;
}

// The time part of a queue place's name, in seconds.
std::optional<int64_t> key_time_s(std::string_view queue_key) {
  // "queue/<19 digits of ns>-<run id>" (claim.h's order_key)
  if (queue_key.size() < 6 + 19 || queue_key.substr(0, 6) != "queue/") return std::nullopt;
  int64_t ns = 0;
  for (char c : queue_key.substr(6, 19)) {
    if (c < '0' || c > '9') return std::nullopt;
    ns = ns * 10 + (c - '0');
  }
  return ns / 1000000000;
}

// An agent runs as ~/.cache/mltrain/mltrain-agent-<16 hex of its hash> (the launcher's state
// folder for local hosts), so the kernel names it "mltrain-agent-<the first hex>". A local user
// can mimic both (any name, any argv[0]); this keeps out what does not take that trouble (a
// process merely named mltrain-agent-x, a script). docs/sharing.md says what it cannot keep out.
bool agent_process(const ProcFacts& f) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  constexpr std::string_view kName = "mltrain-agent-";
  if (f.comm.size() != kName.size() + 1 || f.comm.compare(0, kName.size(), kName) != 0 || !hex(f.comm.back()))
    return false;
  const std::string_view base = std::string_view(f.argv0).substr(f.argv0.rfind('/') + 1);
  if (base.size() != kName.size() + 16 || base.substr(0, kName.size()) != kName) return false;
  for (char c : base.substr(kName.size()))
    if (!hex(c)) return false;
  return base[kName.size()] == f.comm.back();
}

}  // namespace

ProcFacts proc_facts(pid_t pid) {
  ProcFacts f;
  if (pid <= 0) return f;
  const std::string dir = "/proc/" + std::to_string(pid);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    // Gone, or hidden: with /proc mounted hidepid=2 another user's processes (init's too) cannot
    // be seen, and a real holder must not be doubted for it (two jobs would share a GPU).
    f.hidden = ::access("/proc/1/stat", F_OK) != 0;
    return f;
  }
  std::string stat = read_small(dir + "/stat", 4096);
  size_t open = stat.find('('), close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return f;
  f.comm = stat.substr(open + 1, close - open - 1);
  // After the name: state (field 3) ... starttime (field 22), in clock ticks after boot.
  std::string_view rest = std::string_view(stat).substr(close + 2);
  int field = 3;
  while (field < 22 && !rest.empty()) {
    size_t sp = rest.find(' ');
    rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    ++field;
  }
  if (rest.empty() || rest[0] == 'Z') return f;
  const long hz = ::sysconf(_SC_CLK_TCK);
  const int64_t ticks = std::strtoll(std::string(rest.substr(0, rest.find(' '))).c_str(), nullptr, 10);
  if (hz > 0 && boot_time_s() > 0) f.started_s = boot_time_s() + ticks / hz;
  f.alive = stat[close + 2] != 'Z';
  f.uid = st.st_uid;
  const std::string cmdline = read_small(dir + "/cmdline", 4096);
  f.argv0 = cmdline.substr(0, cmdline.find('\0'));
  return f;
}

std::string doubt_of(const Seen& seen, const ProcFacts& facts) {
  if (seen.pid <= 0 || seen.uid == uid_t(-1) || facts.hidden)
    return "";  // the kernel did not say, or /proc hides it: nothing to hold against it
  if (!facts.alive) return "its process (" + std::to_string(seen.pid) + ") is gone; another holds the name";
  if (facts.uid != seen.uid)
    return "its process " + std::to_string(seen.pid) + " belongs to another user now";
  if (!agent_process(facts))
    return "it is not an mltrain agent (its process is '" + facts.comm + "'" +
           (facts.argv0.empty() || facts.argv0 == facts.comm
                ? ""
                : ", run as '" + facts.argv0.substr(0, 200) + "'") +
           ")";
  if (facts.started_s > 0) {
    if (auto it = seen.info.find("since"); it != seen.info.end()) {
      const long long since = std::strtoll(it->second.c_str(), nullptr, 10);
      if (since < facts.started_s - kClockSkewS)
        return "it says it has held it since before its process started";
    }
    if (auto t = key_time_s(seen.name); t && *t < facts.started_s - kClockSkewS)
      return "its queue place is dated before its process started";
  }
  if (seen.answered && !seen.info.count("run")) return "it did not say which run it is";
  return "";
}

std::optional<Seen> holder(const Space& space, std::string_view name, std::chrono::milliseconds timeout) {
  auto seen = holders(space, {std::string(name)}, timeout);
  if (seen.empty()) return std::nullopt;
  return std::move(seen[0]);
}

}  // namespace mltrain::lease
