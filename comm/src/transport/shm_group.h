// One shared-memory segment for all the ranks of a job when they share one host: per rank a
// control block (progress counters, the header of the collective it is in, a closed flag) and
// kSlots staging slots, plus one bell for the group. The direct allreduce
// (algorithms/direct.cpp) runs on it; every other collective keeps using the pairwise links.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/shm_link.h"

namespace mltrain::comm::detail {

class ShmGroup {
 public:
  static constexpr int kSlots = 2;
  static constexpr std::size_t kHeaderBytes = 32;  // sizeof(WireHeader)

  // What each counter of a rank's control block counts. Chunk counters run on across
  // collectives (every rank splits every direct allreduce into the same chunks), so a value
  // never has to be reset.
  enum Counter : int {
    posted = 0,   // the seq of the collective whose header this rank posted
    written = 1,  // chunks this rank has copied into its slot
    reduced = 2,  // chunks whose own segment this rank has reduced (in its slot)
    copied = 3,   // chunks this rank has copied out of every slot (its slot may be reused)
    voted = 4,    // the seq of the collective this rank voted in (vote())
  };

  struct Peer {
    int pid = 0;  // <= 0: not checked
    std::string label;
    std::string host;
  };

  // Waiting: spin this long (yielding), then sleep on the group's bell; a wait that sees no
  // progress for `timeout` throws Error(timeout) naming the rank waited on.
  struct WaitConfig {
    int spin_us = 50;
    std::chrono::milliseconds timeout{300000};
    // Called while sleeping (the direct allreduce checks the links for mismatches); what it throws
    // counts only if the value waited for is still missing after it.
    std::function<void()> on_idle;
  };

  static std::size_t segment_bytes(int size, std::size_t slot_bytes);
  static void init_segment(void* base, int size, std::size_t slot_bytes);
  // Checks magic, version, size and slot size of a segment rank 0 laid out; throws on mismatch.
  static void check_segment(const void* base, int size, std::size_t slot_bytes);

  // base: the job's shared-memory name prefix (result regions are named after it).
  ShmGroup(std::unique_ptr<ShmMapping> segment, std::string base, int rank, std::vector<Peer> peers);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::byte* slot(int rank, int k) const;
  const Peer& peer(int rank) const { return peers_[static_cast<std::size_t>(rank)]; }
  ShmMapping& mapping() { return *segment_; }

  // Chunks this rank has started, over all direct collectives (the same on every rank).
  std::uint64_t chunks = 0;

  // Sets this rank's counter (release) and rings the bell.
  void publish(Counter c, std::uint64_t value);
  // Waits until rank j's counter c reaches value; throws Error naming j when j closed, its
  // process is gone, or nothing moved for the timeout.
  void wait(int j, Counter c, std::uint64_t value, const WaitConfig& cfg);

  void post_header(const void* header);            // kHeaderBytes, then publish(posted)
  void read_header(int rank, void* header) const;  // kHeaderBytes
  void close();                                    // peers waiting on this rank fail now

  // Result regions of allreduce_shared: one per key, mapped by every rank. Rank 0 makes (or keeps)
  // the key's region for `bytes` and posts its id with its header (0: none could be reserved,
  // e.g. /dev/shm is full); the others map the region of the id rank 0 posted. A region stays
  // until its key comes with another size or is released.
  std::uint64_t make_result(std::uint64_t key, std::size_t bytes);  // rank 0; before post_header
  void post_no_result();                                            // rank 0; none this call
  std::uint64_t posted_result() const;                              // rank 0's posted id
  std::byte* map_result(std::uint64_t key, std::uint64_t id, std::size_t bytes);
  void unlink_result(std::uint64_t key);   // rank 0, once every rank has mapped it
  void release_result(std::uint64_t key);  // also unmaps the peers' inputs of the key

  // Inputs read where they lie: a rank whose buffer sits at `offset` of a shared file open as fd
  // posts where (before post_header; fd < 0: it has none); a peer maps that file through
  // /proc/<pid>/fd/<fd> once per key (checked to be the same file by device and inode) and reads
  // the buffer there. map_input returns rank j's buffer of `bytes`, or nullptr when j posted none
  // or it cannot be mapped here (another pid namespace, /proc restricted, a closed fd).
  // key and bytes: the call's, for the vote skip below; wants_inputs: this rank asks for the
  // result in its own buffer (allreduce_mapped), posted whether or not it has a file.
  void post_input(int fd, std::size_t offset, std::uint64_t key = 0, std::size_t bytes = 0,
                  bool wants_inputs = false);
  bool has_input(int j) const;  // rank j posted one (read after its header)
  // writable: mapped for writing too (allreduce_mapped writes each rank's reduced part into every
  // rank's buffer); a read-only mapping of the key is replaced.
  std::byte* map_input(std::uint64_t key, int j, std::size_t bytes, bool writable = false);
  // Some rank asked for the result in its buffer: then every rank gets it in its buffer (read
  // after every header; the same answer on every rank).
  bool any_wants_inputs() const;
  // Every rank says whether it can read every peer's input; true when all can (the same answer on
  // every rank). seq: the collective's.
  bool vote(bool ok, std::uint64_t seq, const WaitConfig& cfg);
  // The vote is skipped on a key whose last call every rank read mapped: after that call each
  // rank remembers the key (its file's device, inode and size); post_input then posts "agreed"
  // when this call's input lies in the same file, within it, and this rank still holds every
  // peer's mapping of the key, and "agreed for writing" when those mappings are writable too.
  // When every rank posted it (all_agreed, read after every header), every mapping of the last
  // call still serves and nobody votes. Any other outcome forgets the key on every rank alike.
  bool all_agreed(bool writable) const;
  void remember(std::uint64_t key);
  void forget(std::uint64_t key) { agreed_.erase(key); }

 private:
  struct Ctl;
  Ctl* ctl(int rank) const;
  struct Region {
    std::uint64_t id = 0;
    std::unique_ptr<ShmMapping> map;
  };
  struct PeerInput {  // a peer's shared file, mapped read-only unless writable
    std::uint64_t dev = 0, ino = 0;
    void* addr = nullptr;
    std::size_t len = 0;
    bool writable = false;
    PeerInput() = default;
    PeerInput(const PeerInput&) = delete;
    PeerInput& operator=(const PeerInput&) = delete;
    ~PeerInput();
  };
  std::unique_ptr<ShmMapping> segment_;
  std::string base_;
  std::map<std::uint64_t, Region> results_;
  std::map<std::pair<std::uint64_t, int>, std::unique_ptr<PeerInput>> inputs_;  // (key, rank)
  struct Agreed {  // this rank's input of a key's last call, which every rank read mapped
    std::uint64_t dev = 0, ino = 0, size = 0;
  };
  std::map<std::uint64_t, Agreed> agreed_;
  std::uint64_t next_result_ = 1;
  int rank_;
  int size_;
  std::size_t slot_bytes_;
  std::vector<Peer> peers_;
  Bell* bell_;
  std::byte* data_;
  bool closed_here_ = false;
};

}  // namespace mltrain::comm::detail
