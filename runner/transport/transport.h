// Transports start the mltrain agent on a host and hand the supervisor one byte stream to it.
// Local: the agent is a child over pipes. SSH: the agent runs over one channel per host.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "runner/plan/plan.h"

namespace mltrain::transport {

// A running agent. The supervisor reads frames from read_fd() and writes commands to write_fd();
// both are non-blocking. Destroying the link closes the stream, which makes the agent stop its
// ranks and exit.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual int read_fd() const = 0;
  virtual int write_fd() const = 0;
  // "localhost", or "h1 (10.0.0.1)": how messages name this host.
  virtual std::string describe() const = 0;
  // The address other hosts reach this host at (MASTER_ADDR when it runs rank 0).
  virtual std::string address() const = 0;
  // This machine's address on the way to that host ("" for a local agent).
  virtual std::string local_address() const { return {}; }
  // Last resort when the agent stops answering: drop the connection without a goodbye. An agent
  // that is still alive sees it close and stops its ranks.
  virtual void kill() = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts (or connects to) the agent for `host`. Throws mltrain::Error with a one-line reason.
  virtual std::unique_ptr<AgentLink> connect(const plan::HostPlan& host) = 0;
  // `mltrain ssh`: runs `script` (for /bin/sh) on `host` with this process's stdin, stdout and
  // stderr; when stdin is a terminal, in a terminal there (a PTY over SSH, its size kept in step)
  // with this one in raw mode meanwhile. Blocks until it ends; returns its exit code (128 + N for
  // signal N). Throws mltrain::Error when the host cannot be reached.
  virtual int interactive(const plan::HostPlan& host, const std::string& script);
};

// Runs the agent as a local child process (posix_spawnp), over pipes.
std::unique_ptr<Transport> make_local_transport();

// Inside a Slurm allocation: each host's agent is one `srun --overlap -N1 -n1 -w HOST` step whose
// stdin/stdout are the agent's stream (slurm_transport.cpp).
struct SlurmOptions {
  std::string srun = "srun";
  std::chrono::milliseconds start_timeout{60000};  // for the step to start and the agent to answer
};
std::unique_ptr<Transport> make_slurm_transport(SlurmOptions o);

// The agent executable embedded in this binary, and its content hash (hex SHA-256).
std::string_view agent_bytes();
std::string_view agent_hash();
// Writes the embedded agent under the state dir (once per content hash) and returns its path.
std::string local_agent_path();

}  // namespace mltrain::transport
