// Gloo allreduce (f32 sum) over Gloo's TCP transport, for bench/compare.sh. One process per
// rank: RANK, WORLD_SIZE, GLOO_STORE_DIR (a shared directory for Gloo's FileStore).
// Prints "gloo-<algorithm> <ranks> <bytes> <median us>" lines on rank 0.
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

int iters_for(std::size_t bytes) {
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (4u << 20)) return 20;
  if (bytes <= (64u << 20)) return 5;
  return 3;
}

template <class Algo>
double median_us(const std::shared_ptr<gloo::Context>& ctx, std::vector<float>& data, int iters) {
  std::vector<float*> ptrs{data.data()};
  Algo algo(ctx, ptrs, static_cast<int>(data.size()));
  algo.run();  // warm-up
  gloo::BarrierAllToAll barrier(ctx);
  barrier.run();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    algo.run();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = env_int("RANK", 0), size = env_int("WORLD_SIZE", 1);
  const char* dir = std::getenv("GLOO_STORE_DIR");
  if (dir == nullptr) {
    std::fprintf(stderr, "gloo_allreduce: set GLOO_STORE_DIR\n");
    return 2;
  }
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  gloo::rendezvous::PrefixStore prefix("bench", store);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(prefix, device);
  std::shared_ptr<gloo::Context> ctx = context;
  for (std::size_t bytes : sizes) {
    std::vector<float> data(bytes / sizeof(float), 1.0f);
    const int iters = iters_for(bytes);
    const double ring = median_us<gloo::AllreduceRing<float>>(ctx, data, iters);
    const double chunked = median_us<gloo::AllreduceRingChunked<float>>(ctx, data, iters);
    const double hd = median_us<gloo::AllreduceHalvingDoubling<float>>(ctx, data, iters);
    const double bcube = median_us<gloo::AllreduceBcube<float>>(ctx, data, iters);
    if (rank == 0) {
      std::printf("gloo-ring %d %zu %.2f\n", size, bytes, ring);
      std::printf("gloo-ring_chunked %d %zu %.2f\n", size, bytes, chunked);
      std::printf("gloo-halving_doubling %d %zu %.2f\n", size, bytes, hd);
      std::printf("gloo-bcube %d %zu %.2f\n", size, bytes, bcube);
      std::fflush(stdout);
    }
  }
  // Leave together: a rank that exits early closes pairs others may still be reading.
  gloo::BarrierAllToAll(ctx).run();
  return 0;
}
