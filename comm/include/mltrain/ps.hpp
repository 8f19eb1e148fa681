// mltrain::comm::ps — the worker's side of parameter-server mode (BytePS-style summation service).
//
// Servers run inside the mltrain agents of the job's server hosts; `mltrain run` tells every rank
// where they are (MLTRAIN_PS_SERVERS). A worker declares keys, then pushes and pulls them:
//   sync servers (default): round r of a key is every worker's r-th push of it; pull returns
//     exactly their sum, never a mix of rounds (a worker's pull waits for its own latest round;
//     before any push it returns the declared initial value). push_pull = push, then that pull.
//   async servers: each push is applied at once by the server's optimizer (sgd with lr,
//     momentum, weight_decay; without one the push is added); pull returns the latest value.
// A key larger than partition_bytes is split into parts spread over the servers; every worker must
// declare the same keys with the same count and dtype (the first declaration's value wins).
// Requests from one client on one key are applied in the order they were made (one connection
// per server, served in order): a pull_async right after a push_async sees that push's round.
//
// Contract: one Client per process, thread-safe. Buffers are read and written in place (no copy on
// the worker) and must stay valid and untouched until the handle's wait() returns. Every
// connection proves the job's token. Every wait ends within the timeout, or throws Error naming
// the server (index, host, address) that did not answer or closed the connection; after an Error
// the client is broken: further calls throw.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "mltrain/comm.hpp"

namespace mltrain::comm::ps {

struct ServerAddress {
  std::string host;  // its host's name in the job, for messages
  std::string addr;  // where to connect
  int port = 0;
};

struct Options {
  int worker = 0;  // this worker's id, 0..num_workers-1 (RANK)
  int num_workers = 1;
  std::vector<ServerAddress> servers;         // MLTRAIN_PS_SERVERS: "host=addr:port,..."
  std::string token;                          // MLTRAIN_TOKEN
  std::size_t partition_bytes = 4u << 20;     // MLTRAIN_PS_PARTITION_BYTES
  bool sync = true;                           // MLTRAIN_PS_SYNC (what the servers do; for messages)
  std::uint32_t generation = 0;               // TORCHELASTIC_RESTART_COUNT: a restarted gang starts afresh
  std::chrono::milliseconds timeout{300000};  // MLTRAIN_COMM_TIMEOUT
  static Options from_env();
};

class Client;

// One request (all the parts of one key). wait() blocks until every part is done, or throws.
class Handle {
 public:
  Handle() = default;
  bool done() const;
  void wait();
  struct State;

 private:
  friend class Client;
  explicit Handle(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

class Client {
 public:
  static std::unique_ptr<Client> init_from_env();
  static std::unique_ptr<Client> create(const Options& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int worker() const noexcept;
  int num_workers() const noexcept;
  int num_servers() const noexcept;
  bool sync() const noexcept;

  // Declares `key`: count elements of dtype, initial value `init` (nullptr: zeros). Blocking.
  // Declaring a key again with the same count and dtype is a no-op; another shape is an Error.
  void declare(std::uint64_t key, std::size_t count, DataType dtype, const void* init = nullptr);
  // The server (index) that holds part `part` of `key`, and how many parts it has.
  int server_of(std::uint64_t key, std::size_t part) const;
  std::size_t parts_of(std::uint64_t key) const;

  Handle push_async(std::uint64_t key, const void* buf);
  Handle pull_async(std::uint64_t key, void* buf);
  Handle push_pull_async(std::uint64_t key, const void* send, void* recv);  // recv may equal send
  void push(std::uint64_t key, const void* buf) { push_async(key, buf).wait(); }
  void pull(std::uint64_t key, void* buf) { pull_async(key, buf).wait(); }
  void push_pull(std::uint64_t key, const void* send, void* recv) { push_pull_async(key, send, recv).wait(); }

  struct Impl;

 private:
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;  // shared with the handles in flight
};

// What a server does and counts; the agent runs one per server thread (comm/src/ps/server.h).
struct ServerStats {
  std::uint64_t bytes_in = 0, bytes_out = 0, requests = 0;
  std::uint32_t workers = 0;          // connected now
  std::uint32_t queue_depth = 0;      // requests waiting for their round now
  std::uint32_t max_queue_depth = 0;  // ... at most
  std::uint64_t keys = 0;             // parts held
};

}  // namespace mltrain::comm::ps
