// Allocation-free scanning of string_views for the telemetry parsers and the encoding.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace mltrain::telemetry::detail {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The next whitespace-separated token of `s` (consumed), "" at the end.
inline std::string_view next_token(std::string_view& s) {
  size_t b = 0;
  while (b < s.size() && is_space(s[b])) ++b;
  size_t e = b;
  while (e < s.size() && !is_space(s[e])) ++e;
  std::string_view token = s.substr(b, e - b);
  s.remove_prefix(e);
  return token;
}

// The next line of `s` (consumed, without its '\n'); false at the end.
inline bool next_line(std::string_view& s, std::string_view& line) {
  if (s.empty()) return false;
  size_t nl = s.find('\n');
  line = s.substr(0, nl);
  s.remove_prefix(nl == std::string_view::npos ? s.size() : nl + 1);
  return true;
}

// The next `sep`-separated cell of `s` (consumed); false after the last.
inline bool next_cell(std::string_view& s, char sep, std::string_view& cell, bool& done) {
  if (done) return false;
  size_t at = s.find(sep);
  if (at == std::string_view::npos) {
    cell = s;
    s = {};
    done = true;
  } else {
    cell = s.substr(0, at);
    s.remove_prefix(at + 1);
  }
  return true;
}

// All of `s` as an unsigned decimal; none for "", a sign, a non-digit or an overflow.
inline std::optional<uint64_t> parse_u64(std::string_view s) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  uint64_t v = 0;
  for (char c : s) {
    if (!is_digit(c)) return std::nullopt;
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

inline std::optional<int64_t> parse_i64(std::string_view s) {
  bool negative = !s.empty() && s.front() == '-';
  if (negative) s.remove_prefix(1);
  auto v = parse_u64(s);
  if (!v || *v > uint64_t(INT64_MAX)) return std::nullopt;
  return negative ? -int64_t(*v) : int64_t(*v);
}

// A non-negative decimal ("228.82", "47", "0.5") times 10^digits, the rest of the fraction
// truncated: fixed_point("228.82", 3) = 228820. None when it is not such a number.
inline std::optional<uint64_t> parse_fixed(std::string_view s, int digits) {
  size_t dot = s.find('.');
  std::string_view whole = s.substr(0, dot);
  std::string_view frac = dot == std::string_view::npos ? std::string_view{} : s.substr(dot + 1);
  if (whole.empty() && frac.empty()) return std::nullopt;
  uint64_t v = 0;
  if (!whole.empty()) {
    auto w = parse_u64(whole);
    if (!w) return std::nullopt;
    v = *w;
  }
  if (dot != std::string_view::npos && frac.empty()) return std::nullopt;
  uint64_t f = 0;
  for (int i = 0; i < digits; ++i) {
    uint64_t d = 0;
    if (size_t(i) < frac.size()) {
      if (!is_digit(frac[size_t(i)])) return std::nullopt;
      d = uint64_t(frac[size_t(i)] - '0');
    }
    f = f * 10 + d;
    if (v > UINT64_MAX / 10) return std::nullopt;
    v *= 10;
  }
  for (size_t i = size_t(digits); i < frac.size(); ++i)
    if (!is_digit(frac[i])) return std::nullopt;
  return v + f;
}

}  // namespace mltrain::telemetry::detail
