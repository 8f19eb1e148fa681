// The job's claim on this host, made once preflight passed (runner/lease/claim.h): the usable GPUs no one
// leases and no process computes on, the host alone when exclusive, a place in the host's queue.
#include <pwd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "runner/agent/detail/agent_impl.h"
#include "runner/agent/gpu_inventory.h"
#include "runner/telemetry/sampler.h"

namespace mltrain::agent::detail {
namespace {

// How long a holder that is asked who it is may take to answer (a stopped one never does).
constexpr std::chrono::milliseconds kAskHolder{200};

// What the holder said of itself, then what the kernel says of it (uid, its account here, pid).
lease::Info holder_info(const lease::Seen& seen) {
  lease::Info info = seen.info;
  if (seen.uid != uid_t(-1)) {
    info["uid"] = std::to_string(seen.uid);
    if (const passwd* pw = ::getpwuid(seen.uid)) info["account"] = pw->pw_name;
  }
  if (seen.pid > 0) info["pid"] = std::to_string(seen.pid);
  return info;
}

// One obstacle as the launcher reads it: lease::encode's "key=value" lines.
std::string in_the_way_text(const lease::InTheWay& w) {
  lease::Info info = w.holder ? holder_info(*w.holder) : lease::Info{};
  info["what"] = w.what;
  return lease::encode(info);
}

// A squatter as the launcher names it: the kernel's word on who, and why it is not believed.
std::string squatter_text(const lease::Seen& seen) {
  lease::Info info;
  for (auto& [k, v] : holder_info(seen))
    if (k == "uid" || k == "account" || k == "pid") info[k] = v;
  info["name"] = seen.name;
  info["doubt"] = seen.doubt;
  return lease::encode(info);
}

}  // namespace

void Agent::on(uint32_t id, const msg::Claim& m) {
  lease::Ask ask;
  ask.space.name = m.lease_space;
  ask.run_id = m.run_id;
  ask.gpus = int(m.gpus);
  ask.pinned.assign(m.pinned_gpus.begin(), m.pinned_gpus.end());
  ask.exclusive = m.exclusive != 0;
  ask.order_key = m.order_key;
  std::string lines;
  for (const auto& kv : m.claim_info) lines += kv + "\n";
  ask.info = lease::decode(lines);
  if (!claim_) claim_.emplace();
  claim_->attempt(ask, claimable_gpus_, kAskHolder);
  msg::Claimed out;
  if (!claim_->error().empty()) {
    out.state = uint32_t(msg::ClaimState::failed);
    out.error = claim_->error();
  } else if (claim_->granted()) {
    out.state = uint32_t(msg::ClaimState::granted);
    out.gpus.assign(claim_->gpus().begin(), claim_->gpus().end());
  } else {
    out.state = uint32_t(msg::ClaimState::busy);
    out.ahead = uint32_t(claim_->ahead());
    for (const auto& w : claim_->in_the_way()) out.in_the_way.push_back(in_the_way_text(w));
  }
  for (const auto& s : claim_->squatters()) out.squatters.push_back(squatter_text(s));
  send(out, id);
}

// `mltrain queue`: every lease here, whoever holds it, with what the kernel says of its holder
// (uid, pid, the uid's account here) over what the holder says of itself; the GPUs and how busy.
void Agent::on(uint32_t id, const msg::LeaseQuery& m) {
  msg::LeaseList out;
  const lease::Space space{m.lease_space};
  for (auto& seen : lease::list(space, "", kAskHolder, 4096)) {
    lease::Info info;
    for (const char* k : {"run", "user", "launcher", "since", "gpus", "hosts", "gpu"})
      if (auto it = seen.info.find(k); it != seen.info.end()) info[k] = it->second;
    info["name"] = seen.name;
    info["answered"] = seen.answered ? "1" : "0";
    if (!seen.doubt.empty()) info["doubt"] = seen.doubt;
    if (seen.uid != uid_t(-1)) {
      info["uid"] = std::to_string(seen.uid);
      if (const passwd* pw = ::getpwuid(seen.uid)) info["account"] = pw->pw_name;
    }
    if (seen.pid > 0) info["pid"] = std::to_string(seen.pid);
    out.leases.push_back(lease::encode(info));
  }
  GpuInventory inv = probe_gpus(nvml_library_for(m.nvml_library), ranks_path(""));
  out.gpus = std::move(inv.gpus);
  out.gpu_note = inv.note;
  // How busy each is, read as `top` reads it: NVML, else nvidia-smi (the UTIL column stayed '-'
  // when only nvidia-smi answered).
  std::vector<telemetry::GpuSample> samples;
  if (!out.gpus.empty()) {
    telemetry::GpuSamplerOptions o;
    o.nvml_library = nvml_library_for(m.nvml_library);
    o.path = ranks_path("");
    telemetry::GpuSampler(o).sample(samples);
  }
  for (const auto& g : out.gpus) {
    auto s = std::find_if(samples.begin(), samples.end(), [&](const telemetry::GpuSample& x) {
      return g.uuid.empty() ? x.index == g.index : x.uuid == g.uuid;
    });
    const bool found = s != samples.end();
    out.util_percent.push_back(found && s->util_percent ? int32_t(*s->util_percent) : -1);
    out.busy.push_back(found && !s->processes.empty() ? 1 : 0);
  }
  send(out, id);
}

void Agent::on(uint32_t, const msg::Unclaim&) {
  if (claim_) claim_->release_grant();
}

// Whoever asks who holds one of this job's leases gets its info: readers wait at most a moment.
void Agent::answer_lease_readers(size_t first_slot) {
  for (size_t i = 0; i < lease_slots_.size(); ++i)
    if (fds_[first_slot + i].revents & POLLIN) lease_slots_[i]->answer();
}

}  // namespace mltrain::agent::detail
