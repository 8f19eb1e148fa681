#include "runner/tree/ignore.h"

namespace mltrain::sync {

namespace {

// A character class at p[0] == '['; returns the length of the class, or 0 when it is not one.
size_t match_class(std::string_view p, char c, bool& matched) {
  size_t i = 1;
  bool negate = i < p.size() && (p[i] == '!' || p[i] == '^');
  if (negate) ++i;
  bool any = false;
  bool first = true;
  while (i < p.size() && (first || p[i] != ']')) {
    first = false;
    char lo = p[i];
    if (lo == '\\' && i + 1 < p.size()) lo = p[++i];
    char hi = lo;
    if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
      hi = p[i + 2];
      if (hi == '\\' && i + 3 < p.size()) hi = p[++i + 2];
      i += 2;
    }
    if (c >= lo && c <= hi) any = true;
    ++i;
  }
  if (i >= p.size()) return 0;  // no closing ']': a literal '['
  matched = (any != negate) && c != '/';
  return i + 1;
}

bool match(std::string_view p, std::string_view s) {
  while (!p.empty()) {
    char c = p[0];
    if (c == '*') {
      if (p.size() >= 2 && p[1] == '*') {
        std::string_view rest = p.substr(2);
        if (rest.empty()) return true;  // "**" at the end: everything below
        if (rest[0] == '/') {
          rest.remove_prefix(1);  // "**/": none or more whole parts
          for (size_t i = 0;;) {
            if (match(rest, s.substr(i))) return true;
            size_t slash = s.find('/', i);
            if (slash == std::string_view::npos) return false;
            i = slash + 1;
          }
        }
        for (size_t i = 0; i <= s.size(); ++i)  // "**x": anything, slashes too
          if (match(rest, s.substr(i))) return true;
        return false;
      }
      std::string_view rest = p.substr(1);
      for (size_t i = 0; i <= s.size(); ++i) {
        if (match(rest, s.substr(i))) return true;
        if (i < s.size() && s[i] == '/') return false;
      }
      return false;
    }
    if (s.empty()) return false;
    if (c == '?') {
      if (s[0] == '/') return false;
      p.remove_prefix(1);
    } else if (c == '[') {
      bool matched = false;
      size_t n = match_class(p, s[0], matched);
      if (n == 0) {
        if (s[0] != '[') return false;
        p.remove_prefix(1);
      } else {
        if (!matched) return false;
        p.remove_prefix(n);
      }
    } else {
      if (c == '\\' && p.size() > 1) {
        c = p[1];
        p.remove_prefix(1);
      }
      if (s[0] != c) return false;
      p.remove_prefix(1);
    }
    s.remove_prefix(1);
  }
  return s.empty();
}

}  // namespace

bool glob_match(std::string_view pattern, std::string_view path) { return match(pattern, path); }

void Rules::add_text(std::string_view text, const std::string& base) {
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    add(line, base);
  }
}

void Rules::add(std::string_view pattern, const std::string& base) {
  // Trailing spaces go unless escaped; blank lines and comments are nothing.
  while (!pattern.empty() && pattern.back() == ' ' &&
         !(pattern.size() >= 2 && pattern[pattern.size() - 2] == '\\'))
    pattern.remove_suffix(1);
  if (pattern.empty() || pattern[0] == '#') return;
  Rule r;
  r.base = base;
  if (pattern[0] == '!') {
    r.negate = true;
    pattern.remove_prefix(1);
  } else if (pattern[0] == '\\' && pattern.size() > 1 && (pattern[1] == '!' || pattern[1] == '#')) {
    pattern.remove_prefix(1);
  }
  if (!pattern.empty() && pattern.back() == '/') {
    r.dir_only = true;
    while (!pattern.empty() && pattern.back() == '/') pattern.remove_suffix(1);
  }
  if (pattern.empty()) return;
  r.anchored = pattern.find('/') != std::string_view::npos;
  while (!pattern.empty() && pattern[0] == '/') pattern.remove_prefix(1);
  if (pattern.empty()) return;
  r.pattern = std::string(pattern);
  rules_.push_back(std::move(r));
}

Rules::Verdict Rules::check(std::string_view path, bool is_dir) const {
  for (size_t k = rules_.size(); k-- > 0;) {
    const Rule& r = rules_[k];
    if (r.dir_only && !is_dir) continue;
    std::string_view rel = path;
    if (!r.base.empty()) {
      if (rel.size() <= r.base.size() || rel.compare(0, r.base.size(), r.base) != 0 ||
          rel[r.base.size()] != '/')
        continue;
      rel.remove_prefix(r.base.size() + 1);
    }
    bool hit;
    if (r.anchored) {
      hit = match(r.pattern, rel);
    } else {
      size_t slash = rel.rfind('/');
      hit = match(r.pattern, slash == std::string_view::npos ? rel : rel.substr(slash + 1));
    }
    if (hit) return r.negate ? included : excluded;
  }
  return none;
}

bool Rules::excluded_with_parents(std::string_view path, bool is_dir) const {
  for (size_t i = path.find('/'); i != std::string_view::npos; i = path.find('/', i + 1))
    if (check(path.substr(0, i), true) == excluded) return true;
  return check(path, is_dir) == excluded;
}

}  // namespace mltrain::sync
