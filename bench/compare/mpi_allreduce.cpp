// Open MPI MPI_Allreduce (f32 sum), for bench/compare.sh (run over --mca btl vader,self and tcp,self).
// Prints "mpi <ranks> <bytes> <median us>" lines on rank 0.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
int iters_for(std::size_t bytes) {
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (4u << 20)) return 20;
  if (bytes <= (64u << 20)) return 5;
  return 3;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int a = 1; a < argc; ++a) {
    const std::size_t bytes = std::strtoull(argv[a], nullptr, 10);
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> in(static_cast<std::size_t>(count), 1.0f), out(static_cast<std::size_t>(count));
    const int iters = iters_for(bytes);
    MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);  // warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    std::vector<double> times;
    for (int i = 0; i < iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      times.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) {
      std::printf("mpi %d %zu %.2f\n", size, bytes, times[times.size() / 2]);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
