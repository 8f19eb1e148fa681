// One parameter server: a thread with its own listening socket, serving every worker of the job
// (semantics in mltrain/ps.hpp, wire format in ps_wire.h). The mltrain agent runs the servers of
// its host; the comm library's tests run them in process.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "mltrain/ps.hpp"

namespace mltrain::comm::detail {

struct ServerConfig {
  int index = 0;  // the server's number in the job (for messages)
  int num_workers = 1;
  std::string token;
  bool sync = true;
  std::string optimizer;  // async: "" (a push is added) or "sgd"
  double lr = 0.01, momentum = 0, weight_decay = 0;
  // Bytes the server may hold (values, rounds under way, momentum, push buffers, its cache of
  // free buffers); a declare or push that would pass it is refused (kNoMemory) naming the key and
  // the worker, and the server goes on serving. 0: no budget.
  std::uint64_t memory_budget = 0;
  // A connection that has not proved the token by then is closed (a stranger holds no descriptor).
  std::chrono::milliseconds hello_timeout{10000};
  // Called on the server's thread with one line (no newline) for the server's log.
  std::function<void(std::string_view)> log;
};

class PsServer {
 public:
  // Listens on `port` (0: a free one) on every interface; throws Error when it cannot.
  explicit PsServer(ServerConfig config, int port = 0);
  ~PsServer();  // stop()
  PsServer(const PsServer&) = delete;
  PsServer& operator=(const PsServer&) = delete;

  int port() const { return port_; }
  void start();  // the serving thread
  void stop();   // ends it (closing every connection) and joins; idempotent
  ps::ServerStats stats() const;
  // "" while it serves; why it stopped serving otherwise (a broken invariant, out of memory).
  std::string failure() const;

  struct State;

 private:
  void serve();
  int port_ = 0;
  std::unique_ptr<State> state_;
  std::thread thread_;
};

}  // namespace mltrain::comm::detail
