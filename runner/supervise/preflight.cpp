// The gang's first two phases: every host's agent opened and greeted (connecting), then every
// host checked (preflight). Nothing starts unless every host passes both.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/supervise/detail/gang.h"

namespace mltrain::supervise::detail {

namespace proto = mltrain::agent;
namespace msg = mltrain::agent::msg;

Connects::Connects() {
  if (::pipe2(pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("pipe2: ") + std::strerror(errno), {}, exit_code::internal);
}

Connects::~Connects() {
  ::close(pipe[0]);
  ::close(pipe[1]);
}

void Connects::put(Result r) {
  {
    std::lock_guard<std::mutex> lock(m);
    if (!abandoned) ready.push_back(std::move(r));
  }
  // Outside the lock: an abandoned link closes here, which tells its agent to exit.
  r.link.reset();
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(pipe[1], &b, 1);
}

std::vector<Connects::Result> Connects::take() {
  char buf[64];
  while (::read(pipe[0], buf, sizeof buf) > 0) {
  }
  std::lock_guard<std::mutex> lock(m);
  return std::exchange(ready, {});
}

void Connects::abandon() {
  std::vector<Result> dropped;
  std::lock_guard<std::mutex> lock(m);
  abandoned = true;
  dropped.swap(ready);
}

Gang::~Gang() {
  if (connects_) connects_->abandon();
  for (auto& h : hosts_)
    if (h.ps_log_fd >= 0) ::close(h.ps_log_fd);
}

void Gang::start_connects() {
  // In parallel: a slow or dead host costs its timeout once, not once per host.
  connects_ = std::make_shared<Connects>();
  // SSH handshakes take seconds: say so, rather than sit silent. Local-only jobs stay quiet.
  std::vector<std::string> remote;
  for (const auto& h : plan_.hosts)
    if (!h.local) remote.push_back(h.host.name);
  if (!remote.empty()) {
    std::string names = remote.size() <= 8 ? " (" + text::join(remote, ", ") + ")" : "";
    std::fprintf(stderr, "mltrain: connecting to %zu host%s%s...\n", remote.size(),
                 remote.size() == 1 ? "" : "s", names.c_str());
  }
  for (size_t i = 0; i < plan_.hosts.size(); ++i) {
    transport::Transport& t = transport_for_(plan_.hosts[i]);
    std::thread([c = connects_, &t, host = plan_.hosts[i], i] {
      Connects::Result r;
      r.host = i;
      try {
        r.link = t.connect(host);
      } catch (const Error& e) {
        // Each host's own advice stays with it in the report.
        r.problem = e.hint().empty() ? e.what() : std::string(e.what()) + "\n      (" + e.hint() + ")";
      } catch (const std::exception& e) {
        r.problem = e.what();
      }
      c->put(std::move(r));
    }).detach();
  }
}

void Gang::take_connected() {
  for (auto& r : connects_->take()) {
    Host& h = hosts_[r.host];
    if (!r.problem.empty()) {
      host_failed(r.host, r.problem);
      continue;
    }
    h.link = std::move(r.link);
    h.state = HostState::greeting;
    h.last_heard = clock_.now();
    msg::Hello hello;
    hello.grace_ms = uint32_t(opts_.grace.count());
    // A local agent sees the launcher go by EOF on its pipe; a heartbeat would only kill the job
    // while the launcher is suspended (Ctrl-Z).
    hello.heartbeat_timeout_ms = h.plan->local ? 0u : uint32_t(opts_.heartbeat_timeout.count());
    send_to(h, hello);
  }
  check_progress();
}

void Gang::host_failed(size_t i, const std::string& problem) {
  Host& h = hosts_[i];
  if (h.state == HostState::failed) return;
  h.state = HostState::failed;
  h.problem = problem;
  if (watch_) watch_problem(i, problem);
}

void Gang::on(size_t i, uint32_t, msg::HelloAck& m) {
  Host& h = hosts_[i];
  if (h.state != HostState::greeting) return;
  if (m.magic != proto::kMagic || m.version != proto::kVersion) {
    host_failed(i, "the agent speaks protocol version " + std::to_string(m.version) + ", this mltrain " +
                       std::to_string(proto::kVersion));
  } else {
    h.state = HostState::greeted;
    if (watch_) start_watching(i);
  }
  check_progress();
}

void Gang::on(size_t i, uint32_t, msg::Prepared& m) {
  Host& h = hosts_[i];
  if (h.state != HostState::preparing) return;
  h.prepared = std::move(m);
  for (const auto& port : h.prepared.ports)  // a host's word, used as a number below
    if (!text::parse_int_in(port, 1, 65535))
      h.prepared.problems.push_back("the agent offered the port '" + text::host_text(port, 32) +
                                    "', not a number from 1 to 65535");
  if (!h.prepared.problems.empty()) {
    host_failed(i, text::join(h.prepared.problems, "; "));
    h.cannot_start = h.prepared.cannot_start != 0;
  } else
    h.state = HostState::ready;
  check_progress();
}

void Gang::check_progress() {
  auto all = [&](HostState s) {
    return std::all_of(hosts_.begin(), hosts_.end(),
                       [&](const Host& h) { return h.state == s || h.state == HostState::failed; });
  };
  if (phase_ == Phase::connecting && watch_) {
    if (all(HostState::ready)) enter(Phase::watching);
  } else if (phase_ == Phase::connecting && pull_only_ && all(HostState::greeted)) {
    enter(Phase::pulling);
  } else if (phase_ == Phase::connecting && all(HostState::greeted)) {
    log::info("supervise", "every agent answered");
    enter(doctor_ ? Phase::probing : Phase::preflight);
  } else if (phase_ == Phase::probing && all(HostState::ready)) {
    enter(Phase::closing);
  } else if (phase_ == Phase::preflight && all(HostState::ready)) {
    log::info("supervise", "preflight done");
    settle_gpus();
    std::vector<std::string> lines;
    for (const auto& h : hosts_)
      if (h.state == HostState::failed) {
        const std::string& n = h.plan->host.name;
        bool named = h.problem.compare(0, n.size() + 2, n + ": ") == 0;
        lines.push_back("  " + (named ? h.problem : n + ": " + h.problem));
      }
    if (!lines.empty()) {
      preflight_error_ = "preflight failed on " + std::to_string(lines.size()) + " of " +
                         std::to_string(hosts_.size()) + (hosts_.size() == 1 ? " host" : " hosts") +
                         "; no rank was started:\n" + text::join(lines, "\n");
      ending_ = Ending::preflight_failed;
      enter(Phase::done);
      return;
    }
    settle_rendezvous();
    settle_ps();
    enter(Phase::running);
  }
}

void Gang::begin_preflight() {
  // Where ranks meet: rank 0's host, by an address the other hosts reach.
  master_ = "127.0.0.1";
  if (plan_.multi_host && hosts_[0].link) {
    master_ = hosts_[0].link->address();
    if (plan_.hosts[0].local)
      for (auto& h : hosts_)
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
  number_ps_servers();
  if (opts_.sync) start_sync_all();
  for (size_t i = 0; i < hosts_.size(); ++i)
    if (hosts_[i].state == HostState::greeted) next_step(i);
  check_progress();
}

void Gang::next_step(size_t i) {
  Host& h = hosts_[i];
  if (!h.open()) return;
  // A PS server host runs no job code: nothing to sync or set up there.
  const bool serves_only = plan_.hosts[i].ranks.empty();
  if (opts_.sync && !h.synced && !serves_only)
    start_sync(i);
  else if (opts_.setup && !h.set_up && !serves_only)
    start_setup(i);
  else
    send_prepare(i);
}

void Gang::send_prepare(size_t i) {
  msg::Prepare m = prepare_;
  uint32_t nports =
      plan_.multi_host ? (plan_.auto_master_port ? 1u : 0u) + 1u + (plan_.ps_mode ? 1u : 0u) : 0u;
  m.gpu_slots_needed = uint32_t(plan_.hosts[i].gpu_slots_needed);
  m.nports = i == 0 ? nports : 0;
  // A fixed master_port must be free on rank 0's host, or rank 0 fails to listen on it later.
  m.fixed_port = i == 0 && !plan_.auto_master_port ? uint32_t(plan_.master_port) : 0;
  if (plan_.hosts[i].ranks.empty()) m.workdir.clear(), m.argv0.clear();  // a PS server host runs no program
  ps_prepare(i, m);
  hosts_[i].state = HostState::preparing;
  hosts_[i].prepare_deadline = clock_.now() + opts_.preflight_timeout;
  send_to(hosts_[i], m);
}

void Gang::settle_gpus() {
  // Each rank's CUDA_VISIBLE_DEVICES from what its host's agent found usable; a host that cannot
  // give every rank its GPUs fails preflight like any other host problem.
  for (size_t i = 0; i < hosts_.size(); ++i) {
    Host& h = hosts_[i];
    if (h.state != HostState::ready || h.plan->gpu_slots_needed == 0) continue;
    plan::HostGpus g;
    for (const auto& gpu : h.prepared.gpus) {
      g.indices.push_back(gpu.index);
      g.names.push_back(gpu.name);
    }
    g.usable.assign(h.prepared.gpu_usable.begin(), h.prepared.gpu_usable.end());
    g.note = h.prepared.gpu_note;
    if (h.prepared.has_cuda_visible_devices) g.cuda_visible_devices = h.prepared.cuda_visible_devices;
    std::string problem = plan::assign_gpus(plan_, int(i), g);
    if (!problem.empty()) host_failed(i, problem);
  }
}

void Gang::settle_rendezvous() {
  if (plan_.multi_host) {
    plan::Rendezvous r;
    r.master_addr = master_;
    const auto& ports = hosts_[0].prepared.ports;
    size_t k = 0;
    auto next = [&](int fallback) {
      return k < ports.size() ? int(*text::parse_int_in(ports[k++], 1, 65535)) : fallback;
    };
    r.master_port = plan_.auto_master_port ? next(plan_.master_port) : plan_.master_port;
    r.store_port = next(plan_.master_port + 1);
    r.ps_port = plan_.ps_mode ? next(0) : 0;
    plan::set_rendezvous(plan_, r);
    for (size_t i = 0; i < hosts_.size(); ++i) plan::set_interface(plan_, int(i), hosts_[i].prepared.ifname);
  }
  // The record shows the rendezvous and environment as preflight settled them.
  records::fill_from_plan(rec_, plan_);
  for (size_t i = 0; i < hosts_.size(); ++i) rec_.hosts[i].address = hosts_[i].link->address();
}

}  // namespace mltrain::supervise::detail
