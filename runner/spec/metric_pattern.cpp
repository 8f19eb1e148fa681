// [metrics] patterns: Python's named groups in std::regex's ECMAScript grammar (docs/metrics.md).
#include <cctype>
#include <regex>
#include <set>

#include "runner/spec/spec.h"

namespace mltrain::spec {

namespace {

bool metric_name(const std::string& n) {
  if (n.empty() || n.size() > 64 || !(std::isalpha(static_cast<unsigned char>(n[0])) || n[0] == '_'))
    return false;
  for (char c : n)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

}  // namespace

std::string metric_regex(const std::string& pattern, std::vector<std::string>& groups, std::string& error) {
  groups.clear();
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {  // an escape: the next character whatever it is
      out += c;
      if (i + 1 < pattern.size()) out += pattern[++i];
      continue;
    }
    if (in_class) {
      in_class = c != ']';
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];  // "[]...]"
      continue;
    }
    if (c != '(') {
      out += c;
      continue;
    }
    std::string_view rest(pattern.data() + i, pattern.size() - i);
    if (rest.rfind("(?P=", 0) == 0) {
      error = "a named back-reference (?P=...) is not supported; use \\1 and the like";
      return {};
    }
    size_t name_at = rest.rfind("(?P<", 0) == 0                                                         ? 4
                     : rest.rfind("(?<", 0) == 0 && rest.size() > 3 && rest[3] != '=' && rest[3] != '!' ? 3
                                                                                                        : 0;
    if (name_at) {
      const size_t close = rest.find('>', name_at);
      std::string name(rest.substr(name_at, close == std::string_view::npos ? 0 : close - name_at));
      if (close == std::string_view::npos || !metric_name(name)) {
        error = "the group name '" + std::string(rest.substr(name_at, 20)) +
                "' is not a name: letters, digits and '_', not starting with a digit, at most 64";
        return {};
      }
      groups.push_back(name);
      out += '(';
      i += close;
      continue;
    }
    if (rest.rfind("(?", 0) != 0) groups.emplace_back();  // (?: (?= (?! capture nothing
    out += c;
  }
  std::set<std::string> seen;
  bool metric = false;
  for (const auto& g : groups) {
    if (g.empty()) continue;
    if (!seen.insert(g).second) {
      error = "the group name '" + g + "' is used twice";
      return {};
    }
    metric = metric || g != "step";
  }
  if (!metric) {
    error = "the pattern names no metric: name a group, as in 'loss=(?P<loss>[-0-9.e+]+)'";
    return {};
  }
  try {
    std::regex check(out, std::regex::ECMAScript);
    if (check.mark_count() != groups.size()) {
      error = "the pattern's groups could not be counted";
      return {};
    }
  } catch (const std::regex_error& e) {
    error = std::string("not a regular expression: ") + e.what();
    return {};
  }
  return out;
}

}  // namespace mltrain::spec
