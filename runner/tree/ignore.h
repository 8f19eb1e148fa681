// Path patterns as .gitignore writes them, for the synced tree (.gitignore, .mltrainignore,
// [sync] exclude) and for what `pull` brings back. libc and the standard library only: the
// launcher and the agent both link it.
//
//   *.log        a name at any depth          build/      a directory at any depth, and all below it
//   /data        `data` beside the rule's file  a/**/b     a/b, a/x/b, a/x/y/b
//   !keep.log    re-includes what an earlier rule excluded (not below an excluded directory)
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mltrain::sync {

// Whether `path` matches the glob `pattern`: `*` and `?` stay within one path part, `**` crosses
// parts ("**/" also matches none), `[abc]` `[a-z]` `[!a]` are character classes, `\` escapes.
bool glob_match(std::string_view pattern, std::string_view path);

class Rules {
 public:
  enum Verdict { none, included, excluded };
  // The patterns of one file's text (blank lines and `#` comments skipped), found in folder
  // `base` ("" for the root; '/'-separated, relative to the root).
  void add_text(std::string_view text, const std::string& base = "");
  void add(std::string_view pattern, const std::string& base = "");
  // What the last rule that matches `path` (relative to the root) says; none when no rule does.
  // Rules only see paths below their base. A directory also matches rules ending in '/'.
  Verdict check(std::string_view path, bool is_dir) const;
  // Whether `path` or a folder above it is excluded (how git decides for a listed file).
  bool excluded_with_parents(std::string_view path, bool is_dir) const;
  bool empty() const { return rules_.empty(); }

 private:
  struct Rule {
    std::string base, pattern;
    bool negate = false, dir_only = false, anchored = false;
  };
  std::vector<Rule> rules_;
};

}  // namespace mltrain::sync
