#include "hostfile/hostfile.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <system_error>

#include "runner/common/text.h"

namespace mltrain::hostfile {
namespace {

// Bounds that keep a typo (slots=4000000000, node[1-999999999]) from becoming a huge allocation.
constexpr int max_slots_per_host = 65536;
constexpr std::size_t max_expanded_names = 65536;
constexpr std::size_t max_hostfile_bytes = std::size_t{64} << 20;
// Messages stay one readable line even when the offending line is enormous.
constexpr std::size_t max_quoted_chars = 120;

constexpr std::string_view keys_hint = "expected slots=N, max_slots=N or port=N";

bool is_blank(char c) { return c == ' ' || c == '\t'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }
char to_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool all_digits(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_digit); }

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), to_lower);
  return out;
}

bool starts_with_ci(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && lowered(s.substr(0, prefix.size())) == prefix;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_blank(s.back())) s.remove_suffix(1);
  return s;
}

// Control and non-ASCII bytes are escaped so a message is always one printable line.
std::string escaped(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, max_quoted_chars)) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  if (s.size() > max_quoted_chars) out += "...";
  return out;
}

std::string quoted(std::string_view s) { return "'" + escaped(s) + "'"; }

// The text being parsed and how to name a position in it. Every string_view handed to fail()
// must point into `text`, so its offset gives the column.
struct Where {
  std::string label;  // "hosts.txt:3" for a hostfile line, "-H" or "--include" for a list
  bool is_file_line = false;
  std::string_view text;  // the whole line or list, quoted in every message

  std::size_t column_of(std::string_view piece) const {
    return static_cast<std::size_t>(piece.data() - text.data()) + 1;
  }

  // Names an item for "first written at ..." in duplicate messages.
  std::string position_of(std::string_view piece) const {
    return is_file_line ? label : "column " + std::to_string(column_of(piece));
  }

  [[noreturn]] void fail(std::string_view piece, const std::string& what, const std::string& hint) const {
    std::string col = std::to_string(column_of(piece));
    std::string msg = is_file_line ? label + ":" + col + ": " : label + ": column " + col + ": ";
    msg += what + " in " + quoted(text);
    if (!hint.empty()) msg += " (" + hint + ")";
    throw ParseError(msg);
  }
};

// The first byte that may not appear in a hostfile line or host list (comments excepted).
void reject_control_chars(const Where& w, std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      w.fail(s.substr(i, 1), "unexpected control character " + quoted(s.substr(i, 1)),
             "hostfiles and host lists are plain text");
    }
  }
}

// Splits on `sep` outside brackets, checking that brackets pair up (they never nest).
std::vector<std::string_view> split_top_level(const Where& w, std::string_view s, char sep) {
  std::vector<std::string_view> pieces;
  std::size_t start = 0;
  std::size_t open = std::string_view::npos;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '[') {
      if (open != std::string_view::npos) {
        w.fail(s.substr(i, 1), "nested '['", "brackets hold one range or one IPv6 address: 'gpu[01-04]'");
      }
      open = i;
    } else if (c == ']') {
      if (open == std::string_view::npos) {
        w.fail(s.substr(i, 1), "unmatched ']'", "remove it, or open the bracket: 'gpu[01-04]'");
      }
      open = std::string_view::npos;
    } else if (c == sep && open == std::string_view::npos) {
      pieces.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  if (open != std::string_view::npos) {
    w.fail(s.substr(open, 1), "missing ']'", "close the bracket: 'gpu[01-04]' or '[fe80::1]'");
  }
  pieces.push_back(s.substr(start));
  return pieces;
}

// Parses a decimal number of digits only ("+4", "-1", "4x", "0x10" are rejected); nullopt when
// malformed or outside [lo, hi].
std::optional<long long> parse_number(std::string_view s, long long lo, long long hi) {
  if (!all_digits(s)) return std::nullopt;
  unsigned long long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  if (v > static_cast<unsigned long long>(hi) || static_cast<long long>(v) < lo) return std::nullopt;
  return static_cast<long long>(v);
}

int parse_slots(const Where& w, std::string_view value, std::string_view what) {
  auto n = parse_number(value, 1, max_slots_per_host);
  if (!n) {
    w.fail(value, "bad " + std::string(what) + " " + quoted(value),
           "expected a positive integer up to " + std::to_string(max_slots_per_host));
  }
  return static_cast<int>(*n);
}

int parse_port(const Where& w, std::string_view value) {
  auto n = parse_number(value, 1, 65535);
  if (!n) w.fail(value, "bad port " + quoted(value), "expected a port number from 1 to 65535");
  return static_cast<int>(*n);
}

// Canonical text of an IPv6 address (with its zone id), or nullopt when it is not one.
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

// What is wrong with a host name, at which byte, and how to fix it.
struct Problem {
  std::size_t index = 0;
  std::string what;
  std::string hint;
};

std::optional<Problem> ipv4_problem(std::string_view name) {
  std::string hint = "expected a dotted quad such as 10.0.0.1, without leading zeros";
  std::size_t start = 0;
  int parts = 0;
  while (true) {
    std::size_t dot = name.find('.', start);
    std::string_view part = name.substr(start, dot == std::string_view::npos ? dot : dot - start);
    ++parts;
    // A leading zero makes inet_aton read the octet as octal: reject rather than guess.
    bool ok = !part.empty() && part.size() <= 3 && !(part.size() > 1 && part[0] == '0') &&
              parse_number(part, 0, 255).has_value();
    if (!ok || parts > 4) return Problem{start, "bad IPv4 address " + quoted(name), hint};
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (parts != 4) return Problem{0, "bad IPv4 address " + quoted(name), hint};
  return std::nullopt;
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
  std::size_t start = 0;
  while (true) {
    std::size_t dot = labels.find('.', start);
    std::size_t len = (dot == std::string_view::npos ? labels.size() : dot) - start;
    if (len == 0) {
      return Problem{start, "empty label in host name " + quoted(name), "remove the extra '.'"};
    }
    if (len > 63) {
      return Problem{start, "label longer than 63 characters in host name " + quoted(name), ""};
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
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

// Expands one bracket group's inside, "01-04,07", into its values with zero padding kept.
void expand_ranges(const Where& w, std::string_view inner, std::string_view group,
                   std::vector<std::string>& out) {
  const std::string hint = "expected numbers and ranges such as '[01-04,07]'";
  if (inner.empty()) w.fail(group, "empty range " + quoted(group), hint);
  std::size_t start = 0;
  while (true) {
    std::size_t comma = inner.find(',', start);
    std::string_view part = inner.substr(start, comma == std::string_view::npos ? comma : comma - start);
    if (part.empty()) w.fail(inner.substr(start, 0), "empty item in range " + quoted(group), hint);
    std::size_t dash = part.find('-');
    std::string_view lo = part.substr(0, dash);
    std::string_view hi = dash == std::string_view::npos ? lo : part.substr(dash + 1);
    // 18 digits keep the arithmetic inside 64 bits.
    if (!all_digits(lo) || !all_digits(hi) || lo.size() > 18 || hi.size() > 18) {
      w.fail(part, "bad range " + quoted(part) + " in " + quoted(group), hint);
    }
    auto lo_n = parse_number(lo, 0, INT64_MAX);
    auto hi_n = parse_number(hi, 0, INT64_MAX);
    if (!lo_n || !hi_n) w.fail(part, "bad range " + quoted(part) + " in " + quoted(group), hint);
    if (*lo_n > *hi_n) {
      w.fail(part, "range " + quoted(part) + " runs backwards", "write the smaller number first");
    }
    // Padding comes from the low end ("01-10" gives 01..10); a padded high end must agree.
    if (hi.size() > 1 && hi[0] == '0' && hi.size() != lo.size()) {
      w.fail(part, "zero padding differs in range " + quoted(part), "pad both ends alike, e.g. '01-08'");
    }
    auto count = static_cast<unsigned long long>(*hi_n - *lo_n) + 1;
    if (count > max_expanded_names - out.size()) {
      w.fail(group, quoted(group) + " expands to more than " + std::to_string(max_expanded_names) + " names",
             "split the list");
    }
    for (long long v = *lo_n; v <= *hi_n; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
}

// Expands Slurm brackets in one name pattern ("r[1-2]n[1-2]", no top-level commas) and checks each
// resulting host name. Groups multiply, the first one varying slowest, as Slurm orders them.
std::vector<std::string> expand_pattern(const Where& w, std::string_view pattern) {
  std::vector<std::string> names{std::string()};
  bool has_brackets = false;
  std::size_t i = 0;
  while (i < pattern.size()) {
    if (pattern[i] == '[') {
      has_brackets = true;
      std::size_t close = pattern.find(']', i);
      if (close == std::string_view::npos) {
        w.fail(pattern.substr(i, 1), "missing ']'", "close the bracket: 'gpu[01-04]'");
      }
      std::string_view group = pattern.substr(i, close - i + 1);
      std::string_view inner = pattern.substr(i + 1, close - i - 1);
      if (auto nested = inner.find('['); nested != std::string_view::npos) {
        w.fail(inner.substr(nested, 1), "nested '['", "brackets hold one range: 'gpu[01-04]'");
      }
      std::vector<std::string> values;
      expand_ranges(w, inner, group, values);
      if (names.size() * values.size() > max_expanded_names) {
        w.fail(pattern,
               quoted(pattern) + " expands to more than " + std::to_string(max_expanded_names) + " names",
               "split the list");
      }
      std::vector<std::string> product;
      product.reserve(names.size() * values.size());
      for (const auto& prefix : names) {
        for (const auto& v : values) product.push_back(prefix + v);
      }
      names = std::move(product);
      i = close + 1;
    } else if (pattern[i] == ']') {
      w.fail(pattern.substr(i, 1), "unmatched ']'", "open the bracket: 'gpu[01-04]'");
    } else {
      std::size_t end = pattern.find_first_of("[]", i);
      if (end == std::string_view::npos) end = pattern.size();
      for (auto& n : names) n.append(pattern.substr(i, end - i));
      i = end;
    }
  }
  for (const auto& n : names) {
    if (auto p = host_name_problem(n)) {
      // Without brackets the name is the pattern itself, so the column can point at the byte.
      std::string_view at = has_brackets ? pattern : pattern.substr(std::min(p->index, pattern.size()));
      w.fail(at, p->what, p->hint);
    }
  }
  return names;
}

// The name two hosts are compared by: DNS is case-insensitive, and "::1" and "0::1" are one address.
std::string comparable_name(std::string_view name) {
  if (name.find(':') != std::string_view::npos) {
    if (auto c = canonical_ipv6(name)) return lowered(*c);
  }
  return lowered(name);
}

std::string duplicate_key(const Host& h) {
  return h.user + '\n' + comparable_name(h.name) + '\n' + std::to_string(h.port);
}

std::string display(const Host& h) {
  bool v6 = h.name.find(':') != std::string::npos;
  std::string host = v6 && h.port ? "[" + h.name + "]" : h.name;
  std::string s = h.user.empty() ? host : h.user + "@" + host;
  return h.port ? "ssh://" + s + ":" + std::to_string(h.port) : s;
}

struct Item {
  std::vector<Host> hosts;           // one per expanded name
  std::string_view first_attribute;  // empty when the item has none; points into the text
};

constexpr std::string_view key_slots = "slots";
constexpr std::string_view key_max_slots = "max_slots";
constexpr std::string_view key_port = "port";

// Parses one host item: "[ssh://][user@]host[:N] [key=value ...]" where host is a name, a Slurm
// pattern or a bracketed IPv6 address, and N is the slot count (or the SSH port after ssh://).
Item parse_item(const Where& w, std::string_view item, const std::string& origin) {
  std::size_t spec_end = 0;
  while (spec_end < item.size() && !is_blank(item[spec_end])) ++spec_end;
  std::string_view spec = item.substr(0, spec_end);
  std::string_view rest = item.substr(spec_end);

  if (spec.find('=') != std::string_view::npos) {
    w.fail(spec, "missing host name before " + quoted(spec), "a line starts with the host: 'gpu1 slots=4'");
  }
  std::string_view s = spec;
  bool ssh_url = starts_with_ci(s, "ssh://");
  if (ssh_url) {
    s.remove_prefix(6);
  } else if (auto scheme = s.find("://"); scheme != std::string_view::npos) {
    w.fail(spec, "unsupported scheme " + quoted(s.substr(0, scheme + 3)),
           "only ssh://[user@]host[:port] is supported");
  }

  std::string user;
  if (auto at = s.find('@'); at != std::string_view::npos) {
    if (auto again = s.find('@', at + 1); again != std::string_view::npos) {
      w.fail(s.substr(again, 1), "more than one '@'", "write user@host");
    }
    check_user(w, s.substr(0, at), s.substr(at, 1));
    user = std::string(s.substr(0, at));
    s = s.substr(at + 1);
  }
  const std::string number_hint = ssh_url ? "expected ssh://[user@]host[:port]" : "expected host[:slots]";

  std::vector<std::string> names;
  std::optional<std::string_view> number;  // the text after the ':' that ends the host
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
    names.emplace_back(addr);
    std::string_view after = s.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') w.fail(after, "unexpected " + quoted(after) + " after ']'", number_hint);
      number = after.substr(1);
    }
  } else {
    std::vector<std::size_t> colons;
    bool in_brackets = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '[') in_brackets = true;
      if (s[i] == ']') in_brackets = false;
      if (s[i] == ':' && !in_brackets) colons.push_back(i);
    }
    if (colons.size() > 1) {
      if (canonical_ipv6(s)) {
        w.fail(s, "IPv6 address " + quoted(s) + " without brackets",
               "write '[" + escaped(s) + "]', or '[address]:N' to give a slot count");
      }
      w.fail(s.substr(colons[1], 1), "unexpected second ':'", number_hint);
    }
    std::string_view host = colons.empty() ? s : s.substr(0, colons[0]);
    if (host.empty()) w.fail(host, "missing host name", number_hint);
    names = expand_pattern(w, host);
    if (!colons.empty()) number = s.substr(colons[0] + 1);
  }

  Host proto;
  proto.user = user;
  proto.origin = origin;
  if (number) {
    if (number->empty()) {
      w.fail(*number, std::string("missing ") + (ssh_url ? "port" : "slot count") + " after ':'",
             number_hint);
    }
    if (ssh_url) {
      proto.port = parse_port(w, *number);
    } else {
      proto.slots = parse_slots(w, *number, "slot count");
    }
  }

  // Attributes: key=value pairs; blanks around '=' are allowed, as Open MPI allows them.
  Item out;
  std::set<std::string> given;
  std::string_view max_slots_text;
  std::size_t i = 0;
  while (true) {
    while (i < rest.size() && is_blank(rest[i])) ++i;
    if (i == rest.size()) break;
    std::size_t key_start = i;
    while (i < rest.size() && !is_blank(rest[i]) && rest[i] != '=') ++i;
    std::string_view key = rest.substr(key_start, i - key_start);
    while (i < rest.size() && is_blank(rest[i])) ++i;
    if (key.empty()) w.fail(rest.substr(i, 1), "missing key before '='", std::string(keys_hint));
    if (i == rest.size() || rest[i] != '=') {
      w.fail(key, "expected key=value after the host, got " + quoted(key),
             "one host per line; " + std::string(keys_hint));
    }
    ++i;
    while (i < rest.size() && is_blank(rest[i])) ++i;
    std::size_t value_start = i;
    while (i < rest.size() && !is_blank(rest[i])) ++i;
    std::string_view value = rest.substr(value_start, i - value_start);
    if (out.first_attribute.empty()) out.first_attribute = key;

    // Open MPI spells it both ways; one canonical name keeps duplicate checks honest.
    std::string canonical = key == "max-slots" ? std::string(key_max_slots) : std::string(key);
    if (canonical != key_slots && canonical != key_max_slots && canonical != key_port) {
      auto guess =
          text::closest(key, {std::string(key_slots), std::string(key_max_slots), std::string(key_port)});
      w.fail(key, "unknown key " + quoted(key),
             guess ? "did you mean '" + *guess + "'?" : std::string(keys_hint));
    }
    if (!given.insert(canonical).second) {
      w.fail(key, "'" + canonical + "' given twice", "keep one");
    }
    if (value.empty()) w.fail(value, "missing value for " + quoted(key), std::string(keys_hint));
    if (canonical == key_slots) {
      if (proto.slots) w.fail(key, "slot count given twice (as ':N' and slots=)", "keep one");
      proto.slots = parse_slots(w, value, "slot count");
    } else if (canonical == key_max_slots) {
      proto.max_slots = parse_slots(w, value, "max_slots");
      max_slots_text = value;
    } else {
      if (proto.port) w.fail(key, "port given twice (in ssh:// and port=)", "keep one");
      proto.port = parse_port(w, value);
    }
  }
  if (proto.max_slots && proto.slots > proto.max_slots) {
    w.fail(
        max_slots_text,
        "max_slots " + std::to_string(proto.max_slots) + " is less than slots " + std::to_string(proto.slots),
        "max_slots must be at least slots");
  }

  for (auto& n : names) {
    Host h = proto;
    h.name = std::move(n);
    out.hosts.push_back(std::move(h));
  }
  return out;
}

// Parses a comma list of items (one hostfile line or one -H value) into `out`, rejecting hosts
// already in `seen` (key -> where it was first written).
void parse_items(const Where& w, std::string_view content, const std::string& origin,
                 std::map<std::string, std::string>& seen, std::vector<Host>& out) {
  reject_control_chars(w, content);
  auto items = split_top_level(w, content, ',');
  for (auto raw : items) {
    std::string_view item = trim(raw);
    if (item.empty()) {
      w.fail(raw, "empty item in list", "remove the extra ',' or write a host between the commas");
    }
    Item parsed = parse_item(w, item, origin);
    // "a,b slots=4" reads as if slots applied to both; refuse rather than pick a meaning.
    if (items.size() > 1 && !parsed.first_attribute.empty()) {
      w.fail(parsed.first_attribute, "key=value in a comma list",
             "use host:N items in a list, or one host per line with its keys");
    }
    for (auto& h : parsed.hosts) {
      auto [it, fresh] = seen.emplace(duplicate_key(h), w.position_of(item));
      if (!fresh) {
        w.fail(item, "duplicate host " + quoted(display(h)),
               "first written at " + it->second + "; remove one of them");
      }
      out.push_back(std::move(h));
    }
  }
}

// Slots a filter may name on a host: its remaining slot ids, or 0..n-1.
std::vector<int> valid_slots(const Host& h) {
  if (!h.slot_ids.empty()) return h.slot_ids;
  std::vector<int> ids(static_cast<std::size_t>(slot_count(h)));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  return ids;
}

std::string describe_slots(const std::vector<int>& ids) {
  bool contiguous = true;
  for (std::size_t i = 1; i < ids.size(); ++i) contiguous = contiguous && ids[i] == ids[i - 1] + 1;
  if (ids.size() > 1 && contiguous) return std::to_string(ids.front()) + "-" + std::to_string(ids.back());
  std::string s;
  for (std::size_t i = 0; i < ids.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  if (ids.size() > 16) s += ",...";
  return s;
}

struct Pick {
  bool all_slots = true;
  std::vector<int> slots;  // sorted, unique
};

}  // namespace

std::vector<Host> parse_hostfile(std::string_view text, std::string_view filename) {
  constexpr std::string_view bom = "\xEF\xBB\xBF";  // Windows editors add it; it is not part of a host name
  if (text.substr(0, bom.size()) == bom) text.remove_prefix(bom.size());
  std::vector<Host> hosts;
  std::map<std::string, std::string> seen;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string_view content = line.substr(0, line.find('#'));
    if (trim(content).empty()) continue;
    Where w{std::string(filename) + ":" + std::to_string(line_no), true, line};
    parse_items(w, trim(content), w.label, seen, hosts);
  }
  return hosts;
}

std::vector<Host> load_hostfile(const std::string& path) {
  auto cannot_read = [&](int err) {
    return ParseError(path + ": cannot read hostfile: " + std::system_category().message(err));
  };
  // O_NONBLOCK so that opening a FIFO with no writer cannot hang; reads are made blocking again below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw cannot_read(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw cannot_read(errno);
  if (S_ISDIR(st.st_mode)) throw cannot_read(EISDIR);
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);

  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw cannot_read(errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_hostfile_bytes) {
      throw ParseError(path + ": cannot read hostfile: larger than " +
                       std::to_string(max_hostfile_bytes >> 20) + " MiB (is it really a hostfile?)");
    }
  }
  return parse_hostfile(text, path);
}

std::vector<Host> parse_host_list(std::string_view list, std::string_view origin) {
  std::vector<Host> hosts;
  std::string_view content = trim(list);
  if (content.empty()) return hosts;
  std::map<std::string, std::string> seen;
  Where w{std::string(origin), false, list};
  parse_items(w, content, w.label, seen, hosts);
  return hosts;
}

std::vector<Host> apply_filters(std::vector<Host> hosts, std::string_view include, std::string_view exclude) {
  include = trim(include);
  exclude = trim(exclude);
  if (!include.empty() && !exclude.empty()) {
    throw ParseError(
        "--include " + quoted(include) + " and --exclude " + quoted(exclude) +
        ": only one of them may be given (keep hosts with --include, or drop them with --exclude)");
  }
  if (include.empty() && exclude.empty()) return hosts;
  const bool including = !include.empty();
  std::string_view filter = including ? include : exclude;
  Where w{including ? "--include" : "--exclude", false, filter};
  reject_control_chars(w, filter);
  const std::string entry_hint = "expected host[:slot,slot...] items joined by '@', e.g. 'gpu1:0,2@gpu2'";

  std::vector<std::string> known;
  for (const auto& h : hosts) {
    if (std::find(known.begin(), known.end(), h.name) == known.end()) known.push_back(h.name);
  }

  std::map<std::size_t, Pick> picks;              // host index -> what the filter says about it
  std::map<std::string, std::string_view> named;  // comparable name -> entry that named it
  for (auto entry : split_top_level(w, filter, '@')) {
    if (entry.empty()) w.fail(entry, "empty host in filter", entry_hint);
    std::vector<std::string> names;
    std::optional<std::string_view> slot_text;
    if (entry[0] == '[') {
      std::size_t close = entry.find(']');
      std::string_view addr = entry.substr(1, close - 1);
      if (!canonical_ipv6(addr)) w.fail(addr, "bad IPv6 address " + quoted(addr), entry_hint);
      names.emplace_back(addr);
      std::string_view after = entry.substr(close + 1);
      if (!after.empty()) {
        if (after[0] != ':') w.fail(after, "unexpected " + quoted(after) + " after ']'", entry_hint);
        slot_text = after.substr(1);
      }
    } else {
      std::size_t colon = std::string_view::npos;
      bool in_brackets = false;
      for (std::size_t i = 0; i < entry.size() && colon == std::string_view::npos; ++i) {
        if (entry[i] == '[') in_brackets = true;
        if (entry[i] == ']') in_brackets = false;
        if (entry[i] == ':' && !in_brackets) colon = i;
      }
      std::string_view name = entry.substr(0, colon);
      if (name.empty()) w.fail(name, "missing host name", entry_hint);
      names = expand_pattern(w, name);
      if (colon != std::string_view::npos) slot_text = entry.substr(colon + 1);
    }

    Pick pick;
    if (slot_text) {
      if (slot_text->empty()) w.fail(*slot_text, "missing slot list after ':'", entry_hint);
      pick.all_slots = false;
      std::size_t start = 0;
      while (true) {
        std::size_t comma = slot_text->find(',', start);
        std::string_view one =
            slot_text->substr(start, comma == std::string_view::npos ? comma : comma - start);
        auto n = parse_number(one, 0, max_slots_per_host - 1);
        if (!n) w.fail(one, "bad slot index " + quoted(one), "expected slot numbers from 0, e.g. 'gpu1:0,2'");
        pick.slots.push_back(static_cast<int>(*n));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
      }
      std::sort(pick.slots.begin(), pick.slots.end());
      pick.slots.erase(std::unique(pick.slots.begin(), pick.slots.end()), pick.slots.end());
    }

    for (const auto& name : names) {
      std::string key = comparable_name(name);
      if (auto [it, fresh] = named.emplace(key, entry); !fresh) {
        w.fail(entry, "host " + quoted(name) + " named twice in the filter",
               "name each host once, with all its slots: 'host:0,1'");
      }
      bool found = false;
      for (std::size_t i = 0; i < hosts.size(); ++i) {
        if (comparable_name(hosts[i].name) != key) continue;
        found = true;
        auto valid = valid_slots(hosts[i]);
        for (int s : pick.slots) {
          if (!std::binary_search(valid.begin(), valid.end(), s)) {
            w.fail(entry, "host " + quoted(hosts[i].name) + " has no slot " + std::to_string(s),
                   "its slots are " + describe_slots(valid));
          }
        }
        picks[i] = pick;
      }
      if (!found) {
        auto guess = text::closest(name, known);
        std::string hint;
        if (guess) {
          hint = "did you mean '" + *guess + "'?";
        } else if (known.empty()) {
          hint = "there are no hosts to filter";
        } else {
          hint = "known hosts: ";
          for (std::size_t i = 0; i < known.size() && i < 5; ++i) hint += (i ? ", " : "") + known[i];
          if (known.size() > 5) hint += ", ...";
        }
        w.fail(entry, "unknown host " + quoted(name), hint);
      }
    }
  }

  std::vector<Host> kept;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    auto it = picks.find(i);
    Host& h = hosts[i];
    if (including) {
      if (it == picks.end()) continue;
      if (!it->second.all_slots) h.slot_ids = it->second.slots;
    } else if (it != picks.end()) {
      if (it->second.all_slots) continue;
      std::vector<int> left;
      for (int s : valid_slots(h)) {
        if (!std::binary_search(it->second.slots.begin(), it->second.slots.end(), s)) left.push_back(s);
      }
      if (left.empty()) continue;
      h.slot_ids = std::move(left);
    }
    kept.push_back(std::move(h));
  }
  return kept;
}

std::vector<std::string> expand_nodelist(std::string_view nodelist) {
  std::vector<std::string> names;
  std::string_view content = trim(nodelist);
  if (content.empty()) return names;
  Where w{"nodelist", false, nodelist};
  reject_control_chars(w, content);
  for (auto raw : split_top_level(w, content, ',')) {
    std::string_view item = trim(raw);
    if (item.empty()) w.fail(raw, "empty item in node list", "remove the extra ','");
    auto expanded = expand_pattern(w, item);
    if (expanded.size() > max_expanded_names - names.size()) {
      w.fail(item, "node list expands to more than " + std::to_string(max_expanded_names) + " names",
             "split the list");
    }
    names.insert(names.end(), expanded.begin(), expanded.end());
  }
  return names;
}

int slot_count(const Host& h) {
  if (!h.slot_ids.empty()) return static_cast<int>(h.slot_ids.size());
  return h.slots > 0 ? h.slots : 1;
}

}  // namespace mltrain::hostfile
