// The rendezvous store: a small TCP key-value store that rank 0 hosts. Every connection opens
// with a hello (magic, version, rank, MLTRAIN_TOKEN); a wrong token is refused and logged.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "transport/key_value.h"
#include "transport/socket.h"

namespace mltrain::comm::detail {

class StoreServer {
 public:
  // Listens at port (0 picks a free one) on all interfaces, or on loopback alone for a job whose
  // ranks all run on this host, and serves from a thread. A connection that has not proven the
  // token within kHelloWithin is dropped; at most kMaxUnproven such connections in all, and
  // kMaxUnprovenPerPeer from one address, are held: strangers cannot exhaust the store.
  StoreServer(int port, std::string token, bool loopback_only = false);
  static constexpr std::chrono::seconds kHelloWithin{5};
  static constexpr std::size_t kMaxUnproven = 256;
  static constexpr std::size_t kMaxUnprovenPerPeer = 32;
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }

 private:
  void serve();
  Fd listen_;
  int port_ = 0;
  std::string token_;
  Fd wake_read_, wake_write_;
  std::thread thread_;
};

class StoreClient : public KeyValue {
 public:
  // Connects (retrying until connect_deadline, the server may start later) and proves the token.
  StoreClient(std::string addr, std::string token, int rank, Deadline connect_deadline);
  void set(const std::string& key, const std::string& value, Deadline deadline) override;
  std::optional<std::string> get(const std::string& key, Deadline deadline);
  // Blocks until the key exists; throws Error(timeout) naming the key at the deadline.
  std::string wait(const std::string& key, Deadline deadline) override;
  std::int64_t add(const std::string& key, std::int64_t delta, Deadline deadline);
  // The local address that routes to the store's host: what peers on other hosts can reach.
  std::string local_address() const { return local_ip_; }
  const std::string& addr() const { return addr_; }

 private:
  void ensure_connected(Deadline deadline);
  void request(const std::string& frame, Deadline deadline);
  void read_exact(void* data, std::size_t n, Deadline deadline);
  std::string addr_, token_;
  int rank_;
  Fd fd_;
  std::string local_ip_;
};

}  // namespace mltrain::comm::detail
