#include "runner/sync/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/hash.h"
#include "runner/tree/ignore.h"

namespace mltrain::sync {

namespace {

constexpr size_t kCacheBytes = 64u << 20;

[[noreturn]] void unreadable(const std::string& path, const char* what) {
  throw Error("sync: cannot " + std::string(what) + " " + path + ": " + std::strerror(errno),
              "fix its permissions, or leave it out with [sync] exclude or a .mltrainignore line");
}

std::string file_hash(const std::string& path, uint64_t size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) unreadable(path, "read");
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  std::vector<char> buf(1 << 20);
  uint64_t got = 0;
  ssize_t n;
  while ((n = ::read(fd, buf.data(), buf.size())) > 0) {
    XXH3_128bits_update(st, buf.data(), size_t(n));
    got += uint64_t(n);
  }
  int e = errno;
  ::close(fd);
  std::string h = canonical(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  if (n < 0) {
    errno = e;
    unreadable(path, "read");
  }
  if (got != size)
    throw Error("sync: " + path + " changed while it was read", "run again once it stops changing");
  return h;
}

// A file's bytes, up to `limit` (and a read's worth more); "" when it cannot be read.
std::string read_file(const std::string& path, size_t limit) {
  std::string s;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[65536];
  ssize_t n;
  while (s.size() < limit && (n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, size_t(n));
  ::close(fd);
  return s;
}

// The hashes of the last listing, by local path: (inode, size, mtime, ctime) -> hash.
struct HashCache {
  struct Key {
    uint64_t ino = 0, size = 0;
    int64_t mtime = 0, ctime = 0;
    bool operator==(const Key&) const = default;
  };
  std::map<std::string, std::pair<Key, std::string>> entries, used;

  static Key key_of(const struct stat& st) {
    return {uint64_t(st.st_ino), uint64_t(st.st_size), mtime_ns(st),
            int64_t(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec};
  }

  void load(const std::string& file) {
    std::string text = read_file(file, SIZE_MAX);
    agent::Reader r(text);
    uint32_t n = r.u32();
    for (uint32_t i = 0; i < n && !r.failed(); ++i) {
      std::string path = r.str();
      Key k;
      k.ino = r.u64(), k.size = r.u64(), k.mtime = int64_t(r.u64()), k.ctime = int64_t(r.u64());
      std::string h = r.str();
      if (!r.failed()) entries[path] = {k, h};
    }
  }

  void save(const std::string& file) const {
    agent::Writer w;
    w.u32(uint32_t(used.size()));
    for (const auto& [path, v] : used)
      w.str(path)
          .u64(v.first.ino)
          .u64(v.first.size)
          .u64(uint64_t(v.first.mtime))
          .u64(uint64_t(v.first.ctime))
          .str(v.second);
    std::string error;  // only a cache: what is not written, the next listing reads from the files
    (void)write_atomically(AT_FDCWD, file, w.take(), 0600, false, error);
  }
};

class Builder {
 public:
  Builder(const TreeOptions& o, Tree& t) : o_(o), t_(t) {
    for (const auto& e : o.exclude) user_.add(e);
    if (!o.cache_file.empty()) cache_.load(o.cache_file);
  }
  ~Builder() {
    if (!o_.cache_file.empty()) cache_.save(o_.cache_file);
  }

  void run() {
    t_.root = o_.root;
    struct stat st {};
    if (::stat(o_.root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
      throw Error("sync: the folder to sync, " + o_.root + ", is not a folder", "set [sync] src");
    std::vector<std::string> listed;
    if (git_list(listed)) {
      t_.git = true;
      for (const auto& p : listed) add_listed(p);
    } else {
      walk("", o_.root, /*honour_gitignore=*/true);
    }
    for (const auto& x : o_.files) add_extra(x);
    hash_unhashed();
    finish();
  }

 private:
  // git ls-files: tracked plus untracked-but-not-ignored, relative to the root.
  bool git_list(std::vector<std::string>& out) {
    std::string q = text::shell_quote(o_.root);
    std::string top = run("git -C " + q + " rev-parse --is-inside-work-tree 2>/dev/null");
    if (text::trim(top) != "true") return false;
    std::string z = run("git -C " + q + " ls-files -z --cached --others --exclude-standard 2>/dev/null");
    std::set<std::string> seen;
    for (size_t i = 0; i < z.size();) {
      size_t end = z.find('\0', i);
      if (end == std::string::npos) end = z.size();
      std::string p = z.substr(i, end - i);
      while (!p.empty() && p.back() == '/') p.pop_back();  // an untracked repository: "sub/"
      if (!p.empty() && seen.insert(p).second) out.push_back(p);
      i = end + 1;
    }
    return true;
  }

  static std::string run(const std::string& cmd) {
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return out;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    ::pclose(p);
    return out;
  }

  // .mltrainignore files of every folder on the way to `rel` (loaded once each).
  // The root's first: a deeper folder's rules come later and win, whatever git lists first.
  void load_ignores_for(const std::string& rel) {
    load_dir_rules("", false);
    for (size_t slash = rel.find('/'); slash != std::string::npos; slash = rel.find('/', slash + 1))
      load_dir_rules(rel.substr(0, slash), false);
  }

  void load_dir_rules(const std::string& rel_dir, bool gitignore) {
    if (!loaded_.insert(rel_dir + (gitignore ? "\1g" : "\1m")).second) return;
    std::string base = rel_dir.empty() ? o_.root : o_.root + "/" + rel_dir;
    if (gitignore) gitignore_.add_text(read_file(base + "/.gitignore", 4u << 20), rel_dir);
    rules_.add_text(read_file(base + "/.mltrainignore", 4u << 20), rel_dir);
  }

  bool skipped(const std::string& rel, bool is_dir) {
    std::string first = rel.substr(0, rel.find('/'));
    if (first == ".git" || first == kStateDir) return true;
    if (rel.size() >= 5 && rel.compare(rel.size() - 5, 5, "/.git") == 0) return true;
    // .gitignore rules apart: a nested `!x` there must not bring back what .mltrainignore leaves out.
    return gitignore_.excluded_with_parents(rel, is_dir) || rules_.excluded_with_parents(rel, is_dir) ||
           user_.excluded_with_parents(rel, is_dir);
  }

  void add_listed(const std::string& rel) {
    load_ignores_for(rel);
    std::string full = o_.root + "/" + rel;
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0) return;  // tracked but deleted in the work tree
    if (skipped(rel, S_ISDIR(st.st_mode))) return;
    if (S_ISDIR(st.st_mode)) {  // a submodule: its files as they are
      add_parents(rel);
      add(rel, full, st);
      walk(rel, full, true);
      return;
    }
    add_parents(rel);
    add(rel, full, st);
  }

  void walk(const std::string& rel_dir, const std::string& dir, bool honour_gitignore) {
    if (honour_gitignore) load_dir_rules(rel_dir, true);
    DIR* d = ::opendir(dir.c_str());
    if (!d) unreadable(dir, "list");
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    for (const auto& name : names) {
      std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
      std::string full = dir + "/" + name;
      struct stat st {};
      if (::lstat(full.c_str(), &st) != 0) continue;
      if (skipped(rel, S_ISDIR(st.st_mode))) continue;
      if (!add(rel, full, st)) continue;
      if (S_ISDIR(st.st_mode)) walk(rel, full, honour_gitignore);
    }
  }

  void add_parents(const std::string& rel) {
    for (size_t i = rel.find('/'); i != std::string::npos; i = rel.find('/', i + 1)) {
      std::string p = rel.substr(0, i);
      if (index_.count(p)) continue;
      struct stat st {};
      std::string full = o_.root + "/" + p;
      if (::stat(full.c_str(), &st) != 0) st.st_mode = S_IFDIR | 0755;
      st.st_mode = S_IFDIR | (st.st_mode & 07777);
      add(p, full, st);
    }
  }

  // Adds (or replaces) one entry; false for what is not synced (sockets, devices, fifos).
  bool add(const std::string& rel, const std::string& full, const struct stat& st) {
    if (o_.max_entries && t_.entries.size() >= o_.max_entries)
      throw TooLarge("it holds more than " + std::to_string(o_.max_entries) + " files and folders");
    if (S_ISREG(st.st_mode) && o_.max_bytes && (listed_bytes_ += uint64_t(st.st_size)) > o_.max_bytes)
      throw TooLarge("its files hold more than " + std::to_string(o_.max_bytes >> 20) + " MiB");
    agent::SyncEntry e;
    e.path = rel;
    e.mode = st.st_mode & 07777;
    e.mtime_ns = mtime_ns(st);
    if (S_ISREG(st.st_mode)) {
      e.kind = agent::SyncEntry::file;
      e.size = uint64_t(st.st_size);
      HashCache::Key k = HashCache::key_of(st);
      auto c = cache_.entries.find(full);
      if (c != cache_.entries.end() && c->second.first == k) {
        e.hash = c->second.second;
        if (!o_.cache_file.empty()) cache_.used[full] = {k, e.hash};
      } else {
        unhashed_.emplace_back(rel, k);  // read once the listing is whole (and within its limits)
      }
    } else if (S_ISDIR(st.st_mode)) {
      e.kind = agent::SyncEntry::dir;
    } else if (S_ISLNK(st.st_mode)) {
      e.kind = agent::SyncEntry::symlink;
      std::vector<char> buf(size_t(st.st_size) + 2 > 4096 ? size_t(st.st_size) + 2 : 4096);
      ssize_t n = ::readlink(full.c_str(), buf.data(), buf.size());
      if (n < 0) unreadable(full, "read the link");
      e.target.assign(buf.data(), size_t(n));
    } else {
      return false;
    }
    auto it = index_.find(rel);
    if (it != index_.end()) {
      t_.entries[it->second] = std::move(e);
      t_.sources[it->second] = full;
    } else {
      index_[rel] = t_.entries.size();
      t_.entries.push_back(std::move(e));
      t_.sources.push_back(full);
    }
    return true;
  }

  void add_extra(const TreeOptions::Extra& x) {
    std::string dst = x.dst;
    while (!dst.empty() && dst.back() == '/') dst.pop_back();
    struct stat st {};
    if (::stat(x.src.c_str(), &st) != 0)
      throw Error(x.origin + ": [[sync.files]] src " + x.src + ": " + std::strerror(errno),
                  "give a file or folder that exists on this machine");
    add_parents(dst);
    if (!S_ISDIR(st.st_mode)) {
      if (!add(dst, x.src, st)) throw Error(x.origin + ": " + x.src + " is not a file or folder");
      return;
    }
    add(dst, x.src, st);
    extra_walk(dst, x.src);
  }

  void extra_walk(const std::string& rel_dir, const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) unreadable(dir, "list");
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0)
        names.emplace_back(e->d_name);
    ::closedir(d);
    for (const auto& name : names) {
      std::string full = dir + "/" + name, rel = rel_dir + "/" + name;
      struct stat st {};
      if (::lstat(full.c_str(), &st) != 0) continue;
      if (add(rel, full, st) && S_ISDIR(st.st_mode)) extra_walk(rel, full);
    }
  }

  // The files the cache did not know, read now that the listing is complete.
  void hash_unhashed() {
    for (const auto& [rel, key] : unhashed_) {
      const size_t i = index_.at(rel);
      auto& e = t_.entries[i];
      if (e.kind != agent::SyncEntry::file || !e.hash.empty()) continue;  // replaced since
      e.hash = file_hash(t_.sources[i], e.size);
      if (!o_.cache_file.empty()) cache_.used[t_.sources[i]] = {key, e.hash};
    }
  }

  void finish() {
    std::vector<size_t> order(t_.entries.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return t_.entries[a].path < t_.entries[b].path; });
    std::vector<agent::SyncEntry> entries;
    std::vector<std::string> sources;
    XXH3_state_t* st = XXH3_createState();
    XXH3_128bits_reset(st);
    for (size_t i : order) {
      auto& e = t_.entries[i];
      if (e.kind == agent::SyncEntry::file) {
        t_.bytes += e.size;
        ++t_.files;
      }
      agent::Writer w;
      w.str(e.path).u32(e.kind).u32(e.mode).str(e.hash).str(e.target);
      std::string b = w.take();
      XXH3_128bits_update(st, b.data(), b.size());
      entries.push_back(std::move(e));
      sources.push_back(std::move(t_.sources[i]));
    }
    std::string d = canonical(XXH3_128bits_digest(st));
    XXH3_freeState(st);
    t_.digest = hex(d);
    t_.entries = std::move(entries);
    t_.sources = std::move(sources);
  }

  const TreeOptions& o_;
  Tree& t_;
  Rules gitignore_, rules_, user_;  // .gitignore (without git), .mltrainignore, [sync] exclude
  std::set<std::string> loaded_;
  std::map<std::string, size_t> index_;
  HashCache cache_;
  uint64_t listed_bytes_ = 0;
  std::vector<std::pair<std::string, HashCache::Key>> unhashed_;
};

}  // namespace

Tree build_tree(const TreeOptions& o) {
  Tree t;
  Builder(o, t).run();
  return t;
}

std::string digest_of(const Tree& t, const std::vector<std::string>& patterns, size_t* matched) {
  Rules rules;  // a path "excluded" by these rules is one matched
  for (const auto& p : patterns) rules.add(p);
  XXH3_state_t* st = XXH3_createState();
  XXH3_128bits_reset(st);
  size_t n = 0;
  for (const auto& e : t.entries) {
    if (!rules.excluded_with_parents(e.path, e.kind == agent::SyncEntry::dir)) continue;
    agent::Writer w;
    w.str(e.path).u32(e.kind).u32(e.mode).str(e.hash).str(e.target);
    std::string b = w.take();
    XXH3_128bits_update(st, b.data(), b.size());
    ++n;
  }
  std::string d = canonical(XXH3_128bits_digest(st));
  XXH3_freeState(st);
  if (matched) *matched = n;
  return hex(d);
}

std::string hash_hex(std::string_view bytes) {
  std::string c = canonical(XXH3_128bits(bytes.data(), bytes.size()));
  return hex(c);
}

Chunks::Chunks(const Tree& t) : tree_(t), cctx_(ZSTD_createCCtx()), incompressible_(t.entries.size(), 0) {}

Chunks::~Chunks() { ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(cctx_)); }

std::shared_ptr<const agent::msg::SyncData> Chunks::get(size_t index, uint64_t offset) {
  auto key = std::make_pair(index, offset);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  const auto& e = tree_.entries[index];
  const std::string& path = tree_.sources[index];
  uint64_t want = std::min<uint64_t>(agent::msg::kSyncChunk, e.size > offset ? e.size - offset : 0);
  std::string raw(want, '\0');
  if (want > 0) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) unreadable(path, "read");
    size_t got = 0;
    while (got < want) {
      ssize_t n = ::pread(fd, raw.data() + got, want - got, off_t(offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += size_t(n);
    }
    ::close(fd);
    if (got != want)
      throw Error("sync: " + path + " changed while it was sent (now shorter than " + std::to_string(e.size) +
                      " bytes)",
                  "run again once it stops changing");
  }
  auto d = std::make_shared<agent::msg::SyncData>();
  d->offset = offset;
  d->raw_size = uint32_t(want);
  if (want >= 512 && !incompressible_[index]) {
    std::string z(ZSTD_compressBound(want), '\0');
    size_t n = ZSTD_compressCCtx(static_cast<ZSTD_CCtx*>(cctx_), z.data(), z.size(), raw.data(), want, 1);
    if (!ZSTD_isError(n) && n < want - want / 20) {
      z.resize(n);
      d->bytes = std::move(z);
      d->compressed = 1;
    } else {
      incompressible_[index] = 1;
    }
  }
  if (!d->compressed) d->bytes = std::move(raw);
  cache_[key] = d;
  order_.push_back(key);
  cached_bytes_ += d->bytes.size();
  while (cached_bytes_ > kCacheBytes && !order_.empty()) {
    auto old = cache_.find(order_.front());
    cached_bytes_ -= old->second->bytes.size();
    cache_.erase(old);
    order_.pop_front();
  }
  return d;
}

}  // namespace mltrain::sync
