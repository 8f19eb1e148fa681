// Every MLTRAIN_COMM_* knob, declared once with its default (docs/comm.md has the table).
#pragma once

#include <cstdint>
#include <string>

namespace mltrain::comm::detail {

struct Knob {
  const char* name;
  const char* default_value;
  const char* help;
};

// The table, for docs and `mltrain` to print.
const Knob* knobs(std::size_t* count);

// Value of an environment variable, or fallback when unset or empty.
std::string env_string(const char* name, const std::string& fallback = {});
// Parses "4K", "1M", "256M", "2G" and plain numbers; throws Error(usage) naming the variable.
std::uint64_t parse_size(const std::string& text, const char* what);
std::int64_t env_int(const char* name, std::int64_t fallback);

}  // namespace mltrain::comm::detail
