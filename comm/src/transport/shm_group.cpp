#include "transport/shm_group.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {

constexpr std::uint32_t kGroupMagic = 0x4d4c4752;  // "MLGR"
constexpr std::uint16_t kGroupVersion = 3;
constexpr std::size_t kCtlBytes = 256;
constexpr std::size_t kCtlStart = 256;

struct GroupHeader {
  std::uint32_t magic;
  std::uint16_t version;
  std::uint16_t reserved;
  std::uint32_t size;
  std::uint32_t reserved2;
  std::uint64_t slot_bytes;
  alignas(64) Bell bell;
};
static_assert(sizeof(GroupHeader) <= kCtlStart);

std::size_t data_offset(int size) {
  const std::size_t end = kCtlStart + static_cast<std::size_t>(size) * kCtlBytes;
  return (end + 4095) & ~std::size_t{4095};
}

}  // namespace

struct ShmGroup::Ctl {
  std::atomic<std::uint64_t> counters[5];
  std::atomic<std::uint32_t> closed;
  std::atomic<std::uint32_t> vote;  // 1: this rank can read every peer's input (set before voted)
  alignas(8) unsigned char header[kHeaderBytes];
  std::atomic<std::uint64_t> result;  // rank 0: the result region of its posted call (0: none)
  // The input of the posted call, when it lies in a shared file (post_input; fd -1: it does not).
  std::int64_t in_fd;
  std::uint64_t in_dev, in_ino, in_size, in_offset;
  // The vote skip (ShmGroup::all_agreed): bit 0, the last call of the key was read mapped and
  // that still holds; bit 1, for writing too.
  std::uint32_t in_agreed;
  std::uint32_t wants_inputs;  // 1: the result in this rank's own buffer (allreduce_mapped)
};

std::size_t ShmGroup::segment_bytes(int size, std::size_t slot_bytes) {
  return data_offset(size) + static_cast<std::size_t>(size) * kSlots * slot_bytes;
}

void ShmGroup::init_segment(void* base, int size, std::size_t slot_bytes) {
  auto* h = new (base) GroupHeader{};
  h->magic = kGroupMagic;
  h->version = kGroupVersion;
  h->size = static_cast<std::uint32_t>(size);
  h->slot_bytes = slot_bytes;
  for (int r = 0; r < size; ++r) {
    auto* c = new (static_cast<std::byte*>(base) + kCtlStart + static_cast<std::size_t>(r) * kCtlBytes) Ctl{};
    for (auto& v : c->counters) v.store(0);
    c->closed.store(0);
    c->vote.store(0);
    c->in_fd = -1;
    c->in_agreed = 0;
    c->wants_inputs = 0;
    c->result.store(0);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void ShmGroup::check_segment(const void* base, int size, std::size_t slot_bytes) {
  const auto* h = static_cast<const GroupHeader*>(base);
  if (h->magic != kGroupMagic || h->version != kGroupVersion)
    throw Error(Error::Kind::mismatch, "the shared memory of rank 0's group has another wire version");
  if (h->size != static_cast<std::uint32_t>(size) || h->slot_bytes != slot_bytes)
    throw Error(Error::Kind::mismatch,
                "rank 0's shared-memory group holds " + std::to_string(h->size) + " ranks with slots of " +
                    std::to_string(h->slot_bytes) + " bytes; this rank expects " + std::to_string(size) +
                    " and " + std::to_string(slot_bytes) + " (MLTRAIN_COMM_SHM_BYTES differs)",
                0);
}

ShmGroup::ShmGroup(std::unique_ptr<ShmMapping> segment, std::string base, int rank, std::vector<Peer> peers)
    : segment_(std::move(segment)),
      base_(std::move(base)),
      rank_(rank),
      size_(static_cast<int>(peers.size())),
      peers_(std::move(peers)) {
  auto* start = static_cast<std::byte*>(segment_->data());
  auto* h = reinterpret_cast<GroupHeader*>(start);
  slot_bytes_ = h->slot_bytes;
  bell_ = &h->bell;
  data_ = start + data_offset(size_);
}

ShmGroup::~ShmGroup() { close(); }

ShmGroup::Ctl* ShmGroup::ctl(int rank) const {
  static_assert(sizeof(Ctl) <= kCtlBytes);
  return reinterpret_cast<Ctl*>(static_cast<std::byte*>(segment_->data()) + kCtlStart +
                                static_cast<std::size_t>(rank) * kCtlBytes);
}

std::byte* ShmGroup::slot(int rank, int k) const {
  return data_ + (static_cast<std::size_t>(rank) * kSlots + static_cast<std::size_t>(k)) * slot_bytes_;
}

void ShmGroup::publish(Counter c, std::uint64_t value) {
  ctl(rank_)->counters[c].store(value, std::memory_order_release);
  ring_bell(bell_);
}

void ShmGroup::post_header(const void* header) { std::memcpy(ctl(rank_)->header, header, kHeaderBytes); }

void ShmGroup::read_header(int rank, void* header) const {
  std::memcpy(header, ctl(rank)->header, kHeaderBytes);
}

std::uint64_t ShmGroup::make_result(std::uint64_t key, std::size_t bytes) {
  auto it = results_.find(key);
  if (it != results_.end() && it->second.map->size() == std::max<std::size_t>(bytes, 1)) {
    ctl(rank_)->result.store(it->second.id, std::memory_order_relaxed);
    return it->second.id;
  }
  if (it != results_.end()) results_.erase(it);
  const std::uint64_t id = next_result_++;
  Region region;
  region.id = id;
  try {
    region.map = std::make_unique<ShmMapping>(base_ + "-res-" + std::to_string(id),
                                              std::max<std::size_t>(bytes, 1), true, /*reserve=*/true);
  } catch (const Error&) {
    ctl(rank_)->result.store(0, std::memory_order_relaxed);  // the call falls back to buf
    return 0;
  }
  results_[key] = std::move(region);
  ctl(rank_)->result.store(id, std::memory_order_relaxed);
  return id;
}

void ShmGroup::post_no_result() { ctl(rank_)->result.store(0, std::memory_order_relaxed); }

std::uint64_t ShmGroup::posted_result() const { return ctl(0)->result.load(std::memory_order_acquire); }

std::byte* ShmGroup::map_result(std::uint64_t key, std::uint64_t id, std::size_t bytes) {
  auto it = results_.find(key);
  if (it == results_.end() || it->second.id != id) {
    Region region;
    region.id = id;
    region.map = std::make_unique<ShmMapping>(base_ + "-res-" + std::to_string(id),
                                              std::max<std::size_t>(bytes, 1), false);
    it = results_.insert_or_assign(key, std::move(region)).first;
  }
  return static_cast<std::byte*>(it->second.map->data());
}

void ShmGroup::unlink_result(std::uint64_t key) {
  if (auto it = results_.find(key); it != results_.end()) it->second.map->unlink_quietly();
}

void ShmGroup::release_result(std::uint64_t key) {
  results_.erase(key);
  agreed_.erase(key);
  for (int j = 0; j < size_; ++j) inputs_.erase({key, j});
}

ShmGroup::PeerInput::~PeerInput() {
  if (addr != nullptr) ::munmap(addr, len);
}

void ShmGroup::post_input(int fd, std::size_t offset, std::uint64_t key, std::size_t bytes,
                          bool wants_inputs) {
  Ctl* c = ctl(rank_);
  c->in_agreed = 0;
  c->wants_inputs = wants_inputs ? 1 : 0;
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    c->in_fd = -1;
    return;
  }
  c->in_fd = fd;
  c->in_dev = static_cast<std::uint64_t>(st.st_dev);
  c->in_ino = static_cast<std::uint64_t>(st.st_ino);
  c->in_size = static_cast<std::uint64_t>(st.st_size);
  c->in_offset = offset;
  const auto it = agreed_.find(key);
  if (it == agreed_.end()) return;
  const Agreed& a = it->second;
  bool read = a.dev == c->in_dev && a.ino == c->in_ino && a.size == c->in_size && offset <= c->in_size &&
              bytes <= c->in_size - offset;
  bool write = read;
  for (int j = 0; j < size_ && read; ++j) {
    if (j == rank_) continue;
    const auto in = inputs_.find({key, j});
    read = in != inputs_.end();
    write = write && read && in->second->writable;
  }
  c->in_agreed = (read ? 1u : 0u) | (write ? 2u : 0u);
}

bool ShmGroup::all_agreed(bool writable) const {
  const std::uint32_t need = writable ? 2u : 1u;
  for (int j = 0; j < size_; ++j)
    if (ctl(j)->in_fd < 0 || (ctl(j)->in_agreed & need) == 0) return false;
  return true;
}

bool ShmGroup::any_wants_inputs() const {
  for (int j = 0; j < size_; ++j)
    if (ctl(j)->wants_inputs != 0) return true;
  return false;
}

void ShmGroup::remember(std::uint64_t key) {
  const Ctl* c = ctl(rank_);
  agreed_[key] = Agreed{c->in_dev, c->in_ino, c->in_size};
}

bool ShmGroup::has_input(int j) const { return ctl(j)->in_fd >= 0; }

std::byte* ShmGroup::map_input(std::uint64_t key, int j, std::size_t bytes, bool writable) {
  const Ctl* c = ctl(j);
  const Peer& p = peer(j);
  if (c->in_fd < 0 || p.pid <= 0 || c->in_offset > c->in_size || bytes > c->in_size - c->in_offset)
    return nullptr;
  if (auto it = inputs_.find({key, j}); it != inputs_.end()) {
    const PeerInput& in = *it->second;
    if (in.dev == c->in_dev && in.ino == c->in_ino && in.len == c->in_size && (in.writable || !writable))
      return static_cast<std::byte*>(in.addr) + c->in_offset;
    inputs_.erase(it);  // the key's buffer moved to another file, or is to be written now
  }
  const std::string path = "/proc/" + std::to_string(p.pid) + "/fd/" + std::to_string(c->in_fd);
  const int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* addr = MAP_FAILED;
  // The same file the peer posted (its fd number may since name another), of the posted size.
  if (::fstat(fd, &st) == 0 && static_cast<std::uint64_t>(st.st_dev) == c->in_dev &&
      static_cast<std::uint64_t>(st.st_ino) == c->in_ino &&
      static_cast<std::uint64_t>(st.st_size) == c->in_size && c->in_size > 0)
    addr = ::mmap(nullptr, c->in_size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (addr == MAP_FAILED) return nullptr;
  auto in = std::make_unique<PeerInput>();
  in->dev = c->in_dev;
  in->ino = c->in_ino;
  in->addr = addr;
  in->len = c->in_size;
  in->writable = writable;
  auto* at = static_cast<std::byte*>(addr) + c->in_offset;
  inputs_[{key, j}] = std::move(in);
  return at;
}

bool ShmGroup::vote(bool ok, std::uint64_t seq, const WaitConfig& cfg) {
  ctl(rank_)->vote.store(ok ? 1 : 0, std::memory_order_relaxed);
  publish(voted, seq);
  bool all = ok;
  for (int j = 0; j < size_; ++j) {
    if (j == rank_) continue;
    wait(j, voted, seq, cfg);
    // Stable until every rank is past this collective, which needs this rank's later counters.
    all = all && ctl(j)->vote.load(std::memory_order_relaxed) == 1;
  }
  return all;
}

void ShmGroup::close() {
  if (closed_here_) return;
  closed_here_ = true;
  ctl(rank_)->closed.store(1, std::memory_order_seq_cst);
  ring_bell(bell_);
}

void ShmGroup::wait(int j, Counter c, std::uint64_t value, const WaitConfig& cfg) {
  const auto& counter = ctl(j)->counters[c];
  if (counter.load(std::memory_order_acquire) >= value) return;
  const auto start = std::chrono::steady_clock::now();
  const auto spin = std::chrono::microseconds(cfg.spin_us);
  const Peer& p = peer(j);
  for (unsigned loops = 0;; ++loops) {
    if (counter.load(std::memory_order_acquire) >= value) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - start < spin) {
      if (loops > 8) sched_yield();  // share the core with peers on oversubscribed hosts
      continue;
    }
    // Closed or gone, and the value will never come (re-read after seeing the flag: it may
    // have published its last counters just before closing or exiting).
    if (ctl(j)->closed.load(std::memory_order_acquire) != 0) {
      if (counter.load(std::memory_order_acquire) >= value) return;
      throw Error(Error::Kind::peer_closed, p.label + " closed the connection", j, p.host);
    }
    if (p.pid > 0 && ::kill(p.pid, 0) != 0 && errno == ESRCH) {
      if (counter.load(std::memory_order_acquire) >= value) return;
      throw Error(Error::Kind::peer_closed, p.label + ": its process is gone", j, p.host);
    }
    if (cfg.on_idle) {
      try {
        cfg.on_idle();
      } catch (const Error&) {
        // A peer that finished this collective may already have moved on: what on_idle saw only
        // counts if the value is still missing (read after it, so its writes are visible).
        if (counter.load(std::memory_order_acquire) >= value) return;
        throw;
      }
    }
    if (now - start >= cfg.timeout) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f s", static_cast<double>(cfg.timeout.count()) / 1000.0);
      throw Error(
          Error::Kind::timeout,
          p.label + " made no progress for " + secs + " (stuck or dead? timeout: MLTRAIN_COMM_TIMEOUT)", j,
          p.host);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(cfg.timeout - (now - start));
    bell_->waiters.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t seen = bell_->seq.load(std::memory_order_seq_cst);
    if (counter.load(std::memory_order_seq_cst) < value &&
        ctl(j)->closed.load(std::memory_order_seq_cst) == 0)
      sleep_on_bell(bell_, seen, static_cast<int>(std::clamp<long long>(left.count() + 1, 1, 100)));
    bell_->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace mltrain::comm::detail
