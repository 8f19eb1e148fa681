// DeepSpeed-style include/exclude filters ("host1:0,2@host2") and the slots a host contributes.
#include <algorithm>
#include <map>
#include <optional>

#include "hostfile/detail/names.h"
#include "hostfile/detail/scan.h"
#include "hostfile/detail/slurm.h"
#include "hostfile/hostfile.h"
#include "runner/common/text.h"

namespace mltrain::hostfile {
namespace {

using detail::quoted;

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

std::vector<Host> apply_filters(std::vector<Host> hosts, std::string_view include, std::string_view exclude) {
  using namespace detail;
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
    HostPart part = split_host(w, entry, entry_hint);
    std::vector<std::string> names = host_names(w, part, entry_hint);

    Pick pick;
    if (const auto& slot_text = part.suffix) {
      if (slot_text->empty()) w.fail(*slot_text, "missing slot list after ':'", entry_hint);
      pick.all_slots = false;
      for (std::string_view one : split(*slot_text, ',')) {
        auto n = parse_number(one, 0, max_slots_per_host - 1);
        if (!n) w.fail(one, "bad slot index " + quoted(one), "expected slot numbers from 0, e.g. 'gpu1:0,2'");
        pick.slots.push_back(static_cast<int>(*n));
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

int slot_count(const Host& h) {
  if (!h.slot_ids.empty()) return static_cast<int>(h.slot_ids.size());
  return h.slots > 0 ? h.slots : 1;
}

}  // namespace mltrain::hostfile
