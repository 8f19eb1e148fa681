// An agent that is a child process of the launcher, its stream two pipes: the local agent, or an
// `srun` whose stdin and stdout are the agent's on a node (slurm_transport.cpp).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>

#include "runner/transport/transport.h"

namespace mltrain::transport {

// Owns the fds and the child: closing the stream tells the agent to stop; the child is reaped
// (killed after 10 s) when the link goes.
std::unique_ptr<AgentLink> make_child_link(pid_t pid, int read_fd, int write_fd, std::string describe,
                                           std::string address);

}  // namespace mltrain::transport
