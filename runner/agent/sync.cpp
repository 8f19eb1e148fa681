// The agent's side of `[sync]`: mirroring the launcher's tree into a folder here (only what differs
// travels; each file lands whole by a rename). `[setup]` is setup.cpp's, `pull` pull.cpp's.
//
// Bookkeeping lives in <dir>/.mltrain-sync/: `index` (what the last sync wrote: path, size, mtime,
// inode, content hash, so an unchanged file is not read again, and a file the job wrote itself is
// never deleted) and one work folder per sync in progress, `tmp-<random>`, holding its temporary
// files and locked (flock on its `lock`) while that sync runs: two syncs of one folder at once
// (two runs, or hosts that share a home) never touch each other's files, and the next sync
// removes only the work folders whose sync has ended.
//
// Every path below the folder is walked from its fd one part at a time, never through a link
// (runner/tree/beneath.h): a link the job or anyone else made inside the folder cannot make a sync
// write or remove anything outside it.
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
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
#include "runner/protocol/protocol.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/beneath.h"
#include "runner/tree/hash.h"
#include "runner/tree/ignore.h"

namespace mltrain::agent::detail {

bool mkdirs(const std::string& path, mode_t mode, bool* made) {
  if (path.empty()) return true;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return S_ISDIR(st.st_mode);
  size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0 && !mkdirs(path.substr(0, slash), 0700)) return false;
  if (::mkdir(path.c_str(), mode) == 0) {
    if (made) *made = true;
    return true;
  }
  return errno == EEXIST;
}

namespace {

using sync::canonical;
using sync::hex;
using sync::mtime_ns;
using sync::to_timespec;

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// Why a path below the folder could not be walked: a part that is a link or not a folder.
std::string walk_text(const std::string& what, const std::string& rel) {
  if (errno == ELOOP || errno == ENOTDIR)
    return what + " " + rel + ": a folder on its way is a link or a file here (not followed)";
  return errno_text(what, rel);
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

std::string hash_fd(int fd) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<char> buf(1 << 20);
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) XXH3_128bits_update(st, buf.data(), size_t(n));
  std::string h = n < 0 ? std::string() : canonical(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  return h;
}

// Whether what lies at a path is what the index says an earlier sync put there.
bool is_kind(char kind, const struct stat& st) {
  return kind == 'd' ? S_ISDIR(st.st_mode) : kind == 'l' ? S_ISLNK(st.st_mode) : S_ISREG(st.st_mode);
}

// What a sync's folder must be: ours, and private when it is mltrain's own (the default
// ~/.cache/mltrain/work/<name>) or was made now: the spec, with any secret in [run.env], travels
// in it.
std::string check_root(int root, const std::string& dir, bool made, const std::string& cache) {
  struct stat st {};
  if (::fstat(root, &st) != 0) return errno_text("cannot read", dir);
  if (st.st_uid != ::getuid())
    return "the sync folder " + dir + " belongs to another user (uid " + std::to_string(st.st_uid) +
           "); give [sync] remote_dir a folder of your own";
  if ((st.st_mode & 077) && (made || dir.compare(0, cache.size(), cache) == 0) && ::fchmod(root, 0700) != 0)
    return errno_text("cannot make private", dir);
  return {};
}

}  // namespace

// ---- the index of what the last sync wrote ----

void Agent::load_sync_index() {
  sync_.index.clear();
  int fd = ::openat(sync_.state.get(), "index", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  FILE* f = fd >= 0 ? ::fdopen(fd, "r") : nullptr;
  if (!f) {
    if (fd >= 0) ::close(fd);
    return;
  }
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

// Written in this sync's work folder, then renamed over the last one: whole or not at all.
bool Agent::save_sync_index() {
  int fd = ::openat(sync_.work.fd(), "index", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  FILE* f = fd >= 0 ? ::fdopen(fd, "w") : nullptr;
  if (!f) {
    if (fd >= 0) ::close(fd);
    return false;
  }
  for (const auto& [path, e] : sync_.index) {
    if (path.find('\n') != std::string::npos) continue;
    std::fprintf(f, "%c %s %llu %lld %llu %s\n", e.kind, e.hash.empty() ? "-" : hex(e.hash).c_str(),
                 (unsigned long long)e.size, (long long)e.mtime_ns, (unsigned long long)e.ino, path.c_str());
  }
  bool ok = std::fflush(f) == 0 && !std::ferror(f);
  ok = std::fclose(f) == 0 && ok;
  return ok && ::renameat(sync_.work.fd(), "index", sync_.state.get(), "index") == 0;
}

// ---- the manifest: what to remove, make, fix and ask for ----

// Makes room at `leaf` of `parent` for a file or link: a folder there goes only when it is empty
// (an earlier sync's folder whose files were removed); one holding what the job wrote stays, and
// the entry is not written ("" when there is room).
static std::string make_room(int parent, const std::string& leaf, const std::string& rel) {
  struct stat st {};
  if (::fstatat(parent, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return {};
  if (::unlinkat(parent, leaf.c_str(), AT_REMOVEDIR) == 0) return {};
  if (errno != ENOTEMPTY && errno != EEXIST) return errno_text("cannot remove the folder", rel);
  std::string inside;
  if (int fd = ::openat(parent, leaf.c_str(), kDirFlags); fd >= 0) {
    if (DIR* d = ::fdopendir(fd)) {
      while (dirent* e = ::readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) {
          inside = rel + "/" + e->d_name;
          break;
        }
      ::closedir(d);
    } else {
      ::close(fd);
    }
  }
  return rel + " is a file in your folder, but here it is a folder holding what the job wrote (" + inside +
         "); it was kept and the file not written: move it away on the host, or rename the file";
}

// The sync's folder, its .mltrain-sync and this sync's work folder; false when one cannot be
// made (said in `out`, and the data that follows is ignored).
bool Agent::open_sync_folder(const std::string& asked, msg::SyncWant& out) {
  auto fail = [&](const std::string& why) {
    out.problems.push_back(why);
    sync_.failed = true;
    send(out);
    return false;
  };
  if (sync_.dir.empty() || sync_.dir[0] != '/')
    return fail("the sync folder '" + asked + "' is not absolute");
  bool made = false;
  if (!mkdirs(sync_.dir, 0700, &made)) return fail(errno_text("cannot make the sync folder", sync_.dir));
  sync_.root.reset(::open(sync_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!sync_.root) return fail(errno_text("cannot open the sync folder", sync_.dir));
  if (std::string why = check_root(sync_.root.get(), sync_.dir, made, expand_home("~/.cache/mltrain/"));
      !why.empty())
    return fail(why);
  const int root = sync_.root.get();
  if (::mkdirat(root, kState, 0700) != 0 && errno != EEXIST)
    return fail(errno_text("cannot make", sync_.dir + "/" + kState));
  sync_.state.reset(::openat(root, kState, kDirFlags));
  if (!sync_.state) return fail(walk_text("cannot open", sync_.dir + "/" + kState));
  const int state = sync_.state.get();
  // Work folders of syncs that ended (cut short: a lost link, kill -9), and older agents'
  // temporary files; one whose sync still runs holds its lock and stays.
  sync::sweep_work_folders(state, "tmp-");
  if (!sync_.work.make(state, "tmp-"))
    return fail(errno_text("cannot make the sync's work folder in", sync_.dir + "/" + kState));
  return true;
}

// The folder asked for, or when an older run still uses it, the first "<it>@N" no older run uses;
// held for this run (shared: its agents on hosts sharing the home hold it together) until the
// agent ends. Without a run id (an older launcher), the folder asked for.
bool Agent::choose_sync_folder(const std::string& asked, const std::string& run, msg::SyncWant& out) {
  constexpr uint32_t kCopies = 16;
  const std::string base = sync_.dir;
  for (uint32_t copy = 0;; ++copy) {
    sync_.dir = copy == 0 ? base : base + "@" + std::to_string(copy + 1);
    if (!open_sync_folder(asked, out)) return false;
    if (run.empty()) return true;
    sync::Fd held(hold_in_use(sync_.state.get(), run));
    const std::string older = used_by_older(sync_.state.get(), run);
    if (older.empty() || copy + 1 == kCopies) {
      in_use_ = std::move(held);
      sync_.copy = copy == 0 ? 0 : copy + 1;
      break;
    }
    sync_.work = sync::WorkFolder();  // this one is left to the run that uses it
  }
  if (sync_.copy == 0) return true;
  // Unchanged files come from the folder the older run has, as hard links (link_from_base).
  sync_.base_root.reset(::open(base.c_str(), kDirFlags));
  if (sync::Fd state{sync_.base_root ? ::openat(sync_.base_root.get(), kState, kDirFlags) : -1}) {
    std::swap(sync_.state, state);
    load_sync_index();
    sync_.base_index = std::move(sync_.index);
    sync_.index.clear();
    std::swap(sync_.state, state);
  }
  return true;
}

// What an earlier sync wrote and the launcher no longer has goes; what the job wrote stays.
void Agent::remove_gone_entries(msg::SyncWant& out) {
  std::set<std::string> wanted_paths;
  for (const auto& e : sync_.entries) wanted_paths.insert(e.path);
  std::vector<std::pair<std::string, char>> gone;
  for (const auto& [path, e] : sync_.index)
    if (!wanted_paths.count(path)) gone.emplace_back(path, e.kind);
  std::sort(gone.rbegin(), gone.rend());  // a folder's contents before the folder
  for (const auto& [path, kind] : gone) {
    sync_.index.erase(path);
    std::string leaf;
    sync::Fd parent(sync::open_parent(sync_.root.get(), path, leaf));
    struct stat st {};
    if (!parent || ::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!is_kind(kind, st)) continue;  // the job put something else there: not ours to remove
    // A folder is kept when the job put files in it.
    if (::unlinkat(parent.get(), leaf.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) == 0) ++out.deleted;
  }
}

// Entry `i` of the manifest: a folder made, a link made, a file kept (its mode and time fixed)
// when its content is the same, else its bytes wanted.
void Agent::place_entry(size_t i, msg::SyncWant& out) {
  const SyncEntry& e = sync_.entries[i];
  if (!sync::is_below(e.path)) {  // "..", "." or a link on the way would let a path leave the folder
    out.problems.push_back("refused the path '" + e.path + "'");
    return;
  }
  std::string leaf;
  sync::Fd parent(sync::open_parent(sync_.root.get(), e.path, leaf, true));
  if (!parent) {
    sync_.problems.push_back(walk_text("cannot write", e.path));
    return;
  }
  const int p = parent.get();
  struct stat st {};
  bool exists = ::fstatat(p, leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
  auto it = sync_.index.find(e.path);
  const bool ours = it != sync_.index.end() && exists && is_kind(it->second.kind, st);
  if (e.kind == SyncEntry::dir) {
    if (exists && !S_ISDIR(st.st_mode)) {
      if (!ours) {  // a file (or link) someone made where your folder has a folder: it stays
        sync_.problems.push_back(
            S_ISLNK(st.st_mode)
                ? e.path +
                      " is a folder in your folder, but here it is a link (not followed: mltrain made no "
                      "link there); it was kept: remove it on the host, or rename the folder"
                : e.path +
                      " is a folder in your folder, but here it is a file the job wrote; "
                      "it was kept: move it away on the host, or rename the folder");
        return;
      }
      ::unlinkat(p, leaf.c_str(), 0), exists = false;
    }
    if (!exists && ::mkdirat(p, leaf.c_str(), 0700) != 0 && errno != EEXIST)
      sync_.problems.push_back(errno_text("cannot make", e.path));
    sync_.index[e.path] = SyncIndexEntry{'d', {}, 0, 0, 0};
    return;
  }
  if (exists && S_ISDIR(st.st_mode)) {
    if (std::string why = make_room(p, leaf, e.path); !why.empty()) {
      sync_.problems.push_back(why);
      return;
    }
    exists = false;
  }
  if (e.kind == SyncEntry::symlink) {
    char buf[4096];
    ssize_t n = exists && S_ISLNK(st.st_mode) ? ::readlinkat(p, leaf.c_str(), buf, sizeof buf) : -1;
    if (n < 0 || std::string(buf, size_t(n)) != e.target) {
      const std::string tmp = "l-" + std::to_string(i);
      if (::symlinkat(e.target.c_str(), sync_.work.fd(), tmp.c_str()) != 0 ||
          ::renameat(sync_.work.fd(), tmp.c_str(), p, leaf.c_str()) != 0)
        out.problems.push_back(errno_text("cannot make the link", e.path));
    }
    sync_.index[e.path] = SyncIndexEntry{'l', {}, 0, 0, 0};
    return;
  }
  // A file: the same content (by the index when size, time and inode match, else by reading
  // it), then only its mode and time are fixed; else its bytes are wanted.
  sync::Fd fd;
  if (exists && S_ISREG(st.st_mode) && uint64_t(st.st_size) == e.size)
    fd.reset(::openat(p, leaf.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  bool same = false;
  if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) {
    std::string h;
    if (ours && it->second.kind == 'f' && it->second.size == e.size && it->second.mtime_ns == mtime_ns(st) &&
        it->second.ino == uint64_t(st.st_ino))
      h = it->second.hash;
    else
      h = hash_fd(fd.get());
    same = h == e.hash;
  }
  if (!same && link_from_base(i, p, leaf)) return;
  if (!same) {
    out.want.push_back(int32_t(i));
    ++sync_.pending;
    return;
  }
  if ((st.st_mode & 07777) != e.mode) ::fchmod(fd.get(), e.mode);
  if (mtime_ns(st) != e.mtime_ns) {
    timespec ts[2] = {to_timespec(e.mtime_ns), to_timespec(e.mtime_ns)};
    ::futimens(fd.get(), ts);
  }
  sync_.index[e.path] = SyncIndexEntry{'f', e.hash, e.size, e.mtime_ns, uint64_t(st.st_ino)};
}

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
  if (!choose_sync_folder(m.dir, m.run_key, out)) return;
  out.dir = sync_.dir;
  out.copy = sync_.copy;
  load_sync_index();
  remove_gone_entries(out);
  for (size_t i = 0; i < sync_.entries.size(); ++i) place_entry(i, out);
  send(out);
}

void Agent::finish_file(uint32_t index, SyncOpen& f) {
  const SyncEntry& e = sync_.entries[index];
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
    sync_.problems.push_back(errno_text("cannot write", e.path));
    ok = false;
  }
  f.fd = -1;
  if (ok) {
    std::string leaf;
    sync::Fd parent(sync::open_parent(sync_.root.get(), e.path, leaf, true));
    std::string why = parent ? make_room(parent.get(), leaf, e.path) : walk_text("cannot write", e.path);
    if (why.empty() && ::renameat(sync_.work.fd(), f.tmp.c_str(), parent.get(), leaf.c_str()) != 0)
      why = errno_text("cannot rename into place", e.path);
    if (!why.empty()) {
      sync_.problems.push_back(why);
      ok = false;
    }
  }
  if (!ok) {
    ::unlinkat(sync_.work.fd(), f.tmp.c_str(), 0);
    sync_.index.erase(e.path);
  } else {
    sync_.index[e.path] = SyncIndexEntry{'f', e.hash, e.size, e.mtime_ns, uint64_t(st.st_ino)};
    ++sync_.files;
  }
}

// Every chunk counts as handled, written or refused: the launcher sends more as these come back.
void Agent::on(uint32_t id, msg::SyncData& m) {
  write_sync_data(id, m);
  sync_.handled += m.raw_size;
  if (sync_.handled - sync_.said >= msg::kSyncWrittenEvery) {
    sync_.said = sync_.handled;
    send(msg::SyncWritten{sync_.handled});
  }
}

void Agent::write_sync_data(uint32_t id, msg::SyncData& m) {
  if (sync_.failed || id >= sync_.entries.size() || !sync_.work) return;
  const SyncEntry& e = sync_.entries[id];
  auto it = sync_.open.find(id);
  if (it == sync_.open.end()) {
    if (m.offset != 0 || sync_.broken.count(id)) return;
    SyncOpen f;
    f.tmp = "f-" + std::to_string(id);
    f.fd =
        ::openat(sync_.work.fd(), f.tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (f.fd < 0) {
      sync_.problems.push_back(errno_text("cannot write", e.path + " (in " + sync_.dir + "/" + kState + ")"));
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
      ::unlinkat(sync_.work.fd(), f.tmp.c_str(), 0);
      sync_.broken.insert(id);
    }
    XXH3_freeState(static_cast<XXH3_state_t*>(f.hash));
    sync_.open.erase(it);
  }
}

void Agent::close_sync_files() {
  for (auto& [id, f] : sync_.open) {
    ::close(f.fd);
    XXH3_freeState(static_cast<XXH3_state_t*>(f.hash));
  }
  sync_.open.clear();
}

void Agent::on(uint32_t, const msg::SyncEnd&) {
  msg::SyncDone out;
  for (const auto& [id, f] : sync_.open)
    sync_.problems.push_back(sync_.entries[id].path + " did not arrive whole");
  close_sync_files();
  if (!sync_.failed && sync_.root) {
    // Folder modes last (a read-only folder would have refused its files), deepest first.
    for (size_t i = sync_.entries.size(); i-- > 0;) {
      const SyncEntry& e = sync_.entries[i];
      if (e.kind != SyncEntry::dir || !sync::is_below(e.path)) continue;
      std::string leaf;
      sync::Fd parent(sync::open_parent(sync_.root.get(), e.path, leaf));
      sync::Fd dir(parent ? ::openat(parent.get(), leaf.c_str(), kDirFlags) : -1);
      if (dir) ::fchmod(dir.get(), e.mode);
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

}  // namespace mltrain::agent::detail
