// `mltrain gc --hosts`: every host's agent asked to remove the synced folders no run uses
// (detail/ask_play.h; the agent's side is runner/agent/gc.cpp), and what it did, in lines.
#include "runner/supervise/gc_hosts.h"

#include <chrono>
#include <cstdio>

#include "runner/common/text.h"
#include "runner/lease/lease.h"
#include "runner/supervise/detail/ask_play.h"
#include "runner/supervise/detail/pulls.h"

namespace mltrain::supervise {

int run_gc_hosts(plan::Plan& plan, const Options& opts, const TransportFor& transport_for,
                 std::chrono::seconds older_than, bool dry_run, std::vector<HostGc>& hosts) {
  detail::Fleet fleet(plan, opts, transport_for);
  agent::msg::GcWork ask{uint64_t(std::max<int64_t>(0, older_than.count())), dry_run ? 1u : 0u};
  detail::AskPlay<agent::msg::GcWork, agent::msg::GcDone> play(fleet, ask, "clean its synced folders");
  const int code = play.run();
  for (size_t i = 0; i < fleet.size(); ++i) {
    HostGc h;
    h.host = fleet[i].name();
    h.ok = play.answer(i).has_value();
    if (h.ok)
      h.done = std::move(*play.answer(i));
    else
      h.problem = play.problem(i);
    hosts.push_back(std::move(h));
  }
  return code;
}

std::string format_gc_hosts(const std::vector<HostGc>& hosts, bool dry_run) {
  std::string out;
  uint64_t gone = 0, bytes = 0;
  size_t folders = 0;
  for (const auto& h : hosts) {
    if (!h.ok) {
      out += "mltrain: " + text::named(h.host, h.problem) + "\n";
      continue;
    }
    for (const auto& entry : h.done.folders) {  // a host's words: escaped and cut
      lease::Info f = lease::decode(entry);
      const std::string name = text::host_text(f["name"], 120), state = f["state"];
      const uint64_t size = uint64_t(text::parse_int_in(f["bytes"], 0, INT64_MAX).value_or(0));
      const auto age =
          std::chrono::milliseconds(text::parse_int_in(f["age_s"], 0, INT64_MAX / 1000).value_or(0) * 1000);
      const std::string when = "synced " + text::format_duration(age) + " ago";
      ++folders;
      if (state == "removed" || state == "would_remove") {
        ++gone, bytes += size;
        out += h.host + ": " + (state == "removed" ? "removed " : "would remove ") + name + " (" +
               detail::bytes_text(size) + ", " + when + ")\n";
      } else if (state == "in_use") {
        out += h.host + ": kept " + name + " (in use by run " + text::host_text(f["run"], 80) + ")\n";
      } else if (state == "failed") {
        out += h.host + ": could not remove " + name + "\n";
      }
    }
    for (const auto& p : h.done.problems) out += "mltrain: " + h.host + ": " + text::host_text(p, 300) + "\n";
  }
  char total[160];
  std::snprintf(total, sizeof total, "%s %llu of %zu synced folder%s (%s)\n",
                dry_run ? "would remove" : "removed", (unsigned long long)gone, folders,
                folders == 1 ? "" : "s", detail::bytes_text(bytes).c_str());
  return out + total;
}

}  // namespace mltrain::supervise
