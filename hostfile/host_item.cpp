// One host item: DeepSpeed / Open MPI "host slots=4 max_slots=8", Horovod "host:4", "user@host",
// "[fe80::1]:4", "ssh://user@host:2222 slots=4" and "host port=2222".
#include "hostfile/detail/host_item.h"

#include <optional>
#include <set>

#include "hostfile/detail/names.h"
#include "hostfile/detail/scan.h"
#include "hostfile/detail/slurm.h"
#include "runner/common/text.h"

namespace mltrain::hostfile::detail {
namespace {

constexpr std::string_view keys_hint = "expected slots=N, max_slots=N, port=N or role=worker|server|both";
constexpr std::string_view key_slots = "slots";
constexpr std::string_view key_max_slots = "max_slots";
constexpr std::string_view key_port = "port";
constexpr std::string_view key_role = "role";

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

Role parse_role(const Where& w, std::string_view value) {
  for (Role r : {Role::worker, Role::server, Role::both})
    if (value == role_name(r)) return r;
  auto guess = text::closest(std::string(value), {"worker", "server", "both"});
  w.fail(value, "bad role " + quoted(value),
         (guess ? "did you mean '" + *guess + "'? " : std::string()) +
             "expected role=worker (ranks), role=server (parameter servers only) or role=both");
}

}  // namespace

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

  HostPart part = split_host(w, s, number_hint);
  if (!part.second_colon.empty()) {
    if (canonical_ipv6(s)) {
      w.fail(s, "IPv6 address " + quoted(s) + " without brackets",
             "write '[" + escaped(s) + "]', or '[address]:N' to give a slot count");
    }
    w.fail(part.second_colon, "unexpected second ':'", number_hint);
  }
  std::vector<std::string> names = host_names(w, part, number_hint);
  const std::optional<std::string_view>& number = part.suffix;  // the slot count, or the port after ssh://

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
    if (canonical != key_slots && canonical != key_max_slots && canonical != key_port &&
        canonical != key_role) {
      auto guess = text::closest(key, {std::string(key_slots), std::string(key_max_slots),
                                       std::string(key_port), std::string(key_role)});
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
    } else if (canonical == key_role) {
      proto.role = parse_role(w, value);
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

}  // namespace mltrain::hostfile::detail
