// The libssh pieces the SSH transport's files share: an owned session, and the agent link that
// runs over one of its channels. Internal to runner/transport.
#pragma once

#include <libssh/libssh.h>

#include <memory>
#include <string>

#include "runner/transport/transport.h"

namespace mltrain::transport::detail {

struct SessionDeleter {
  void operator()(ssh_session s) const {
    if (s) {
      ssh_disconnect(s);
      ssh_free(s);
    }
  }
};
using Session = std::unique_ptr<ssh_session_struct, SessionDeleter>;

// The agent's byte stream over `channel` (an exec channel already running the agent), with
// `leftover` the agent's bytes already read past the bootstrap marker. A pump thread moves bytes
// between the channel and a socketpair the supervisor polls; the link owns session and channel.
// Throws mltrain::Error when the socketpair cannot be made.
std::unique_ptr<AgentLink> make_ssh_link(Session session, ssh_channel channel, std::string name,
                                         std::string leftover);

}  // namespace mltrain::transport::detail
