// Character classes, numbers and splitting shared by the hostfile parsers, and the bounds that keep
// a typo (slots=4000000000, node[1-999999999]) from becoming a huge allocation.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hostfile/detail/where.h"

namespace mltrain::hostfile::detail {

constexpr int max_slots_per_host = 65536;
constexpr std::size_t max_expanded_names = 65536;

inline bool is_blank(char c) { return c == ' ' || c == '\t'; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }

bool all_digits(std::string_view s);  // false for ""
std::string lowered(std::string_view s);
bool starts_with_ci(std::string_view s, std::string_view prefix);  // `prefix` in lower case
std::string_view trim(std::string_view s);                         // blanks are ' ' and '\t'

// Splits on every `sep`, keeping empty pieces; each piece points into `s`, so it still gives a column.
std::vector<std::string_view> split(std::string_view s, char sep);

// Splits on `sep` outside brackets, checking that brackets pair up (they never nest).
std::vector<std::string_view> split_top_level(const Where& w, std::string_view s, char sep);

// Fails at the first byte that may not appear in a hostfile line or host list (comments excepted).
void reject_control_chars(const Where& w, std::string_view s);

// Parses a decimal number of digits only ("+4", "-1", "4x", "0x10" are rejected); nullopt when
// malformed or outside [lo, hi].
std::optional<long long> parse_number(std::string_view s, long long lo, long long hi);

}  // namespace mltrain::hostfile::detail
