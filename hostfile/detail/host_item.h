// One host item in any of the formats a hostfile line or host list accepts.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "hostfile/detail/where.h"
#include "hostfile/hostfile.h"

namespace mltrain::hostfile::detail {

struct Item {
  std::vector<Host> hosts;           // one per expanded name
  std::string_view first_attribute;  // empty when the item has none; points into the text
};

// Parses one host item: "[ssh://][user@]host[:N] [key=value ...]" where host is a name, a Slurm
// pattern or a bracketed IPv6 address, and N is the slot count (or the SSH port after ssh://).
// Keys are DeepSpeed's and Open MPI's slots=, max_slots= (max-slots=) and port=.
Item parse_item(const Where& w, std::string_view item, const std::string& origin);

}  // namespace mltrain::hostfile::detail
