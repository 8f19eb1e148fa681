// Slurm node lists: "gpu[01-04,07],cpu1" and the bracket ranges items and filters share.
#include "hostfile/detail/slurm.h"

#include <algorithm>
#include <cstdint>

#include "hostfile/detail/names.h"
#include "hostfile/detail/scan.h"
#include "hostfile/hostfile.h"

namespace mltrain::hostfile {
namespace detail {
namespace {

// Fails when `at` (a bracket group, a pattern or a whole node list) would give too many names.
[[noreturn]] void fail_too_many(const Where& w, std::string_view at, const std::string& subject) {
  w.fail(at, subject + " expands to more than " + std::to_string(max_expanded_names) + " names",
         "split the list");
}

// Expands one bracket group's inside, "01-04,07", into its values with zero padding kept.
void expand_ranges(const Where& w, std::string_view inner, std::string_view group,
                   std::vector<std::string>& out) {
  const std::string hint = "expected numbers and ranges such as '[01-04,07]'";
  if (inner.empty()) w.fail(group, "empty range " + quoted(group), hint);
  for (std::string_view part : split(inner, ',')) {
    if (part.empty()) w.fail(part, "empty item in range " + quoted(group), hint);
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
    if (count > max_expanded_names - out.size()) fail_too_many(w, group, quoted(group));
    for (long long v = *lo_n; v <= *hi_n; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo.size()) digits.insert(0, lo.size() - digits.size(), '0');
      out.push_back(std::move(digits));
    }
  }
}

}  // namespace

std::vector<std::string> host_names(const Where& w, const HostPart& part, const std::string& hint) {
  if (part.is_address) return {std::string(part.host)};
  if (part.host.empty()) w.fail(part.host, "missing host name", hint);
  return expand_pattern(w, part.host);
}

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
      if (names.size() * values.size() > max_expanded_names) fail_too_many(w, pattern, quoted(pattern));
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

}  // namespace detail

std::vector<std::string> expand_nodelist(std::string_view nodelist) {
  using namespace detail;
  std::vector<std::string> names;
  std::string_view content = trim(nodelist);
  if (content.empty()) return names;
  Where w{"nodelist", false, nodelist};
  reject_control_chars(w, content);
  for (auto raw : split_top_level(w, content, ',')) {
    std::string_view item = trim(raw);
    if (item.empty()) w.fail(raw, "empty item in node list", "remove the extra ','");
    auto expanded = expand_pattern(w, item);
    if (expanded.size() > max_expanded_names - names.size()) fail_too_many(w, item, "node list");
    names.insert(names.end(), expanded.begin(), expanded.end());
  }
  return names;
}

}  // namespace mltrain::hostfile
