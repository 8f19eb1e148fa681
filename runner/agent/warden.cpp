// The warden: what kills a job's processes on a host when its agent is killed outright.
//
// While the agent lives, its own sweep (Agent::kill_orphans) kills everything below it: as a child
// subreaper it inherits every orphan of its ranks. A SIGKILLed agent sweeps nothing; its ranks'
// leaders die with it (PR_SET_PDEATHSIG), but their descendants are handed to init. So before the
// first rank starts, the agent forks a warden: a process outside every rank's tree, holding only
// the read end of a pipe whose write end only the agent holds. When the agent is gone, however it
// went, the read returns 0, and the warden kills every process of this user on this host that
// carries the job's run id in its environment (every rank does, and every descendant that kept its
// environment), sweep after sweep until none is found (after an ordinary end it finds nothing), then
// removes the job's shared memory segments from /dev/shm and the agent's private folder.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "runner/agent/detail/agent_impl.h"

namespace mltrain::agent::detail {

namespace {

// True when /proc/PID/environ holds `marker` as one whole NUL-terminated entry.
bool environ_has(const char* pid, const std::string& marker) {
  char path[300];
  std::snprintf(path, sizeof path, "/proc/%s/environ", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // Entries may straddle reads: keep the unfinished tail of the last one.
  std::string entry;
  char buf[16 * 1024];
  bool found = false;
  ssize_t n;
  while (!found && (n = ::read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\0') {
        if (entry.size() <= marker.size()) entry.push_back(buf[i]);
        continue;
      }
      if (entry == marker) {
        found = true;
        break;
      }
      entry.clear();
    }
  }
  ::close(fd);
  return found;
}

// The network namespace a process is in ("net:[4026531840]"), "" when it cannot be read.
std::string netns_of(const char* pid) {
  char path[300], link[128];
  std::snprintf(path, sizeof path, "/proc/%s/ns/net", pid);
  const ssize_t n = ::readlink(path, link, sizeof link - 1);
  return n > 0 ? std::string(link, size_t(n)) : std::string();
}

// Kills this user's processes that carry `marker` on this host; returns how many it found. A
// process in another network namespace is another host's, where several hosts share one process
// table (containers of one machine, the test cluster): the ranks of its agent, alive there. One
// whose namespace cannot be read counts as this host's.
int sweep(const std::string& marker) {
  DIR* d = ::opendir("/proc");
  if (!d) return 0;
  const uid_t uid = ::getuid();
  const pid_t self = ::getpid();
  const std::string here = netns_of("self");
  int found = 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    if (std::atoi(e->d_name) == self) continue;
    struct stat st;
    char path[300];
    std::snprintf(path, sizeof path, "/proc/%s", e->d_name);
    if (::stat(path, &st) != 0 || st.st_uid != uid) continue;
    if (!environ_has(e->d_name, marker)) continue;
    if (const std::string ns = netns_of(e->d_name); !here.empty() && !ns.empty() && ns != here) continue;
    ++found;
    ::kill(pid_t(std::atoi(e->d_name)), SIGKILL);
  }
  ::closedir(d);
  return found;
}

// Removes this user's /dev/shm entries of the job: the comm library names its segments
// /mltrain-<run id>-… (run id with characters other than [A-Za-z0-9._-] as '_', at most 100), and
// a killed rank leaves the ones its peers had not mapped yet.
void remove_shm(const std::string& run_id) {
  std::string prefix = "mltrain-";
  for (char c : run_id.substr(0, 100))
    prefix += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                      c == '_' || c == '.'
                  ? c
                  : '_';
  prefix += '-';
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  const uid_t uid = ::getuid();
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && st.st_uid == uid &&
        S_ISREG(st.st_mode))
      (void)::unlinkat(::dirfd(d), e->d_name, 0);
  }
  ::closedir(d);
}

}  // namespace

void remove_private_dir(const std::string& dir) {
  if (dir.empty()) return;
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  const uid_t uid = ::geteuid();
  if (::fstat(fd, &st) != 0 || st.st_uid != uid) {
    ::close(fd);
    return;
  }
  if (DIR* d = ::fdopendir(fd)) {
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      struct stat est;
      if (::fstatat(fd, e->d_name, &est, AT_SYMLINK_NOFOLLOW) == 0 && est.st_uid == uid &&
          !S_ISDIR(est.st_mode))
        (void)::unlinkat(fd, e->d_name, 0);  // a link itself, never what it names
    }
    ::closedir(d);  // closes fd
  } else {
    ::close(fd);
  }
  (void)::rmdir(dir.c_str());  // fails, and stays, if a rank left a folder of its own in it
}

int start_warden(const std::string& marker, const std::string& private_dir, pid_t& warden) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    return -1;
  }
  if (pid > 0) {
    ::close(p[0]);
    warden = pid;
    return p[1];  // the agent keeps it, and never writes to it
  }
  // The warden. Nothing of the agent's stream may stay open here, or a remote agent's SSH channel
  // would not close when the agent dies; no terminal signal may reach it.
  (void)::setsid();
  for (int s = 1; s < 65; ++s) ::signal(s, SIG_DFL);
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd)
    if (null >= 0) ::dup2(null, fd);
  const int keep = p[0];
  if (DIR* fds = ::opendir("/proc/self/fd")) {
    int dfd = ::dirfd(fds);
    while (dirent* e = ::readdir(fds)) {
      int fd = std::atoi(e->d_name);
      if (e->d_name[0] != '.' && fd > 2 && fd != keep && fd != dfd) ::close(fd);
    }
    ::closedir(fds);
  }
  char c;
  while (::read(keep, &c, 1) != 0) {
    if (errno != EINTR) break;
  }
  // A descendant may fork while it is being killed, and pids wrap (pid_max is often 32768): its
  // child can land behind the scan's cursor in /proc while the parent, exiting, no longer shows its
  // environment, so one empty sweep proves nothing. Sweep until 5 in a row, 10 ms apart, find none.
  for (int round = 0, empty = 0; round < 2000 && empty < 5; ++round) {
    empty = sweep(marker) > 0 ? 0 : empty + 1;
    ::usleep(empty > 0 || round >= 10 ? 10000 : 1000);
  }
  remove_shm(marker.substr(marker.find('=') + 1));
  remove_private_dir(private_dir);
  ::_exit(0);
}

}  // namespace mltrain::agent::detail
