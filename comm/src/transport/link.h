// A Link is one bidirectional byte stream to one peer rank: the only thing algorithms see.
// Transfers are non-blocking; waiting is ProgressWait's (transport/progress.h), with the hooks
// below, so algorithms never see a descriptor.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace mltrain::comm::detail {

// A per-rank doorbell in shared memory: whoever makes progress possible for a rank rings its
// bell; the rank sleeps on it (futex) after spinning. seq counts rings, waiters gates the wake.
struct Bell {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<std::uint32_t> waiters{0};
};
void ring_bell(Bell* bell);
// Sleeps while bell->seq == seen, at most timeout_ms.
void sleep_on_bell(Bell* bell, std::uint32_t seen, int timeout_ms);

class Link {
 public:
  Link(int peer_rank, std::string peer_host) : peer_rank_(peer_rank), peer_host_(std::move(peer_host)) {}
  virtual ~Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Copies up to n bytes out; returns how many (0: would block). Throws Error(peer_closed).
  std::size_t send_some(const void* data, std::size_t n) {
    const std::size_t k = do_send(data, n);
    tx_pos_ += k;
    return k;
  }
  // Readable bytes, possibly empty; valid until consume(). Throws Error(peer_closed) when the
  // peer closed and nothing is left to read.
  std::span<const std::byte> peek() { return do_peek(); }
  void consume(std::size_t n) {
    do_consume(n);
    rx_pos_ += n;
  }
  // Copies up to n received bytes straight into dst (no staging where the transport allows);
  // returns how many (0: nothing yet). Throws like peek().
  std::size_t recv_into(void* dst, std::size_t n) {
    const std::size_t k = do_recv_into(dst, n);
    rx_pos_ += k;
    return k;
  }
  // Stream positions, so both ends can pad to 8-byte boundaries identically.
  std::uint64_t tx_pos() const { return tx_pos_; }
  std::uint64_t rx_pos() const { return rx_pos_; }

  virtual bool can_send() = 0;
  virtual bool can_recv() = 0;
  virtual int fd() const { return -1; }  // -1: wait on the bell instead
  virtual bool peer_alive() { return true; }
  // Bytes to move per engine step on this link, given the configured piece.
  virtual std::size_t piece_bytes(std::size_t base) const { return base; }
  // The peer closed its end: whatever is buffered is all that will ever come.
  virtual bool peer_gone() const { return false; }
  virtual void close() = 0;  // tells the peer we are gone; idempotent
  virtual const char* kind() const = 0;

  int peer_rank() const { return peer_rank_; }
  const std::string& peer_host() const { return peer_host_; }
  std::string peer_label() const { return "rank " + std::to_string(peer_rank_) + " (" + peer_host_ + ")"; }

 protected:
  virtual std::size_t do_send(const void* data, std::size_t n) = 0;
  virtual std::span<const std::byte> do_peek() = 0;
  virtual void do_consume(std::size_t n) = 0;
  virtual std::size_t do_recv_into(void* dst, std::size_t n) {
    const auto view = do_peek();
    const std::size_t k = view.size() < n ? view.size() : n;
    if (k > 0) {
      std::memcpy(dst, view.data(), k);
      do_consume(k);
    }
    return k;
  }

 private:
  int peer_rank_;
  std::string peer_host_;
  std::uint64_t tx_pos_ = 0, rx_pos_ = 0;
};

}  // namespace mltrain::comm::detail
