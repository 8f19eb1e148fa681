// PS mode on this host: the agent runs the job's parameter servers (comm/src/ps/server.h), each on
// a thread of its own with its own port, from preflight until the agent exits. Their log lines come
// back to the launcher as PsLog frames (through a pipe the loop polls), their counters as PsStats.
#include <fcntl.h>
#include <unistd.h>

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

int Agent::ps_fd() const { return ps_ ? ps_->pipe[0] : -1; }

void Agent::start_ps(const msg::Prepare& m, msg::Prepared& out) {
  if (m.ps_servers.empty() || ps_) return;
  auto host = std::make_shared<PsHost>();
  if (::pipe2(host->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    out.problems.push_back(std::string("cannot start the PS servers: pipe: ") + std::strerror(errno));
    return;
  }
  PsHost* raw = host.get();
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
    host->lines.emplace_back(host->numbers[i], "listening on port " +
                                                   std::to_string(host->servers[i]->port()) + " for " +
                                                   std::to_string(m.ps_workers) + " workers (" +
                                                   (m.ps_sync ? "sync" : "async") + ")");
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
