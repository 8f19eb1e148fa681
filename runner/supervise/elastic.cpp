// Elastic restarts (docs/elastic.md): after a failure the gang restarts without its lost hosts,
// a spare in a lost host's place where one is ready, while at least [cluster] min_hosts remain.
// As torchrun's elastic agent, the ranks are numbered anew and WORLD_SIZE, NODE_RANK and
// TORCHELASTIC_RESTART_COUNT follow; a host that comes back is not taken in again by this run.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "runner/common/text.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;

void RunPlay::begin_gang() {
  seats_.assign(plan_.hosts.size(), {});
  gang_.clear();
  for (size_t i = 0; i < plan_.hosts.size(); ++i) {
    const auto& hp = plan_.hosts[i];
    if (hp.ranks.empty()) continue;  // a spare, or a PS server-only host
    gang_.push_back(int(i));
    for (int r : hp.ranks) seats_[i].push_back(plan_.ranks[size_t(r)].gpu_slots);
  }
}

bool RunPlay::may_restart() {
  const bool lost_host = ending_ == Ending::host_failure;
  if (!(ending_ == Ending::failure || (lost_host && plan_.elastic())) || restart_ >= opts_.max_restarts)
    return false;
  if (!plan_.elastic())  // every host is needed: a lost one ends the run
    return std::all_of(fleet_.hosts().begin(), fleet_.hosts().end(),
                       [](const FleetHost& h) { return h.open(); });
  // Each host of the gang stays if its link does and its ranks could start (the agent's spawn is
  // the check a restart makes again: the workdir, the program, the GPUs there); a lost one's place
  // goes to the first spare ready, else the gang goes on without it.
  std::vector<bool> taken(plan_.hosts.size(), false);
  for (int h : gang_) taken[size_t(h)] = true;
  std::vector<std::string> left, replaced;
  next_gang_.clear();
  for (int h : gang_) {
    const bool started = !spawn_failed_.count(size_t(h));
    if (fleet_[size_t(h)].open() && started) {
      next_gang_.push_back(h);
      continue;
    }
    const std::string name =
        plan_.hosts[size_t(h)].host.name + (started ? "" : " (its ranks could not start)");
    int spare = -1;
    for (size_t s = 0; s < plan_.hosts.size() && spare < 0; ++s)
      if (plan_.hosts[s].spare && !taken[s] && !spawn_failed_.count(s) && fleet_[s].open() &&
          fleet_[s].state() == HostState::ready)
        spare = int(s);
    if (spare < 0) {
      left.push_back(name);
      continue;
    }
    taken[size_t(spare)] = true;
    seats_[size_t(spare)] = seats_[size_t(h)];
    next_gang_.push_back(spare);
    replaced.push_back(plan_.hosts[size_t(spare)].host.name + " in place of " + name);
  }
  if (int(next_gang_.size()) < plan_.min_hosts) {
    out_->before_message();
    std::fprintf(
        stderr,
        "mltrain: not restarting: %zu of the gang's hosts are left (without %s, no spare ready), fewer "
        "than [cluster] min_hosts = %d\n",
        next_gang_.size(), text::join(left, ", ").c_str(), plan_.min_hosts);
    return false;
  }
  gang_change_.clear();
  if (!replaced.empty()) gang_change_ = text::join(replaced, ", ");
  if (!left.empty())
    gang_change_ += (gang_change_.empty() ? "" : "; ") + std::string("without ") + text::join(left, ", ") +
                    ", on " + std::to_string(next_gang_.size()) + " hosts";
  return true;
}

void RunPlay::regroup_gang() {
  // A host the gang leaves gives back what it was granted (docs/sharing.md): its GPUs are free
  // for other jobs. Its link stays, for [sync] pull of what its ranks wrote.
  for (int h : gang_)
    if (opts_.claims && fleet_[size_t(h)].open() &&
        std::find(next_gang_.begin(), next_gang_.end(), h) == next_gang_.end())
      fleet_.send(size_t(h), msg::Unclaim{});
  std::vector<std::vector<std::vector<int>>> seats;
  for (int h : next_gang_) seats.push_back(seats_[size_t(h)]);
  const int rank0_was = plan_.ranks.empty() ? -1 : plan_.ranks[0].host;
  plan::regroup(plan_, next_gang_, seats);
  const int rank0_is = plan_.ranks.empty() ? -1 : plan_.ranks[0].host;
  if (rank0_was >= 0 && rank0_is >= 0 && rank0_was != rank0_is) {
    // MLTRAIN_CHECKPOINT_DIR is on rank 0's host: a new rank 0 elsewhere finds it only where the
    // hosts share a home (NFS); otherwise the gang starts over, and it should not do so unsaid.
    const std::string& from = plan_.hosts[size_t(rank0_was)].host.name;
    const std::string& to = plan_.hosts[size_t(rank0_is)].host.name;
    out_->before_message();
    std::fprintf(
        stderr,
        "mltrain: rank 0 moves from %s to %s: the checkpoint folder (MLTRAIN_CHECKPOINT_DIR) is on %s; "
        "unless the hosts share a home folder, the new gang starts without it (docs/elastic.md)\n",
        from.c_str(), to.c_str(), from.c_str());
    gang_change_ += (gang_change_.empty() ? "" : "; ") + std::string("rank 0 moved from ") + from + " to " +
                    to + " (its checkpoint folder stays on " + from + " unless homes are shared)";
  }
  gang_ = next_gang_;
  ranks_.assign(plan_.ranks.size(), RankState{});
  settle_gpus();        // the same GPUs of each host, to its ranks as numbered now
  settle_rendezvous();  // rank 0's host may be another: the rendezvous moves there
  out_->relabel(rank_infos());
}

void RunPlay::idle_lost(size_t i, const std::string& why) {
  fleet_.advance(i, HostState::lost);
  out_->flush();
  out_->before_message();
  std::fprintf(stderr, "mltrain: %s %s lost (%s); the run goes on without it\n",
               plan_.hosts[i].spare && !ran_ranks_.count(i) ? "spare" : "host (out of the gang)",
               fleet_.describe(i).c_str(), why.c_str());
  fleet_[i].link->kill();
}

}  // namespace mltrain::supervise::detail
