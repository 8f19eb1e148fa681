// The one parser for each kind of knob value: durations, byte sizes, integers, flags. The spec
// loader, the CLI, the comm library and the benchmark all parse through these.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string_view>

namespace mltrain::knobs {

// "90s", "2h", "1h30m", "500ms", "1.5m", "2d"; spaces around are ignored. A bare number ("12") is
// a count of `bare_unit` (seconds wherever docs/spec.md and docs/comm.md speak of durations).
// nullopt when malformed, negative, or beyond about 30 years.
std::optional<std::chrono::milliseconds> parse_duration(
    std::string_view text, std::chrono::milliseconds bare_unit = std::chrono::seconds(1));

// "4096", "4K", "1M", "256MiB", "2G" (binary multiples; k/m/g too); nullopt when malformed or
// beyond 2^64.
std::optional<std::uint64_t> parse_bytes(std::string_view text);

// A whole decimal number, optionally signed; nullopt when malformed or out of range.
std::optional<std::int64_t> parse_int(std::string_view text);

// 1/0, true/false, yes/no, on/off (any case); nullopt otherwise.
std::optional<bool> parse_flag(std::string_view text);

}  // namespace mltrain::knobs
