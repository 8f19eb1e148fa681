// Comma lists of host items, as one hostfile line or one -H value holds them.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hostfile/detail/where.h"
#include "hostfile/hostfile.h"

namespace mltrain::hostfile::detail {

// Parses a comma list of items into `out`, rejecting hosts already in `seen` (key -> where it was
// first written), so duplicates are found across the lines of one hostfile.
void parse_items(const Where& w, std::string_view content, const std::string& origin,
                 std::map<std::string, std::string>& seen, std::vector<Host>& out);

}  // namespace mltrain::hostfile::detail
