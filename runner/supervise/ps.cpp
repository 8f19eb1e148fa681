// PS mode in the run: which servers each host's agent runs (asked in its Prepare), where they
// listen (its Prepared), the ranks told so (MLTRAIN_PS_SERVERS) before any starts; the servers'
// log lines into the run's ps-<host>.log, their counters into run.json, and a server that stops
// serving fails the job like a rank, named by its host.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/records/records.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;

namespace {
std::string decimal(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}
}  // namespace

void RunPlay::number_ps_servers() {
  // Numbers taken host by host in turn (h3: 0 2, h4: 1 3), so the first servers are on
  // different hosts and a job's keys spread over every host's NIC.
  ps_numbers_.assign(fleet_.size(), {});
  if (!plan_.ps_mode) return;
  int next = 0;
  for (int round = 0;; ++round) {
    bool any = false;
    for (size_t i = 0; i < fleet_.size(); ++i)
      if (plan_.hosts[i].ps_servers > round) ps_numbers_[i].push_back(next++), any = true;
    if (!any) break;
  }
}

void RunPlay::ps_prepare(size_t i, msg::Prepare& m) const {
  if (i >= ps_numbers_.size() || ps_numbers_[i].empty()) return;
  m.ps_servers = ps_numbers_[i];
  m.ps_workers = uint32_t(plan_.ranks.size());
  m.ps_sync = plan_.ps.sync ? 1 : 0;
  m.ps_token = plan_.token;
  m.ps_optimizer = plan_.ps.optimizer;
  m.ps_lr = decimal(plan_.ps.lr);
  m.ps_momentum = decimal(plan_.ps.momentum);
  m.ps_weight_decay = decimal(plan_.ps.weight_decay);
  m.ps_memory = plan_.ps_memory;
}

std::string RunPlay::reach_address(size_t i) const {
  // How the other hosts reach host i: its SSH peer address; this machine by its address on the
  // way to them; everything on one machine: loopback.
  if (!plan_.multi_host) return "127.0.0.1";
  if (!plan_.hosts[i].local && fleet_[i].link) return fleet_[i].link->address();
  for (const auto& h : fleet_.hosts())
    if (h.link && !h.plan->local && !h.link->local_address().empty()) return h.link->local_address();
  return "127.0.0.1";
}

void RunPlay::settle_ps() {
  if (!plan_.ps_mode) return;
  std::vector<std::string> entries(size_t(plan_.ps.servers));
  rec_.ps_servers.assign(entries.size(), {});
  for (size_t i = 0; i < fleet_.size(); ++i) {
    const auto& ports = hosts_[i].prepared.ps_ports;
    for (size_t k = 0; k < ps_numbers_[i].size() && k < ports.size(); ++k) {
      const size_t n = size_t(ps_numbers_[i][k]);
      if (n >= entries.size()) continue;
      const std::string addr = reach_address(i) + ":" + std::to_string(ports[k]);
      entries[n] = plan_.hosts[i].host.name + "=" + addr;
      rec_.ps_servers[n].server = int(n);
      rec_.ps_servers[n].host = plan_.hosts[i].host.name;
      rec_.ps_servers[n].address = addr;
    }
  }
  plan::set_ps_servers(plan_, entries);
}

void RunPlay::on(size_t i, uint32_t, msg::PsLog& m) {
  RunHost& h = hosts_[i];
  if (h.ps_log_fd < 0) {
    const std::string path = records::run_dir(rec_.id) + "/ps-" + fleet_[i].name() + ".log";
    h.ps_log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  const std::string line =
      "server " + std::to_string(m.server) + ": " + (m.failed ? "failed: " : "") + m.line + "\n";
  if (h.ps_log_fd >= 0) [[maybe_unused]]
    ssize_t n = ::write(h.ps_log_fd, line.data(), line.size());
  if (!m.failed) return;
  const std::string why = "PS server " + std::to_string(m.server) + " stopped serving: " + m.line;
  if (before_running())
    fail_host(i, why);
  else if (phase_ == Phase::running)
    fail_first(-1, fleet_[i].name(), exit_code::host_failure, 0, fleet_.describe(i) + ": " + why,
               "ps_server");
}

void RunPlay::on(size_t, uint32_t, msg::PsStats& m) {
  for (const auto& s : m.servers) {
    if (s.server < 0 || size_t(s.server) >= rec_.ps_servers.size()) continue;
    records::PsServerRecord& r = rec_.ps_servers[size_t(s.server)];
    r.bytes_in = s.bytes_in, r.bytes_out = s.bytes_out, r.requests = s.requests, r.keys = s.keys;
    r.max_queue_depth = s.max_queue_depth;
  }
}

std::string RunPlay::ps_note(size_t i) const {
  if (i >= ps_numbers_.size() || ps_numbers_[i].empty()) return {};
  std::vector<std::string> n;
  for (int32_t s : ps_numbers_[i]) n.push_back(std::to_string(s));
  return std::string(" (PS server") + (n.size() == 1 ? " " : "s ") + text::join(n, ", ") + " ran there)";
}

}  // namespace mltrain::supervise::detail
