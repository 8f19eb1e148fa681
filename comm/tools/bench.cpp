// mltrain-comm-bench: nccl-tests style sweep over message sizes for one collective. Every rank
// runs it (env as for init_from_env); rank 0 prints the table.
#include "mltrain/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/reduce.h"
#include "mltrain/comm.hpp"
#include "transport/nccl.h"

namespace mltrain::comm {

namespace {

enum class BenchOp { allreduce, broadcast, allgather, reduce_scatter };

struct Args {
  BenchOp op = BenchOp::allreduce;
  std::string op_name = "allreduce";
  ReduceOp redop = ReduceOp::sum;
  DataType dtype = DataType::f32;
  std::uint64_t min_bytes = 4096, max_bytes = 256ull << 20;
  double factor = 2;
  int iters = 20, warmup = 5;
  bool check = false, json = false, inplace = false, median = false;
  bool device = false;  // buffers in GPU memory: the NCCL backend carries them
  int root = 0;
};

const char* kUsage =
    "usage: mltrain-comm-bench [--op allreduce|broadcast|allgather|reduce_scatter]\n"
    "         [--redop sum|prod|min|max|avg] [--dtype f32|f64|f16|bf16|i32|i64|u8]\n"
    "         [-b MIN] [-e MAX] [-f FACTOR] [-n|--iters N] [-w|--warmup N] [-c|--check]\n"
    "         [--inplace] [--root R] [--stat mean|median] [--json] [--device]\n"
    "  Sizes take K/M/G suffixes. Start one process per rank with RANK, WORLD_SIZE,\n"
    "  MLTRAIN_STORE_ADDR, MLTRAIN_TOKEN set (mltrain bench -n N does this).\n";

Args parse(int argc, char** argv) {
  Args a;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw Error(Error::Kind::usage, std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--op") {
      a.op_name = need(i);
      if (a.op_name == "allreduce")
        a.op = BenchOp::allreduce;
      else if (a.op_name == "broadcast")
        a.op = BenchOp::broadcast;
      else if (a.op_name == "allgather")
        a.op = BenchOp::allgather;
      else if (a.op_name == "reduce_scatter")
        a.op = BenchOp::reduce_scatter;
      else
        throw Error(Error::Kind::usage, "unknown --op '" + a.op_name + "'");
    } else if (f == "--redop" || f == "-o") {
      const std::string v = need(i);
      const auto op = parse_redop(v);
      if (!op) throw Error(Error::Kind::usage, "unknown --redop '" + v + "'");
      a.redop = *op;
    } else if (f == "--dtype" || f == "-d") {
      const std::string v = need(i);
      const auto dt = parse_dtype(v);
      if (!dt) throw Error(Error::Kind::usage, "unknown --dtype '" + v + "'");
      a.dtype = *dt;
    } else if (f == "-b" || f == "--minbytes") {
      a.min_bytes = detail::parse_size(need(i), "-b");
    } else if (f == "-e" || f == "--maxbytes") {
      a.max_bytes = detail::parse_size(need(i), "-e");
    } else if (f == "-f" || f == "--stepfactor") {
      a.factor = std::stod(need(i));
    } else if (f == "-n" || f == "--iters") {
      a.iters = std::stoi(need(i));
    } else if (f == "-w" || f == "--warmup") {
      a.warmup = std::stoi(need(i));
    } else if (f == "-c" || f == "--check") {
      a.check = true;
    } else if (f == "--json") {
      a.json = true;
    } else if (f == "--stat") {
      const std::string v = need(i);
      if (v != "mean" && v != "median") throw Error(Error::Kind::usage, "--stat takes mean or median");
      a.median = v == "median";
    } else if (f == "--device") {
      a.device = true;
    } else if (f == "--inplace") {
      a.inplace = true;
    } else if (f == "--root") {
      a.root = std::stoi(need(i));
    } else if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw Error(Error::Kind::usage, "unknown flag '" + f + "'\n" + kUsage);
    }
  }
  if (a.factor <= 1.0) throw Error(Error::Kind::usage, "-f must be > 1");
  if (a.iters < 1 || a.warmup < 0) throw Error(Error::Kind::usage, "bad -n/-w");
  return a;
}

// Small integer inputs: exact in every dtype, so expected values are exact too.
double input_value(const Args& a, int rank, std::size_t i) {
  switch (a.redop) {
    case ReduceOp::prod:
      return (rank == 0 && i % 3 == 0) ? 2.0 : 1.0;
    case ReduceOp::min:
    case ReduceOp::max:
      return static_cast<double>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11);
    default:
      return static_cast<double>((i + static_cast<std::size_t>(rank)) % 4);
  }
}

double expected_reduce(const Args& a, int world, std::size_t i, DataType dt) {
  double acc = input_value(a, 0, i);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(a, r, i);
    switch (a.redop) {
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
      default:
        acc += v;
    }
  }
  if (dt == DataType::u8 && a.redop != ReduceOp::min && a.redop != ReduceOp::max) acc = std::fmod(acc, 256.0);
  if (a.redop == ReduceOp::avg) {
    const bool integral = dt == DataType::i32 || dt == DataType::i64 || dt == DataType::u8;
    acc = integral ? std::trunc(acc / world) : acc / world;
  }
  return acc;
}

bool close_enough(double got, double want, DataType dt) {
  const double tol = dt == DataType::f16 ? 1e-3 : dt == DataType::bf16 ? 8e-3 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

// Host buffers, and with --device their twins in device memory (results checked on the host).
struct Buffers {
  std::vector<std::byte> send, recv;
  std::byte* dsend = nullptr;
  std::byte* drecv = nullptr;
  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() { release(); }
  void release() {
    detail::device_free(dsend);
    detail::device_free(drecv);
    dsend = drecv = nullptr;
  }
  void to_device() {
    release();
    dsend = static_cast<std::byte*>(detail::device_alloc(send.size()));
    drecv = static_cast<std::byte*>(detail::device_alloc(recv.size()));
    detail::device_copy(dsend, send.data(), send.size());
    detail::device_copy(drecv, recv.data(), recv.size());
  }
};

// Elements: total is what nccl-tests calls count (recv side for allgather, send side for
// reduce_scatter).
std::int64_t run_once_and_check(Communicator& comm, const Args& a, std::size_t total, bool check,
                                Buffers& b) {
  const int n = comm.size(), r = comm.rank();
  const std::size_t es = size_of(a.dtype);
  const std::size_t per = total / static_cast<std::size_t>(n);
  std::byte* const S = a.device ? b.dsend : b.send.data();
  std::byte* const R = a.device ? b.drecv : b.recv.data();
  void* recv = R;
  const void* send = a.inplace ? R : S;
  if (check) {
    std::size_t inputs = total;
    void* in = a.inplace ? b.recv.data() : b.send.data();
    if (a.op == BenchOp::allgather) {
      inputs = per;
      if (a.inplace) in = b.recv.data() + static_cast<std::size_t>(r) * per * es;
      send = a.inplace ? R + static_cast<std::size_t>(r) * per * es : S;
    }
    for (std::size_t i = 0; i < inputs; ++i) {
      const std::size_t gi = a.op == BenchOp::allgather ? static_cast<std::size_t>(r) * per + i : i;
      detail::store_from_double(
          in, i, a.dtype, a.op == BenchOp::broadcast ? (r == a.root ? gi % 5 : 99) : input_value(a, r, gi));
    }
    if (a.device) {
      detail::device_copy(b.dsend, b.send.data(), b.send.size());
      detail::device_copy(b.drecv, b.recv.data(), b.recv.size());
    }
  }
  switch (a.op) {
    case BenchOp::allreduce:
      comm.allreduce(send, recv, total, a.dtype, a.redop);
      break;
    case BenchOp::broadcast:
      if (!a.inplace && r == a.root) {
        if (a.device)
          detail::device_copy(R, S, total * es);
        else
          std::memcpy(recv, b.send.data(), total * es);
      }
      comm.broadcast(recv, total, a.dtype, a.root);
      break;
    case BenchOp::allgather:
      comm.allgather(a.inplace ? R + static_cast<std::size_t>(r) * per * es : S, recv, per, a.dtype);
      break;
    case BenchOp::reduce_scatter:
      comm.reduce_scatter(a.inplace ? R : S, a.inplace ? R + static_cast<std::size_t>(r) * per * es : recv,
                          per, a.dtype, a.redop);
      break;
  }
  if (!check) return 0;
  if (a.device) detail::device_copy(b.recv.data(), b.drecv, b.recv.size());
  std::int64_t wrong = 0;
  const auto* out = b.recv.data();
  switch (a.op) {
    case BenchOp::allreduce:
      for (std::size_t i = 0; i < total; ++i)
        wrong += !close_enough(detail::load_as_double(out, i, a.dtype), expected_reduce(a, n, i, a.dtype),
                               a.dtype);
      break;
    case BenchOp::broadcast:
      for (std::size_t i = 0; i < total; ++i)
        wrong += detail::load_as_double(out, i, a.dtype) != static_cast<double>(i % 5);
      break;
    case BenchOp::allgather:
      for (std::size_t i = 0; i < per * static_cast<std::size_t>(n); ++i)
        wrong += detail::load_as_double(out, i, a.dtype) != input_value(a, static_cast<int>(i / per), i);
      break;
    case BenchOp::reduce_scatter: {
      const std::byte* mine = a.inplace ? out + static_cast<std::size_t>(r) * per * es : out;
      for (std::size_t i = 0; i < per; ++i) {
        const std::size_t gi = static_cast<std::size_t>(r) * per + i;
        wrong += !close_enough(detail::load_as_double(mine, i, a.dtype), expected_reduce(a, n, gi, a.dtype),
                               a.dtype);
      }
      break;
    }
  }
  return wrong;
}

double bus_factor(BenchOp op, int n) {
  switch (op) {
    case BenchOp::allreduce:
      return 2.0 * (n - 1) / n;
    case BenchOp::allgather:
    case BenchOp::reduce_scatter:
      return static_cast<double>(n - 1) / n;
    case BenchOp::broadcast:
      return 1.0;
  }
  return 1.0;
}

}  // namespace

int bench_main(int argc, char** argv) {
  Args a;
  try {
    a = parse(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "mltrain-comm-bench: %s\n", e.what());
    return 2;
  }
  try {
    // As torchrun-style workers: the device of this local rank is current before init.
    if (a.device) {
      const char* local = std::getenv("LOCAL_RANK");
      try {
        detail::use_device_of_local_rank(local ? std::atoi(local) : 0);
      } catch (const Error& e) {
        throw Error(e.kind(),
                    std::string("--device (mltrain bench --backend nccl) needs a GPU: ") + e.what());
      }
    }
    auto comm = Communicator::init_from_env();
    if (a.device && comm->backend() != Backend::nccl)
      throw Error(Error::Kind::usage, "--device needs the NCCL backend, and this job uses the CPU backend: " +
                                          comm->backend_reason());
    const int n = comm->size(), r = comm->rank();
    const std::size_t es = size_of(a.dtype);
    const bool reduces = a.op == BenchOp::allreduce || a.op == BenchOp::reduce_scatter;
    if (r == 0 && !a.json) {
      std::printf("# mltrain-comm-bench: %s, %d ranks, rank 0 on %s, large allreduce: %s\n",
                  a.op_name.c_str(), n, comm->host().c_str(), name_of(comm->algo()).data());
      std::printf("# %s; buffers in %s memory\n", nccl_status().c_str(), a.device ? "device" : "host");
      std::printf("# iters %d, warmup %d, %s\n", a.iters, a.warmup, a.inplace ? "in place" : "out of place");
      std::printf("#%12s %12s %6s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "time", "algbw",
                  "busbw", "#wrong");
      std::printf("#%12s %12s %6s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
                  "(GB/s)", "");
      std::fflush(stdout);
    }
    // Warm up links, page tables and the scheduler before the first timed size.
    {
      float x = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      int go = 1;
      while (go != 0) {
        for (int i = 0; i < 50; ++i) comm->allreduce(&x, 1, DataType::f32, ReduceOp::sum);
        go = std::chrono::steady_clock::now() < until ? 1 : 0;
        comm->allreduce(&go, 1, DataType::i32, ReduceOp::max);  // everyone stops together
      }
    }
    Buffers b;
    for (double size = static_cast<double>(a.min_bytes); size <= static_cast<double>(a.max_bytes) * 1.0001;
         size *= a.factor) {
      std::size_t total = static_cast<std::size_t>(size) / es;
      if (a.op == BenchOp::allgather || a.op == BenchOp::reduce_scatter)
        total -= total % static_cast<std::size_t>(n);
      b.send.assign(total * es + 64, std::byte{1});
      b.recv.assign(total * es + 64, std::byte{0});
      if (a.device) b.to_device();
      for (int i = 0; i < a.warmup; ++i) run_once_and_check(*comm, a, total, false, b);
      comm->barrier();
      std::vector<double> times;
      const auto t0 = std::chrono::steady_clock::now();
      auto t_prev = t0;
      for (int i = 0; i < a.iters; ++i) {
        run_once_and_check(*comm, a, total, false, b);
        const auto t = std::chrono::steady_clock::now();
        times.push_back(std::chrono::duration<double, std::micro>(t - t_prev).count());
        t_prev = t;
      }
      double us = std::chrono::duration<double, std::micro>(t_prev - t0).count() / a.iters;
      if (a.median) {
        std::sort(times.begin(), times.end());
        us = times[times.size() / 2];
      }
      double slowest = us;
      comm->allreduce(&slowest, 1, DataType::f64, ReduceOp::max);
      std::int64_t wrong = a.check ? run_once_and_check(*comm, a, total, true, b) : 0;
      if (a.check) comm->allreduce(&wrong, 1, DataType::i64, ReduceOp::sum);
      const double bytes = static_cast<double>(total * es);
      const double algbw = bytes / slowest / 1e3;  // bytes/us = MB/s; /1e3 -> GB/s
      const double busbw = algbw * bus_factor(a.op, n);
      if (r == 0) {
        const char* redop = reduces ? name_of(a.redop).data() : "none";
        if (a.json) {
          // JSON Lines, one object per size (docs/json.md, "bench"); "wrong" is null without --check.
          char wrong_json[24] = "null";
          if (a.check) std::snprintf(wrong_json, sizeof wrong_json, "%lld", static_cast<long long>(wrong));
          std::printf(
              "{\"schema\":1,\"op\":\"%s\",\"ranks\":%d,\"size\":%.0f,\"count\":%zu,\"type\":\"%s\","
              "\"redop\":%s,\"time_us\":%.2f,\"algbw\":%.4f,\"busbw\":%.4f,"
              "\"wrong\":%s}\n",
              a.op_name.c_str(), n, bytes, total, name_of(a.dtype).data(),
              reduces ? ("\"" + std::string(redop) + "\"").c_str() : "null", slowest, algbw, busbw,
              wrong_json);
        } else {
          char wrong_text[24];
          if (a.check)
            std::snprintf(wrong_text, sizeof wrong_text, "%lld", static_cast<long long>(wrong));
          else
            std::snprintf(wrong_text, sizeof wrong_text, "N/A");
          std::printf(" %12.0f %12zu %6s %6s %11.2f %8.3f %8.3f %7s\n", bytes, total, name_of(a.dtype).data(),
                      redop, slowest, algbw, busbw, wrong_text);
        }
        std::fflush(stdout);
      }
      if (a.check && wrong != 0 && r == 0 && !a.json) std::printf("# WRONG results at size %.0f\n", bytes);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace mltrain::comm
