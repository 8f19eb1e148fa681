#include "hostfile/detail/names.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <vector>

#include "hostfile/detail/scan.h"

namespace mltrain::hostfile::detail {
namespace {

std::size_t offset_in(std::string_view whole, std::string_view piece) {
  return static_cast<std::size_t>(piece.data() - whole.data());
}

std::optional<Problem> ipv4_problem(std::string_view name) {
  std::string hint = "expected a dotted quad such as 10.0.0.1, without leading zeros";
  auto parts = split(name, '.');
  for (std::size_t i = 0; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    // A leading zero makes inet_aton read the octet as octal: reject rather than guess.
    bool ok = !part.empty() && part.size() <= 3 && !(part.size() > 1 && part[0] == '0') &&
              parse_number(part, 0, 255).has_value();
    if (!ok || i >= 4) return Problem{offset_in(name, part), "bad IPv4 address " + quoted(name), hint};
  }
  if (parts.size() != 4) return Problem{0, "bad IPv4 address " + quoted(name), hint};
  return std::nullopt;
}

}  // namespace

std::optional<std::string> canonical_ipv6(std::string_view addr) {
  auto pct = addr.find('%');
  std::string_view ip = addr.substr(0, pct);
  std::string zone;
  if (pct != std::string_view::npos) {
    zone = std::string(addr.substr(pct + 1));
    bool zone_ok = !zone.empty() && std::all_of(zone.begin(), zone.end(), [](char c) {
      return is_alnum(c) || c == '_' || c == '-' || c == '.';
    });
    if (!zone_ok) return std::nullopt;
  }
  if (ip.size() > INET6_ADDRSTRLEN) return std::nullopt;
  in6_addr bytes{};
  if (inet_pton(AF_INET6, std::string(ip).c_str(), &bytes) != 1) return std::nullopt;
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, &bytes, buf, sizeof buf);
  return zone.empty() ? std::string(buf) : std::string(buf) + "%" + zone;
}

std::optional<Problem> host_name_problem(std::string_view name) {
  const std::string hint = "host names use letters, digits, '-', '_' and '.'";
  if (name.empty()) return Problem{0, "missing host name", "expected a host name, alias or address"};
  if (name.size() > 253) return Problem{0, "host name too long", "at most 253 characters"};
  // ssh would read a leading '-' as an option, so such a name is never a host.
  if (name[0] == '-') {
    return Problem{0, "host name " + quoted(name) + " starts with '-'", "a host name cannot start with '-'"};
  }
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (!(is_alnum(c) || c == '-' || c == '_' || c == '.')) {
      return Problem{i, "bad character " + quoted(name.substr(i, 1)) + " in host name " + quoted(name), hint};
    }
  }
  std::string_view labels = name;
  if (labels.size() > 1 && labels.back() == '.') labels.remove_suffix(1);  // fully qualified "a.b."
  for (std::string_view label : split(labels, '.')) {
    if (label.empty()) {
      return Problem{offset_in(name, label), "empty label in host name " + quoted(name),
                     "remove the extra '.'"};
    }
    if (label.size() > 63) {
      return Problem{offset_in(name, label), "label longer than 63 characters in host name " + quoted(name),
                     ""};
    }
  }
  if (std::all_of(name.begin(), name.end(), [](char c) { return is_digit(c) || c == '.'; })) {
    return ipv4_problem(name);
  }
  return std::nullopt;
}

void check_user(const Where& w, std::string_view user, std::string_view at_sign) {
  if (user.empty()) w.fail(at_sign, "missing user name before '@'", "write user@host, or drop the '@'");
  if (user[0] == '-') w.fail(user, "user name " + quoted(user) + " starts with '-'", "");
  for (std::size_t i = 0; i < user.size(); ++i) {
    char c = user[i];
    if (!(is_alnum(c) || c == '-' || c == '_' || c == '.')) {
      w.fail(user.substr(i, 1),
             "bad character " + quoted(user.substr(i, 1)) + " in user name " + quoted(user),
             "user names use letters, digits, '-', '_' and '.'");
    }
  }
}

std::string comparable_name(std::string_view name) {
  if (name.find(':') != std::string_view::npos) {
    if (auto c = canonical_ipv6(name)) return lowered(*c);
  }
  return lowered(name);
}

HostPart split_host(const Where& w, std::string_view s, const std::string& hint) {
  HostPart out;
  if (!s.empty() && s[0] == '[') {
    std::size_t close = s.find(']');
    if (close == std::string_view::npos) {
      w.fail(s.substr(0, 1), "missing ']'", "close the bracket: '[fe80::1]'");
    }
    std::string_view addr = s.substr(1, close - 1);
    if (!canonical_ipv6(addr)) {
      // "[1-4]" is most likely a Slurm range that lost its prefix.
      w.fail(
          addr, "bad IPv6 address " + quoted(addr),
          addr.find(':') == std::string_view::npos
              ? "brackets at the start hold an IPv6 address; a Slurm range needs a prefix, e.g. 'node[1-4]'"
              : "expected an address such as '[fe80::1]'");
    }
    out.host = addr;
    out.is_address = true;
    std::string_view after = s.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') w.fail(after, "unexpected " + quoted(after) + " after ']'", hint);
      out.suffix = after.substr(1);
    }
    return out;
  }
  std::vector<std::size_t> colons;
  bool in_brackets = false;
  for (std::size_t i = 0; i < s.size() && colons.size() < 2; ++i) {
    if (s[i] == '[') in_brackets = true;
    if (s[i] == ']') in_brackets = false;
    if (s[i] == ':' && !in_brackets) colons.push_back(i);
  }
  out.host = colons.empty() ? s : s.substr(0, colons[0]);
  if (!colons.empty()) out.suffix = s.substr(colons[0] + 1);
  if (colons.size() > 1) out.second_colon = s.substr(colons[1], 1);
  return out;
}

}  // namespace mltrain::hostfile::detail
