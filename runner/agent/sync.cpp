// The agent's side of `[sync]`, `[setup]` and `pull`: mirroring the launcher's tree into a folder
// here (only what differs travels; each file lands whole by a rename), running the setup command
// when what it depends on changed, and sending files back.
//
// Bookkeeping lives in <dir>/.mltrain-sync/: `index` (what the last sync wrote: path, size, mtime,
// inode, content hash, so an unchanged file is not read again, and a file the job wrote itself is
// never deleted) and the temporary files of a sync in progress (removed by the next one).
#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/protocol.h"
#include "runner/sync/hash.h"
#include "runner/sync/ignore.h"

namespace mltrain::agent::detail {

namespace {

using sync::canonical;
using sync::hex;
using sync::mtime_ns;
using sync::to_timespec;

constexpr const char* kState = ".mltrain-sync";

std::string errno_text(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

bool unhex(const std::string& s, std::string& out) {
  if (s.size() % 2) return false;
  out.clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    auto v = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
    int a = v(s[i]), b = v(s[i + 1]);
    if (a < 0 || b < 0) return false;
    out += char(a << 4 | b);
  }
  return true;
}

std::string hash_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) XXH3_128bits_update(st, buf.data(), size_t(n));
  ::close(fd);
  std::string h = n < 0 ? std::string() : canonical(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return h;
}

bool mkdirs(const std::string& path, mode_t mode) {
  if (path.empty()) return true;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0 && !mkdirs(path.substr(0, slash), 0755)) return false;
  return ::mkdir(path.c_str(), mode) == 0 || errno == EEXIST;
}

// rm -rf of one path (not following links).
void remove_all(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
      ::closedir(d);
      for (const auto& n : names) remove_all(path + "/" + n);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

// Whether a manifest path stays inside the folder: relative, with no ".." part.
bool inside(const std::string& path) {
  if (path.empty() || path[0] == '/') return false;
  for (size_t p = 0; p <= path.size();) {
    size_t q = std::min(path.find('/', p), path.size());
    if (q - p == 2 && path.compare(p, 2, "..") == 0) return false;
    p = q + 1;
  }
  return true;
}

}  // namespace

std::string expand_home(const std::string& path) {
  if (path.empty() || path[0] != '~' || (path.size() > 1 && path[1] != '/')) return path;
  const char* home = ::getenv("HOME");
  std::string h = home && *home ? home : "";
  if (h.empty())
    if (passwd* pw = ::getpwuid(::getuid())) h = pw->pw_dir;
  return h + path.substr(1);
}

// ---- the index of what the last sync wrote ----

void Agent::load_sync_index() {
  sync_.index.clear();
  FILE* f = std::fopen((sync_.dir + "/" + kState + "/index").c_str(), "r");
  if (!f) return;
  char* line = nullptr;
  size_t cap = 0;
  ssize_t n;
  while ((n = ::getline(&line, &cap, f)) > 0) {
    // "<kind> <hash hex or -> <size> <mtime_ns> <ino> <path>"
    std::string s(line, size_t(n));
    if (!s.empty() && s.back() == '\n') s.pop_back();
    char kind = 0;
    char hash[64] = {};
    unsigned long long size = 0, ino = 0;
    long long mt = 0;
    int used = 0;
    if (std::sscanf(s.c_str(), "%c %63s %llu %lld %llu %n", &kind, hash, &size, &mt, &ino, &used) < 5 ||
        used <= 0)
      continue;
    SyncIndexEntry e;
    e.kind = kind;
    if (std::strcmp(hash, "-") != 0 && !unhex(hash, e.hash)) continue;
    e.size = size, e.mtime_ns = mt, e.ino = ino;
    sync_.index[s.substr(size_t(used))] = e;
  }
  std::free(line);
  std::fclose(f);
}

bool Agent::save_sync_index() {
  std::string tmp = sync_.dir + "/" + kState + "/index.tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) return false;
  for (const auto& [path, e] : sync_.index) {
    if (path.find('\n') != std::string::npos) continue;
    std::fprintf(f, "%c %s %llu %lld %llu %s\n", e.kind, e.hash.empty() ? "-" : hex(e.hash).c_str(),
                 (unsigned long long)e.size, (long long)e.mtime_ns, (unsigned long long)e.ino, path.c_str());
  }
  bool ok = std::fflush(f) == 0 && !std::ferror(f);
  ok = std::fclose(f) == 0 && ok;
  return ok && ::rename(tmp.c_str(), (sync_.dir + "/" + kState + "/index").c_str()) == 0;
}

// ---- the manifest: what to remove, make, fix and ask for ----

void Agent::on(uint32_t, msg::SyncManifest& m) {
  if (sync_.entries.empty() || !sync_.receiving) {
    sync_ = SyncState{};
    sync_.receiving = true;
  }
  for (auto& e : m.entries) sync_.entries.push_back(std::move(e));
  if (!m.last) return;
  sync_.receiving = false;
  sync_.dir = expand_home(m.dir);
  while (sync_.dir.size() > 1 && sync_.dir.back() == '/') sync_.dir.pop_back();
  msg::SyncWant out;
  auto fail = [&](const std::string& why) {
    out.problems.push_back(why);
    sync_.failed = true;
    send(out);
  };
  if (sync_.dir.empty() || sync_.dir[0] != '/')
    return fail("the sync folder '" + m.dir + "' is not absolute");
  if (!mkdirs(sync_.dir, 0755)) return fail(errno_text("cannot make the sync folder", sync_.dir));
  const std::string state = sync_.dir + "/" + kState;
  if (!mkdirs(state, 0700)) return fail(errno_text("cannot make", state));
  // A sync that was cut short left temporary files: they were never visible under a real name.
  if (DIR* d = ::opendir(state.c_str())) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, "tmp-", 4) == 0) ::unlink((state + "/" + e->d_name).c_str());
    ::closedir(d);
  }
  out.dir = sync_.dir;
  load_sync_index();

  std::set<std::string> wanted_paths;
  for (const auto& e : sync_.entries) wanted_paths.insert(e.path);
  // What an earlier sync wrote and the launcher no longer has goes; what the job wrote stays.
  std::vector<std::string> gone;
  for (const auto& [path, e] : sync_.index)
    if (!wanted_paths.count(path)) gone.push_back(path);
  std::sort(gone.rbegin(), gone.rend());  // a folder's contents before the folder
  for (const auto& path : gone) {
    std::string full = sync_.dir + "/" + path;
    struct stat st {};
    if (::lstat(full.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) {
        if (::rmdir(full.c_str()) == 0) ++out.deleted;  // kept when the job put files in it
      } else if (::unlink(full.c_str()) == 0) {
        ++out.deleted;
      }
    }
    sync_.index.erase(path);
  }

  for (size_t i = 0; i < sync_.entries.size(); ++i) {
    const SyncEntry& e = sync_.entries[i];
    if (!inside(e.path)) {  // ".." anywhere would let a path leave the folder
      out.problems.push_back("refused the path '" + e.path + "'");
      continue;
    }
    std::string full = sync_.dir + "/" + e.path;
    struct stat st {};
    bool exists = ::lstat(full.c_str(), &st) == 0;
    SyncIndexEntry& ix = sync_.index[e.path];
    if (e.kind == SyncEntry::dir) {
      if (exists && !S_ISDIR(st.st_mode)) ::unlink(full.c_str()), exists = false;
      if (!exists && ::mkdir(full.c_str(), 0700) != 0 && errno != EEXIST)
        out.problems.push_back(errno_text("cannot make", full));
      ix = SyncIndexEntry{'d', {}, 0, 0, 0};
      continue;
    }
    if (exists && S_ISDIR(st.st_mode)) remove_all(full), exists = false;
    if (e.kind == SyncEntry::symlink) {
      char buf[4096];
      ssize_t n = exists && S_ISLNK(st.st_mode) ? ::readlink(full.c_str(), buf, sizeof buf) : -1;
      if (n < 0 || std::string(buf, size_t(n)) != e.target) {
        std::string tmp = sync_.dir + "/" + kState + "/tmp-link-" + std::to_string(i);
        ::unlink(tmp.c_str());
        if (::symlink(e.target.c_str(), tmp.c_str()) != 0 || ::rename(tmp.c_str(), full.c_str()) != 0)
          out.problems.push_back(errno_text("cannot make the link", full));
      }
      ix = SyncIndexEntry{'l', {}, 0, 0, 0};
      continue;
    }
    // A file: the same content (by the index when size, time and inode match, else by reading
    // it), then only its mode and time are fixed; else its bytes are wanted.
    bool same = false;
    if (exists && S_ISREG(st.st_mode) && uint64_t(st.st_size) == e.size) {
      std::string h;
      if (ix.kind == 'f' && ix.size == e.size && ix.mtime_ns == mtime_ns(st) && ix.ino == uint64_t(st.st_ino))
        h = ix.hash;
      else
        h = hash_file(full);
      same = h == e.hash;
    }
    if (!same) {
      out.want.push_back(int32_t(i));
      ++sync_.pending;
      continue;
    }
    if ((st.st_mode & 07777) != e.mode) ::chmod(full.c_str(), e.mode);
    if (mtime_ns(st) != e.mtime_ns) {
      timespec ts[2] = {to_timespec(e.mtime_ns), to_timespec(e.mtime_ns)};
      ::utimensat(AT_FDCWD, full.c_str(), ts, AT_SYMLINK_NOFOLLOW);
    }
    ix = SyncIndexEntry{'f', e.hash, e.size, e.mtime_ns, uint64_t(st.st_ino)};
  }
  send(out);
}

void Agent::finish_file(uint32_t index, SyncOpen& f) {
  const SyncEntry& e = sync_.entries[index];
  std::string full = sync_.dir + "/" + e.path;
  std::string got = canonical(XXH3_128bits_digest(static_cast<XXH3_state_t*>(f.hash)));
  struct stat st {};
  bool ok = true;
  if (got != e.hash) {
    sync_.problems.push_back(e.path + " arrived damaged (its content hash differs); it was not written");
    ok = false;
  }
  if (ok) {
    ::fchmod(f.fd, e.mode);
    timespec ts[2] = {to_timespec(e.mtime_ns), to_timespec(e.mtime_ns)};
    ::futimens(f.fd, ts);
    ::fstat(f.fd, &st);
  }
  if (::close(f.fd) != 0 && ok) {
    sync_.problems.push_back(errno_text("cannot write", full));
    ok = false;
  }
  f.fd = -1;
  if (ok) {
    struct stat old {};
    if (::lstat(full.c_str(), &old) == 0 && S_ISDIR(old.st_mode)) remove_all(full);
    if (::rename(f.tmp.c_str(), full.c_str()) != 0) {
      sync_.problems.push_back(errno_text("cannot rename into place", full));
      ok = false;
    }
  }
  if (!ok) {
    ::unlink(f.tmp.c_str());
    sync_.index.erase(e.path);
  } else {
    sync_.index[e.path] = SyncIndexEntry{'f', e.hash, e.size, e.mtime_ns, uint64_t(st.st_ino)};
    ++sync_.files;
  }
}

void Agent::on(uint32_t id, msg::SyncData& m) {
  if (sync_.failed || id >= sync_.entries.size()) return;
  const SyncEntry& e = sync_.entries[id];
  auto it = sync_.open.find(id);
  if (it == sync_.open.end()) {
    if (m.offset != 0 || sync_.broken.count(id)) return;
    SyncOpen f;
    f.tmp = sync_.dir + "/" + kState + "/tmp-" + std::to_string(id);
    f.fd = ::open(f.tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    if (f.fd < 0) {
      sync_.problems.push_back(errno_text("cannot write", f.tmp));
      sync_.broken.insert(id);
      return;
    }
    auto* st = XXH3_createState();
    XXH3_128bits_reset(st);
    f.hash = st;
    it = sync_.open.emplace(id, f).first;
  }
  SyncOpen& f = it->second;
  std::string raw;
  const std::string* bytes = &m.bytes;
  if (m.compressed) {
    raw.resize(m.raw_size);
    size_t n = ZSTD_decompress(raw.data(), raw.size(), m.bytes.data(), m.bytes.size());
    if (ZSTD_isError(n) || n != m.raw_size) {
      sync_.problems.push_back(e.path + ": a damaged chunk (" + ZSTD_getErrorName(n) + ")");
      n = 0;
    }
    raw.resize(ZSTD_isError(n) ? 0 : n);
    bytes = &raw;
  }
  bool ok = m.offset == f.written;
  for (size_t done = 0; ok && done < bytes->size();) {
    ssize_t n = ::write(f.fd, bytes->data() + done, bytes->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      sync_.problems.push_back(errno_text("cannot write", e.path + " (in " + sync_.dir + ")"));
      ok = false;
      break;
    }
    done += size_t(n);
  }
  if (ok) {
    XXH3_128bits_update(static_cast<XXH3_state_t*>(f.hash), bytes->data(), bytes->size());
    f.written += bytes->size();
    sync_.bytes += bytes->size();
  }
  if (!ok || f.written >= e.size) {
    if (ok)
      finish_file(id, f);
    else {
      ::close(f.fd);
      ::unlink(f.tmp.c_str());
      sync_.broken.insert(id);
    }
    XXH3_freeState(static_cast<XXH3_state_t*>(f.hash));
    sync_.open.erase(it);
  }
}

void Agent::on(uint32_t, const msg::SyncEnd&) {
  msg::SyncDone out;
  for (auto& [id, f] : sync_.open) {
    ::close(f.fd);
    ::unlink(f.tmp.c_str());
    XXH3_freeState(static_cast<XXH3_state_t*>(f.hash));
    sync_.problems.push_back(sync_.entries[id].path + " did not arrive whole");
  }
  sync_.open.clear();
  if (!sync_.failed) {
    // Folder modes last (a read-only folder would have refused its files), deepest first.
    for (size_t i = sync_.entries.size(); i-- > 0;) {
      const SyncEntry& e = sync_.entries[i];
      if (e.kind == SyncEntry::dir) ::chmod((sync_.dir + "/" + e.path).c_str(), e.mode);
    }
    if (!save_sync_index())
      sync_.problems.push_back(errno_text("cannot save", sync_.dir + "/" + kState + "/index"));
  }
  out.files = sync_.files;
  out.bytes = sync_.bytes;
  out.problems = std::move(sync_.problems);
  sync_ = SyncState{};
  send(out);
}

// ---- setup ----

void Agent::on(uint32_t, msg::Setup& m) {
  std::string cwd = expand_home(m.cwd);
  std::string dir = expand_home("~/.cache/mltrain/setup");
  setup_stamp_ = dir + "/" + hex(canonical(XXH3_128bits(cwd.data(), cwd.size())));
  setup_key_ = m.key;
  if (!m.force) {
    FILE* f = std::fopen(setup_stamp_.c_str(), "r");
    std::string got;
    if (f) {
      char buf[512];
      size_t n = std::fread(buf, 1, sizeof buf, f);
      got.assign(buf, n);
      std::fclose(f);
    }
    if (got == m.key + "\n") {
      send(msg::SetupDone{0, 0, {}});
      return;
    }
  }
  mkdirs(dir, 0700);
  ::unlink(setup_stamp_.c_str());  // a setup that fails or is cut short runs again next time
  msg::Spawn s;
  s.cwd = cwd;
  s.argv = {"/bin/sh", "-c", m.command};
  s.env = std::move(m.env);
  setup_running_ = true;
  on(kSetupId, s);
}

void Agent::setup_exited(int status) {
  setup_running_ = false;
  if (status == 0) {
    std::string tmp = setup_stamp_ + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%s\n", setup_key_.c_str());
      if (std::fclose(f) == 0) ::rename(tmp.c_str(), setup_stamp_.c_str());
    }
  }
  send(msg::SetupDone{1, status, {}});
}

// ---- pull ----

namespace {

void collect(const std::string& root, const std::string& rel_dir, const sync::Rules& rules, bool all,
             std::vector<std::string>& out) {
  std::string dir = rel_dir.empty() ? root : root + "/" + rel_dir;
  DIR* d = ::opendir(dir.c_str());
  if (!d) {  // asked for, so listed all the same: its open says why it cannot be read, not "nothing matched"
    if (all || rel_dir.empty()) out.push_back(rel_dir);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) names.emplace_back(e->d_name);
  ::closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    std::string rel = rel_dir.empty() ? n : rel_dir + "/" + n;
    if (rel == kState) continue;
    struct stat st {};
    if (::lstat((root + "/" + rel).c_str(), &st) != 0) {
      if (all || rules.check(rel, false) == sync::Rules::excluded) out.push_back(rel);  // as above
      continue;
    }
    bool hit = all || rules.check(rel, S_ISDIR(st.st_mode)) == sync::Rules::excluded;
    if (S_ISDIR(st.st_mode))
      collect(root, rel, rules, hit, out);
    else if (S_ISREG(st.st_mode) && hit)
      out.push_back(rel);
  }
}

}  // namespace

void Agent::on(uint32_t, const msg::Pull& m) {
  pull_ = PullState{};
  pull_.active = true;
  pull_.dir = expand_home(m.dir);
  pull_.max_bytes = m.max_bytes;
  sync::Rules rules;  // a path "excluded" by these rules is one asked for
  for (const auto& p : m.patterns) rules.add(p);
  struct stat st {};
  if (::stat(pull_.dir.c_str(), &st) != 0) {
    pull_.problems.push_back(errno_text("cannot read", pull_.dir));
  } else if (!S_ISDIR(st.st_mode)) {
    pull_.files.push_back("");  // the one file the Pull names
    pull_.single_file = true;
  } else {
    collect(pull_.dir, "", rules, m.patterns.empty(), pull_.files);
  }
  pump_pull();
}

// Sends the next pieces while the outbox has room; the loop calls it again as the launcher reads.
void Agent::pump_pull() {
  while (pull_.active && outbox_.size() - outbox_pos_ < kOutboxHighWater / 2) {
    if (pull_.fd < 0) {
      if (pull_.next >= pull_.files.size() || (pull_.max_bytes && pull_.bytes >= pull_.max_bytes)) {
        if (pull_.next < pull_.files.size())
          pull_.problems.push_back(std::to_string(pull_.files.size() - pull_.next) +
                                   " files left behind: past the limit of " +
                                   std::to_string(pull_.max_bytes >> 20) + " MiB");
        send(msg::PullDone{pull_.sent, pull_.bytes, std::move(pull_.problems), pull_.single_file ? 1u : 0u});
        pull_ = PullState{};
        return;
      }
      const std::string& rel = pull_.files[pull_.next++];
      std::string full = rel.empty() ? pull_.dir : pull_.dir + "/" + rel;
      int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (fd < 0 || ::fstat(fd, &st) != 0) {
        pull_.problems.push_back(errno_text("cannot read", full));
        if (fd >= 0) ::close(fd);
        continue;
      }
      pull_.fd = fd;
      pull_.left = uint64_t(st.st_size);
      ++pull_.id;
      std::string name = rel.empty() ? pull_.dir.substr(pull_.dir.rfind('/') + 1) : rel;
      send(msg::PullFile{name, uint32_t(st.st_mode & 07777), pull_.left, mtime_ns(st)}, pull_.id);
      ++pull_.sent;
    }
    char buf[kReadChunk * 4];
    size_t want = size_t(std::min<uint64_t>(sizeof buf, pull_.left));
    ssize_t n = want ? ::read(pull_.fd, buf, want) : 0;
    if (n > 0) {
      pull_.left -= uint64_t(n);
      pull_.bytes += uint64_t(n);
      send(msg::PullData{std::string(buf, size_t(n))}, pull_.id);
    }
    if (n <= 0 || pull_.left == 0) {
      if (pull_.left > 0)  // it shrank while read: the launcher sees it short and says so
        pull_.problems.push_back(pull_.files[pull_.next - 1] + " shrank while it was read");
      ::close(pull_.fd);
      pull_.fd = -1;
    }
  }
}

}  // namespace mltrain::agent::detail
