#include "runner/records/code.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/secret.h"
#include "runner/common/state_home.h"
#include "runner/common/sys_check.h"
#include "runner/common/text.h"
#include "runner/records/records.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/hash.h"

namespace mltrain::records {

namespace {

using json = nlohmann::json;

constexpr size_t kReadChunk = 1u << 20;
constexpr size_t kMaxDiff = 16u << 20;  // code.diff beyond this is cut, and says so
constexpr size_t kMinSecret = 4;        // shorter values would withhold files by chance

// A descriptor closed when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool is_hash(std::string_view h) {
  return h.size() == 32 && std::all_of(h.begin(), h.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string objects_dir() { return code_store_dir() + "/objects"; }

// The store's lock: shared while a run keeps its code (its code.json is written first), exclusive
// while a sweep decides what no run names, so a sweep never takes a content a new run just found.
Fd lock_store(int how) {
  make_private_dirs(objects_dir());
  const std::string path = code_store_dir() + "/lock";
  Fd f(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (f.fd < 0)
    throw Error(sys_error_text("open", path, errno), "check the state folder's permissions",
                exit_code::state);
  while (::flock(f.fd, how) != 0)
    if (errno != EINTR)
      throw Error(sys_error_text("flock", path, errno), "check the state folder's permissions",
                  exit_code::state);
  return f;
}

Fd open_dir_at(int at, const char* name) {
  return Fd(::openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

// Looks for every secret in a stream of chunks, across chunk boundaries.
class SecretScan {
 public:
  explicit SecretScan(const std::vector<std::string>& secrets) {
    for (const auto& s : secrets)
      if (s.size() >= kMinSecret) secrets_.push_back(s), longest_ = std::max(longest_, s.size());
  }
  void feed(std::string_view bytes) {
    if (found_ || secrets_.empty()) return;
    carry_.append(bytes);
    for (const auto& s : secrets_)
      if (carry_.find(s) != std::string::npos) found_ = true;
    if (carry_.size() >= longest_) carry_.erase(0, carry_.size() - (longest_ - 1));
  }
  bool found() const { return found_; }

 private:
  std::vector<std::string> secrets_;
  size_t longest_ = 0;
  std::string carry_;
  bool found_ = false;
};

enum class Kept { present, stored, secret, changed, unreadable };

// Copies one file into the store as a zstd frame named by its hash, unless the store has it. The
// content must still hash as listed, and hold no secret; a temporary file is renamed in only then.
Kept keep_file(int objects, const CodeEntry& e, const std::vector<std::string>& secrets, ZSTD_CCtx* cctx,
               uint64_t& added) {
  const std::string sub = e.hash.substr(0, 2), name = e.hash.substr(2);
  if (::mkdirat(objects, sub.c_str(), 0700) != 0 && errno != EEXIST) return Kept::unreadable;
  Fd dir = open_dir_at(objects, sub.c_str());
  if (dir.fd < 0) return Kept::unreadable;
  struct stat st {};
  if (::fstatat(dir.fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return Kept::present;
  Fd in(::open(e.source.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (in.fd < 0) return Kept::unreadable;
  sync::AtomicFile out(dir.fd, name);
  if (!out.ok()) return Kept::unreadable;
  XXH3_state_t* st3 = XXH3_createState();
  XXH3_128bits_reset(st3);
  SecretScan scan(secrets);
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_only);
  std::string raw(kReadChunk, '\0'), packed(ZSTD_CStreamOutSize(), '\0');
  uint64_t total = 0, written = 0;
  bool ok = true, done = false;
  while (ok && !done) {
    ssize_t n = ::read(in.fd, raw.data(), raw.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (!ok) break;
    done = n == 0;
    total += uint64_t(n);
    XXH3_128bits_update(st3, raw.data(), size_t(n));
    scan.feed(std::string_view(raw.data(), size_t(n)));
    ZSTD_inBuffer ib{raw.data(), size_t(n), 0};
    for (bool more = true; ok && more;) {
      ZSTD_outBuffer ob{packed.data(), packed.size(), 0};
      size_t left = ZSTD_compressStream2(cctx, &ob, &ib, done ? ZSTD_e_end : ZSTD_e_continue);
      if (ZSTD_isError(left)) ok = false;
      if (ob.pos > 0 && !out.write(std::string_view(packed.data(), ob.pos))) ok = false;
      written += ob.pos;
      more = done ? left != 0 : ib.pos < ib.size;
    }
  }
  const std::string got = sync::hex(sync::canonical(XXH3_128bits_digest(st3)));
  XXH3_freeState(st3);
  Kept result = !ok                                  ? Kept::unreadable
                : scan.found()                       ? Kept::secret
                : (got != e.hash || total != e.size) ? Kept::changed
                                                     : Kept::stored;
  if (result == Kept::stored && !out.commit(true)) result = Kept::unreadable;  // else its temporary goes
  if (result == Kept::stored) added += written;
  return result;
}

std::string object_path(const std::string& hash) {
  return objects_dir() + "/" + hash.substr(0, 2) + "/" + hash.substr(2);
}

// Streams the content of the store's frame open at `fd` to `take` (false: stop). False when the
// frame is damaged or cut short, or `take` stopped.
template <class Take>
bool unpack(int fd, ZSTD_DCtx* dctx, Take&& take) {
  ZSTD_DCtx_reset(dctx, ZSTD_reset_session_only);
  std::string packed(ZSTD_DStreamInSize(), '\0'), raw(ZSTD_DStreamOutSize(), '\0');
  bool ok = true;
  size_t left = 1;  // 0 once a whole frame is in
  for (ssize_t n; ok && (n = ::read(fd, packed.data(), packed.size())) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    ZSTD_inBuffer ib{packed.data(), ok ? size_t(n) : 0, 0};
    while (ok && ib.pos < ib.size) {
      ZSTD_outBuffer ob{raw.data(), raw.size(), 0};
      left = ZSTD_decompressStream(dctx, &ob, &ib);
      ok = !ZSTD_isError(left) && take(std::string_view(raw.data(), ob.pos));
    }
  }
  return ok && left == 0;
}

std::string redacted(std::string text, const std::vector<std::string>& secrets) {
  for (const auto& s : secrets) {
    if (s.size() < kMinSecret) continue;
    for (size_t at = 0; (at = text.find(s, at)) != std::string::npos; at += secret::kShown.size())
      text.replace(at, s.size(), secret::kShown);
  }
  return text;
}

// `git diff HEAD` of the work tree: its uncommitted changes to tracked files (untracked files are
// in the manifest itself), with any secret's value replaced.
std::string git_diff(const std::string& root, const std::vector<std::string>& secrets) {
  std::string cmd = "git -C " + text::shell_quote(root) +
                    " diff HEAD --no-color --no-ext-diff --no-textconv --relative -- . 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
    if (out.size() < kMaxDiff) out.append(buf, std::min(n, kMaxDiff - out.size()));
  ::pclose(p);
  if (out.size() >= kMaxDiff) out += "\n[mltrain: the diff is cut at 16 MiB]\n";
  return redacted(std::move(out), secrets);
}

// Writes `text` into the run's folder as `name`, atomically.
void write_in_run(const std::string& run_id, const std::string& name, const std::string& text) {
  std::string error;
  if (!sync::write_atomically(AT_FDCWD, run_dir(run_id) + "/" + name, text, 0600, true, error))
    throw Error(error, "free some space in the state folder", exit_code::state);
}

json manifest_json(const std::vector<CodeEntry>& entries, const CodeSummary& s, const std::string& root,
                   const std::vector<std::pair<std::string, std::string>>& withheld) {
  json list = json::array();
  for (const auto& e : entries)
    list.push_back(json::array({e.path, e.kind, e.mode, e.size, e.hash, e.target}));
  json held = json::array();
  for (const auto& [path, why] : withheld) held.push_back({{"path", path}, {"why", why}});
  return {{"schema", kJsonSchema}, {"root", root},     {"kept", s.kept},
          {"skipped", s.skipped},  {"files", s.files}, {"bytes", s.bytes},
          {"dirty", s.dirty},      {"withheld", held}, {"entries", list}};
}

const char* why_withheld(Kept k) {
  switch (k) {
    case Kept::secret:
      return "it holds a secret's value";
    case Kept::changed:
      return "it changed after it was synced";
    default:
      return "it could not be read";
  }
}

std::string size_words(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.1f GiB", double(n) / double(1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", double(n) / double(1ull << 20));
  return buf;
}

// Every hash some run's code.json names; false when a manifest cannot be read (then nothing may go).
bool hashes_in_use(std::set<std::string>& used) {
  DIR* d = ::opendir(runs_dir().c_str());
  if (!d) return errno == ENOENT;
  bool ok = true;
  while (dirent* de = ::readdir(d)) {
    if (de->d_name[0] == '.') continue;
    const std::string path = runs_dir() + "/" + de->d_name + "/code.json";
    FILE* f = std::fopen(path.c_str(), "re");
    if (!f) {
      if (errno != ENOENT && errno != ENOTDIR) ok = false;
      continue;
    }
    json j = json::parse(f, nullptr, false);
    std::fclose(f);
    if (j.is_discarded() || !j.contains("entries") || !j["entries"].is_array()) {
      log::warn("records", "code store: " + path + " cannot be read; nothing is removed from the store");
      ok = false;
      continue;
    }
    for (const auto& e : j["entries"])
      if (e.is_array() && e.size() >= 5 && e[4].is_string()) used.insert(e[4].get<std::string>());
  }
  ::closedir(d);
  return ok;
}

// Calls f(dir fd, name) for each entry of the folder open at `fd` (not "." or "..").
template <class F>
void each_name(int fd, F&& f) {
  int dup = ::dup(fd);
  if (dup < 0) return;
  DIR* d = ::fdopendir(dup);
  if (!d) {
    ::close(dup);
    return;
  }
  std::vector<std::string> names;
  while (dirent* de = ::readdir(d))
    if (std::strcmp(de->d_name, ".") != 0 && std::strcmp(de->d_name, "..") != 0) names.push_back(de->d_name);
  ::closedir(d);
  for (const auto& n : names) f(n);
}

}  // namespace

std::string code_store_dir() { return state_home() + "/code"; }
std::string reruns_dir() { return state_home() + "/reruns"; }

CodeSummary keep_code(const std::string& run_id, const std::vector<CodeEntry>& entries,
                      const CodeOptions& o) {
  CodeSummary s;
  s.recorded = true;
  for (const auto& e : entries)
    if (e.kind == CodeEntry::file) ++s.files, s.bytes += e.size;
  std::string diff = o.git ? git_diff(o.root, o.secrets) : std::string();
  s.dirty = !diff.empty();
  if (o.max_bytes > 0 && s.bytes > o.max_bytes)
    s.skipped =
        "the tree is " + size_words(s.bytes) + ", over [record] code_max (" + size_words(o.max_bytes) + ")";
  Fd lock = lock_store(LOCK_SH);
  std::vector<std::pair<std::string, std::string>> withheld;
  if (s.skipped.empty()) {
    Fd objects(::open(objects_dir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (objects.fd < 0)
      throw Error(sys_error_text("open", objects_dir(), errno), "check the state folder's permissions",
                  exit_code::state);
    // The manifest first: a sweep (which waits for this lock) must see what the store keeps for it.
    write_in_run(run_id, "code.json", manifest_json(entries, s, o.root, withheld).dump());
    ZSTD_CCtx* cctx = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);
    for (const auto& e : entries) {
      if (e.kind != CodeEntry::file || !is_hash(e.hash)) continue;
      Kept k = keep_file(objects.fd, e, o.secrets, cctx, s.new_bytes);
      if (k != Kept::present && k != Kept::stored) withheld.emplace_back(e.path, why_withheld(k));
    }
    ZSTD_freeCCtx(cctx);
    s.kept = true;
    s.withheld = withheld.size();
  }
  write_in_run(run_id, "code.json", manifest_json(entries, s, o.root, withheld).dump());
  if (s.dirty) write_in_run(run_id, "code.diff", diff);
  return s;
}

namespace {

// A path of the manifest as parts: relative, no empty, "." or ".." part.
std::optional<std::vector<std::string>> parts_of(const std::string& path) {
  std::vector<std::string> parts = text::split(path, '/');
  if (path.empty() || parts.empty()) return std::nullopt;
  for (const auto& p : parts)
    if (p.empty() || p == "." || p == "..") return std::nullopt;
  return parts;
}

// The folder holding `parts`' last part, opened below `root` without following a link.
Fd open_parent(int root, const std::vector<std::string>& parts) {
  Fd at(::dup(root));
  for (size_t i = 0; i + 1 < parts.size() && at.fd >= 0; ++i) at = open_dir_at(at.fd, parts[i].c_str());
  return at;
}

[[noreturn]] void damaged(const std::string& run_id, const std::string& path, const std::string& why) {
  throw Error(
      "run " + run_id + ": the code store's copy of " + path + " " + why,
      "the store under " + code_store_dir() + " was changed by hand; the run's code cannot be restored",
      exit_code::state);
}

// Writes one kept content into a new file, checking it against its hash and size.
void restore_file(const std::string& run_id, const json& e, int parent, const std::string& leaf,
                  ZSTD_DCtx* dctx) {
  const std::string path = e[0].get<std::string>(), hash = e[4].get<std::string>();
  if (!is_hash(hash)) damaged(run_id, path, "has no valid hash in code.json");
  const std::string object = object_path(hash);
  Fd in(::open(object.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (in.fd < 0) damaged(run_id, path, "is missing (" + object + ")");
  Fd out(::openat(parent, leaf.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (out.fd < 0) throw Error(sys_error_text("create", path, errno), {}, exit_code::state);
  XXH3_state_t* st3 = XXH3_createState();
  XXH3_128bits_reset(st3);
  uint64_t total = 0;
  const bool ok = unpack(in.fd, dctx, [&](std::string_view raw) {
    XXH3_128bits_update(st3, raw.data(), raw.size());
    total += raw.size();
    return raw.empty() || ::write(out.fd, raw.data(), raw.size()) == ssize_t(raw.size());
  });
  const std::string got = sync::hex(sync::canonical(XXH3_128bits_digest(st3)));
  XXH3_freeState(st3);
  if (!ok || got != hash || total != e[3].get<uint64_t>()) damaged(run_id, path, "does not match its hash");
  ::fchmod(out.fd, mode_t(e[2].get<uint32_t>() & 07777));
}

}  // namespace

Restored restore_code(const std::string& run_id, const std::string& dest) {
  const std::string path = run_dir(run_id) + "/code.json";
  FILE* f = std::fopen(path.c_str(), "re");
  if (!f)
    throw Error("run " + run_id + " kept no code",
                "a run keeps the code it ran when it syncs it ([sync], and [record] code not false; "
                "docs/records.md)");
  json j = json::parse(f, nullptr, false);
  std::fclose(f);
  if (j.is_discarded() || !j.contains("entries") || !j["entries"].is_array())
    throw Error(path + " cannot be read", "the run's record was changed by hand", exit_code::state);
  if (!j.value("kept", false))
    throw Error("run " + run_id + " kept only its code's manifest: " + j.value("skipped", std::string()),
                "raise [record] code_max for runs to come (docs/records.md)");
  Restored r;
  r.root = j.value("root", std::string());
  std::set<std::string> held;
  for (const auto& w : j.value("withheld", json::array()))
    if (w.is_object() && w.contains("path") && w["path"].is_string())
      held.insert(w["path"].get<std::string>());
  if (::mkdir(dest.c_str(), 0700) != 0)
    throw Error(sys_error_text("mkdir", dest, errno), {}, exit_code::state);
  Fd root(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (root.fd < 0) throw Error(sys_error_text("open", dest, errno), {}, exit_code::state);
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  std::vector<std::pair<std::string, uint32_t>> dir_modes;  // set last: a read-only folder is filled first
  try {
    for (const auto& e : j["entries"]) {
      if (!e.is_array() || e.size() < 6 || !e[0].is_string() || !e[1].is_number() || !e[2].is_number() ||
          !e[3].is_number() || !e[4].is_string() || !e[5].is_string())
        throw Error(path + " has a malformed entry", "the run's record was changed by hand",
                    exit_code::state);
      const std::string p = e[0].get<std::string>();
      auto parts = parts_of(p);
      if (!parts)
        throw Error(path + " names a path outside the tree: " + text::excerpt(p), {}, exit_code::state);
      Fd parent = open_parent(root.fd, *parts);
      if (parent.fd < 0) throw Error(sys_error_text("open the folder of", p, errno), {}, exit_code::state);
      const std::string& leaf = parts->back();
      const uint32_t kind = e[1].get<uint32_t>();
      if (kind == CodeEntry::dir) {
        if (::mkdirat(parent.fd, leaf.c_str(), 0700) != 0 && errno != EEXIST)
          throw Error(sys_error_text("mkdir", p, errno), {}, exit_code::state);
        dir_modes.emplace_back(p, e[2].get<uint32_t>());
      } else if (kind == CodeEntry::symlink) {
        if (::symlinkat(e[5].get<std::string>().c_str(), parent.fd, leaf.c_str()) != 0)
          throw Error(sys_error_text("symlink", p, errno), {}, exit_code::state);
      } else if (held.count(p)) {
        r.withheld.push_back(p);
      } else {
        restore_file(run_id, e, parent.fd, leaf, dctx);
        ++r.files;
      }
    }
  } catch (...) {
    ZSTD_freeDCtx(dctx);
    throw;
  }
  ZSTD_freeDCtx(dctx);
  for (auto it = dir_modes.rbegin(); it != dir_modes.rend(); ++it) {
    auto parts = parts_of(it->first);
    Fd parent = open_parent(root.fd, *parts);
    Fd dir = parent.fd < 0 ? Fd() : open_dir_at(parent.fd, parts->back().c_str());
    if (dir.fd >= 0) ::fchmod(dir.fd, mode_t(it->second & 07777) | 0700);
  }
  return r;
}

std::optional<Manifest> code_manifest(const std::string& run_id) {
  FILE* f = std::fopen((run_dir(run_id) + "/code.json").c_str(), "re");
  if (!f) return std::nullopt;
  json j = json::parse(f, nullptr, false);
  std::fclose(f);
  if (j.is_discarded() || !j.contains("entries") || !j["entries"].is_array()) return std::nullopt;
  Manifest m;
  m.kept = j.value("kept", false);
  for (const auto& e : j["entries"]) {
    if (!e.is_array() || e.size() < 6 || !e[0].is_string() || !e[1].is_number() || !e[2].is_number() ||
        !e[3].is_number() || !e[4].is_string() || !e[5].is_string())
      continue;
    CodeEntry c;
    c.path = e[0].get<std::string>(), c.kind = e[1].get<uint32_t>(), c.mode = e[2].get<uint32_t>();
    c.size = e[3].get<uint64_t>(), c.hash = e[4].get<std::string>(), c.target = e[5].get<std::string>();
    m.entries.push_back(std::move(c));
  }
  for (const auto& w : j.value("withheld", json::array()))
    if (w.is_object() && w.contains("path") && w["path"].is_string())
      m.withheld.push_back(w["path"].get<std::string>());
  return m;
}

std::optional<std::string> stored_content(const std::string& hash, uint64_t max) {
  if (!is_hash(hash)) return std::nullopt;
  Fd in(::open(object_path(hash).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (in.fd < 0) return std::nullopt;
  ZSTD_DCtx* dctx = ZSTD_createDCtx();
  std::string out;
  const bool ok = unpack(in.fd, dctx, [&](std::string_view raw) {
    out.append(raw);
    return out.size() <= max;
  });
  ZSTD_freeDCtx(dctx);
  if (!ok) return std::nullopt;
  return out;
}

uint64_t sweep_code_store() {
  struct stat st {};
  if (::stat(objects_dir().c_str(), &st) != 0) return 0;  // no store: nothing to do
  Fd lock = lock_store(LOCK_EX);
  std::set<std::string> used;
  if (!hashes_in_use(used)) return 0;
  Fd objects(::open(objects_dir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (objects.fd < 0) return 0;
  uint64_t freed = 0;
  each_name(objects.fd, [&](const std::string& sub) {
    if (sub.size() != 2) return;
    Fd dir = open_dir_at(objects.fd, sub.c_str());
    if (dir.fd < 0) return;
    each_name(dir.fd, [&](const std::string& name) {
      // Ours only: contents named by their hash, and temporary files a killed run left (no run
      // keeps code while this lock is held).
      const bool tmp = name[0] == '.' && name.find(".tmp") != std::string::npos;  // sync::AtomicFile's
      if (!tmp && (!is_hash(sub + name) || used.count(sub + name))) return;
      struct stat fs {};
      if (::fstatat(dir.fd, name.c_str(), &fs, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fs.st_mode)) return;
      if (::unlinkat(dir.fd, name.c_str(), 0) == 0) freed += uint64_t(fs.st_size);
    });
    ::unlinkat(objects.fd, sub.c_str(), AT_REMOVEDIR);  // only when it is empty now
  });
  return freed;
}

uint64_t code_store_bytes() {
  uint64_t total = 0;
  Fd objects(::open(objects_dir().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (objects.fd < 0) return 0;
  each_name(objects.fd, [&](const std::string& sub) {
    Fd dir = open_dir_at(objects.fd, sub.c_str());
    if (dir.fd < 0) return;
    each_name(dir.fd, [&](const std::string& name) {
      struct stat fs {};
      if (::fstatat(dir.fd, name.c_str(), &fs, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fs.st_mode))
        total += uint64_t(fs.st_size);
    });
  });
  return total;
}

}  // namespace mltrain::records
