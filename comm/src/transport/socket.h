// Thin POSIX socket helpers with deadlines; every failure is an Error carrying errno's text.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <utility>

#include "core/clock.h"

namespace mltrain::comm::detail {

// Milliseconds until the deadline, clamped to [0, cap].
int ms_until(Deadline deadline, int cap = 1 << 30);

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

// "host:port" -> {host, port}; throws Error(usage) on a malformed address.
std::pair<std::string, int> split_host_port(const std::string& addr);

// Listening socket on all interfaces; port 0 picks one. Returns the fd and the bound port.
// Listens on port (0 picks a free one) on every interface, or on 127.0.0.1 alone.
std::pair<Fd, int> listen_tcp(int port, int backlog = 128, bool loopback_only = false);
// Connects, retrying refused connections until the deadline (the listener may start later).
Fd connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what);
// Accepts one connection, waiting until the deadline; returns an empty Fd on timeout.
Fd accept_tcp(int listen_fd, Deadline deadline);

void set_nonblocking(int fd);
void set_nodelay(int fd);
// Sets a link's congestion control from Options::tcp_congestion; returns the algorithm it set,
// or "" where it kept the host's. A name the kernel refuses throws Error(usage) naming what the
// host allows (net.ipv4.tcp_allowed_congestion_control); under auto a refusal keeps the host's.
std::string set_congestion(int fd, const std::string& choice);
// Init's check of a named choice on a socket of its own, so a refused name fails every job at
// init, whether or not it has TCP links.
void check_congestion(const std::string& choice);
std::string local_ip(int fd);
std::string peer_name(int fd);

// Blocking-with-deadline transfers on a non-blocking fd. Throw Error(peer_closed / timeout)
// whose message starts with `what`.
void send_all(int fd, const void* data, std::size_t n, Deadline deadline, const std::string& what);
void recv_all(int fd, void* data, std::size_t n, Deadline deadline, const std::string& what);

}  // namespace mltrain::comm::detail
