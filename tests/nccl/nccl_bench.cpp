// mltrain-nccl-bench: allreduce on device buffers through mltrain::comm (its NCCL backend)
// against a raw NCCL loop on the same buffers, in interleaved rounds; rank 0 prints the median
// time of each per size and their ratio. Run as a job: `mltrain run -n GPUS -- mltrain-nccl-bench`
// (tests/gpu/run.sh). The raw communicator is made with the same libnccl (found as the comm
// library finds it, knobs/gpu_library.h), its unique id broadcast over mltrain's CPU path.
//
//   -b MIN -e MAX -f FACTOR   sizes in bytes (K/M/G), default 1M..256M, x4
//   -n ITERS -r ROUNDS        allreduces per timed block, interleaved rounds (default 20, 5)
#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/env.h"
#include "knobs/gpu_library.h"
#include "mltrain/comm.hpp"

namespace {

using mltrain::comm::Communicator;
using mltrain::comm::DataType;
using mltrain::comm::ReduceOp;

// The few CUDA and NCCL entry points the raw loop needs, with their C ABI (opaque handles, enums
// as int: ncclFloat32 = 7, ncclSum = 0).
struct Raw {
  int (*Malloc)(void**, std::size_t) = nullptr;
  int (*Memset)(void*, int, std::size_t) = nullptr;
  int (*StreamSynchronize)(void*) = nullptr;
  int (*GetUniqueId)(void*) = nullptr;
  int (*CommInitRank)(void**, int, std::array<char, 128>, int) = nullptr;
  int (*AllReduce)(const void*, void*, std::size_t, int, int, void*, void*) = nullptr;
  int (*CommDestroy)(void*) = nullptr;
};

// The library the comm library loads: the same knob, the same search (knobs/gpu_library.h).
void* open_lib(mltrain::knobs::GpuLibrary lib) {
  return mltrain::knobs::load_library(lib, mltrain::knobs::library_setting(lib, "")).handle;
}

template <class F>
void sym(void* lib, const char* name, F& f) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  if (!f) {
    std::fprintf(stderr, "mltrain-nccl-bench: %s missing\n", name);
    std::exit(2);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t min_bytes = 1u << 20, max_bytes = 256u << 20;
  double factor = 4;
  int iters = 20, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "-b")
      min_bytes = mltrain::comm::detail::parse_size(v, "-b");
    else if (f == "-e")
      max_bytes = mltrain::comm::detail::parse_size(v, "-e");
    else if (f == "-f")
      factor = std::stod(v);
    else if (f == "-n")
      iters = std::stoi(v);
    else if (f == "-r")
      rounds = std::stoi(v);
    else {
      std::fprintf(stderr,
                   "usage: mltrain-nccl-bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-r ROUNDS]\n");
      return 2;
    }
  }
  try {
    auto c = Communicator::init_from_env();
    const int n = c->size(), me = c->rank();
    if (c->backend() != mltrain::comm::Backend::nccl) {
      if (me == 0) std::printf("# no NCCL backend: %s\n", c->backend_reason().c_str());
      return 3;
    }
    Raw raw;
    void* cuda = open_lib(mltrain::knobs::GpuLibrary::cudart);
    void* nccl = open_lib(mltrain::knobs::GpuLibrary::nccl);
    if (!cuda || !nccl) {
      std::fprintf(stderr, "mltrain-nccl-bench: cannot load the CUDA runtime or NCCL\n");
      return 2;
    }
    sym(cuda, "cudaMalloc", raw.Malloc);
    sym(cuda, "cudaMemset", raw.Memset);
    sym(cuda, "cudaStreamSynchronize", raw.StreamSynchronize);
    sym(nccl, "ncclGetUniqueId", raw.GetUniqueId);
    sym(nccl, "ncclCommInitRank", raw.CommInitRank);
    sym(nccl, "ncclAllReduce", raw.AllReduce);
    sym(nccl, "ncclCommDestroy", raw.CommDestroy);
    std::array<char, 128> id{};
    if (me == 0 && raw.GetUniqueId(id.data()) != 0) throw std::runtime_error("ncclGetUniqueId failed");
    c->broadcast(id.data(), id.size(), DataType::u8, 0);
    void* rc = nullptr;
    if (raw.CommInitRank(&rc, n, id, me) != 0) throw std::runtime_error("raw ncclCommInitRank failed");
    void* buf = nullptr;
    if (raw.Malloc(&buf, max_bytes) != 0) throw std::runtime_error("cudaMalloc failed");
    raw.Memset(buf, 0, max_bytes);
    if (me == 0) {
      std::printf("# allreduce f32 sum on device buffers, %d ranks; %s\n", n, c->backend_reason().c_str());
      std::printf("# median of %d interleaved rounds of %d calls each, time per call\n", rounds, iters);
      std::printf("#%12s %12s %12s %9s %9s %8s\n", "size(B)", "mltrain(us)", "raw nccl(us)", "busbw",
                  "raw busbw", "ratio");
    }
    for (double size = double(min_bytes); size <= double(max_bytes) * 1.0001; size *= factor) {
      const std::size_t count = std::size_t(size) / 4;
      auto time_block = [&](bool through_mltrain) {
        c->barrier();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
          if (through_mltrain)
            c->allreduce(buf, count, DataType::f32, ReduceOp::sum);
          else if (raw.AllReduce(buf, buf, count, 7, 0, rc, nullptr) != 0)
            throw std::runtime_error("raw ncclAllReduce failed");
        }
        if (!through_mltrain) raw.StreamSynchronize(nullptr);
        double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
        c->allreduce(&us, 1, DataType::f64, ReduceOp::max);  // the slowest rank's time
        return us;
      };
      time_block(true);  // warm up both
      time_block(false);
      std::vector<double> ours, theirs;
      for (int r = 0; r < rounds; ++r) {
        ours.push_back(time_block(true));
        theirs.push_back(time_block(false));
      }
      const double a = median(ours), b = median(theirs);
      const double bus = 2.0 * (n - 1) / n;
      if (me == 0)
        std::printf(" %12.0f %12.1f %12.1f %9.2f %9.2f %8.3f\n", size, a, b, size / a / 1e3 * bus,
                    size / b / 1e3 * bus, a / b);
      std::fflush(stdout);
    }
    raw.CommDestroy(rc);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
