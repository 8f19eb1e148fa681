// The one regular-expression engine for text a user or a rank gives mltrain ([metrics] patterns,
// `ls --where 'f ~ RE'`, `logs --grep`): RE2, whose matching takes time linear in the text and
// whose compiling is bounded, so no pattern and no line can stall the launcher or overflow its
// stack (std::regex took 76 s on one long line, and crashed on a 100,000-character pattern).
// The syntax is RE2's (Perl's without back-references and look-around; Python's `(?P<name>...)`
// groups). re2.h stays in regex.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::text {

class Regex {
 public:
  // The longest pattern and the deepest nesting of groups accepted.
  static constexpr size_t kMaxPattern = 4096;
  static constexpr int kMaxDepth = 64;

  // The compiled `pattern`, or nullptr with `error` saying why not ("missing ): ...").
  static std::unique_ptr<Regex> compile(std::string_view pattern, std::string& error);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Whether it matches somewhere in `text`.
  bool search(std::string_view text) const;
  // The same, with each capturing group's text in `groups` (one per group, in order; a group that
  // took no part is empty with a null data()).
  bool search(std::string_view text, std::vector<std::string_view>& groups) const;
  // Each capturing group's name in order, "" for an unnamed one.
  const std::vector<std::string>& group_names() const { return names_; }

 private:
  struct Impl;
  explicit Regex(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> names_;
};

}  // namespace mltrain::text
