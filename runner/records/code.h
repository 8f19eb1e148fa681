// The code a run ran: its tree's manifest in the run's folder (code.json, and code.diff for a git
// work tree's uncommitted changes), the files' contents in one content-addressed store under the
// state home, kept once however many runs hold them (code/objects/<2 hex>/<30 hex>, zstd frames).
// `rm` and `gc` remove a content no remaining run names (docs/records.md, "The code of a run").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mltrain::records {

// One entry of the tree, as the sync listed it.
struct CodeEntry {
  enum Kind : uint32_t { file = 0, dir = 1, symlink = 2 };
  std::string path;  // relative, '/'-separated
  uint32_t kind = file;
  uint32_t mode = 0;
  uint64_t size = 0;
  std::string hash;    // files: 32 hex digits of XXH3-128 of the content
  std::string target;  // symlinks
  std::string source;  // the local file it was read from (not recorded)
};

struct CodeOptions {
  std::string root;                  // the local folder the tree came from
  uint64_t max_bytes = 0;            // a tree larger than this keeps its manifest only (0: no limit)
  std::vector<std::string> secrets;  // values no kept file or diff may hold
  bool git = false;                  // the root is in a git work tree: record its commit and diff
};

// What run.json says of the code (RunRecord::code).
struct CodeSummary {
  bool recorded = false;  // a code.json exists
  bool kept = false;      // the contents are in the store (else only the manifest)
  uint64_t files = 0, bytes = 0;
  uint64_t new_bytes = 0;  // what this run added to the store (compressed)
  uint64_t withheld = 0;   // files not kept: they held a secret's value, or changed while read
  bool dirty = false;      // the git work tree had uncommitted changes (code.diff)
  std::string skipped;     // why the contents were not kept ("" when they were)
};

// The store's folder: <state home>/code.
std::string code_store_dir();
// Where `rerun` keeps each run's restored tree: <state home>/reruns/<run>.
std::string reruns_dir();

// Writes the run's code.json (and code.diff) and keeps every file's content the store does not
// hold yet. Never throws for a file it cannot keep: it is withheld and named in code.json.
// Throws mltrain::Error when the run's folder or the store cannot be written.
CodeSummary keep_code(const std::string& run_id, const std::vector<CodeEntry>& entries, const CodeOptions& o);

// The entries of a run's code.json (nullopt when the run has none) and the paths it withheld.
struct Manifest {
  std::vector<CodeEntry> entries;
  std::vector<std::string> withheld;
  bool kept = false;
};
std::optional<Manifest> code_manifest(const std::string& run_id);

// A file's content as the store keeps it, when it is there and at most `max` bytes.
std::optional<std::string> stored_content(const std::string& hash, uint64_t max);

// What restore_code made.
struct Restored {
  std::string root;  // the folder the run's code.json says the tree came from
  uint64_t files = 0;
  std::vector<std::string> withheld;  // files the store never kept (code.json says why)
};

// Writes the tree a run ran into `dest` (a new folder, created here; it must not exist): its
// folders, links and files from the store, each checked against its hash. Throws mltrain::Error
// when the run kept no code, or a content is missing or damaged.
Restored restore_code(const std::string& run_id, const std::string& dest);

// Removes every content of the store that no run's code.json names. Returns the bytes freed.
uint64_t sweep_code_store();

// The bytes the store's contents use on disk.
uint64_t code_store_bytes();

}  // namespace mltrain::records
