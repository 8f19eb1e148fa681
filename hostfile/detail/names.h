// Host names, user names and IPv6 addresses: what makes one valid and when two are the same host.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "hostfile/detail/where.h"

namespace mltrain::hostfile::detail {

// Canonical text of an IPv6 address (with its zone id), or nullopt when it is not one.
std::optional<std::string> canonical_ipv6(std::string_view addr);

// What is wrong with a host name, at which byte, and how to fix it.
struct Problem {
  std::size_t index = 0;
  std::string what;
  std::string hint;
};

// Checks a host name or IPv4 address (not an IPv6 one); nullopt when it is fine.
std::optional<Problem> host_name_problem(std::string_view name);

// Fails unless `user` is a user name; `at_sign` is the '@' after it, blamed when `user` is empty.
void check_user(const Where& w, std::string_view user, std::string_view at_sign);

// The name two hosts are compared by: DNS is case-insensitive, and "::1" and "0::1" are one address.
std::string comparable_name(std::string_view name);

// A host as written in an item or filter entry, split from the text after its ':'.
struct HostPart {
  std::string_view host;                   // an IPv6 address without its brackets, or a name or Slurm pattern
  bool is_address = false;                 // written in brackets (and checked to be IPv6)
  std::optional<std::string_view> suffix;  // the text after the ':' that ends the host
  std::string_view second_colon;           // a further ':' outside brackets; empty when none
};

// Splits "[v6]:suffix" or "name:suffix" (the first ':' outside Slurm brackets). A bracketed address
// must be IPv6 and be followed by nothing or ':'; `hint` says what was expected otherwise.
HostPart split_host(const Where& w, std::string_view s, const std::string& hint);

}  // namespace mltrain::hostfile::detail
