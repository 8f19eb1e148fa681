// Comma lists of host items ("-H a:2,user@b:4,[fe80::1]:2,gpu[01-03]:8") and their duplicate check.
#include "hostfile/detail/host_list.h"

#include "hostfile/detail/host_item.h"
#include "hostfile/detail/names.h"
#include "hostfile/detail/scan.h"

namespace mltrain::hostfile {
namespace detail {
namespace {

std::string duplicate_key(const Host& h) {
  return h.user + '\n' + comparable_name(h.name) + '\n' + std::to_string(h.port);
}

std::string display(const Host& h) {
  bool v6 = h.name.find(':') != std::string::npos;
  std::string host = v6 && h.port ? "[" + h.name + "]" : h.name;
  std::string s = h.user.empty() ? host : h.user + "@" + host;
  return h.port ? "ssh://" + s + ":" + std::to_string(h.port) : s;
}

}  // namespace

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

}  // namespace detail

std::vector<Host> parse_host_list(std::string_view list, std::string_view origin) {
  std::vector<Host> hosts;
  std::string_view content = detail::trim(list);
  if (content.empty()) return hosts;
  std::map<std::string, std::string> seen;
  detail::Where w{std::string(origin), false, list};
  detail::parse_items(w, content, w.label, seen, hosts);
  return hosts;
}

}  // namespace mltrain::hostfile
