// What a transport needs of the rendezvous store to exchange its own connection data (the NCCL
// unique id): set a key, wait for one. The rendezvous layer implements it, so transports never
// include the store.
#pragma once

#include <string>

#include "transport/socket.h"

namespace mltrain::comm::detail {

class KeyValue {
 public:
  virtual ~KeyValue() = default;
  virtual void set(const std::string& key, const std::string& value, Deadline deadline) = 0;
  // Blocks until the key exists; throws Error(timeout) naming the key at the deadline.
  virtual std::string wait(const std::string& key, Deadline deadline) = 0;
};

}  // namespace mltrain::comm::detail
