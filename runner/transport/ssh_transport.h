// The SSH transport: libssh, honouring the user's ssh config, agent and known_hosts.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "runner/transport/transport.h"

namespace mltrain::transport {

struct SshOptions {
  std::string config;  // "" = ~/.ssh/config when present
  std::string user, identity_file, known_hosts;
  int port = 0;
  std::string strict_host_keys = "yes";  // yes | accept-new | no
  bool strict_host_keys_set = false;     // else the ssh config's StrictHostKeyChecking applies
  std::chrono::milliseconds connect_timeout{10000};
  bool connect_timeout_set = false;  // else the ssh config's ConnectTimeout (or this default) applies
};

// Host keys are checked strictly unless told otherwise: unknown or changed keys are refused
// with their fingerprint. Each connect() uploads the agent by content hash if the host lacks it.
std::unique_ptr<Transport> make_ssh_transport(SshOptions o);

}  // namespace mltrain::transport
