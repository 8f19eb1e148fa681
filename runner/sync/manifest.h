// The launcher's side of `[sync]`: which files of the local folder travel (tracked and
// untracked-not-ignored files of a git tree, else everything .gitignore files allow; minus
// .mltrainignore and [sync] exclude), with their kinds, modes, times and content hashes, and the
// bytes to send for each, compressed once for every host.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runner/common/error.h"
#include "runner/protocol/protocol.h"

namespace mltrain::sync {

// Never synced, never deleted: the host's bookkeeping (index, temporary files, setup stamp).
inline constexpr const char* kStateDir = ".mltrain-sync";

struct TreeOptions {
  std::string root;                  // the local folder, absolute
  std::vector<std::string> exclude;  // patterns, as in .gitignore
  struct Extra {
    std::string src;     // a local file or folder, absolute
    std::string dst;     // where it goes, relative to the synced folder
    std::string origin;  // "job.toml:12:1", for errors
  };
  std::vector<Extra> files;
  // Where the hashes of the last listing are kept ("": nowhere): a file whose inode, size, mtime
  // and ctime are as they were is not read again.
  std::string cache_file;
  // Stop listing (build_tree throws TooLarge) past this many entries or bytes of files (0: no
  // limit): a run's record lists an unsynced workdir only when it is a project, not a home.
  size_t max_entries = 0;
  uint64_t max_bytes = 0;
};

// build_tree went past TreeOptions' max_entries or max_bytes.
struct TooLarge : Error {
  using Error::Error;
};

struct Tree {
  std::string root;
  std::vector<agent::SyncEntry> entries;  // sorted by path: a folder before what it holds
  std::vector<std::string> sources;       // each entry's local path
  uint64_t bytes = 0;                     // of every file
  size_t files = 0;
  bool git = false;    // listed by git (tracked + untracked, not ignored)
  std::string digest;  // hex; changes with any path, kind, mode, content or link target
};

// Lists and hashes the tree. Throws mltrain::Error naming the path that cannot be read.
Tree build_tree(const TreeOptions& o);

// 32 hex digits of XXH3-128 of `bytes`.
std::string hash_hex(std::string_view bytes);

// The digest of the tree's entries that `patterns` (.gitignore patterns from its root) match, or
// of a folder they match: it changes with those entries' paths, kinds, modes, contents or link
// targets only. `matched`: how many entries counted.
std::string digest_of(const Tree& t, const std::vector<std::string>& patterns, size_t* matched = nullptr);

// The SyncData frames of a tree's files: each chunk read (and compressed with zstd when that
// saves at least 5%) once, then kept for the other hosts while it is among the last 64 MiB used.
class Chunks {
 public:
  explicit Chunks(const Tree& t);
  ~Chunks();
  Chunks(const Chunks&) = delete;
  Chunks& operator=(const Chunks&) = delete;
  // Chunk `offset` of entry `index` as a SyncData (raw_size 0 for an empty file). Throws
  // mltrain::Error when the file cannot be read or changed size since it was listed.
  std::shared_ptr<const agent::msg::SyncData> get(size_t index, uint64_t offset);

 private:
  const Tree& tree_;
  void* cctx_ = nullptr;  // ZSTD_CCtx
  std::map<std::pair<size_t, uint64_t>, std::shared_ptr<const agent::msg::SyncData>> cache_;
  std::list<std::pair<size_t, uint64_t>> order_;  // oldest first
  size_t cached_bytes_ = 0;
  std::vector<char> incompressible_;  // per entry: an earlier chunk did not shrink
};

}  // namespace mltrain::sync
