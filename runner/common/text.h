// Small text helpers shared by the spec loader, the CLI, the supervisor and the hostfile parser.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "knobs/parse.h"

namespace mltrain::text {

// The candidate closest to `word` by edit distance (case-insensitive, a swapped pair of letters
// is one edit), if it is close enough to be a likely typo: at most a third of the word's length in
// edits (1 to 3), or the one candidate that the word begins (3 letters or more). Words over 256
// characters get no suggestion. The one "did you mean" engine of mltrain, hostfile's included.
std::optional<std::string> closest(std::string_view word, const std::vector<std::string>& candidates);

// " (did you mean 'x'?)" or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// "90s", "2h", "1h30m", "500ms", "1.5m" or a bare number of seconds; nullopt when malformed. The
// one duration parser, shared with the comm library, lives in knobs/.
using knobs::parse_duration;
std::string format_duration(std::chrono::milliseconds d);

std::vector<std::string> split(std::string_view s, char sep);
std::string trim(std::string_view s);
std::string join(const std::vector<std::string>& parts, std::string_view sep);
bool starts_with(std::string_view s, std::string_view prefix);

// Parses "0,3,5-7" into rank numbers; nullopt when malformed.
std::optional<std::vector<int>> parse_int_list(std::string_view s);

// Quotes `s` for a POSIX shell, only when needed (for display in --dry-run output).
std::string shell_quote(std::string_view s);

// `s` for a one-line message: at most `max` bytes, tab as \t, other control bytes and non-ASCII as
// \xNN, "..." when cut (hostfile and spec errors quote user text this way).
std::string excerpt(std::string_view s, size_t max = 120);

// `bytes` as a terminal should show a rank's output: control bytes but tab and SGR colour codes,
// and invalid UTF-8, as \xNN (the live console and `mltrain logs` alike).
std::string escape_console(std::string_view bytes);
// How many bytes of `s` end before an incomplete UTF-8 sequence at its end.
size_t complete_utf8(std::string_view s);

}  // namespace mltrain::text
