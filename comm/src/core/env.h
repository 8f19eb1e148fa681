// Reading the comm library's knobs. The table itself (names, defaults, help) is knobs/, shared with
// the launcher; `mltrain knobs` prints it.
#pragma once

#include <cstdint>
#include <string>

namespace mltrain::comm::detail {

// Parses "4K", "1M", "256M", "2G" and plain numbers (knobs::parse_bytes); throws Error(usage)
// naming `what` (a flag or variable).
std::uint64_t parse_size(const std::string& text, const char* what);

// LOCAL_RANK, through the knob registry (0 when unset); a bad value is Error(usage).
int local_rank();

}  // namespace mltrain::comm::detail
