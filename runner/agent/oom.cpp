#include "runner/agent/oom.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <string>

namespace mltrain::agent {

namespace {

std::optional<std::string> read_small(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[4096];
  ssize_t n;
  while (out.size() < (1u << 16) && ((n = ::read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)))
    if (n > 0) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

bool has_number_after(std::string_view s, std::string_view key, pid_t pid) {
  for (size_t at = s.find(key); at != std::string_view::npos; at = s.find(key, at + 1)) {
    const std::string_view rest = s.substr(at + key.size());
    size_t digits = rest.find_first_not_of("0123456789");
    if (digits == 0) continue;
    std::string_view num = rest.substr(0, digits);
    if (num == std::to_string(pid) && (digits == std::string_view::npos || rest[digits] == ' ' ||
                                       rest[digits] == ',' || rest[digits] == '\n'))
      return true;
  }
  return false;
}

}  // namespace

namespace detail {

std::optional<uint64_t> parse_oom_kill_count(std::string_view events) {
  for (size_t at = 0; at < events.size();) {
    size_t nl = events.find('\n', at);
    std::string_view line =
        events.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    if (line.substr(0, 9) == "oom_kill ") {
      std::string num(line.substr(9));
      char* end = nullptr;
      unsigned long long v = std::strtoull(num.c_str(), &end, 10);
      if (!num.empty() && end && *end == 0) return v;
    }
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return std::nullopt;
}

bool kmsg_record_kills(std::string_view record, pid_t pid, uint64_t since_us) {
  size_t semi = record.find(';');
  // "prio,seq,timestamp_us,flags;": a record from before the process began is not about it
  size_t c1 = record.find(','), c2 = c1 == std::string_view::npos ? c1 : record.find(',', c1 + 1);
  if (since_us > 0 && c2 != std::string_view::npos && c2 < semi) {
    std::string ts(record.substr(c2 + 1, record.find(',', c2 + 1) - c2 - 1));
    if (std::strtoull(ts.c_str(), nullptr, 10) < since_us) return false;
  }
  std::string_view text = semi == std::string_view::npos ? record : record.substr(semi + 1);
  // "Out of memory: Killed process 42 (x)", "Memory cgroup out of memory: Killed process 42 (x)"
  if (text.find("out of memory") != std::string_view::npos ||
      text.find("Out of memory") != std::string_view::npos)
    if (has_number_after(text, "Killed process ", pid)) return true;
  // "oom-kill:constraint=CONSTRAINT_MEMCG,...,task=x,pid=42,uid=1000"
  if (text.substr(0, 9) == "oom-kill:" && has_number_after(text, ",pid=", pid)) return true;
  return false;
}

std::string_view cgroup_v2_path(std::string_view proc_cgroup) {
  for (size_t at = 0; at < proc_cgroup.size();) {
    size_t nl = proc_cgroup.find('\n', at);
    std::string_view line =
        proc_cgroup.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    if (line.substr(0, 3) == "0::") return line.substr(3);
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return {};
}

}  // namespace detail

std::optional<uint64_t> cgroup_oom_kills(pid_t pid) {
  auto cg = read_small("/proc/" + std::to_string(pid) + "/cgroup");
  if (!cg) return std::nullopt;
  std::string_view path = detail::cgroup_v2_path(*cg);
  if (!path.empty() && path.find("..") == std::string_view::npos) {
    if (auto ev = read_small("/sys/fs/cgroup" + std::string(path == "/" ? "" : path) + "/memory.events"))
      return detail::parse_oom_kill_count(*ev);
  }
  return std::nullopt;
}

uint64_t monotonic_us() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000000u + uint64_t(t.tv_nsec) / 1000u;
}

std::optional<bool> kmsg_oom_killed(pid_t pid, uint64_t since_us) {
  int fd = ::open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  bool found = false, read_any = false;
  char buf[8192];  // one record per read
  for (int records = 0; records < 100000; ++records) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EPIPE) continue;  // records overwritten while read: go on with the next
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0 && errno != EAGAIN && !read_any) {  // EPERM and the like: not readable after all
        ::close(fd);
        return std::nullopt;
      }
      break;
    }
    read_any = true;
    if (detail::kmsg_record_kills(std::string_view(buf, size_t(n)), pid, since_us)) found = true;
  }
  ::close(fd);
  return found;
}

bool oom_killed(pid_t pid, uint64_t started_us, std::optional<uint64_t> kills_at_start) {
  // A second of slack: kmsg's clock and CLOCK_MONOTONIC may differ a little.
  if (auto k = kmsg_oom_killed(pid, started_us > 1000000 ? started_us - 1000000 : 0)) return *k;
  if (!kills_at_start) return false;
  auto now = cgroup_oom_kills(::getpid());  // the rank is gone: its cgroup is the agent's own
  return now && *now > *kills_at_start;
}

}  // namespace mltrain::agent
