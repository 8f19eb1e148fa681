// runner/sync: gitignore-style patterns, the local tree's manifest and the chunks that carry it.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/sync/manifest.h"
#include "runner/tree/atomic_file.h"
#include "runner/tree/beneath.h"
#include "runner/tree/ignore.h"
#include "temp_dir.h"

using namespace mltrain::sync;
using mltrain::agent::SyncEntry;
using mltrain::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The entries' paths, one a line (a failed CHECK shows both lists).
std::string paths(const Tree& t) {
  std::string out;
  for (const auto& e : t.entries) out += e.path + "\n";
  return out;
}

std::string lines(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

const SyncEntry* find(const Tree& t, const std::string& path) {
  for (const auto& e : t.entries)
    if (e.path == path) return &e;
  return nullptr;
}

size_t index_of(const Tree& t, const std::string& path) {
  for (size_t i = 0; i < t.entries.size(); ++i)
    if (t.entries[i].path == path) return i;
  FAIL("no entry " << path);
  return 0;
}

std::string hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) s += d[c >> 4], s += d[c & 15];
  return s;
}

TreeOptions options(const TempDir& d) {
  TreeOptions o;
  o.root = d.str();
  return o;
}

// Runs the shell command `cmd` in `dir`, quietly; fails the test when it fails.
void sh(const TempDir& dir, const std::string& cmd) {
  std::string full = "cd " + mltrain::text::shell_quote(dir.str()) + " && (" + cmd + ") >/dev/null 2>&1";
  REQUIRE_MESSAGE(std::system(full.c_str()) == 0, cmd);
}

// The git cases need git; without it they pass with a note.
bool have_git() {
  static const bool have = std::system("git --version >/dev/null 2>&1") == 0;
  if (!have) MESSAGE("git not found: skipping a git work tree case");
  return have;
}

constexpr const char* kGit = "git -c user.email=a@b -c user.name=n -c core.excludesFile=/dev/null";

// Deterministic bytes: random-looking (incompressible) or a repetitive text (compressible).
std::string random_bytes(size_t n) {
  uint64_t s = 0x9e3779b97f4a7c15ULL;
  std::string out(n, '\0');
  for (auto& c : out) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    c = char(s >> 32);
  }
  return out;
}

std::string text_bytes(size_t n) {
  std::string out;
  for (int i = 0; out.size() < n; ++i) out += "step " + std::to_string(i % 977) + " loss 0.25\n";
  out.resize(n);
  return out;
}

std::string unpack(const mltrain::agent::msg::SyncData& d) {
  if (!d.compressed) return d.bytes;
  std::string raw(d.raw_size, '\0');
  size_t n = ZSTD_decompress(raw.data(), raw.size(), d.bytes.data(), d.bytes.size());
  REQUIRE_FALSE(ZSTD_isError(n));
  CHECK(n == d.raw_size);
  return raw;
}

}  // namespace

TEST_CASE("sync: glob_match") {
  SUBCASE("* and ? stay within one part") {
    CHECK(glob_match("*.log", "a.log"));
    CHECK(glob_match("*.log", ".log"));
    CHECK_FALSE(glob_match("*.log", "d/a.log"));
    CHECK_FALSE(glob_match("*.log", "a.log.gz"));
    CHECK(glob_match("a/*/c", "a/b/c"));
    CHECK_FALSE(glob_match("a/*/c", "a/b/x/c"));
    CHECK(glob_match("a?c", "abc"));
    CHECK_FALSE(glob_match("a?c", "a/c"));
    CHECK_FALSE(glob_match("a?c", "ac"));
    CHECK(glob_match("*", "x"));
    CHECK_FALSE(glob_match("*", "x/y"));
  }
  SUBCASE("**/ matches none or more whole parts") {
    CHECK(glob_match("**/foo", "foo"));
    CHECK(glob_match("**/foo", "a/foo"));
    CHECK(glob_match("**/foo", "a/b/foo"));
    CHECK_FALSE(glob_match("**/foo", "afoo"));
    CHECK_FALSE(glob_match("**/foo", "a/foo/bar"));
  }
  SUBCASE("a trailing /** is everything below, not the folder itself") {
    CHECK(glob_match("a/**", "a/x"));
    CHECK(glob_match("a/**", "a/x/y/z"));
    CHECK_FALSE(glob_match("a/**", "a"));
    CHECK_FALSE(glob_match("a/**", "b/x"));
  }
  SUBCASE("a/**/b") {
    CHECK(glob_match("a/**/b", "a/b"));
    CHECK(glob_match("a/**/b", "a/x/b"));
    CHECK(glob_match("a/**/b", "a/x/y/b"));
    CHECK_FALSE(glob_match("a/**/b", "a/xb"));
    CHECK_FALSE(glob_match("a/**/b", "b"));
    CHECK_FALSE(glob_match("a/**/b", "a/b/c"));
  }
  SUBCASE("character classes") {
    CHECK(glob_match("[a-z].txt", "q.txt"));
    CHECK_FALSE(glob_match("[a-z].txt", "Q.txt"));
    CHECK_FALSE(glob_match("[a-z].txt", "1.txt"));
    CHECK(glob_match("[abc]", "b"));
    CHECK_FALSE(glob_match("[abc]", "d"));
    CHECK(glob_match("[!a]x", "bx"));
    CHECK_FALSE(glob_match("[!a]x", "ax"));
    CHECK_FALSE(glob_match("[!a]x", "/x"));  // not even a negated class crosses a part
    CHECK(glob_match("[^a]x", "bx"));
    CHECK(glob_match("v[0-9][0-9]", "v42"));
    CHECK(glob_match("[]]", "]"));
    CHECK(glob_match("[a", "[a"));  // no closing ']': a literal '['
  }
  SUBCASE("escapes") {
    CHECK(glob_match("\\*", "*"));
    CHECK_FALSE(glob_match("\\*", "x"));
    CHECK(glob_match("a\\?", "a?"));
    CHECK_FALSE(glob_match("a\\?", "ab"));
    CHECK(glob_match("\\[x]", "[x]"));
    CHECK_FALSE(glob_match("\\[x]", "x"));
    CHECK(glob_match("[\\]]", "]"));
  }
  SUBCASE("whole names only") {
    CHECK(glob_match("abc", "abc"));
    CHECK_FALSE(glob_match("abc", "abcd"));
    CHECK_FALSE(glob_match("abc", "ab"));
    CHECK(glob_match("", ""));
  }
}

TEST_CASE("sync: Rules") {
  Rules r;
  CHECK(r.empty());
  CHECK(r.check("anything", false) == Rules::none);

  SUBCASE("a basename pattern matches at any depth") {
    r.add("*.log");
    CHECK_FALSE(r.empty());
    CHECK(r.check("a.log", false) == Rules::excluded);
    CHECK(r.check("d/e/a.log", false) == Rules::excluded);
    CHECK(r.check("d/a.txt", false) == Rules::none);
    CHECK(r.check("a.log/b", false) == Rules::none);  // only the last part; parents are the caller's
  }
  SUBCASE("a leading / anchors to the rule's folder") {
    r.add("/x");
    CHECK(r.check("x", false) == Rules::excluded);
    CHECK(r.check("x", true) == Rules::excluded);
    CHECK(r.check("d/x", false) == Rules::none);
  }
  SUBCASE("a / inside anchors too") {
    r.add("doc/*.md");
    CHECK(r.check("doc/a.md", false) == Rules::excluded);
    CHECK(r.check("src/doc/a.md", false) == Rules::none);
  }
  SUBCASE("a trailing / matches a directory, not a file") {
    r.add("build/");
    CHECK(r.check("build", true) == Rules::excluded);
    CHECK(r.check("build", false) == Rules::none);
    CHECK(r.check("src/build", true) == Rules::excluded);
  }
  SUBCASE("a later ! re-includes") {
    r.add_text("*.log\n!keep.log\n");
    CHECK(r.check("x.log", false) == Rules::excluded);
    CHECK(r.check("keep.log", false) == Rules::included);
    CHECK(r.check("d/keep.log", false) == Rules::included);
    r.add("*.log");  // the last match wins
    CHECK(r.check("keep.log", false) == Rules::excluded);
  }
  SUBCASE("text: comments, blank lines, CRLF, trailing spaces, escaped # and !") {
    r.add_text("# a comment\n\n  \ncache \r\n\\#hash\n\\!bang\n");
    CHECK(r.check("cache", false) == Rules::excluded);
    CHECK(r.check("# a comment", false) == Rules::none);
    CHECK(r.check("#hash", false) == Rules::excluded);
    CHECK(r.check("!bang", false) == Rules::excluded);
  }
  SUBCASE("rules from a nested folder apply only below it") {
    r.add("*.tmp", "sub");
    r.add("/top", "sub");
    CHECK(r.check("sub/a.tmp", false) == Rules::excluded);
    CHECK(r.check("sub/deep/a.tmp", false) == Rules::excluded);
    CHECK(r.check("a.tmp", false) == Rules::none);
    CHECK(r.check("subx/a.tmp", false) == Rules::none);
    CHECK(r.check("other/sub/a.tmp", false) == Rules::none);
    CHECK(r.check("sub", true) == Rules::none);
    CHECK(r.check("sub/top", false) == Rules::excluded);
    CHECK(r.check("sub/deep/top", false) == Rules::none);
    CHECK(r.check("top", false) == Rules::none);
  }
  SUBCASE("excluded_with_parents: what lies under an excluded folder") {
    r.add("build/");
    r.add("!build/keep.txt");  // git cannot re-include below an excluded folder
    CHECK(r.check("build/out/a.o", false) == Rules::none);
    CHECK(r.excluded_with_parents("build/out/a.o", false));
    CHECK(r.excluded_with_parents("build/keep.txt", false));
    CHECK(r.excluded_with_parents("build", true));
    CHECK_FALSE(r.excluded_with_parents("build", false));  // a file named build
    CHECK_FALSE(r.excluded_with_parents("src/a.cpp", false));
  }
}

TEST_CASE("sync: hash_hex is XXH3-128 in 32 hex digits") {
  CHECK(hash_hex("") == "99aa06d3014798d86001c324468d497f");
  CHECK(hash_hex("a").size() == 32);
  CHECK(hash_hex("a") != hash_hex("b"));
}

TEST_CASE("sync: build_tree without git honours .gitignore, .mltrainignore and exclude") {
  TempDir d("sync");
  d.write(".gitignore", "*.log\n/out/\n");
  d.write(".mltrainignore", "data/\n");
  d.write("main.py", "print(1)\n");
  d.write("a.log", "x");
  d.write("out/model.bin", "weights");
  d.write("data/big.bin", "big");
  d.write("src/lib.py", "def f(): pass\n");
  d.write("src/out/kept.txt", "out/ is anchored to the root");
  d.write("src/.gitignore", "*.tmp\n!important.log\n");
  d.write("src/x.tmp", "t");
  d.write("x.tmp", "a nested .gitignore stops at its folder");
  d.write("src/important.log", "re-included below");
  d.write("notes/secret.txt", "s");
  d.write("notes/plan.txt", "p");
  d.write(".git/config", "not a repo, still skipped");
  d.write(".mltrain-sync/index", "bookkeeping");
  d.write("run.sh", "#!/bin/sh\n");
  fs::permissions(d.path / "run.sh", fs::perms(0755));
  fs::permissions(d.path / "main.py", fs::perms(0644));
  fs::create_directories(d.path / "empty");
  fs::create_symlink("src/lib.py", d.path / "link");
  fs::create_symlink("nowhere", d.path / "dangling");

  TreeOptions o = options(d);
  o.exclude = {"notes/secret.txt", "*.cache"};
  d.write("w.cache", "c");
  Tree t = build_tree(o);

  CHECK_FALSE(t.git);
  CHECK(t.root == d.str());
  const std::vector<std::string> want = {
      ".gitignore", ".mltrainignore", "dangling",         "empty", "link",           "main.py",
      "notes",      "notes/plan.txt", "run.sh",           "src",   "src/.gitignore", "src/important.log",
      "src/lib.py", "src/out",        "src/out/kept.txt", "x.tmp"};
  CHECK(paths(t) == lines(want));
  REQUIRE(t.sources.size() == t.entries.size());
  CHECK(t.sources[index_of(t, "src/lib.py")] == (d.path / "src/lib.py").string());

  const SyncEntry* link = find(t, "link");
  REQUIRE(link);
  CHECK(link->kind == SyncEntry::symlink);
  CHECK(link->target == "src/lib.py");
  CHECK(link->hash.empty());
  REQUIRE(find(t, "dangling"));
  CHECK(find(t, "dangling")->kind == SyncEntry::symlink);
  CHECK(find(t, "dangling")->target == "nowhere");

  const SyncEntry* run = find(t, "run.sh");
  REQUIRE(run);
  CHECK(run->kind == SyncEntry::file);
  CHECK(run->mode == 0755);
  CHECK(find(t, "main.py")->mode == 0644);

  const SyncEntry* empty = find(t, "empty");
  REQUIRE(empty);
  CHECK(empty->kind == SyncEntry::dir);
  CHECK(empty->size == 0);

  const SyncEntry* main = find(t, "main.py");
  CHECK(main->size == 9);
  CHECK(main->hash.size() == 16);
  CHECK(hex(main->hash) == hash_hex("print(1)\n"));
  struct stat st {};
  REQUIRE(::stat((d.path / "main.py").c_str(), &st) == 0);
  CHECK(main->mtime_ns == int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec);

  uint64_t bytes = 0;
  size_t files = 0;
  for (const auto& e : t.entries)
    if (e.kind == SyncEntry::file) bytes += e.size, ++files;
  CHECK(t.files == files);
  CHECK(t.bytes == bytes);
  CHECK(t.digest.size() == 32);
}

TEST_CASE("sync: without git, a nested .gitignore cannot bring back what .mltrainignore leaves out") {
  // As in a git tree: .gitignore decides what git would list, then .mltrainignore takes away.
  TempDir d("sync");
  d.write(".mltrainignore", "*.log\n");
  d.write("sub/.gitignore", "!keep.log\n");
  d.write("sub/keep.log", "k");
  d.write("sub/.mltrainignore", "!again.log\n");
  d.write("sub/again.log", "a nested .mltrainignore can");
  Tree t = build_tree(options(d));
  const std::vector<std::string> want = {".mltrainignore", "sub", "sub/.gitignore", "sub/.mltrainignore",
                                         "sub/again.log"};
  CHECK(paths(t) == lines(want));
}

TEST_CASE("sync: build_tree places [[sync.files]] at their dst, with parent folders") {
  TempDir d("sync");
  TempDir outside("sync-extra");
  d.write("main.py", "x");
  std::string cfg = outside.write("cfg.yaml", "lr: 0.1\n");
  outside.write("assets/a.txt", "A");
  outside.write("assets/sub/b.txt", "BB");
  fs::permissions(outside.path / "assets/sub/b.txt", fs::perms(0700));

  TreeOptions o = options(d);
  o.files = {{cfg, "conf/deep/cfg.yaml", "job.toml:3:1"},
             {(outside.path / "assets").string(), "res/", "job.toml:4:1"}};
  Tree t = build_tree(o);

  const std::vector<std::string> want = {"conf",      "conf/deep", "conf/deep/cfg.yaml", "main.py", "res",
                                         "res/a.txt", "res/sub",   "res/sub/b.txt"};
  CHECK(paths(t) == lines(want));
  CHECK(find(t, "conf")->kind == SyncEntry::dir);
  CHECK(find(t, "conf/deep")->kind == SyncEntry::dir);
  CHECK(find(t, "conf/deep/cfg.yaml")->kind == SyncEntry::file);
  CHECK(hex(find(t, "conf/deep/cfg.yaml")->hash) == hash_hex("lr: 0.1\n"));
  CHECK(t.sources[index_of(t, "conf/deep/cfg.yaml")] == cfg);
  CHECK(find(t, "res")->kind == SyncEntry::dir);
  CHECK(find(t, "res/sub/b.txt")->size == 2);
  CHECK(find(t, "res/sub/b.txt")->mode == 0700);
  CHECK(t.sources[index_of(t, "res/sub/b.txt")] == (outside.path / "assets/sub/b.txt").string());
  CHECK(t.files == 4);

  o.files = {{(outside.path / "missing").string(), "m", "job.toml:9:1"}};
  try {
    build_tree(o);
    FAIL("a missing src must throw");
  } catch (const mltrain::Error& e) {
    CHECK(std::string(e.what()).find("job.toml:9:1") != std::string::npos);
  }
}

TEST_CASE("sync: build_tree of what is not a folder throws") {
  TempDir d("sync");
  TreeOptions o;
  o.root = (d.path / "missing").string();
  CHECK_THROWS_AS(build_tree(o), mltrain::Error);
  o.root = d.write("file", "x");
  CHECK_THROWS_AS(build_tree(o), mltrain::Error);
}

TEST_CASE("sync: build_tree in a git work tree lists tracked and untracked-not-ignored files") {
  if (!have_git()) return;
  TempDir d("sync");
  d.write(".gitignore", "*.log\nbuild/\n");
  d.write("tracked.py", "t");
  d.write("gone.py", "deleted from the work tree, still in the index");
  d.write("src/mod.py", "m");
  d.write("force.log", "tracked although ignored");
  d.write(".mltrainignore", "*.ckpt\n");
  d.write("model.ckpt", "tracked, but .mltrainignore leaves it out");
  sh(d, std::string("git init -q && ") + kGit +
            " add .gitignore .mltrainignore tracked.py gone.py src model.ckpt && " + kGit +
            " add -f force.log && " + kGit + " commit -q -m init");
  std::filesystem::remove(d.path / "gone.py");
  d.write("new.py", "untracked, not ignored");
  d.write("other/new.txt", "untracked in a folder");
  d.write("run.log", "ignored");
  d.write("build/out.o", "ignored folder");
  d.write(".mltrain-sync/index", "bookkeeping");
  fs::create_directories(d.path / "empty");  // git lists no folders of its own

  TreeOptions o = options(d);
  o.exclude = {"other/"};
  Tree t = build_tree(o);
  CHECK(t.git);
  const std::vector<std::string> want = {".gitignore", ".mltrainignore", "force.log", "new.py",
                                         "src",        "src/mod.py",     "tracked.py"};
  CHECK(paths(t) == lines(want));
  CHECK(find(t, "src")->kind == SyncEntry::dir);
  CHECK(hex(find(t, "tracked.py")->hash) == hash_hex("t"));
}

TEST_CASE("sync: in a git tree, a nested .mltrainignore overrides the root's") {
  if (!have_git()) return;
  // git lists untracked files before tracked ones: the rules of sub/ must still come after the
  // root's, however the listing starts.
  TempDir d("sync");
  d.write(".mltrainignore", "*.log\n");
  d.write("a.log", "a");
  sh(d, std::string("git init -q && ") + kGit + " add -A && " + kGit + " commit -q -m init");
  d.write("sub/.mltrainignore", "!keep.log\n");
  d.write("sub/keep.log", "k");
  d.write("sub/drop.log", "d");
  Tree t = build_tree(options(d));
  CHECK(t.git);
  const std::vector<std::string> want = {".mltrainignore", "sub", "sub/.mltrainignore", "sub/keep.log"};
  CHECK(paths(t) == lines(want));
}

TEST_CASE("sync: an untracked git repository inside a git tree is synced as a folder") {
  if (!have_git()) return;
  TempDir d("sync");
  d.write("a.py", "a");
  d.write("inner/x.py", "x");
  sh(d, std::string("git init -q && ") + kGit + " add a.py && " + kGit +
            " commit -q -m init && cd inner && git init -q");
  Tree t = build_tree(options(d));
  CHECK(t.git);
  const std::vector<std::string> want = {"a.py", "inner", "inner/x.py"};
  CHECK(paths(t) == lines(want));
}

TEST_CASE("sync: the digest follows content, mode and paths, not times") {
  TempDir d("sync");
  d.write("a.py", "one");
  d.write("d/b.py", "two");
  fs::permissions(d.path / "a.py", fs::perms(0644));
  const TreeOptions o = options(d);
  const std::string first = build_tree(o).digest;
  CHECK(first.size() == 32);
  CHECK(build_tree(o).digest == first);

  fs::last_write_time(d.path / "a.py", fs::last_write_time(d.path / "a.py") - std::chrono::hours(5));
  Tree touched = build_tree(o);
  CHECK(touched.digest == first);

  d.write("a.py", "ONE");
  const std::string content = build_tree(o).digest;
  CHECK(content != first);

  fs::permissions(d.path / "a.py", fs::perms(0755));
  const std::string mode = build_tree(o).digest;
  CHECK(mode != content);

  fs::rename(d.path / "d/b.py", d.path / "d/c.py");
  CHECK(build_tree(o).digest != mode);
}

TEST_CASE("sync: Chunks") {
  namespace msg = mltrain::agent::msg;
  TempDir d("sync");
  const std::string text = text_bytes(600 << 10);
  const std::string noise = random_bytes(300 << 10);
  d.write("text.txt", text);
  d.write("noise.bin", noise);
  d.write("empty", "");
  d.write("small", "tiny");
  Tree t = build_tree(options(d));
  Chunks chunks(t);

  SUBCASE("a compressible file: chunks of 256 KiB, compressed, decompressing to the file") {
    const size_t i = index_of(t, "text.txt");
    std::string got;
    std::vector<uint64_t> offsets;
    for (uint64_t off = 0; off < t.entries[i].size; off += msg::kSyncChunk) {
      auto c = chunks.get(i, off);
      REQUIRE(c);
      offsets.push_back(c->offset);
      CHECK(c->compressed == 1);
      CHECK(c->raw_size == std::min<uint64_t>(msg::kSyncChunk, text.size() - off));
      CHECK(c->bytes.size() < c->raw_size);
      got += unpack(*c);
    }
    CHECK(offsets == std::vector<uint64_t>{0, 256 << 10, 512 << 10});
    CHECK(got == text);
    CHECK(chunks.get(i, 0) == chunks.get(i, 0));  // kept for the next host
  }
  SUBCASE("random bytes go raw") {
    const size_t i = index_of(t, "noise.bin");
    auto a = chunks.get(i, 0);
    auto b = chunks.get(i, msg::kSyncChunk);
    CHECK(a->compressed == 0);
    CHECK(b->compressed == 0);
    CHECK(a->raw_size == msg::kSyncChunk);
    CHECK(b->raw_size == noise.size() - msg::kSyncChunk);
    CHECK(a->bytes + b->bytes == noise);
  }
  SUBCASE("an empty file is one chunk of nothing; a small one goes raw") {
    auto e = chunks.get(index_of(t, "empty"), 0);
    CHECK(e->offset == 0);
    CHECK(e->raw_size == 0);
    CHECK(e->bytes.empty());
    CHECK(e->compressed == 0);
    auto s = chunks.get(index_of(t, "small"), 0);
    CHECK(s->compressed == 0);
    CHECK(s->bytes == "tiny");
  }
  SUBCASE("a file that shrank after it was listed throws") {
    fs::resize_file(d.path / "text.txt", 1000);
    CHECK_THROWS_AS(chunks.get(index_of(t, "text.txt"), 0), mltrain::Error);
    fs::remove(d.path / "noise.bin");
    CHECK_THROWS_AS(chunks.get(index_of(t, "noise.bin"), 0), mltrain::Error);
  }
}

// ---- runner/sync/beneath: paths from elsewhere, walked without following a link ----

TEST_CASE("beneath: only plain relative paths are below a folder") {
  for (const char* ok : {"a", "a/b", "a.b/c..d", ".hidden/x", "..a", "a/...", "a b/c"})
    CHECK_MESSAGE(is_below(ok), ok);
  for (const char* bad : {"", "/a", "..", "a/..", "../a", "a/../b", ".", "./a", "a/.", "a//b", "a/", "//"})
    CHECK_MESSAGE(!is_below(bad), bad);
  CHECK(!is_below(std::string("a\0b", 3)));
}

TEST_CASE("beneath: open_parent walks below the folder, makes folders, and refuses links and files") {
  TempDir t("beneath");
  fs::create_directories(fs::path(t.path) / "root" / "a");
  fs::create_directories(fs::path(t.path) / "outside");
  t.write("outside/precious.txt", "precious\n");
  t.write("root/file", "f\n");
  fs::create_directory_symlink(fs::path(t.path) / "outside", fs::path(t.path) / "root" / "link");
  Fd root(::open((t.path / "root").c_str(), O_RDONLY | O_DIRECTORY));
  REQUIRE(root);
  std::string leaf;
  {
    Fd p(open_parent(root.get(), "a/b/c/x.txt", leaf, true, 0700));
    REQUIRE(p);
    CHECK(leaf == "x.txt");
    CHECK(fs::is_directory(fs::path(t.path) / "root/a/b/c"));
  }
  Fd through_link(open_parent(root.get(), "link/precious.txt", leaf, true));
  CHECK(!through_link);
  CHECK((errno == ELOOP || errno == ENOTDIR));  // O_DIRECTORY with O_NOFOLLOW on a link: ENOTDIR
  Fd through_file(open_parent(root.get(), "file/x", leaf, true));
  CHECK(!through_file);
  CHECK(errno == ENOTDIR);
  Fd dotdot(open_parent(root.get(), "a/../../outside/x", leaf, true));
  CHECK(!dotdot);
  CHECK(errno == EINVAL);
  Fd missing(open_parent(root.get(), "nope/x", leaf, false));
  CHECK(!missing);
  CHECK(errno == ENOENT);
  CHECK(!fs::exists(fs::path(t.path) / "root" / "nope"));
}

TEST_CASE("beneath: remove_tree_at removes a link, never what it points to") {
  TempDir t("beneath");
  t.write("outside/precious.txt", "precious\n");
  t.write("root/tree/a/b.txt", "b\n");
  fs::create_directory_symlink(fs::path(t.path) / "outside",
                               fs::path(t.path) / "root" / "tree" / "a" / "link");
  Fd root(::open((t.path / "root").c_str(), O_RDONLY | O_DIRECTORY));
  REQUIRE(root);
  CHECK(remove_tree_at(root.get(), "tree") == 0);
  CHECK(!fs::exists(fs::path(t.path) / "root" / "tree"));
  CHECK(fs::exists(fs::path(t.path) / "outside" / "precious.txt"));
  CHECK(remove_tree_at(root.get(), "not-there") == 0);
}

TEST_CASE("beneath: a held work folder survives a sweep; one nobody holds, and old leftovers, go") {
  TempDir t("beneath");
  Fd parent(::open(t.path.c_str(), O_RDONLY | O_DIRECTORY));
  REQUIRE(parent);
  {
    WorkFolder held;
    REQUIRE(held.make(parent.get(), "tmp-"));
    CHECK(held.name().rfind("tmp-", 0) == 0);
    t.write(held.name() + "/f-1", "in progress\n");
    t.write("tmp-dead0123456789ab/lock", "");  // its sync was killed: nobody holds the lock
    t.write("tmp-dead0123456789ab/f-2", "left\n");
    t.write("tmp-7", "an older agent's file\n");
    t.write("other/keep", "not a work folder\n");
    CHECK(sweep_work_folders(parent.get(), "tmp-") == 2);
    CHECK(fs::exists(t.path / held.name() / "f-1"));
    CHECK(!fs::exists(t.path / "tmp-dead0123456789ab"));
    CHECK(!fs::exists(t.path / "tmp-7"));
    CHECK(fs::exists(t.path / "other" / "keep"));
  }
  // It goes with what is left in it when the WorkFolder does.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(t.path)) left.push_back(e.path().filename().string());
  CHECK(left == std::vector<std::string>{"other"});
}

TEST_CASE("atomic file: a reader sees the old file or the new one whole, never a part or a temporary") {
  TempDir dir("atomic-file");
  const fs::path file = dir.path / "state.json";
  std::ofstream(file) << "old\n";
  const int d = ::open(dir.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(d >= 0);
  {
    AtomicFile f(d, "state.json", 0640);
    REQUIRE(f.ok());
    CHECK(f.write("new "));
    CHECK(mltrain::testing::lines_of(file) ==
          std::vector<std::string>{"old"});  // not yet: the name holds the old file
    CHECK(f.write("and whole\n"));
    CHECK(f.commit(true));
  }
  CHECK(mltrain::testing::lines_of(file) == std::vector<std::string>{"new and whole"});
  struct stat st {};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
  {
    AtomicFile f(d, "state.json");
    CHECK(f.write("abandoned"));
  }  // never committed: the old file stays, the temporary goes
  CHECK(mltrain::testing::lines_of(file) == std::vector<std::string>{"new and whole"});
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
  // What fails says what, on which file; a path through AT_FDCWD works as a name in a folder does.
  fs::create_directory(dir.path / "sub");
  std::string error;
  CHECK_FALSE(write_atomically(AT_FDCWD, (dir.path / "missing" / "x").string(), "y", 0600, false, error));
  CHECK(error.rfind("open " + (dir.path / "missing").string() + "/.x.tmp.", 0) == 0);
  CHECK(error.find("No such file or directory") != std::string::npos);
  CHECK(write_atomically(AT_FDCWD, (dir.path / "sub" / "x").string(), "y\n", 0600, false, error));
  CHECK(mltrain::testing::lines_of(dir.path / "sub" / "x") == std::vector<std::string>{"y"});
  ::close(d);
}
