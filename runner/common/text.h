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

// The one parser of a whole number a user typed (an integer flag, the RANK of RUN:RANK:PATH):
// `s` when it is one from `lo` to `hi`, else an Error (usage, exit 2) naming `what`, one message
// for every flag: "--tail: '99999999999999999999' is out of range (a whole number from 0 to
// 2147483647)", "--tail: 'x' is not a whole number (from 0 to 2147483647)".
long long parse_int_arg(std::string_view s, std::string_view what, long long lo, long long hi);
// The same without an error: nullopt when `s` is not a whole number from lo to hi.
std::optional<long long> parse_int_in(std::string_view s, long long lo, long long hi);

// Parses "0,3,5-7" into rank numbers; nullopt when malformed.
std::optional<std::vector<int>> parse_int_list(std::string_view s);

// Whole numbers as ranges, ascending, each once: {6, 0, 1, 2, 3} -> "0-3,6" (rank lists in messages;
// parse_int_list reads it back). With `columns`, at most that many: cut after a whole item, ",…".
std::string int_ranges(std::vector<int> v, size_t columns = 0);

// Host names, each once, in the order given; three or more that differ only in a trailing number
// as one Slurm-style range, as -H takes it: {h1, h2, h3, h5, login} -> "h[1-3,5], login".
std::string compact_names(const std::vector<std::string>& names);

// `s` in at most `columns` terminal columns (a UTF-8 character is one), "…" last when cut.
std::string cut(std::string_view s, size_t columns);

// `line` said of host `name`: "name: line", unless it begins so already (a transport's errors
// name their host: "h3: h3: cannot connect" was printed).
std::string named(std::string_view name, std::string_view line);
// `line` without a leading "name: ", for a place that shows the name apart (a table's column).
std::string unnamed(std::string_view name, std::string_view line);

// Quotes `s` for a POSIX shell, only when needed (for display in --dry-run output).
std::string shell_quote(std::string_view s);

// `s` for a one-line message: at most `max` bytes, tab as \t, other control bytes and non-ASCII as
// \xNN, "..." when cut (hostfile and spec errors quote user text this way).
std::string excerpt(std::string_view s, size_t max = 120);

// The one sanitiser of text that came from a host (an agent's messages, problems, GPU names,
// file names, versions; a rank's or a setup command's output), for a terminal or a record: every
// control byte (NUL, ESC, newline, DEL ...) and invalid UTF-8 byte as \xNN, tab as \t, C1 controls
// and bidirectional overrides as \u{NNNN}; printable UTF-8 passes. The result is valid UTF-8 with
// no control byte, and sanitising it again changes nothing. At most `max` bytes of `s` are shown,
// then "..." (0: all).
std::string host_text(std::string_view s, size_t max = 0);

// `bytes` as a terminal should show a rank's output: host_text, except that tab and SGR colour
// codes pass (the live console, `mltrain logs` and [setup] output alike). `terminal` false (the
// console is a pipe or a file): bytes that are not UTF-8 pass as they are too, except 0x80-0x9f
// (C1 control codes to a terminal in an 8-bit mode; a pipe may end at one); control codes and the
// rest stay escaped, so nothing that moves a cursor or sets a title gets through either way.
std::string escape_console(std::string_view bytes, bool terminal = true);
// How many bytes of `s` end before an incomplete UTF-8 sequence at its end.
size_t complete_utf8(std::string_view s);

}  // namespace mltrain::text
