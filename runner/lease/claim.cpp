#include "runner/lease/claim.h"

#include <algorithm>
#include <cstdio>

namespace mltrain::lease {
namespace {

// A lease name part from a run id: the characters a name may hold, cut to fit.
std::string name_part(const std::string& s, size_t max) {
  std::string out;
  for (char c : s) {
    if (out.size() >= max) break;
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out;
}

// The presence lease of a job on a host: job/<run id>.
std::string job_name(const std::string& run_id) { return "job/" + name_part(run_id, kMaxName - 4); }

// The name a job takes for `base` ("exclusive", "gpu/<uuid>") when a squatter holds `base`:
// "<base>/<hash of the run id>" (short: an abstract name, its space's prefix included, is at most
// 107 bytes). Every job looks for both forms, so the lease still excludes.
std::string alternate(const std::string& base, const std::string& run_id) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : run_id) h = (h ^ c) * 16777619u;
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", h);
  return base + "/" + hex;
}

bool is_ours(const Seen& s, const Ask& ask) { return s.info.count("run") && s.info.at("run") == ask.run_id; }

}  // namespace

std::string order_key(int64_t wall_ns, const std::string& run_id) {
  char ns[24];
  std::snprintf(ns, sizeof ns, "%019lld", static_cast<long long>(std::max<int64_t>(0, wall_ns)));
  return std::string(ns) + "-" + name_part(run_id, kMaxName - 6 - 20);
}

std::vector<std::string> Claim::held_names() {
  std::vector<std::string> out;
  for (Lease* l : leases()) out.push_back(l->name());
  return out;
}

std::vector<Lease*> Claim::leases() {
  std::vector<Lease*> out;
  for (auto* l : {&presence_, &ticket_, &exclusive_})
    if (*l) out.push_back(&**l);
  for (auto& l : gpu_leases_) out.push_back(&l);
  return out;
}

void Claim::release_grant() {
  gpu_leases_.clear();
  exclusive_.reset();
  gpus_.clear();
  uuids_.clear();
  granted_ = false;
}

// A holder that proved nothing (Seen::doubt) is named once per attempt and otherwise ignored.
bool Claim::squatter(const Seen& s) {
  if (s.doubt.empty()) return false;
  if (std::none_of(squatters_.begin(), squatters_.end(), [&](const Seen& o) { return o.name == s.name; }))
    squatters_.push_back(s);
  return true;
}

// Jobs queued before this one (every queued job, for one that does not queue): they go first.
bool Claim::ahead_in_queue(const Ask& ask, std::chrono::milliseconds t) {
  const std::string mine = ask.order_key.empty() ? "" : "queue/" + ask.order_key;
  for (auto& s : list(ask.space, "queue/", t, 4096, held_names())) {
    if (!mine.empty() && s.name >= mine) continue;
    if (is_ours(s, ask) || squatter(s)) continue;  // our own, from another agent; or no job at all
    if (ahead_++ == 0) in_the_way_.push_back({"queue", s, s.name});
  }
  return ahead_ > 0;
}

// Another job's holders of `base` or of its alternates (a job of ours or a squatter is none).
std::vector<Seen> Claim::others_holding(const Ask& ask, const std::string& base, std::chrono::milliseconds t,
                                        const std::string& also_mine) {
  std::vector<std::string> skip = held_names();
  if (!also_mine.empty()) skip.push_back(also_mine);
  std::vector<Seen> out;
  for (auto& s : list(ask.space, base, t, 4096, skip)) {
    if (s.name != base && s.name.rfind(base + "/", 0) != 0) continue;  // "gpu/GPU-1" is no "gpu/GPU-12"
    if (!is_ours(s, ask) && !squatter(s)) out.push_back(std::move(s));
  }
  return out;
}

// Takes `base`, or its alternate when a squatter holds `base`; then yields when another job holds
// either form (two jobs racing for one both yield, and wait or fail; neither gets it twice).
std::optional<Lease> Claim::take_lease(const Ask& ask, const std::string& base, Info info,
                                       std::chrono::milliseconds t) {
  auto l = take(ask.space, base, info, &error_);
  if (!l && error_.empty()) {
    auto h = holder(ask.space, base, t);
    if (!h || !squatter(*h)) return std::nullopt;  // a job holds it (or it was let go just now)
    l = take(ask.space, alternate(base, ask.run_id), std::move(info), &error_);
    if (!l) return std::nullopt;
  }
  if (l && !others_holding(ask, base, t, l->name()).empty()) return std::nullopt;  // `l` goes
  return l;
}

// Exclusive: no other job on the host, and no one else exclusive; shared: no one exclusive.
// Each side takes its own lease before it looks for the other, so two racing jobs cannot both
// miss each other (one of them, or both, waits).
bool Claim::exclusive_ok(const Ask& ask, std::chrono::milliseconds t) {
  if (!ask.exclusive) {
    auto others = others_holding(ask, "exclusive", t);
    if (!others.empty()) {
      in_the_way_.push_back({"exclusive", others[0], others[0].name});
      return false;
    }
    return true;
  }
  if (!exclusive_) exclusive_ = take_lease(ask, "exclusive", ask.info, t);
  if (!exclusive_) {
    if (!error_.empty()) return false;
    auto others = others_holding(ask, "exclusive", t);
    in_the_way_.push_back({"exclusive", others.empty() ? std::nullopt : std::optional<Seen>(others[0]),
                           others.empty() ? "exclusive" : others[0].name});
    return false;
  }
  for (auto& s : list(ask.space, "job/", t, 4096, held_names())) {
    if (s.name == job_name(ask.run_id) || squatter(s)) continue;
    in_the_way_.push_back({"job", s, s.name});
  }
  if (in_the_way_.empty()) return true;
  exclusive_.reset();
  return false;
}

void Claim::note_gpu_holders(const Ask& ask, const std::vector<Gpu>& inventory, std::chrono::milliseconds t) {
  if (ask.gpus <= 0 && ask.pinned.empty()) return;
  std::vector<std::string> names;
  for (const auto& g : inventory)
    if (ask.pinned.empty() || std::count(ask.pinned.begin(), ask.pinned.end(), g.index))
      names.push_back("gpu/" + g.uuid);
  for (auto& seen : holders(ask.space, names, t))
    if (!squatter(seen))
      for (const auto& g : inventory)
        if (seen.name == "gpu/" + g.uuid)
          in_the_way_.push_back({"gpu " + std::to_string(g.index), seen, seen.name});
}

bool Claim::take_gpus(const Ask& ask, const std::vector<Gpu>& inventory, std::chrono::milliseconds t) {
  std::vector<const Gpu*> candidates;
  if (!ask.pinned.empty()) {
    for (int want : ask.pinned) {
      auto it =
          std::find_if(inventory.begin(), inventory.end(), [&](const Gpu& g) { return g.index == want; });
      if (it == inventory.end()) {
        error_ = "GPU " + std::to_string(want) + " is not one of this host's usable GPUs";
        return false;
      }
      candidates.push_back(&*it);
    }
  } else {
    for (const auto& g : inventory) candidates.push_back(&g);
  }
  const size_t need = ask.pinned.empty() ? size_t(std::max(ask.gpus, 0)) : ask.pinned.size();
  std::vector<Lease> taken;
  std::vector<const Gpu*> got;
  for (const Gpu* g : candidates) {
    if (got.size() == need) break;
    if (g->foreign) {
      in_the_way_.push_back({"foreign process on gpu " + std::to_string(g->index), std::nullopt, ""});
      continue;
    }
    Info info = ask.info;
    info["gpu"] = std::to_string(g->index);
    const std::string base = "gpu/" + g->uuid;
    if (auto l = take_lease(ask, base, info, t)) {
      taken.push_back(std::move(*l));
      got.push_back(g);
    } else {
      if (!error_.empty()) return false;
      in_the_way_.push_back({"gpu " + std::to_string(g->index), std::nullopt, base});
    }
  }
  if (got.size() < need) {  // `taken` goes: all or nothing
    // Who holds them, asked at once (a holder that does not answer costs the timeout once).
    std::vector<std::string> held;
    for (auto& w : in_the_way_)
      if (!w.lease.empty()) held.push_back(w.lease);
    for (auto& s : holders(ask.space, held, t))
      for (auto& w : in_the_way_)
        if (w.lease == s.name && !squatter(s)) w.holder = s;
    return false;
  }
  in_the_way_.clear();
  gpu_leases_ = std::move(taken);
  for (const Gpu* g : got) gpus_.push_back(g->index), uuids_.push_back(g->uuid);
  return true;
}

void Claim::attempt(const Ask& ask, const std::vector<Gpu>& inventory,
                    std::chrono::milliseconds ask_timeout) {
  error_.clear();
  in_the_way_.clear();
  squatters_.clear();
  ahead_ = 0;
  if (granted_) return;
  if (!presence_) presence_ = take(ask.space, job_name(ask.run_id), ask.info, &error_);
  if (!ask.order_key.empty() && !ticket_) {
    ticket_ = take(ask.space, "queue/" + ask.order_key, ask.info, &error_);
    if (!ticket_ && error_.empty()) error_ = "the queue place " + ask.order_key + " is taken";
  }
  if (!error_.empty()) return;
  // Only what is contended waits its turn: a job that asks for no GPU and not the whole host goes
  // by every queued one (it takes nothing they wait for), as long as no one has the host alone.
  const bool contends = ask.gpus > 0 || !ask.pinned.empty() || ask.exclusive;
  if (contends && ahead_in_queue(ask, ask_timeout)) {
    note_gpu_holders(ask, inventory, ask_timeout);  // who holds them too, taking none
    return;
  }
  if (!exclusive_ok(ask, ask_timeout)) return;
  if (ask.gpus > 0 || !ask.pinned.empty()) {
    if (!take_gpus(ask, inventory, ask_timeout)) {
      exclusive_.reset();
      return;
    }
  }
  granted_ = true;
}

}  // namespace mltrain::lease
