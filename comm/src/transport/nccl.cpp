// The NCCL backend (see nccl.h). Every foreign call goes through one check macro per library that
// names the call, so a failure says which call failed and what the library said.
#include "transport/nccl.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "config.h"
#include "knobs/gpu_library.h"
#include "knobs/registry.h"

#if MLTRAIN_HAVE_NCCL_HEADERS
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace mltrain::comm::detail {

BackendChoice choose_backend(Backend wanted, const std::vector<GpuVote>& votes,
                             const std::vector<std::string>& hosts, const std::vector<std::string>& memory) {
  BackendChoice c;
  if (wanted == Backend::tcp) {
    c.why = "MLTRAIN_COMM_BACKEND=tcp";
    return c;
  }
  auto label = [&](std::size_t r) { return "rank " + std::to_string(r) + " (" + hosts[r] + ")"; };
  for (std::size_t r = 0; r < votes.size(); ++r)
    if (!votes[r].nccl) {
      c.why = label(r) + ": " + votes[r].why;
      c.refused = wanted == Backend::nccl;
      return c;
    }
  for (std::size_t r = 1; r < votes.size(); ++r) {
    if (votes[r].nccl_version != votes[0].nccl_version) {
      c.why = label(0) + " has NCCL " + votes[0].nccl_version + ", " + label(r) + " NCCL " +
              votes[r].nccl_version + ": NCCL needs the same version on every rank";
      c.refused = wanted == Backend::nccl;
      return c;
    }
    for (std::size_t q = 0; q < r; ++q)
      if (memory[q] == memory[r] && votes[q].device == votes[r].device) {
        c.why = "ranks " + std::to_string(q) + " and " + std::to_string(r) + " (" + hosts[r] +
                ") share GPU " + votes[r].device +
                ", and NCCL refuses two ranks of one communicator on one GPU (give each rank its own: "
                "[gpus] per_proc = 1, or CUDA_VISIBLE_DEVICES per rank)";
        c.refused = wanted == Backend::nccl;
        return c;
      }
  }
  c.backend = Backend::nccl;
  c.why = votes.size() == 1 ? "the rank has a GPU and NCCL " + votes[0].nccl_version + " loads"
                            : "every rank has its own GPU and NCCL " + votes[0].nccl_version + " loads";
  return c;
}

#if MLTRAIN_HAVE_NCCL_HEADERS

namespace {

// The functions used, resolved once per process. The libraries stay loaded until exit: CUDA and
// NCCL keep threads and handlers that must not outlive their code.
struct Api {
  std::string cuda_error, nccl_error;  // why a library did not load ("" when it did)
  std::string cuda_path, nccl_path;    // the files loaded and which step found them
  int nccl_code = 0;
  // libcudart
  cudaError_t (*GetDeviceCount)(int*) = nullptr;
  cudaError_t (*GetDevice)(int*) = nullptr;
  cudaError_t (*DeviceGetPCIBusId)(char*, int, int) = nullptr;
  cudaError_t (*PointerGetAttributes)(cudaPointerAttributes*, const void*) = nullptr;
  cudaError_t (*StreamQuery)(cudaStream_t) = nullptr;
  cudaError_t (*Malloc)(void**, size_t) = nullptr;
  cudaError_t (*Free)(void*) = nullptr;
  cudaError_t (*Memset)(void*, int, size_t) = nullptr;
  cudaError_t (*GetLastError)() = nullptr;
  cudaError_t (*Memcpy)(void*, const void*, size_t, cudaMemcpyKind) = nullptr;
  cudaError_t (*SetDevice)(int) = nullptr;
  const char* (*GetErrorString)(cudaError_t) = nullptr;
  // libnccl
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int) = nullptr;
  ncclResult_t (*CommDestroy)(ncclComm_t) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  const char* (*GetErrorString_)(ncclResult_t) = nullptr;
  const char* (*GetLastError_)(ncclComm_t) = nullptr;
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                            cudaStream_t) = nullptr;
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t) = nullptr;

  bool cuda_ok() const { return cuda_error.empty(); }
  bool nccl_ok() const { return cuda_ok() && nccl_error.empty(); }
};

// Why a library in the one search order did not load, and where it was looked for.
std::string not_loaded(const std::string& error, const std::string& searched, const std::string& named,
                       knobs::GpuLibrary lib) {
  return error +
         (named.empty() ? "; looked in " + searched : std::string(" (") + knobs::library_knob(lib) + ")");
}

// dlopen a library in the one search order (knobs/gpu_library.h); the handle, or nullptr and why.
void* open_library(knobs::GpuLibrary lib, std::string& error, std::string* path = nullptr) {
  const std::string named = knobs::get_string(knobs::library_knob(lib));
  knobs::LoadedLibrary l = knobs::load_library(lib, named);
  if (l.handle) {
    if (path) *path = l.found_text();
    error.clear();
    return l.handle;
  }
  error = not_loaded(l.error, l.searched, named, lib);
  return nullptr;
}

template <class F>
bool resolve(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  if (fn == nullptr && error.empty()) error = std::string("symbol ") + name + " missing";
  return fn != nullptr;
}

const Api& api() {
  static Api a;
  static std::once_flag once;
  std::call_once(once, [] {
    // Without a driver there is nothing to load: keep CPU jobs free of CUDA's start-up cost.
    if (!knobs::is_set("MLTRAIN_CUDART_LIBRARY") && ::access("/dev/nvidiactl", F_OK) != 0) {
      a.cuda_error = "no NVIDIA driver (/dev/nvidiactl missing)";
      a.nccl_error = a.cuda_error;
      return;
    }
    void* cuda = open_library(knobs::GpuLibrary::cudart, a.cuda_error, &a.cuda_path);
    if (cuda == nullptr) {
      a.cuda_error = "CUDA runtime not found (" + a.cuda_error + ")";
    } else {
      std::string& e = a.cuda_error;
      resolve(cuda, "cudaGetDeviceCount", a.GetDeviceCount, e);
      resolve(cuda, "cudaGetDevice", a.GetDevice, e);
      resolve(cuda, "cudaDeviceGetPCIBusId", a.DeviceGetPCIBusId, e);
      resolve(cuda, "cudaPointerGetAttributes", a.PointerGetAttributes, e);
      resolve(cuda, "cudaStreamQuery", a.StreamQuery, e);
      resolve(cuda, "cudaMalloc", a.Malloc, e);
      resolve(cuda, "cudaFree", a.Free, e);
      resolve(cuda, "cudaMemset", a.Memset, e);
      resolve(cuda, "cudaGetLastError", a.GetLastError, e);
      resolve(cuda, "cudaGetErrorString", a.GetErrorString, e);
      resolve(cuda, "cudaMemcpy", a.Memcpy, e);
      resolve(cuda, "cudaSetDevice", a.SetDevice, e);
      if (!e.empty()) e = "CUDA runtime unusable: " + e;
    }
    const std::string named = knobs::get_string(knobs::library_knob(knobs::GpuLibrary::nccl));
    const NcclProbe probe = probe_nccl(named);
    void* nccl = probe.handle;
    if (nccl == nullptr) {
      a.nccl_error =
          "NCCL not found (" + not_loaded(probe.error, probe.searched, named, knobs::GpuLibrary::nccl) + ")";
      return;
    }
    a.nccl_path = probe.found;
    a.nccl_code = probe.version;
    std::string& e = a.nccl_error;
    if (!probe.has_get_version)
      e = "symbol ncclGetVersion missing";
    else if (!probe.version_known)
      e = "ncclGetVersion failed";
    if (e.empty() && !probe.new_enough()) {
      e = nccl_too_old(probe.version, a.nccl_path);
      return;
    }
    resolve(nccl, "ncclGetUniqueId", a.GetUniqueId, e);
    resolve(nccl, "ncclCommInitRank", a.CommInitRank, e);
    resolve(nccl, "ncclCommDestroy", a.CommDestroy, e);
    resolve(nccl, "ncclCommAbort", a.CommAbort, e);
    resolve(nccl, "ncclCommGetAsyncError", a.CommGetAsyncError, e);
    resolve(nccl, "ncclGetErrorString", a.GetErrorString_, e);
    resolve(nccl, "ncclGetLastError", a.GetLastError_, e);
    resolve(nccl, "ncclAllReduce", a.AllReduce, e);
    resolve(nccl, "ncclBroadcast", a.Broadcast, e);
    resolve(nccl, "ncclAllGather", a.AllGather, e);
    resolve(nccl, "ncclReduceScatter", a.ReduceScatter, e);
    if (!e.empty()) e = "NCCL at " + a.nccl_path + " unusable: " + e;
  });
  return a;
}

std::string cuda_text(const Api& a, cudaError_t r) {
  const char* s = a.GetErrorString ? a.GetErrorString(r) : nullptr;
  return s ? s : "CUDA error " + std::to_string(static_cast<int>(r));
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
    case DataType::f16:
      return ncclFloat16;
    case DataType::bf16:
      return ncclBfloat16;
    case DataType::i32:
      return ncclInt32;
    case DataType::i64:
      return ncclInt64;
    case DataType::u8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::prod:
      return ncclProd;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::avg:
      return ncclAvg;
  }
  return ncclSum;
}

std::string hex(const void* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(static_cast<const char*>(data)[i]);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool unhex(const std::string& text, void* out, std::size_t n) {
  if (text.size() != 2 * n) return false;
  auto val = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  for (std::size_t i = 0; i < n; ++i)
    static_cast<unsigned char*>(out)[i] =
        static_cast<unsigned char>(val(text[2 * i]) * 16 + val(text[2 * i + 1]));
  return true;
}

}  // namespace

GpuVote probe_gpu() {
  GpuVote v;
  const Api& a = api();
  if (!a.cuda_ok()) {
    v.why = a.cuda_error;
    return v;
  }
  int count = 0;
  if (const cudaError_t r = a.GetDeviceCount(&count); r != cudaSuccess || count <= 0) {
    a.GetLastError();  // clear it
    v.why = "no GPU visible (" + (r != cudaSuccess ? cuda_text(a, r) : std::string("0 devices")) + ")";
    return v;
  }
  int dev = 0;
  char bus[64] = {};
  if (const cudaError_t r = a.GetDevice(&dev); r != cudaSuccess) {
    v.why = "cudaGetDevice: " + cuda_text(a, r);
    return v;
  }
  if (const cudaError_t r = a.DeviceGetPCIBusId(bus, sizeof bus - 1, dev); r != cudaSuccess) {
    v.why = "cudaDeviceGetPCIBusId: " + cuda_text(a, r);
    return v;
  }
  v.gpu = true;
  v.device = bus;
  if (!a.nccl_error.empty()) {
    v.why = a.nccl_error;
    return v;
  }
  v.nccl = true;
  v.nccl_version = nccl_version_text(a.nccl_code);
  return v;
}

bool is_device_pointer(const void* p) {
  const Api& a = api();
  if (!a.cuda_ok() || p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (a.PointerGetAttributes(&attr, p) != cudaSuccess) {
    a.GetLastError();  // an unknown pointer: host memory for us
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

namespace {
const Api& cuda_or_throw() {
  const Api& a = api();
  if (!a.cuda_ok()) throw Error(Error::Kind::usage, a.cuda_error);
  return a;
}
void cuda_check(const Api& a, cudaError_t r, const std::string& call) {
  if (r != cudaSuccess) throw Error(Error::Kind::internal, call + ": " + cuda_text(a, r));
}
}  // namespace

void* device_alloc(std::size_t bytes) {
  const Api& a = cuda_or_throw();
  void* p = nullptr;
  cuda_check(a, a.Malloc(&p, bytes ? bytes : 1), "cudaMalloc(" + std::to_string(bytes) + ")");
  return p;
}

void device_free(void* p) noexcept {
  if (p && api().cuda_ok()) api().Free(p);
}

void device_copy(void* dst, const void* src, std::size_t bytes) {
  const Api& a = cuda_or_throw();
  cuda_check(a, a.Memcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
}

void use_device_of_local_rank(int local_rank) {
  const Api& a = cuda_or_throw();
  int count = 0;
  cuda_check(a, a.GetDeviceCount(&count), "cudaGetDeviceCount");
  const int index = count > 0 ? local_rank % count : 0;
  cuda_check(a, a.SetDevice(index), "cudaSetDevice(" + std::to_string(index) + ")");
}

struct NcclComm::State {
  const Api& a = api();
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;  // the legacy default stream
  std::chrono::milliseconds timeout;
  int rank = 0;
  std::string host;
  void* scratch = nullptr;  // a few bytes of device memory for barrier()
  bool aborted = false;

  std::string nccl_text(ncclResult_t r) const {
    std::string s = a.GetErrorString_(r);
    const char* last_c = a.GetLastError_(comm);
    const std::string last = last_c ? last_c : "";
    if (last.rfind(s, 0) == 0) return last;  // it often repeats the code's text
    return last.empty() ? s : s + ": " + last;
  }
  void check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return;
    const std::string what = std::string(call) + ": " + nccl_text(r);
    abort();
    // A remote error is some other rank's; anything else happened here.
    if (r == ncclRemoteError) throw Error(Error::Kind::peer_closed, "NCCL " + what);
    throw Error(Error::Kind::internal, "NCCL " + what, rank, host);
  }
  void abort() noexcept {
    if (comm && !aborted) a.CommAbort(comm);
    aborted = true;
  }
  // Until the stream has done the call's work: polls the async error, and aborts the
  // communicator on an error or at the timeout (a rank stopped or the network is cut).
  void wait(const char* call) {
    const auto start = Clock::now();
    for (unsigned polls = 0;; ++polls) {
      const cudaError_t q = a.StreamQuery(stream);
      ncclResult_t async = ncclSuccess;
      const ncclResult_t got = a.CommGetAsyncError(comm, &async);
      if (got != ncclSuccess) check(got, "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) check(async, call);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        const std::string why = cuda_text(a, q);
        abort();
        throw Error(Error::Kind::internal, std::string("CUDA stream of NCCL ") + call + ": " + why);
      }
      if (Clock::now() - start > timeout) {
        abort();
        throw Error(Error::Kind::timeout, std::string("NCCL ") + call + " did not complete within " +
                                              std::to_string(timeout.count() / 1000) +
                                              " s (MLTRAIN_COMM_TIMEOUT): a rank stopped or the network "
                                              "is cut; the NCCL communicator was aborted");
      }
      // Spin briefly (a small collective ends in microseconds), then sleep in short steps.
      if (polls < 2000)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(polls < 20000 ? 20 : 200));
    }
  }
};

NcclComm::NcclComm(int rank, int size, KeyValue* store, Deadline deadline, std::chrono::milliseconds timeout,
                   const std::string& host)
    : s_(std::make_unique<State>()) {
  State& s = *s_;
  s.timeout = timeout;
  s.rank = rank;
  s.host = host;
  if (!s.a.nccl_ok()) throw Error(Error::Kind::usage, s.a.cuda_ok() ? s.a.nccl_error : s.a.cuda_error);
  ncclUniqueId id{};
  if (rank == 0) {
    s.check(s.a.GetUniqueId(&id), "ncclGetUniqueId");
    if (store) store->set("nccl/id", hex(&id, sizeof id), deadline);
  } else if (!unhex(store->wait("nccl/id", deadline), &id, sizeof id)) {
    throw Error(Error::Kind::store, "the NCCL unique id in the store is damaged");
  }
  s.check(s.a.CommInitRank(&s.comm, size, id, rank), "ncclCommInitRank");
  if (const cudaError_t r = s.a.Malloc(&s.scratch, 16); r != cudaSuccess) {
    s.abort();
    throw Error(Error::Kind::internal, "cudaMalloc of 16 bytes: " + cuda_text(s.a, r));
  }
  s.a.Memset(s.scratch, 0, 16);
}

NcclComm::~NcclComm() {
  State& s = *s_;
  if (s.comm) {
    if (s.aborted)
      ;  // aborting freed it
    else
      s.a.CommDestroy(s.comm);
  }
  if (s.scratch && !s.aborted) s.a.Free(s.scratch);
}

void NcclComm::set_stream(void* stream) { s_->stream = static_cast<cudaStream_t>(stream); }

void NcclComm::abort() noexcept { s_->abort(); }

void NcclComm::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op) {
  State& s = *s_;
  s.check(s.a.AllReduce(send, recv, count, nccl_type(dtype), nccl_op(op), s.comm, s.stream), "ncclAllReduce");
  s.wait("ncclAllReduce");
}

void NcclComm::broadcast(void* buf, std::size_t count, DataType dtype, int root) {
  State& s = *s_;
  s.check(s.a.Broadcast(buf, buf, count, nccl_type(dtype), root, s.comm, s.stream), "ncclBroadcast");
  s.wait("ncclBroadcast");
}

void NcclComm::allgather(const void* send, void* recv, std::size_t count, DataType dtype) {
  State& s = *s_;
  s.check(s.a.AllGather(send, recv, count, nccl_type(dtype), s.comm, s.stream), "ncclAllGather");
  s.wait("ncclAllGather");
}

void NcclComm::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                              ReduceOp op) {
  State& s = *s_;
  s.check(s.a.ReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), s.comm, s.stream),
          "ncclReduceScatter");
  s.wait("ncclReduceScatter");
}

void NcclComm::barrier() {
  State& s = *s_;
  s.check(s.a.AllReduce(s.scratch, s.scratch, 1, ncclFloat32, ncclSum, s.comm, s.stream), "ncclAllReduce");
  s.wait("ncclAllReduce (barrier)");
}

#else  // built without the CUDA and NCCL headers

GpuVote probe_gpu() {
  GpuVote v;
  v.why = "built without NCCL (no CUDA/NCCL headers at build time)";
  return v;
}

bool is_device_pointer(const void*) { return false; }
void* device_alloc(std::size_t) { throw Error(Error::Kind::usage, "built without NCCL: no device memory"); }
void device_free(void*) noexcept {}
void device_copy(void*, const void*, std::size_t) {
  throw Error(Error::Kind::usage, "built without NCCL: no device memory");
}
void use_device_of_local_rank(int) {
  throw Error(Error::Kind::usage, "built without NCCL: no device memory");
}

struct NcclComm::State {};

NcclComm::NcclComm(int, int, KeyValue*, Deadline, std::chrono::milliseconds, const std::string&) {
  throw Error(Error::Kind::usage, "built without NCCL (no CUDA/NCCL headers at build time)");
}
NcclComm::~NcclComm() = default;
void NcclComm::set_stream(void*) {}
void NcclComm::abort() noexcept {}
void NcclComm::allreduce(const void*, void*, std::size_t, DataType, ReduceOp) {}
void NcclComm::broadcast(void*, std::size_t, DataType, int) {}
void NcclComm::allgather(const void*, void*, std::size_t, DataType) {}
void NcclComm::reduce_scatter(const void*, void*, std::size_t, DataType, ReduceOp) {}
void NcclComm::barrier() {}

#endif

}  // namespace mltrain::comm::detail
