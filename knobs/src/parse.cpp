#include "knobs/parse.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

namespace mltrain::knobs {

namespace {

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

// Longer than this is a typo, not a timeout (about 31,700 years).
constexpr double kMaxDurationMs = 1e15;

}  // namespace

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text,
                                                        std::chrono::milliseconds bare_unit) {
  std::string_view s = trimmed(text);
  if (s.empty()) return std::nullopt;
  double total_ms = 0;
  bool any = false;
  while (!s.empty()) {
    size_t i = 0;
    while (i < s.size() && (is_digit(s[i]) || s[i] == '.')) ++i;
    if (i == 0) return std::nullopt;
    const std::string number(s.substr(0, i));
    char* end = nullptr;
    const double value = std::strtod(number.c_str(), &end);
    if (end != number.c_str() + number.size()) return std::nullopt;
    s.remove_prefix(i);
    size_t j = 0;
    while (j < s.size() && std::isalpha(static_cast<unsigned char>(s[j]))) ++j;
    const std::string_view unit = s.substr(0, j);
    s.remove_prefix(j);
    double scale;
    if (unit.empty()) {
      if (any || !s.empty()) return std::nullopt;  // a bare number must stand alone
      scale = static_cast<double>(bare_unit.count());
    } else if (unit == "ms")
      scale = 1;
    else if (unit == "s")
      scale = 1e3;
    else if (unit == "m" || unit == "min")
      scale = 60e3;
    else if (unit == "h")
      scale = 3600e3;
    else if (unit == "d")
      scale = 86400e3;
    else
      return std::nullopt;
    total_ms += value * scale;
    any = true;
  }
  if (!std::isfinite(total_ms) || total_ms < 0 || total_ms > kMaxDurationMs) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(std::llround(total_ms)));
}

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  const std::string_view s = trimmed(text);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  const std::string_view suffix(end, static_cast<size_t>(s.data() + s.size() - end));
  unsigned shift;
  if (suffix.empty())
    shift = 0;
  else if (suffix == "K" || suffix == "k" || suffix == "KiB")
    shift = 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB")
    shift = 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB")
    shift = 30;
  else if (suffix == "T" || suffix == "t" || suffix == "TiB")
    shift = 40;
  else
    return std::nullopt;
  if (shift != 0 && value > (UINT64_MAX >> shift)) return std::nullopt;
  return value << shift;
}

std::optional<std::int64_t> parse_int(std::string_view text) {
  std::string_view s = trimmed(text);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  std::int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

std::optional<bool> parse_flag(std::string_view text) {
  std::string s(trimmed(text));
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off") return false;
  return std::nullopt;
}

}  // namespace mltrain::knobs
