#include "runner/common/text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "runner/common/error.h"

namespace mltrain::text {

namespace {
// A word this long is no typo: no suggestion, and no quadratic cost on hostile input.
constexpr size_t kLongestWord = 256;

char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }

// Optimal string alignment distance, case-insensitive: swapping two neighbouring letters counts
// as one edit ("nmae" -> "name").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (lower(s[i]) != lower(prefix[i])) return false;
  return true;
}
}  // namespace

std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.size() > kLongestWord) return std::nullopt;
  std::optional<std::string> best;
  size_t best_distance = 0;
  for (const auto& c : candidates) {
    if (c.size() > kLongestWord) continue;
    size_t d = edit_distance(word, c);
    if (!best || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // Like ninja: accept up to a third of the word's length in edits, at least 1, at most 3; but
  // never a word that shares no letter with it ("a" is no typo of "b").
  size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  if (best && best_distance <= limit && best_distance < word.size()) return best;
  // A shortened key ("grace" for "grace_period") is a typo too, when it begins only one candidate
  // ("worker" of worker-1 and worker-2 would be a guess).
  if (word.size() < 3) return std::nullopt;
  std::optional<std::string> only;
  for (const auto& c : candidates)
    if (c.size() > word.size() && starts_with_nocase(c, word)) {
      if (only) return std::nullopt;
      only = c;
    }
  return only;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto c = closest(word, candidates);
  return c ? " (did you mean '" + *c + "'?)" : std::string();
}

std::string format_duration(std::chrono::milliseconds d) {
  long long ms = d.count();
  char buf[64];
  if (ms < 1000)
    std::snprintf(buf, sizeof buf, "%lldms", ms);
  else if (ms < 60'000)
    std::snprintf(buf, sizeof buf, "%.1fs", ms / 1000.0);
  else if (ms < 3'600'000)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", ms / 60'000, (ms / 1000) % 60);
  else
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", ms / 3'600'000, (ms / 60'000) % 60);
  return buf;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(b, e - b + 1));
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

std::optional<std::vector<int>> parse_int_list(std::string_view s) {
  std::vector<int> out;
  for (const auto& raw : split(s, ',')) {
    std::string part = trim(raw);
    if (part.empty()) return std::nullopt;
    auto parse = [](std::string_view t) -> std::optional<int> {
      int v = 0;
      auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
      if (ec != std::errc() || p != t.data() + t.size() || v < 0) return std::nullopt;
      return v;
    };
    size_t dash = part.find('-');
    if (dash == std::string::npos) {
      auto v = parse(part);
      if (!v) return std::nullopt;
      out.push_back(*v);
    } else {
      auto a = parse(std::string_view(part).substr(0, dash));
      auto b = parse(std::string_view(part).substr(dash + 1));
      if (!a || !b || *b < *a || *b - *a > 1'000'000) return std::nullopt;
      for (int v = *a; v <= *b; ++v) out.push_back(v);
    }
  }
  return out;
}

std::string named(std::string_view name, std::string_view line) {
  if (line.size() > name.size() + 1 && line.substr(0, name.size()) == name &&
      line.substr(name.size(), 2) == ": ")
    return std::string(line);
  return std::string(name) + ": " + std::string(line);
}

std::string unnamed(std::string_view name, std::string_view line) {
  const std::string n = named(name, line);
  return n.substr(name.size() + 2);
}

std::string shell_quote(std::string_view s) {
  bool plain = !s.empty();
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) ||
          std::string_view("@%+=:,./-_").find(c) != std::string_view::npos)) {
      plain = false;
      break;
    }
  }
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  out += "'";
  return out;
}

namespace {

// host_text and escape_console: one walk, `output` says whether tab and SGR codes pass, `bytes`
// whether bytes that are not UTF-8 pass (0xa0-0xff: never a control code, even to a terminal in an
// 8-bit mode, which takes 0x80-0x9f for C1).
std::string sanitise(std::string_view b, bool output, size_t max, bool bytes = false) {
  std::string out;
  const bool cut = max > 0 && b.size() > max;
  if (cut) b = b.substr(0, max);
  out.reserve(b.size());
  auto hex = [&](unsigned char c) {
    char x[8];
    std::snprintf(x, sizeof x, "\\x%02x", unsigned(c));
    out += x;
  };
  for (size_t i = 0; i < b.size();) {
    auto c = static_cast<unsigned char>(b[i]);
    if (c == 0x1b && output) {  // colour (SGR) codes pass: ESC [ digits and ';' m
      size_t j = i + 1;
      if (j < b.size() && b[j] == '[') {
        ++j;
        while (j < b.size() && ((b[j] >= '0' && b[j] <= '9') || b[j] == ';')) ++j;
        if (j < b.size() && b[j] == 'm') {
          out.append(b.substr(i, j + 1 - i));
          i = j + 1;
          continue;
        }
      }
      hex(c), ++i;
    } else if (c == '\t') {
      out += output ? "\t" : "\\t";
      ++i;
    } else if (c < 0x20 || c == 0x7f) {
      hex(c), ++i;
    } else if (c < 0x80) {
      out += char(c), ++i;
    } else {
      size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool ok = len > 0 && i + len <= b.size();
      for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(b[i + k]) & 0xc0) == 0x80;
      uint32_t cp = 0;
      if (ok) {
        cp = c & (0xff >> (len + 1));
        for (size_t k = 1; k < len; ++k) cp = cp << 6 | (static_cast<unsigned char>(b[i + k]) & 0x3f);
        // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
        ok = !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10ffff)) &&
             !(cp >= 0xd800 && cp <= 0xdfff);
      }
      if (!ok) {
        if (bytes && c >= 0xa0)
          out += char(c);
        else
          hex(c);
        ++i;
        continue;
      }
      // C1 controls (a terminal may take U+009B for CSI) and bidirectional overrides, which
      // reorder what the rest of the line seems to say.
      if (cp <= 0x9f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069)) {
        char x[16];
        std::snprintf(x, sizeof x, "\\u{%04x}", unsigned(cp));
        out += x;
      } else {
        out.append(b.substr(i, len));
      }
      i += len;
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace

std::optional<long long> parse_int_in(std::string_view s, long long lo, long long hi) {
  long long v = 0;
  if (!s.empty() && s[0] == '+') s.remove_prefix(1);
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

long long parse_int_arg(std::string_view s, std::string_view what, long long lo, long long hi) {
  if (auto v = parse_int_in(s, lo, hi)) return *v;
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  std::string_view digits = s.substr(!s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0);
  const bool number = !digits.empty() && digits.find_first_not_of("0123456789") == std::string_view::npos;
  throw Error(std::string(what) + ": '" + host_text(s, 64) + "' " +
                  (number ? "is out of range (a whole number from " + range + ")"
                          : "is not a whole number (from " + range + ")"),
              "give " + std::string(what) + " a whole number from " + range, exit_code::usage);
}

std::string host_text(std::string_view s, size_t max) { return sanitise(s, false, max); }

std::string escape_console(std::string_view b, bool terminal) { return sanitise(b, true, 0, !terminal); }

size_t complete_utf8(std::string_view s) {
  size_t i = s.size();
  for (int back = 0; back < 3 && i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xc0) == 0x80; ++back) --i;
  if (i == 0) return s.size();
  auto c = static_cast<unsigned char>(s[i - 1]);
  size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  return len > 0 && s.size() - (i - 1) < len ? i - 1 : s.size();
}

std::string excerpt(std::string_view s, size_t max) {
  std::string out;
  for (char ch : s.substr(0, max)) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", unsigned(c));
      out += buf;
    } else {
      out += ch;
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string int_ranges(std::vector<int> v, size_t columns) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(v[i]);
    if (j > i) out += (j == i + 1 ? "," : "-") + std::to_string(v[j]);
    i = j + 1;
  }
  if (columns == 0 || out.size() <= columns) return out;
  size_t comma = out.rfind(',', columns >= 2 ? columns - 2 : 0);  // room for ",…"
  return comma == std::string::npos ? "\u2026" : out.substr(0, comma) + ",\u2026";
}

std::string compact_names(const std::vector<std::string>& names) {
  // A group: the same stem, and numbers of one width when zero-padded (gpu01..gpu16).
  struct Group {
    std::string stem;
    size_t width = 0;  // 0: not zero-padded
    std::vector<std::string> names;
    std::vector<int> numbers;
  };
  std::vector<Group> groups;
  std::vector<std::string> seen;
  for (const auto& n : names) {
    if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
    seen.push_back(n);
    size_t d = n.size();
    while (d > 0 && std::isdigit(static_cast<unsigned char>(n[d - 1]))) --d;
    const size_t digits = n.size() - d;
    Group key;
    key.stem = n.substr(0, d);
    if (digits == 0 || digits > 9 || d == 0)
      key.stem = n, key.width = std::string::npos;  // no number
    else if (n[d] == '0' && digits > 1)
      key.width = digits;
    auto g = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.width != std::string::npos && x.stem == key.stem &&
             (x.width == key.width || (key.width == 0 && x.width == digits));  // gpu10 joins gpu01
    });
    if (g == groups.end()) g = groups.insert(groups.end(), key);
    g->names.push_back(n);
    if (g->width != std::string::npos) g->numbers.push_back(std::stoi(n.substr(d)));
  }
  std::vector<std::string> parts;
  for (const auto& g : groups) {
    if (g.names.size() < 3) {
      parts.insert(parts.end(), g.names.begin(), g.names.end());
      continue;
    }
    std::string ranges = int_ranges(g.numbers);
    if (g.width > 0) {  // zero-padded: each number at the group's width
      std::string padded, num;
      auto pad = [&](const std::string& x) {
        return std::string(g.width - std::min(g.width, x.size()), '0') + x;
      };
      for (char c : ranges + ",") {
        if (std::isdigit(static_cast<unsigned char>(c))) {
          num += c;
          continue;
        }
        padded += pad(num) + c;
        num.clear();
      }
      ranges = padded.substr(0, padded.size() - 1);
    }
    parts.push_back(g.stem + "[" + ranges + "]");
  }
  return join(parts, ", ");
}

std::string cut(std::string_view s, size_t columns) {
  size_t cols = 0, i = 0, keep = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) continue;  // inside a character
    if (cols + 1 == columns) keep = i;                                // where "…" would go
    if (++cols > columns) break;
  }
  if (cols <= columns) return std::string(s);
  return columns == 0 ? std::string() : std::string(s.substr(0, keep)) + "\u2026";
}

}  // namespace mltrain::text
