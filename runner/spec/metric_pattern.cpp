// [metrics] patterns: Python's named groups in RE2's grammar (docs/metrics.md).
#include <cctype>
#include <set>

#include "runner/common/regex.h"
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
  // RE2 names groups as Python does, (?P<name>...); (?<name>...), which ECMAScript and PCRE
  // take too, becomes that form. Escapes and classes are copied as they are.
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
    std::string_view rest(pattern.data() + i, pattern.size() - i);
    if (rest.rfind("(?P=", 0) == 0) {
      error = "a named back-reference (?P=...) is not supported (RE2's syntax has no back-references)";
      return {};
    }
    if (rest.rfind("(?<", 0) == 0 && rest.size() > 3 && rest[3] != '=' && rest[3] != '!') {
      out += "(?P<";
      i += 2;
      continue;
    }
    out += c;
  }
  auto re = text::Regex::compile(out, error);
  if (!re) {
    error = "not a regular expression (RE2's syntax): " + error;
    return {};
  }
  groups = re->group_names();
  std::set<std::string> seen;
  bool metric = false;
  for (const auto& g : groups) {
    if (g.empty()) continue;
    if (!metric_name(g)) {
      error = "the group name '" + g +
              "' is not a name: letters, digits and '_', not starting with a digit, at most 64";
      return {};
    }
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
  return out;
}

}  // namespace mltrain::spec
