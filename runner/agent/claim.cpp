// The job's claim on this host, made at preflight (runner/lease/claim.h): the usable GPUs no one
// leases and no process computes on, the host alone when exclusive, a place in the host's queue.
#include <algorithm>
#include <chrono>
#include <memory>
#include <set>

#include "runner/agent/detail/agent_impl.h"
#include "runner/gpu/nvml.h"

namespace mltrain::agent::detail {
namespace {

// How long a holder that is asked who it is may take to answer (a stopped one never does).
constexpr std::chrono::milliseconds kAskHolder{200};

// The GPUs a compute process runs on now, by NVML index; none known without NVML (nvidia-smi
// alone cannot be trusted to list them all: no process is then taken as foreign).
std::set<int> gpus_in_use(const std::string& nvml_library) {
  std::set<int> busy;
  gpu::Nvml::Failure failure;
  auto nvml = gpu::Nvml::open(nvml_library, failure);
  if (!nvml) return busy;
  unsigned count = 0;
  if (nvml->device_count(count) != gpu::Nvml::kSuccess) return busy;
  std::vector<gpu::Nvml::Process> procs;
  for (unsigned i = 0; i < count; ++i) {
    gpu::Nvml::Device dev{};
    if (nvml->device(i, dev) == gpu::Nvml::kSuccess &&
        nvml->compute_processes(dev, procs) == gpu::Nvml::kSuccess && !procs.empty())
      busy.insert(int(i));
  }
  return busy;
}

// One obstacle as the launcher reads it: lease::encode's "key=value" lines.
std::string in_the_way_text(const lease::InTheWay& w) {
  lease::Info info;
  if (w.holder) {
    info = w.holder->info;
    if (w.holder->uid != uid_t(-1)) info["uid"] = std::to_string(w.holder->uid);
    if (w.holder->pid > 0) info["pid"] = std::to_string(w.holder->pid);
  }
  info["what"] = w.what;
  return lease::encode(info);
}

}  // namespace

void Agent::claim(const msg::Prepare& m, msg::Prepared& out) {
  lease::Ask ask;
  ask.space.name = m.lease_space;
  ask.run_id = m.run_id;
  ask.gpus = int(m.gpu_slots_needed);
  ask.pinned.assign(m.pinned_gpus.begin(), m.pinned_gpus.end());
  ask.exclusive = m.exclusive != 0;
  ask.order_key = m.order_key;
  std::string lines;
  for (const auto& kv : m.claim_info) lines += kv + "\n";
  ask.info = lease::decode(lines);
  std::vector<lease::Gpu> inventory;
  if (ask.gpus > 0 || !ask.pinned.empty()) {
    const std::set<int> busy = gpus_in_use(nvml_library_for(m.nvml_library));
    for (int i : out.gpu_usable) {
      auto g = std::find_if(out.gpus.begin(), out.gpus.end(), [&](const Gpu& x) { return x.index == i; });
      if (g != out.gpus.end()) inventory.push_back({i, g->uuid, busy.count(i) > 0});
    }
  }
  if (!claim_) claim_.emplace();
  claim_->attempt(ask, inventory, kAskHolder);
  if (!claim_->error().empty()) {
    out.claim_state = uint32_t(msg::ClaimState::failed);
    out.claim_error = claim_->error();
  } else if (claim_->granted()) {
    out.claim_state = uint32_t(msg::ClaimState::granted);
    if (!inventory.empty()) out.gpu_usable.assign(claim_->gpus().begin(), claim_->gpus().end());
  } else {
    out.claim_state = uint32_t(msg::ClaimState::busy);
    out.claim_ahead = uint32_t(claim_->ahead());
    for (const auto& w : claim_->in_the_way()) out.claim_in_the_way.push_back(in_the_way_text(w));
  }
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
