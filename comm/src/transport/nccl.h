// The NCCL backend: libcudart and libnccl loaded with dlopen at run time (never linked), so one
// library serves hosts with and without CUDA. Compiled against the CUDA/NCCL headers when the
// build finds them; without them every probe says "built without NCCL".
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/nccl_probe.h"
#include "mltrain/comm.hpp"
#include "transport/key_value.h"
#include "transport/socket.h"

namespace mltrain::comm::detail {

// What this process can offer the NCCL backend, published by every rank at init (in its
// PeerRecord, rendezvous/records.h) so that every rank resolves the backend the same way.
struct GpuVote {
  bool gpu = false;          // a CUDA device is visible to this process
  bool nccl = false;         // ... and NCCL >= kMinNcclVersion loads: this rank can join an NCCL comm
  std::string device;        // PCI bus id of the current device (when gpu)
  std::string nccl_version;  // "2.28.9" (when it loaded)
  std::string why;           // when !nccl: why not, in a few words a user can act on
};
// Loads libcudart and libnccl (once per process) and looks at the current device. Never throws.
GpuVote probe_gpu();

// The backend every rank resolves from every rank's vote (votes, hosts and memory identities are
// indexed by rank; ranks with equal memory identity share a machine). refused: `wanted` is nccl
// and some rank cannot join (why says which and why).
struct BackendChoice {
  Backend backend = Backend::tcp;
  std::string why;
  bool refused = false;
};
BackendChoice choose_backend(Backend wanted, const std::vector<GpuVote>& votes,
                             const std::vector<std::string>& hosts, const std::vector<std::string>& memory);

// Whether `p` points to device (or managed) memory; false when CUDA never loaded.
bool is_device_pointer(const void* p);

// Device memory through the loaded CUDA runtime, for the benchmark's --device mode; each throws
// Error when CUDA did not load or the call fails. device_copy copies either way
// (cudaMemcpyDefault). use_device_of_local_rank makes device local_rank % (visible devices)
// current, before init, as torchrun-style workers do.
void* device_alloc(std::size_t bytes);
void device_free(void* p) noexcept;
void device_copy(void* dst, const void* src, std::size_t bytes);
void use_device_of_local_rank(int local_rank);

// One NCCL communicator over every rank of the job, on the device current at construction.
// Collectives enqueue on the stream set with set_stream (default: the legacy default stream, so
// they follow the device's earlier work) and return when done. Every wait polls
// ncclCommGetAsyncError; an error, or no completion within `timeout`, aborts the communicator
// and throws Error (peer_closed for a remote failure, timeout, internal).
class NcclComm {
 public:
  // Rank 0 makes the unique id and publishes it in the store (null when the world is one rank);
  // the others wait for it until `deadline`. Throws Error.
  // `host` names this rank in errors it causes itself.
  NcclComm(int rank, int size, KeyValue* store, Deadline deadline, std::chrono::milliseconds timeout,
           const std::string& host);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  void set_stream(void* stream);
  void allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
  void broadcast(void* buf, std::size_t count, DataType dtype, int root);
  void allgather(const void* send, void* recv, std::size_t count, DataType dtype);
  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype, ReduceOp op);
  void barrier();
  // After a failure elsewhere (a CPU link, a peer's report): stop the communicator at once.
  void abort() noexcept;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

}  // namespace mltrain::comm::detail
