// PS mode on this host: the agent runs the job's parameter servers (comm/src/ps/server.h), each on
// a thread of its own with its own port, from preflight until the agent exits. Their log lines come
// back to the launcher as PsLog frames (through a pipe the loop polls), their counters as PsStats.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "mltrain/comm.hpp"
#include "ps/server.h"
#include "runner/agent/detail/agent_impl.h"

namespace mltrain::agent::detail {

struct PsHost {
  std::vector<std::unique_ptr<comm::detail::PsServer>> servers;
  std::vector<int32_t> numbers;  // each server's number in the job
  std::vector<bool> failure_said;
  int pipe[2] = {-1, -1};  // a server thread wrote a line
  std::mutex m;
  std::vector<std::pair<int32_t, std::string>> lines;
  ~PsHost() {
    for (auto& s : servers) s->stop();
    for (int fd : pipe)
      if (fd >= 0) ::close(fd);
  }
};

namespace {

uint64_t number_in(const std::string& text) {
  if (text.empty() || text[0] < '0' || text[0] > '9') return 0;  // "max", or nothing
  return std::strtoull(text.c_str(), nullptr, 10);
}

// The memory this agent may use: the smaller of MemTotal and every memory limit of its cgroup and
// the cgroups above it (v2 memory.max, v1 memory.limit_in_bytes); 0 when none can be read.
uint64_t host_memory_bytes() {
  uint64_t best = 0;
  auto take = [&](uint64_t v) {
    if (v > 0 && (best == 0 || v < best)) best = v;
  };
  std::string text;
  if (telemetry::read_small_file("/proc/meminfo", text))
    if (size_t at = text.find("MemTotal:"); at != std::string::npos)
      take(std::strtoull(text.c_str() + at + 9, nullptr, 10) * 1024);
  if (!telemetry::read_small_file("/proc/self/cgroup", text)) return best;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    const size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    std::string base, file;
    if (controllers.empty())
      base = "/sys/fs/cgroup", file = "/memory.max";
    else if (("," + controllers + ",").find(",memory,") != std::string::npos)
      base = "/sys/fs/cgroup/memory", file = "/memory.limit_in_bytes";
    else
      continue;
    if (path.find("..") != std::string::npos) continue;
    for (int depth = 0; depth < 32; ++depth) {
      std::string limit;
      if (telemetry::read_small_file((base + path + file).c_str(), limit)) take(number_in(limit));
      if (path.empty() || path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == std::string::npos || slash == 0 ? "" : path.substr(0, slash);
    }
  }
  return best;
}

// What this host's servers may hold together, from Prepare's ps_memory ("N" bytes or "P%" of the
// host's memory; "": 50%); 0: no budget (the host's memory is unknown).
uint64_t ps_host_budget(const std::string& spec) {
  const std::string v = spec.empty() ? "50%" : spec;
  if (v.back() != '%') return std::strtoull(v.c_str(), nullptr, 10);
  const uint64_t pct = std::strtoull(v.c_str(), nullptr, 10);
  const uint64_t memory = host_memory_bytes(), share = std::min<uint64_t>(pct, 100);
  return memory / 100 * share + memory % 100 * share / 100;  // exact, and no overflow
}

}  // namespace

int Agent::ps_fd() const { return ps_ ? ps_->pipe[0] : -1; }

void Agent::start_ps(const msg::Prepare& m, msg::Prepared& out) {
  if (m.ps_servers.empty() || ps_) return;
  auto host = std::make_shared<PsHost>();
  if (::pipe2(host->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    out.problems.push_back(std::string("cannot start the PS servers: pipe: ") + std::strerror(errno));
    return;
  }
  PsHost* raw = host.get();
  // The host's budget, shared evenly by its servers.
  const uint64_t budget = ps_host_budget(m.ps_memory) / m.ps_servers.size();
  for (int32_t number : m.ps_servers) {
    comm::detail::ServerConfig c;
    c.index = number;
    c.num_workers = int(m.ps_workers);
    c.token = m.ps_token;
    c.sync = m.ps_sync != 0;
    c.optimizer = m.ps_optimizer;
    c.lr = std::strtod(m.ps_lr.c_str(), nullptr);
    c.momentum = std::strtod(m.ps_momentum.c_str(), nullptr);
    c.weight_decay = std::strtod(m.ps_weight_decay.c_str(), nullptr);
    c.memory_budget = budget;
    c.log = [raw, number](std::string_view line) {
      {
        std::lock_guard<std::mutex> lock(raw->m);
        raw->lines.emplace_back(number, std::string(line));
      }
      char b = 1;
      (void)!::write(raw->pipe[1], &b, 1);
    };
    try {
      auto server = std::make_unique<comm::detail::PsServer>(std::move(c));
      out.ps_ports.push_back(server->port());
      host->servers.push_back(std::move(server));
      host->numbers.push_back(number);
    } catch (const std::exception& e) {
      out.problems.push_back("cannot start PS server " + std::to_string(number) + ": " + e.what());
      return;  // the host fails preflight; the servers made so far stop with `host`
    }
  }
  host->failure_said.assign(host->servers.size(), false);
  // Said before the threads start: from then on only they (under the lock) add lines.
  for (size_t i = 0; i < host->servers.size(); ++i)
    host->lines.emplace_back(
        host->numbers[i], "listening on port " + std::to_string(host->servers[i]->port()) + " for " +
                              std::to_string(m.ps_workers) + " workers (" + (m.ps_sync ? "sync" : "async") +
                              ", memory budget " + (budget ? std::to_string(budget >> 20) + " MiB" : "none") +
                              ")");
  for (auto& server : host->servers) server->start();
  ps_ = std::move(host);
  pump_ps();
}

void Agent::pump_ps() {
  if (!ps_) return;
  char buf[256];
  while (::read(ps_->pipe[0], buf, sizeof buf) > 0) {
  }
  std::vector<std::pair<int32_t, std::string>> lines;
  {
    std::lock_guard<std::mutex> lock(ps_->m);
    lines.swap(ps_->lines);
  }
  for (auto& [server, line] : lines) send(msg::PsLog{server, 0, std::move(line)});
  for (size_t i = 0; i < ps_->servers.size(); ++i) {
    if (ps_->failure_said[i]) continue;
    std::string why = ps_->servers[i]->failure();
    if (why.empty()) continue;
    ps_->failure_said[i] = true;
    send(msg::PsLog{ps_->numbers[i], 1, why});
  }
}

void Agent::send_ps_stats() {
  if (!ps_) return;
  msg::PsStats m;
  for (size_t i = 0; i < ps_->servers.size(); ++i) {
    comm::ps::ServerStats s = ps_->servers[i]->stats();
    msg::PsServerCounters c;
    c.server = ps_->numbers[i];
    c.port = ps_->servers[i]->port();
    c.bytes_in = s.bytes_in, c.bytes_out = s.bytes_out, c.requests = s.requests, c.keys = s.keys;
    c.workers = s.workers, c.queue_depth = s.queue_depth, c.max_queue_depth = s.max_queue_depth;
    m.servers.push_back(c);
  }
  send(m);
}

void Agent::stop_ps() {
  if (!ps_) return;
  for (auto& s : ps_->servers) s->stop();
  pump_ps();
  send_ps_stats();
  ps_.reset();
}

}  // namespace mltrain::agent::detail
