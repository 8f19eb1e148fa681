#include "hostfile/detail/scan.h"

#include <algorithm>
#include <charconv>
#include <system_error>

namespace mltrain::hostfile::detail {

bool all_digits(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_digit); }

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; });
  return out;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && lowered(s.substr(0, prefix.size())) == prefix;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> pieces;
  std::size_t start = 0;
  while (true) {
    std::size_t at = s.find(sep, start);
    pieces.push_back(s.substr(start, at == std::string_view::npos ? at : at - start));
    if (at == std::string_view::npos) return pieces;
    start = at + 1;
  }
}

std::vector<std::string_view> split_top_level(const Where& w, std::string_view s, char sep) {
  std::vector<std::string_view> pieces;
  std::size_t start = 0;
  std::size_t open = std::string_view::npos;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[') {
      if (open != std::string_view::npos) {
        w.fail(s.substr(i, 1), "nested '['", "brackets hold one range or one IPv6 address: 'gpu[01-04]'");
      }
      open = i;
    } else if (c == ']') {
      if (open == std::string_view::npos) {
        w.fail(s.substr(i, 1), "unmatched ']'", "remove it, or open the bracket: 'gpu[01-04]'");
      }
      open = std::string_view::npos;
    } else if (c == sep && open == std::string_view::npos) {
      pieces.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  if (open != std::string_view::npos) {
    w.fail(s.substr(open, 1), "missing ']'", "close the bracket: 'gpu[01-04]' or '[fe80::1]'");
  }
  pieces.push_back(s.substr(start));
  return pieces;
}

void reject_control_chars(const Where& w, std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      w.fail(s.substr(i, 1), "unexpected control character " + quoted(s.substr(i, 1)),
             "hostfiles and host lists are plain text");
    }
  }
}

std::optional<long long> parse_number(std::string_view s, long long lo, long long hi) {
  if (!all_digits(s)) return std::nullopt;
  unsigned long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  if (v > static_cast<unsigned long long>(hi) || static_cast<long long>(v) < lo) return std::nullopt;
  return static_cast<long long>(v);
}

}  // namespace mltrain::hostfile::detail
