// Data-parallel SGD worker: linear regression on synthetic data from a fixed seed, sharded by
// rank, gradients summed with mltrain::comm allreduce.
//
// Default (fixed-point): data, weights and gradients are i64 fixed point, so the allreduce sum
// is exact and order-free: 1, 2 or 4 ranks print the same weights checksum, bit for bit.
// --float: f64 gradients and weights; results then agree across world sizes within the float
// bound of docs/comm.md (about 1e-12 relative here), not bitwise.
//
//   RANK=0 WORLD_SIZE=1 ./mltrain-sgd --steps 200
//   mltrain run examples/sgd.toml
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mltrain/comm.hpp"

namespace {

namespace comm = mltrain::comm;

struct Config {
  int steps = 200, features = 16, samples = 8192, batch = 1024, print_every = 50;
  double lr = 0.5;
  std::uint64_t seed = 42;
  bool use_float = false;
};

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), from (seed, stream, index): any rank can generate any sample.
double uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t h = mix(seed ^ mix(stream * 0x100000001b3ull ^ index));
  return static_cast<double>(h >> 11) / 4503599627370496.0 - 1.0;
}

constexpr int kDataShift = 12;    // x, y fixed point: value * 2^12
constexpr int kWeightShift = 20;  // w fixed point: value * 2^20

struct Data {
  std::vector<std::int64_t> x;  // samples x features, only this rank's shard is filled
  std::vector<std::int64_t> y;
};

Data make_data(const Config& c, int rank, int world) {
  Data d;
  d.x.assign(static_cast<std::size_t>(c.samples) * c.features, 0);
  d.y.assign(static_cast<std::size_t>(c.samples), 0);
  for (int i = rank; i < c.samples; i += world) {  // shard: sample i belongs to rank i % world
    double y = 0;
    for (int j = 0; j < c.features; ++j) {
      const double xv = uniform(c.seed, 1, static_cast<std::uint64_t>(i) * c.features + j);
      const double wv = uniform(c.seed, 2, static_cast<std::uint64_t>(j));  // the true weights
      d.x[static_cast<std::size_t>(i) * c.features + j] = std::llround(xv * (1 << kDataShift));
      y += wv * xv;
    }
    y += 0.01 * uniform(c.seed, 3, static_cast<std::uint64_t>(i));  // noise
    d.y[static_cast<std::size_t>(i)] = std::llround(y * (1 << kDataShift));
  }
  return d;
}

std::uint64_t fnv(const void* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const unsigned char*>(data)[i]) * 1099511628211ull;
  return h;
}

int run(const Config& c) {
  auto world = comm::Communicator::init_from_env();
  const int rank = world->rank(), size = world->size();
  const Data d = make_data(c, rank, size);
  const auto f = static_cast<std::size_t>(c.features);
  std::vector<std::int64_t> w(f, 0), grad(f + 1);  // grad[f] carries the squared error
  std::vector<double> wf(f, 0.0), gradf(f + 1);
  for (int step = 0; step < c.steps; ++step) {
    const int first = (step * c.batch) % c.samples;  // global batch: samples [first, first+batch)
    std::fill(grad.begin(), grad.end(), 0);
    std::fill(gradf.begin(), gradf.end(), 0.0);
    for (int k = 0; k < c.batch; ++k) {
      const int i = (first + k) % c.samples;
      if (i % size != rank) continue;
      const std::int64_t* xi = &d.x[static_cast<std::size_t>(i) * f];
      if (c.use_float) {
        constexpr double kScale = 1.0 / (1 << kDataShift);
        double p = 0;
        for (std::size_t j = 0; j < f; ++j) p += wf[j] * (static_cast<double>(xi[j]) * kScale);
        const double err = p - static_cast<double>(d.y[static_cast<std::size_t>(i)]) * kScale;
        for (std::size_t j = 0; j < f; ++j) gradf[j] += err * (static_cast<double>(xi[j]) * kScale);
        gradf[f] += err * err;
      } else {
        std::int64_t p = 0;  // scale 2^(20+12)
        for (std::size_t j = 0; j < f; ++j) p += w[j] * xi[j];
        const std::int64_t err = (p >> kWeightShift) - d.y[static_cast<std::size_t>(i)];  // 2^12
        for (std::size_t j = 0; j < f; ++j) grad[j] += err * xi[j];                       // scale 2^24
        grad[f] += err * err;                                                             // scale 2^24
      }
    }
    if (c.use_float) {
      world->allreduce(gradf.data(), gradf.size(), comm::DataType::f64, comm::ReduceOp::sum);
      for (std::size_t j = 0; j < f; ++j) wf[j] -= c.lr * gradf[j] / c.batch;
    } else {
      world->allreduce(grad.data(), grad.size(), comm::DataType::i64, comm::ReduceOp::sum);
      // w (2^20) -= lr * mean(grad) (2^24 -> 2^20: / 16); integer division is deterministic.
      const auto lr_q = static_cast<std::int64_t>(std::llround(c.lr * 1024));
      for (std::size_t j = 0; j < f; ++j) w[j] -= grad[j] * lr_q / (1024LL * 16 * c.batch);
    }
    if (rank == 0 && (step % c.print_every == 0 || step == c.steps - 1)) {
      const double loss =
          c.use_float ? gradf[f] / c.batch : static_cast<double>(grad[f]) / (1 << (2 * kDataShift)) / c.batch;
      std::printf("step %4d  loss %.6e\n", step, loss);
    }
  }
  if (rank == 0) {
    double err = 0;
    for (std::size_t j = 0; j < f; ++j) {
      const double have = c.use_float ? wf[j] : static_cast<double>(w[j]) / (1 << kWeightShift);
      err = std::max(err, std::fabs(have - uniform(c.seed, 2, j)));
    }
    std::printf("world %d: max |w - w_true| = %.3e\n", size, err);
    if (c.use_float) {
      std::printf("weights:");
      for (double v : wf) std::printf(" %.15e", v);
      std::printf("\n");
    } else {
      std::printf("weights checksum %016" PRIx64 "\n", fnv(w.data(), w.size() * sizeof w[0]));
    }
  }
  world->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "mltrain-sgd: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps")
      c.steps = std::atoi(next());
    else if (a == "--features")
      c.features = std::atoi(next());
    else if (a == "--samples")
      c.samples = std::atoi(next());
    else if (a == "--batch")
      c.batch = std::atoi(next());
    else if (a == "--lr")
      c.lr = std::atof(next());
    else if (a == "--seed")
      c.seed = std::strtoull(next(), nullptr, 10);
    else if (a == "--print-every")
      c.print_every = std::max(1, std::atoi(next()));
    else if (a == "--float")
      c.use_float = true;
    else {
      std::fprintf(stderr,
                   "usage: mltrain-sgd [--steps N] [--features D] [--samples N] [--batch B] "
                   "[--lr X] [--seed S] [--print-every K] [--float]\n");
      return 2;
    }
  }
  try {
    return run(c);
  } catch (const comm::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
