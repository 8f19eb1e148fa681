// The run's preflight: every host checked (after its sync and setup) before any rank starts.
// Nothing starts unless every host passes.
#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;
using std::chrono::milliseconds;

void RunPlay::on_progress() {
  if (phase_ == Phase::connecting && fleet_.all(HostState::greeted)) {
    log::info("supervise", "every agent answered");
    step(Event::greeted);
  } else if (phase_ == Phase::preflight && fleet_.all(HostState::ready)) {
    preflight_done();
  } else if (phase_ == Phase::claiming && opts_.claims) {
    for (size_t k = 0; k < fleet_.size(); ++k)
      if (fleet_[k].open() && !hosts_[k].claimed) return;
    claims_answered();
  }
}

// "  h2: problem" for every host that failed; empty when none did.
std::vector<std::string> RunPlay::failed_hosts() const {
  std::vector<std::string> lines;
  for (const auto& h : fleet_.hosts())
    if (h.state() == HostState::failed && !h.plan->spare) {
      const std::string& n = h.name();
      lines.push_back("  " + text::named(n, h.problem));
    }
  return lines;
}

void RunPlay::preflight_failed(const std::vector<std::string>& lines) {
  preflight_error_ = "preflight failed on " + std::to_string(lines.size()) + " of " +
                     std::to_string(fleet_.size()) + (fleet_.size() == 1 ? " host" : " hosts") +
                     "; no rank was started:\n" + text::join(lines, "\n");
  ending_ = Ending::preflight_failed;
  step(Event::preflight_failed);
}

void RunPlay::fail_host(size_t i, const std::string& problem) {
  fleet_.fail(i, problem);
  on_progress();
}

void RunPlay::preflight_done() {
  log::info("supervise", "preflight done");
  settle_gpus();
  for (size_t i = 0; i < fleet_.size(); ++i)  // a spare that failed is left out; the job starts
    if (plan_.hosts[i].spare && fleet_[i].state() == HostState::failed) {
      out_->before_message();
      const std::string& n = fleet_[i].name();  // a spare never reached has no link to describe
      const std::string& why = fleet_[i].problem;
      const bool named = why.compare(0, n.size() + 2, n + ": ") == 0;
      std::fprintf(stderr, "mltrain: spare %s is left out: %s\n", n.c_str(),
                   (named ? why.substr(n.size() + 2) : why).c_str());
    }
  if (auto lines = failed_hosts(); !lines.empty()) return preflight_failed(lines);
  step(Event::preflight_passed);  // claiming (claims.cpp), then start_job()
}

void RunPlay::start_job() {
  if (opts_.claims && !settle_gpus()) {  // what was granted serves the ranks as the usable ones did
    preflight_error_ = "the GPUs granted do not fit the ranks";
    ending_ = Ending::preflight_failed;
    return step(Event::refused);
  }
  settle_rendezvous();
  settle_ps();
  step(Event::granted);
}

// Each host's preflight answers within the timeout of being asked; a sync or a setup may take as
// long as it needs while its agent answers heartbeats.
void RunPlay::preflight_timers(Clock::time_point now) {
  for (size_t i = 0; i < fleet_.size(); ++i) {
    const HostState st = fleet_[i].state();
    const auto& deadline = hosts_[i].prepare_deadline;
    if (st == HostState::preparing && deadline && now >= *deadline)
      fleet_.fail(
          i, "the agent did not finish its preflight within " +
                 text::format_duration(std::chrono::duration_cast<milliseconds>(opts_.preflight_timeout)));
    else if ((st == HostState::syncing || st == HostState::setting_up) && fleet_.silent(i, now))
      on_lost(i, std::string("stopped answering heartbeats while ") +
                     (st == HostState::syncing ? "syncing" : "running the setup"));
  }
  if (phase_ != Phase::preflight) return;
  on_progress();
  if (phase_ != Phase::preflight) return;
  if (syncs_) syncs_->progress(now);
  fleet_.ping(now);
}

void RunPlay::begin_preflight() {
  // Where ranks meet: rank 0's host, by an address the other hosts reach.
  master_ = "127.0.0.1";
  if (plan_.multi_host && fleet_[0].link) {
    master_ = fleet_[0].link->address();
    if (plan_.hosts[0].local)
      for (const auto& h : fleet_.hosts())
        if (h.link && !h.plan->local && !h.link->local_address().empty()) {
          master_ = h.link->local_address();
          break;
        }
  }
  msg::Prepare& m = prepare_;
  m.master_addr = plan_.multi_host ? master_ : std::string();
  m.workdir = plan_.workdir;
  m.argv0 = plan_.argv.empty() ? std::string() : plan_.argv[0];
  for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, 0))
    if (k == "PATH") m.path = v;
  m.nvml_library = plan_.nvml_library;
  m.nccl_required = plan_.nccl_required ? 1 : 0;
  m.nccl_library = plan_.nccl_library;
  m.has_cuda_visible_devices = plan_.user_cuda_visible_devices ? 1 : 0;
  m.cuda_visible_devices = plan_.user_cuda_visible_devices.value_or("");
  m.facts = 1;
  number_ps_servers();
  if (opts_.sync)
    syncs_ = std::make_unique<Syncs>(fleet_, *opts_.sync, *out_, out_->terminal() && opts_.console.color);
  for (size_t i = 0; i < fleet_.size(); ++i)
    if (fleet_[i].state() == HostState::greeted) next_step(i);
  on_progress();
}

void RunPlay::next_step(size_t i) {
  RunHost& h = hosts_[i];
  if (!fleet_[i].open()) return;
  // A PS server host runs no job code: nothing to sync or set up there.
  const bool serves_only = !plan_.hosts[i].runs_program();
  if (syncs_ && !syncs_->synced(i) && !serves_only)
    syncs_->start(i);
  else if (opts_.setup && !h.set_up && !serves_only)
    start_setup(i);
  else
    send_prepare(i);
}

void RunPlay::send_prepare(size_t i) {
  msg::Prepare m = prepare_;
  uint32_t nports =
      plan_.multi_host ? (plan_.auto_master_port ? 1u : 0u) + 1u + (plan_.ps_mode ? 1u : 0u) : 0u;
  m.gpu_slots_needed = uint32_t(plan_.hosts[i].gpu_slots_needed);
  // Rank 0's host offers the rendezvous ports; in an elastic job every host that may become it.
  const bool may_lead = i == 0 || (plan_.elastic() && plan_.hosts[i].runs_program());
  m.nports = may_lead ? nports : 0;
  // A fixed master_port must be free on rank 0's host, or rank 0 fails to listen on it later.
  m.fixed_port = may_lead && !plan_.auto_master_port ? uint32_t(plan_.master_port) : 0;
  if (!plan_.hosts[i].runs_program()) m.workdir.clear(), m.argv0.clear();  // a PS server host runs no program
  ps_prepare(i, m);
  fleet_.advance(i, HostState::preparing);
  hosts_[i].prepare_deadline = clock_.now() + opts_.preflight_timeout;
  fleet_.send(i, m);
}

// What a host's agent said of it, into the record: a host's words, so bounded (32 facts of a
// known name, 200 bytes each); unknown names are dropped.
void RunPlay::record_facts(size_t i, const std::vector<std::string>& facts) {
  static const std::set<std::string> kNames = {"os",         "kernel", "arch", "glibc",  "cpus",  "gpus",
                                               "gpu_driver", "cuda",   "nccl", "python", "torch", "mltrain"};
  if (i >= rec_.hosts.size()) return;
  auto& env = rec_.hosts[i].environment;
  env.clear();
  for (const auto& f : facts) {
    const size_t eq = f.find('=');
    if (eq == std::string::npos || !kNames.count(f.substr(0, eq)) || env.size() >= 32) continue;
    env.emplace_back(f.substr(0, eq), f.substr(eq + 1, 200));
  }
}

void RunPlay::on(size_t i, uint32_t, msg::Prepared& m) {
  if (fleet_[i].state() != HostState::preparing) return;
  RunHost& h = hosts_[i];
  h.prepared = std::move(m);
  record_facts(i, h.prepared.facts);
  for (const auto& port : h.prepared.ports)  // a host's word, used as a number below
    if (!text::parse_int_in(port, 1, 65535))
      h.prepared.problems.push_back("the agent offered the port '" + text::host_text(port, 32) +
                                    "', not a number from 1 to 65535");
  if (!h.prepared.problems.empty()) {
    fleet_.fail(i, text::join(h.prepared.problems, "; "));
    h.cannot_start = h.prepared.cannot_start != 0;
  } else {
    fleet_.advance(i, HostState::ready);
  }
  on_progress();
}

bool RunPlay::settle_gpus() {
  bool fit = true;
  // Each rank's CUDA_VISIBLE_DEVICES from what its host's agent found usable; a host that cannot
  // give every rank its GPUs fails preflight like any other host problem.
  for (size_t i = 0; i < fleet_.size(); ++i) {
    const RunHost& h = hosts_[i];
    if (fleet_[i].state() != HostState::ready || fleet_[i].plan->gpu_slots_needed == 0) continue;
    plan::HostGpus g;
    for (const auto& gpu : h.prepared.gpus) {
      g.indices.push_back(gpu.index);
      g.names.push_back(gpu.name);
    }
    const auto& usable = h.claimed ? h.claimed->gpus : h.prepared.gpu_usable;
    g.usable.assign(usable.begin(), usable.end());
    g.note = h.prepared.gpu_note;
    if (h.prepared.has_cuda_visible_devices) g.cuda_visible_devices = h.prepared.cuda_visible_devices;
    std::string problem = plan::assign_gpus(plan_, int(i), g);
    if (problem.empty()) continue;
    fleet_.fail(i, problem);
    fit = fit && plan_.hosts[i].spare && plan_.hosts[i].ranks.empty();  // an idle spare is left out
  }
  return fit;
}

void RunPlay::settle_rendezvous() {
  if (plan_.multi_host) {
    const size_t lead = size_t(plan_.ranks[0].host);  // another than hosts[0] after an elastic regroup
    if (lead != 0) master_ = reach_address(lead);
    plan::Rendezvous r;
    r.master_addr = master_;
    const auto& ports = hosts_[lead].prepared.ports;
    size_t k = 0;
    auto next = [&](int fallback) {
      return k < ports.size() ? int(*text::parse_int_in(ports[k++], 1, 65535)) : fallback;
    };
    r.master_port = plan_.auto_master_port ? next(plan_.master_port) : plan_.master_port;
    r.store_port = next(plan_.master_port + 1);
    r.ps_port = plan_.ps_mode ? next(0) : 0;
    plan::set_rendezvous(plan_, r);
    for (size_t i = 0; i < fleet_.size(); ++i) plan::set_interface(plan_, int(i), hosts_[i].prepared.ifname);
  }
  // The record shows the rendezvous and environment as preflight settled them.
  records::fill_from_plan(rec_, plan_);
  for (size_t i = 0; i < fleet_.size(); ++i) {
    if (fleet_[i].link) rec_.hosts[i].address = fleet_[i].link->address();
    record_facts(i, hosts_[i].prepared.facts);
    if (syncs_ && syncs_->on_host(i, plan_.workdir) != plan_.workdir)
      rec_.hosts[i].workdir = syncs_->on_host(i, plan_.workdir);
  }
  // Which physical GPUs each rank has, by index and UUID (its host's inventory says which is which).
  for (auto& rr : rec_.ranks) {
    auto it = plan_.runtime.gpus.find(rr.rank);
    if (it == plan_.runtime.gpus.end()) continue;
    for (int index : it->second) {
      std::string uuid;
      for (const auto& g : hosts_[size_t(rr.host)].prepared.gpus)
        if (g.index == index) uuid = text::host_text(g.uuid, 80);
      rr.gpus.push_back({index, uuid});
    }
  }
}

}  // namespace mltrain::supervise::detail
