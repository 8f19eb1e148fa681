#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/sys_check.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {
std::string errno_text(int err) { return std::strerror(err); }
}  // namespace

int ms_until(Deadline deadline, int cap) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > cap ? cap : static_cast<int>(left);
}

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::pair<std::string, int> split_host_port(const std::string& addr) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon + 1 == addr.size())
    throw Error(Error::Kind::usage, "address '" + addr + "' is not host:port");
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  char* end = nullptr;
  const long port = std::strtol(addr.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || port < 0 || port > 65535)
    throw Error(Error::Kind::usage, "address '" + addr + "' has a bad port");
  if (host.empty()) host = "127.0.0.1";
  return {host, static_cast<int>(port)};
}

void set_nonblocking(int fd) {
  const std::string where = "fd " + std::to_string(fd);
  const int flags = check_sys(::fcntl(fd, F_GETFL, 0), "fcntl(F_GETFL)", where);
  check_sys(::fcntl(fd, F_SETFL, flags | O_NONBLOCK), "fcntl(F_SETFL, O_NONBLOCK)", where);
}

void set_nodelay(int fd) {
  int one = 1;
  check_sys(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one), "setsockopt(TCP_NODELAY)",
            "fd " + std::to_string(fd));
}

std::string set_congestion(int fd, const std::string& choice) {
  if (choice == "system") return {};
  std::vector<std::string> tries{choice};
  if (choice == "auto") {
    char now[32] = {};
    socklen_t len = sizeof now - 1;
    if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, now, &len) != 0 || std::string(now) != "bbr") return {};
    tries = {"cubic", "reno"};
  }
  int err = 0;
  for (const std::string& t : tries) {
    if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, t.data(), static_cast<socklen_t>(t.size())) == 0)
      return t;
    err = errno;
  }
  if (choice == "auto") return {};
  const std::string allowed = first_line("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  throw Error(Error::Kind::usage, "MLTRAIN_COMM_TCP_CC=" + choice + ": the kernel refused it (" +
                                      errno_text(err) + "); this host allows " +
                                      (allowed.empty() ? "?" : allowed) + " (auto or system keep working)");
}

void check_congestion(const std::string& choice) {
  if (choice == "auto" || choice == "system") return;
  Fd probe(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (probe) set_congestion(probe.get(), choice);
}

std::pair<Fd, int> listen_tcp(int port, int backlog, bool loopback_only) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw Error(Error::Kind::internal, "socket(): " + errno_text(errno));
  int one = 1;
  check_sys(::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), "setsockopt(SO_REUSEADDR)",
            "listening on port " + std::to_string(port));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(loopback_only ? INADDR_LOOPBACK : INADDR_ANY);
  sa.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    throw Error(Error::Kind::usage,
                "cannot listen on port " + std::to_string(port) + ": " + errno_text(errno));
  if (::listen(fd.get(), backlog) != 0) throw Error(Error::Kind::internal, "listen(): " + errno_text(errno));
  socklen_t len = sizeof sa;
  check_sys(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&sa), &len), "getsockname",
            "listening on port " + std::to_string(port));
  set_nonblocking(fd.get());
  return {std::move(fd), ntohs(sa.sin_port)};
}

Fd connect_tcp(const std::string& host, int port, Deadline deadline, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  std::string last_error = "timed out";
  auto backoff = std::chrono::milliseconds(2);
  while (true) {
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (rc != 0) {
      last_error = std::string("cannot resolve '") + host + "': " + ::gai_strerror(rc);
    } else {
      for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
        if (!fd) continue;
        set_nonblocking(fd.get());
        int err = 0;
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
          err = errno;
          if (err == EINPROGRESS) {
            pollfd p{fd.get(), POLLOUT, 0};
            const int n = ::poll(&p, 1, ms_until(deadline));
            socklen_t len = sizeof err;
            if (n == 1) {
              if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
            } else {
              err = n < 0 ? errno : ETIMEDOUT;
            }
          }
        }
        if (err == 0) {
          ::freeaddrinfo(res);
          set_nodelay(fd.get());
          return fd;
        }
        last_error = errno_text(err);
      }
      ::freeaddrinfo(res);
    }
    if (Clock::now() + backoff >= deadline)
      throw Error(Error::Kind::timeout, what + ": cannot connect to " + host + ":" + std::to_string(port) +
                                            " (" + last_error + ")");
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

Fd accept_tcp(int listen_fd, Deadline deadline) {
  while (true) {
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd) {
      set_nodelay(fd.get());
      return fd;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw Error(Error::Kind::internal, "accept(): " + errno_text(errno));
    pollfd p{listen_fd, POLLIN, 0};
    const int ms = ms_until(deadline);
    if (ms == 0) return Fd();
    if (::poll(&p, 1, ms) < 0 && errno != EINTR)
      throw_sys("poll", "accepting on fd " + std::to_string(listen_fd));
  }
}

std::string local_ip(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "127.0.0.1";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return buf;
}

std::string peer_name(int fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(sa.sin_port));
}

void send_all(int fd, const void* data, std::size_t n, Deadline deadline, const std::string& what) {
  auto p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(Error::Kind::peer_closed, what + ": " + errno_text(errno));
    pollfd pfd{fd, POLLOUT, 0};
    const int ms = ms_until(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) throw Error(Error::Kind::timeout, what + ": timed out sending");
  }
}

void recv_all(int fd, void* data, std::size_t n, Deadline deadline, const std::string& what) {
  auto p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) throw Error(Error::Kind::peer_closed, what + ": connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(Error::Kind::peer_closed, what + ": " + errno_text(errno));
    pollfd pfd{fd, POLLIN, 0};
    const int ms = ms_until(deadline);
    if (ms == 0 || ::poll(&pfd, 1, ms) == 0) throw Error(Error::Kind::timeout, what + ": timed out waiting");
  }
}

}  // namespace mltrain::comm::detail
