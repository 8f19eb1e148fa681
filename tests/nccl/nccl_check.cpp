// mltrain-nccl-check: every collective x op x dtype through mltrain::comm on buffers in device
// memory, against a reference computed on the host. Run as a job (mltrain run -n N ...): with a
// real GPU and NCCL it checks the real backend (tests/gpu/run.sh); in CI it runs against the fakes
// of libcudart and libnccl (tests/fakes). Prints one line per case and "#wrong"; exits 1 on any.
//
//   --backend-only   print the backend and why, then a barrier, and exit
//   --loop N         N allreduces of 4 KiB (for fault tests: an injected error or a killed rank)
#include <dlfcn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/reduce.h"
#include "knobs/gpu_library.h"
#include "mltrain/comm.hpp"

namespace {

using mltrain::comm::Backend;
using mltrain::comm::Communicator;
using mltrain::comm::DataType;
using mltrain::comm::ReduceOp;
namespace detail = mltrain::comm::detail;

// The CUDA runtime the comm library uses, for device memory: the same knob, the same names.
struct Cuda {
  int (*Malloc)(void**, std::size_t) = nullptr;
  int (*Free)(void*) = nullptr;
  int (*Memcpy)(void*, const void*, std::size_t, int) = nullptr;  // kind 4: cudaMemcpyDefault
  int (*DeviceSynchronize)() = nullptr;

  bool load() {
    using mltrain::knobs::GpuLibrary;
    void* h = mltrain::knobs::load_library(GpuLibrary::cudart,
                                           mltrain::knobs::library_setting(GpuLibrary::cudart, ""))
                  .handle;
    if (!h) return false;
    Malloc = reinterpret_cast<decltype(Malloc)>(::dlsym(h, "cudaMalloc"));
    Free = reinterpret_cast<decltype(Free)>(::dlsym(h, "cudaFree"));
    Memcpy = reinterpret_cast<decltype(Memcpy)>(::dlsym(h, "cudaMemcpy"));
    DeviceSynchronize = reinterpret_cast<decltype(DeviceSynchronize)>(::dlsym(h, "cudaDeviceSynchronize"));
    return Malloc && Free && Memcpy && DeviceSynchronize;
  }
};

Cuda cuda;

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cuda.Malloc(&p, bytes ? bytes : 1) != 0) {
      std::fprintf(stderr, "cudaMalloc(%zu) failed\n", bytes);
      std::exit(2);
    }
  }
  ~DeviceBuffer() { cuda.Free(p); }
  void put(const std::vector<char>& h) const { cuda.Memcpy(p, h.data(), h.size(), 4); }
  std::vector<char> get(std::size_t bytes) const {
    std::vector<char> h(bytes);
    cuda.Memcpy(h.data(), p, bytes, 4);
    return h;
  }
};

// Rank r's element i: small integers, exact in every dtype and op (prod stays within 2^world).
double value(int rank, std::size_t i, ReduceOp op) {
  if (op == ReduceOp::prod) return (i + static_cast<std::size_t>(rank)) % 3 == 0 ? 2.0 : 1.0;
  return static_cast<double>((static_cast<std::size_t>(rank) * 7 + i * 3) % 11) + 1.0;
}

double combine(double a, double b, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::prod:
      return a * b;
    case ReduceOp::min:
      return std::min(a, b);
    case ReduceOp::max:
      return std::max(a, b);
  }
  return a;
}

double expected(std::size_t i, ReduceOp op, int world, DataType dtype) {
  double acc = value(0, i, op);
  for (int r = 1; r < world; ++r) acc = combine(acc, value(r, i, op), op);
  if (op == ReduceOp::avg) {
    const bool integer = dtype == DataType::i32 || dtype == DataType::i64 || dtype == DataType::u8;
    acc = integer ? std::trunc(acc / world) : acc / world;
  }
  return acc;
}

bool close_enough(double got, double want, DataType dtype) {
  const double tol = dtype == DataType::bf16 ? 1e-2 : dtype == DataType::f16 ? 1e-3 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

std::vector<char> host(std::size_t count, DataType dtype, int rank, ReduceOp op) {
  std::vector<char> h(count * mltrain::comm::size_of(dtype));
  for (std::size_t i = 0; i < count; ++i) detail::store_from_double(h.data(), i, dtype, value(rank, i, op));
  return h;
}

int wrong_total = 0;

void report(const char* coll, DataType dtype, const char* op, std::size_t count, bool in_place, int wrong,
            int rank) {
  wrong_total += wrong;
  if (rank == 0 || wrong)
    std::printf("rank %d %-14s %-4s %-4s %9zu %-12s #wrong %d\n", rank, coll,
                std::string(mltrain::comm::name_of(dtype)).c_str(), op, count,
                in_place ? "in-place" : "out-of-place", wrong);
}

void check_all(Communicator& c) {
  const int n = c.size(), me = c.rank();
  const std::vector<DataType> dtypes{DataType::f32, DataType::f64, DataType::f16, DataType::bf16,
                                     DataType::i32, DataType::i64, DataType::u8};
  const std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};
  const std::vector<std::size_t> counts{0, 1, 1000, (1u << 20) + 3};
  for (DataType dt : dtypes) {
    const std::size_t es = mltrain::comm::size_of(dt);
    for (std::size_t count : counts) {
      if (count > 1000 && dt != DataType::f32 && dt != DataType::bf16) continue;  // large: two dtypes
      for (ReduceOp op : ops) {
        if (dt == DataType::u8 && op == ReduceOp::sum && n > 20) continue;  // would overflow
        for (bool in_place : {true, false}) {
          DeviceBuffer send(count * es), recv(count * es);
          send.put(host(count, dt, me, op));
          c.allreduce(send.p, in_place ? send.p : recv.p, count, dt, op);
          auto got = (in_place ? send : recv).get(count * es);
          int wrong = 0;
          for (std::size_t i = 0; i < count; ++i)
            wrong += !close_enough(detail::load_as_double(got.data(), i, dt), expected(i, op, n, dt), dt);
          report("allreduce", dt, std::string(mltrain::comm::name_of(op)).c_str(), count, in_place, wrong,
                 me);
        }
      }
      for (int root = 0; root < n; root += std::max(1, n - 1)) {
        DeviceBuffer buf(count * es);
        buf.put(host(count, dt, me, ReduceOp::sum));
        c.broadcast(buf.p, count, dt, root);
        auto got = buf.get(count * es);
        auto want = host(count, dt, root, ReduceOp::sum);
        int wrong = 0;
        for (std::size_t i = 0; i < count; ++i)
          wrong += detail::load_as_double(got.data(), i, dt) != detail::load_as_double(want.data(), i, dt);
        report(root == 0 ? "broadcast(0)" : "broadcast(n-1)", dt, "-", count, true, wrong, me);
      }
      {
        DeviceBuffer send(count * es), recv(count * es * std::size_t(n));
        send.put(host(count, dt, me, ReduceOp::sum));
        c.allgather(send.p, recv.p, count, dt);
        auto got = recv.get(count * es * std::size_t(n));
        int wrong = 0;
        for (int r = 0; r < n; ++r) {
          auto want = host(count, dt, r, ReduceOp::sum);
          for (std::size_t i = 0; i < count; ++i)
            wrong += detail::load_as_double(got.data(), std::size_t(r) * count + i, dt) !=
                     detail::load_as_double(want.data(), i, dt);
        }
        report("allgather", dt, "-", count, false, wrong, me);
      }
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
        DeviceBuffer send(count * es * std::size_t(n)), recv(count * es);
        send.put(host(count * std::size_t(n), dt, me, op));
        c.reduce_scatter(send.p, recv.p, count, dt, op);
        auto got = recv.get(count * es);
        int wrong = 0;
        for (std::size_t i = 0; i < count; ++i)
          wrong += !close_enough(detail::load_as_double(got.data(), i, dt),
                                 expected(std::size_t(me) * count + i, op, n, dt), dt);
        report("reduce_scatter", dt, std::string(mltrain::comm::name_of(op)).c_str(), count, false, wrong,
               me);
      }
    }
  }
  c.barrier();
  // Host buffers still take the CPU path beside NCCL.
  std::vector<float> h(1000, float(me + 1));
  c.allreduce(h.data(), h.size(), DataType::f32, ReduceOp::sum);
  int wrong = 0;
  for (float v : h) wrong += v != float(n * (n + 1) / 2);
  report("allreduce-host", DataType::f32, "sum", h.size(), true, wrong, me);
}

}  // namespace

int main(int argc, char** argv) {
  bool backend_only = false;
  long loop = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--backend-only"))
      backend_only = true;
    else if (!std::strcmp(argv[i], "--loop") && i + 1 < argc)
      loop = std::atol(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--backend-only] [--loop N]\n", argv[0]);
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    auto c = Communicator::init_from_env();
    std::printf("rank %d backend %s: %s\n", c->rank(),
                std::string(mltrain::comm::name_of(c->backend())).c_str(), c->backend_reason().c_str());
    if (backend_only) {
      c->barrier();
      return 0;
    }
    if (c->backend() != Backend::nccl) {
      std::printf("rank %d: no NCCL backend, nothing to check\n", c->rank());
      return 3;
    }
    if (!cuda.load()) {
      std::fprintf(stderr, "cannot load the CUDA runtime for device memory\n");
      return 2;
    }
    if (loop > 0) {
      DeviceBuffer buf(4096);
      buf.put(std::vector<char>(4096, 0));
      for (long i = 0; i < loop; ++i) {
        c->allreduce(buf.p, 1024, DataType::f32, ReduceOp::sum);
        if (i % 10 == 0) std::printf("rank %d: allreduce %ld done\n", c->rank(), i);
      }
      return 0;
    }
    check_all(*c);
    std::printf("rank %d: %s, #wrong %d\n", c->rank(), wrong_total ? "FAILED" : "all results correct",
                wrong_total);
    return wrong_total ? 1 : 0;
  } catch (const mltrain::comm::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
