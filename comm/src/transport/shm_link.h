// Shared-memory links between ranks on one host: one segment per pair holding two
// single-producer/single-consumer byte rings; every rank owns a doorbell segment (Bell) that
// producers and consumers ring, so a rank can sleep on one futex for all its links.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/link.h"
#include "transport/socket.h"

namespace mltrain::comm::detail {

inline constexpr std::uint32_t kShmMagic = 0x4d4c5348;  // "MLSH"
inline constexpr std::uint16_t kShmVersion = 1;

// A mapped POSIX shared-memory object; unmapped on destruction (unlinking is explicit).
class ShmMapping {
 public:
  // create: O_CREAT|O_EXCL of `bytes`; otherwise opens an existing object of at least `bytes`.
  // reserve (with create): allocate the pages now (posix_fallocate), so a full /dev/shm is an
  // error here rather than a SIGBUS on first touch.
  ShmMapping(const std::string& name, std::size_t bytes, bool create, bool reserve = false);
  ~ShmMapping();
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  void* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  void unlink();
  void unlink_quietly() noexcept;  // unlink if still named here; errors ignored

 private:
  std::string name_;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool linked_ = false;
};

class ShmLink final : public Link {
 public:
  // side 0 is the lower rank of the pair (it created the segment), side 1 the higher.
  ShmLink(std::unique_ptr<ShmMapping> segment, int side, Bell* own_bell,
          std::unique_ptr<ShmMapping> peer_bell, int peer_pid, int peer_rank, std::string peer_host);
  ~ShmLink() override;

  // Lays out a fresh segment of the given ring capacity; returns its total size.
  static std::size_t segment_bytes(std::size_t capacity);
  static void init_segment(void* base, std::size_t capacity);
  // Checks magic/version/capacity of a segment opened by the higher rank; throws on mismatch.
  static void check_segment(const void* base, std::size_t capacity, const std::string& who);

  bool can_send() override;
  bool can_recv() override;
  bool peer_alive() override;
  void close() override;
  const char* kind() const override { return "shm"; }

 protected:
  std::size_t do_send(const void* data, std::size_t n) override;
  std::span<const std::byte> do_peek() override;
  void do_consume(std::size_t n) override;

 private:
  struct Ring;
  void throw_closed() const;
  std::unique_ptr<ShmMapping> segment_;
  std::unique_ptr<ShmMapping> peer_bell_map_;
  Bell* own_bell_;
  Bell* peer_bell_;
  int peer_pid_;
  int side_;
  Ring* tx_;
  Ring* rx_;
  std::byte* tx_data_;
  std::byte* rx_data_;
  std::uint64_t cap_;
  std::atomic<std::uint32_t>* closed_;  // [2]: side i closed
  bool closed_here_ = false;
};

}  // namespace mltrain::comm::detail
