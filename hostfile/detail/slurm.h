// Slurm bracket ranges inside host names, shared by items, filters and node lists.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hostfile/detail/names.h"
#include "hostfile/detail/where.h"

namespace mltrain::hostfile::detail {

// Expands Slurm brackets in one name pattern ("r[1-2]n[1-2]", no top-level commas) and checks each
// resulting host name. Groups multiply, the first one varying slowest, as Slurm orders them.
std::vector<std::string> expand_pattern(const Where& w, std::string_view pattern);

// The names a host written in an item or filter entry stands for: its IPv6 address, or its name
// pattern expanded. Fails with `hint` when the name is missing.
std::vector<std::string> host_names(const Where& w, const HostPart& part, const std::string& hint);

}  // namespace mltrain::hostfile::detail
