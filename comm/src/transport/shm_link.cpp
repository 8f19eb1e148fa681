#include "transport/shm_link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <csignal>
#include <cstring>

#include "core/sys_check.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {

long futex(std::atomic<std::uint32_t>* addr, int op, std::uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), op, val, ts, nullptr, 0);
}

struct SegmentHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t reserved;
  std::uint64_t capacity;
};

constexpr std::size_t kHeaderBytes = 4096;

}  // namespace

void ring_bell(Bell* bell) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell->waiters.load(std::memory_order_relaxed) != 0) {
    bell->seq.fetch_add(1, std::memory_order_seq_cst);
    futex(&bell->seq, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void sleep_on_bell(Bell* bell, std::uint32_t seen, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  futex(&bell->seq, FUTEX_WAIT, seen, &ts);
}

struct ShmLink::Ring {
  alignas(64) std::atomic<std::uint64_t> head;  // written by the producer
  alignas(64) std::atomic<std::uint64_t> tail;  // written by the consumer
};

namespace {
struct Layout {
  SegmentHeader header;
  alignas(64) std::atomic<std::uint32_t> closed[2];
};
}  // namespace

ShmMapping::ShmMapping(const std::string& name, std::size_t bytes, bool create, bool reserve) : name_(name) {
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0)
    throw Error(
        Error::Kind::internal,
        "shm_open(" + name + "): " + std::strerror(errno) +
            (create ? ""
                    : " (the peer's /dev/shm is not this one: MLTRAIN_COMM_TRANSPORT=shm forces shared "
                      "memory; auto uses it only between ranks with the same boot id and /dev/shm)"));
  linked_ = create;
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::shm_unlink(name.c_str());
    throw Error(Error::Kind::internal, "ftruncate(" + name + "): " + std::strerror(err));
  }
  if (create && reserve) {
    if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw Error(Error::Kind::internal, "cannot reserve " + std::to_string(bytes) +
                                             " bytes of /dev/shm for " + name + ": " + std::strerror(err));
    }
  }
  if (!create) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      throw Error(Error::Kind::internal, "fstat(" + name + "): " + std::strerror(err));
    }
    if (static_cast<std::size_t>(st.st_size) < bytes) {
      ::close(fd);
      throw Error(Error::Kind::internal, "shared memory " + name + " is smaller than expected");
    }
  }
  data_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (data_ == MAP_FAILED) {
    data_ = nullptr;
    if (create) ::shm_unlink(name.c_str());
    throw Error(Error::Kind::internal, "mmap(" + name + "): " + std::strerror(errno));
  }
  bytes_ = bytes;
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
  if (linked_) ::shm_unlink(name_.c_str());
}

void ShmMapping::unlink_quietly() noexcept {
  if (linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

void ShmMapping::unlink() {
  // ENOENT: the other end unlinked it first.
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) throw_sys("shm_unlink", name_);
  linked_ = false;
}

std::size_t ShmLink::segment_bytes(std::size_t capacity) { return kHeaderBytes + 2 * capacity; }

void ShmLink::init_segment(void* base, std::size_t capacity) {
  auto* layout = new (base) Layout{};
  layout->header = {kShmMagic, kShmVersion, 0, capacity};
  auto* rings = reinterpret_cast<Ring*>(static_cast<std::byte*>(base) + 1024);
  for (int i = 0; i < 2; ++i) {
    new (&rings[i]) Ring{};
    rings[i].head.store(0);
    rings[i].tail.store(0);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmLink::check_segment(const void* base, std::size_t capacity, const std::string& who) {
  const auto* header = static_cast<const SegmentHeader*>(base);
  if (header->magic != kShmMagic || header->version != kShmVersion)
    throw Error(Error::Kind::mismatch,
                "shared memory from " + who + " has a different wire version (magic/version)");
  if (header->capacity != capacity)
    throw Error(Error::Kind::mismatch, "shared memory from " + who + " has ring capacity " +
                                           std::to_string(header->capacity) + ", this rank " +
                                           std::to_string(capacity) + " (MLTRAIN_COMM_SHM_BYTES differs)");
}

ShmLink::ShmLink(std::unique_ptr<ShmMapping> segment, int side, Bell* own_bell,
                 std::unique_ptr<ShmMapping> peer_bell, int peer_pid, int peer_rank, std::string peer_host)
    : Link(peer_rank, std::move(peer_host)),
      segment_(std::move(segment)),
      peer_bell_map_(std::move(peer_bell)),
      own_bell_(own_bell),
      peer_bell_(static_cast<Bell*>(peer_bell_map_->data())),
      peer_pid_(peer_pid),
      side_(side) {
  auto* base = static_cast<std::byte*>(segment_->data());
  auto* layout = reinterpret_cast<Layout*>(base);
  cap_ = layout->header.capacity;
  closed_ = layout->closed;
  auto* rings = reinterpret_cast<Ring*>(base + 1024);
  tx_ = &rings[side];
  rx_ = &rings[1 - side];
  tx_data_ = base + kHeaderBytes + static_cast<std::size_t>(side) * cap_;
  rx_data_ = base + kHeaderBytes + static_cast<std::size_t>(1 - side) * cap_;
}

ShmLink::~ShmLink() { close(); }

void ShmLink::close() {
  if (closed_here_) return;
  closed_here_ = true;
  closed_[side_].store(1, std::memory_order_seq_cst);
  ring_bell(peer_bell_);
}

void ShmLink::throw_closed() const {
  throw Error(Error::Kind::peer_closed, peer_label() + " closed the connection", peer_rank(), peer_host());
}

bool ShmLink::peer_alive() { return peer_pid_ <= 0 || ::kill(peer_pid_, 0) == 0 || errno != ESRCH; }

bool ShmLink::can_send() {
  return tx_->head.load(std::memory_order_relaxed) - tx_->tail.load(std::memory_order_acquire) < cap_ ||
         closed_[1 - side_].load(std::memory_order_relaxed) != 0;
}

bool ShmLink::can_recv() {
  return rx_->head.load(std::memory_order_acquire) != rx_->tail.load(std::memory_order_relaxed) ||
         closed_[1 - side_].load(std::memory_order_relaxed) != 0;
}

std::size_t ShmLink::do_send(const void* data, std::size_t n) {
  if (closed_[1 - side_].load(std::memory_order_relaxed) != 0 || closed_here_) throw_closed();
  const std::uint64_t head = tx_->head.load(std::memory_order_relaxed);
  const std::uint64_t room = cap_ - (head - tx_->tail.load(std::memory_order_acquire));
  const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(n, room));
  if (k == 0) return 0;
  const std::size_t at = static_cast<std::size_t>(head % cap_);
  const std::size_t first = std::min(k, static_cast<std::size_t>(cap_) - at);
  std::memcpy(tx_data_ + at, data, first);
  if (first < k) std::memcpy(tx_data_, static_cast<const std::byte*>(data) + first, k - first);
  tx_->head.store(head + k, std::memory_order_release);
  ring_bell(peer_bell_);
  return k;
}

std::span<const std::byte> ShmLink::do_peek() {
  const std::uint64_t tail = rx_->tail.load(std::memory_order_relaxed);
  const std::uint64_t head = rx_->head.load(std::memory_order_acquire);
  if (head == tail) {
    if (closed_[1 - side_].load(std::memory_order_acquire) != 0) {
      // Re-read: the peer may have written its last bytes just before closing.
      if (rx_->head.load(std::memory_order_acquire) == tail) throw_closed();
    }
    return {};
  }
  const std::size_t at = static_cast<std::size_t>(tail % cap_);
  const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(head - tail, cap_ - at));
  return {rx_data_ + at, n};
}

void ShmLink::do_consume(std::size_t n) {
  rx_->tail.store(rx_->tail.load(std::memory_order_relaxed) + n, std::memory_order_release);
  ring_bell(peer_bell_);
}

}  // namespace mltrain::comm::detail
