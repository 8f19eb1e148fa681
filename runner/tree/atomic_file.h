// Files written whole or not at all. The bytes go into a temporary file beside the file's name
// (".NAME.tmp.<pid>.<n>.<random>", created 0600 with O_EXCL, never through a link); commit() renames it over
// the name only once every byte is written (and on disk first, when durable). A reader never sees
// part of a file, and a writer killed at any moment leaves the old file whole (and at most a hidden
// temporary). Every file mltrain writes so goes through here. libc only: the launcher and the
// agent both link it.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

namespace mltrain::sync {

class AtomicFile {
 public:
  // The file `name` of the folder `dir` (an fd, or AT_FDCWD for a path), given `mode` when it
  // commits. `name` is one part (no '/') unless `dir` is AT_FDCWD.
  AtomicFile(int dir, std::string name, mode_t mode = 0600);
  ~AtomicFile();  // uncommitted: its temporary file goes
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // False once anything failed: error() says what, on which file.
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool write(std::string_view bytes);
  // Flushes it to disk (when `durable`), closes it and renames it over its name: true when the
  // name now holds what was written. The folder itself is not fsynced.
  bool commit(bool durable);
  const std::string& error() const { return error_; }

 private:
  bool fail(const char* call, const std::string& what, int err);
  int dir_;
  std::string name_, tmp_, error_;
  mode_t mode_;
  int fd_ = -1;
};

// `data` as the whole of `name` in `dir` (AtomicFile): true, or false with `error` set.
bool write_atomically(int dir, const std::string& name, std::string_view data, mode_t mode, bool durable,
                      std::string& error);

}  // namespace mltrain::sync
