// mltrain::comm — collectives: a token-checked TCP store for rendezvous, shared-memory rings
// between ranks on one host, TCP between hosts, and NCCL for buffers in GPU memory.
//
// Contract: one Communicator per rank; calls are collective (every rank makes the same calls in
// the same order with the same count/dtype/op/root) and blocking; a Communicator is not
// thread-safe. Every call finishes, or throws mltrain::comm::Error within the timeout naming the
// peer rank and host that did not answer. After an Error the communicator is broken: further
// calls throw.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mltrain::comm {

enum class DataType : int { f32 = 0, f64 = 1, f16 = 2, bf16 = 3, i32 = 4, i64 = 5, u8 = 6 };
enum class ReduceOp : int { sum = 0, prod = 1, min = 2, max = 3, avg = 4 };
enum class Transport : int { automatic = 0, tcp = 1, shm = 2 };
// Where device (GPU) buffers go. automatic: NCCL when every rank has its own GPU and NCCL loads on
// every host, else tcp (the CPU backend: shared memory and TCP), which refuses device buffers.
// nccl: as automatic, but a rank that cannot join NCCL fails init. Host buffers always take the
// CPU path.
enum class Backend : int { automatic = 0, tcp = 1, nccl = 2 };
// Large allreduce on 3+ ranks: ring; bidir (two opposite rings on halves of the buffer, so every
// connection carries data both ways); hd (recursive halving then doubling: each round one
// partner, both ways; power-of-two worlds, else ring). automatic: ring on one host; across hosts
// hd on power-of-two worlds, else bidir.
enum class Algo : int { automatic = 0, ring = 1, bidir = 2, hd = 3, direct = 4 };

std::size_t size_of(DataType dtype);
std::string_view name_of(DataType dtype);
std::string_view name_of(ReduceOp op);
std::string_view name_of(Algo algo);
std::string_view name_of(Backend backend);
std::optional<DataType> parse_dtype(std::string_view text);
std::optional<ReduceOp> parse_redop(std::string_view text);

// The one exception type. peer_rank() is -1 when no single peer is to blame.
class Error : public std::runtime_error {
 public:
  enum class Kind { usage, store, timeout, peer_closed, mismatch, internal };
  Error(Kind kind, const std::string& what, int peer_rank = -1, std::string peer_host = {});
  Kind kind() const noexcept { return kind_; }
  int peer_rank() const noexcept { return peer_rank_; }
  const std::string& peer_host() const noexcept { return peer_host_; }

 private:
  Kind kind_;
  int peer_rank_;
  std::string peer_host_;
};

// Where an allreduce_shared input lies in a shared file: byte `offset` of the file open as fd,
// mapped MAP_SHARED (a torch storage after share_memory_(), a memfd, a file in /dev/shm). The
// ranks on one host then read each other's inputs where they lie instead of copying them into
// staging slots first. fd stays open and the buffer unchanged until the call returns.
struct SharedFile {
  int fd = -1;
  std::size_t offset = 0;
};

// Everything init needs. from_env() reads the variables listed in docs/comm.md.
struct Options {
  int rank = 0;
  int world_size = 1;
  std::string store_addr;  // host:port of the store (rank 0 hosts it)
  std::string token;       // MLTRAIN_TOKEN, proved on every connection
  bool host_store = true;  // rank 0 starts the store server itself
  std::chrono::milliseconds timeout{300000};
  Transport transport = Transport::automatic;  // automatic: shm on one host, TCP across hosts
  std::size_t shm_bytes = 1u << 20;            // ring capacity per direction per pair
  std::size_t chunk_bytes = 256u << 10;        // pipeline piece (TCP links use 2x, >= 512K)
  std::size_t small_bytes = 64u << 10;         // below: latency-oriented algorithm
  int spin_us = 50;                            // spin (with yields) before blocking
  // Congestion control of the TCP links between ranks: "auto" (the host's, except bbr, which
  // without the fq qdisc paces each packet with a kernel timer: then cubic, or reno, whichever
  // the host allows), "system" (the host's), or an algorithm the host allows.
  std::string tcp_congestion = "auto";
  Algo algo = Algo::automatic;           // all ranks must agree (checked on every call)
  Backend backend = Backend::automatic;  // MLTRAIN_COMM_BACKEND
  std::string host;                      // name in messages; default gethostname()
  // Set: ranks must also have equal `host` to share memory (splits one machine for tests).
  bool host_splits_shm = false;
  bool debug_links = false;  // MLTRAIN_COMM_DEBUG: say on stderr which transport each link uses
  // MLTRAIN_RUN_ID: shared memory is named /mltrain-<run_id>-…, so the launcher's agent can remove
  // what killed ranks leave in /dev/shm.
  std::string run_id;
  // With a run id: keep per-rank counters in /dev/shm for the agent (mltrain/comm_stats.h).
  bool stats = true;
  // Their shared-memory name (MLTRAIN_COMM_STATS_NAME, which the agent sets: "/mltrain-…", no
  // other '/'); "": /mltrain-<run_id>-stats-<rank>.
  std::string stats_name;

  static Options from_env();
};

class Communicator {
 public:
  // Reads Options::from_env() and joins the job; throws Error.
  static std::unique_ptr<Communicator> init_from_env();
  static std::unique_ptr<Communicator> create(const Options& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept;
  int size() const noexcept;
  const std::string& host() const noexcept;
  // The large-allreduce algorithm this job uses (never automatic; the same on every rank).
  Algo algo() const noexcept;
  // The backend for device buffers (tcp or nccl, never automatic; the same on every rank) and
  // why, in one line ("every rank has its own GPU and NCCL 2.28.9 loads", "rank 2 (h2): NCCL
  // not found (...)").
  Backend backend() const noexcept;
  const std::string& backend_reason() const noexcept;
  // NCCL backend: the cudaStream_t device collectives are enqueued on (nullptr, the default: the
  // legacy default stream, so they follow the device's earlier work). Calls still block until
  // the work is done. Ignored by the CPU backend.
  void set_cuda_stream(void* stream) noexcept;

  // recv may equal send (in place). Buffers hold count elements, naturally aligned. With the NCCL
  // backend, buffers in device memory go through NCCL (send and recv in the same kind of memory).
  void allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  void allreduce(void* buf, std::size_t count, DataType dtype, ReduceOp op) {
    allreduce(buf, buf, count, dtype, op);
  }
  // Allreduce of buf whose result may land in shared memory instead: when every rank shares
  // this host (MLTRAIN_COMM_ALGO direct), the reduced elements go to a region all of them map,
  // one per key, and the call returns it, saving each rank the copy back into buf (which keeps
  // its input). Valid until this rank calls again with the same key or releases it; every rank
  // must pass the same key. Elsewhere (or when /dev/shm cannot hold the region, or another rank
  // called allreduce_mapped with the key: see there) buf is reduced in place and returned.
  // For DDP hooks (mltrain.torch.allreduce_hook), whose framework copies the result out anyway.
  // With `file` on every rank (buf lies in a shared file), each rank reduces its part straight
  // from its peers' buffers: no staging copy, three waits a call (two once the key's calls
  // repeat). When any rank passes none or cannot map a peer's file, the call stages as without.
  const void* allreduce_shared(void* buf, std::size_t count, DataType dtype, ReduceOp op, std::uint64_t key,
                               const SharedFile* file = nullptr);
  // Allreduce of buf in place, buf lying in `file` on every rank: when every rank shares this
  // host and can map every peer's file for writing, each rank reduces its part straight from the
  // peers' buffers and writes it into all of them (no staging copy, no copy back, three waits a
  // call). Else as allreduce(buf, ...). Every rank must pass the same key (peers' files stay
  // mapped per key until release_shared); ranks may call allreduce_shared with it meanwhile, and
  // then get the result in their buf too. For a DDP bucket that its gradients view
  // (gradient_as_bucket_view=True): the framework copies nothing out of it.
  void allreduce_mapped(void* buf, std::size_t count, DataType dtype, ReduceOp op, std::uint64_t key,
                        const SharedFile& file);
  void release_shared(std::uint64_t key) noexcept;  // unmaps the key's region and peers' files here
  void broadcast(void* buf, std::size_t count, DataType dtype, int root);
  // recv holds size()*count elements; rank i's send lands at recv + i*count. send may alias it.
  void allgather(const void* send, void* recv, std::size_t count, DataType dtype);
  // send holds size()*recv_count elements; this rank gets the reduced block rank()*recv_count.
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype, ReduceOp op);
  void barrier();

  // Parameter-server calls (push/pull/push_pull): mltrain/ps.hpp, a client of its own.

  struct Impl;

 private:
  explicit Communicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What this process can use: "NCCL 2.28.9 on GPU 00000000:18:00.0" / "no NVIDIA driver (...)" /
// "NCCL not found (...)" / "built without NCCL (...)".
std::string nccl_status();

}  // namespace mltrain::comm
