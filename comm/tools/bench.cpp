// mltrain-comm-bench: nccl-tests style sweep over message sizes for one collective. Every rank
// runs it (env as for init_from_env); rank 0 prints the table.
#include "mltrain/bench.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/reduce.h"
#include "mltrain/comm.hpp"
#include "mltrain/ps.hpp"
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
  bool ps = false;                 // --mode ps: push_pull through the job's servers beside allreduce
  std::vector<int> server_counts;  // --servers 1,2,4
  bool explicit_max = false;
};

const char* kUsage =
    "usage: mltrain-comm-bench [--op allreduce|broadcast|allgather|reduce_scatter]\n"
    "         [--redop sum|prod|min|max|avg] [--dtype f32|f64|f16|bf16|i32|i64|u8]\n"
    "         [-b MIN] [-e MAX] [-f FACTOR] [-n|--iters N] [-w|--warmup N] [-c|--check]\n"
    "         [--inplace] [--root R] [--stat mean|median] [--json] [--device]\n"
    "         [--mode allreduce|ps] [--servers 1,2,4]\n"
    "  Sizes take K/M/G suffixes. Start one process per rank with RANK, WORLD_SIZE,\n"
    "  MLTRAIN_STORE_ADDR, MLTRAIN_TOKEN set (mltrain bench -n N does this).\n";

constexpr int kMaxIters = 1000000;
constexpr std::size_t kMaxRows = 1000;

// A whole number flag from lo to hi, or a usage error that says so.
int whole(const std::string& v, const char* flag, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || errno == ERANGE || n < lo || n > hi)
    throw Error(Error::Kind::usage, std::string(flag) + " '" + v + "' is not a whole number from " +
                                        std::to_string(lo) + " to " + std::to_string(hi));
  return static_cast<int>(n);
}

// The message sizes, in bytes, from -b up to -e, each the last times -f (nccl-tests). A 0-byte
// start is one row of no elements, then the sizes go on from one element (0 times -f stays 0,
// and a run would never end).
std::vector<double> sizes(const Args& a) {
  std::vector<double> out;
  double size = static_cast<double>(a.min_bytes);
  const double top = static_cast<double>(a.max_bytes) * 1.0001;
  if (size == 0) {
    out.push_back(0);
    size = static_cast<double>(size_of(a.dtype));
  }
  for (; size <= top; size *= a.factor) {
    out.push_back(size);
    if (out.size() > kMaxRows)
      throw Error(Error::Kind::usage, "-b " + std::to_string(a.min_bytes) + " to -e " +
                                          std::to_string(a.max_bytes) + " by -f " + std::to_string(a.factor) +
                                          " makes more than " + std::to_string(kMaxRows) +
                                          " sizes: raise -f or narrow -b/-e");
  }
  return out;
}

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
      a.explicit_max = true;
    } else if (f == "--mode") {
      const std::string v = need(i);
      if (v != "allreduce" && v != "ps") throw Error(Error::Kind::usage, "--mode takes allreduce or ps");
      a.ps = v == "ps";
    } else if (f == "--servers") {
      const std::string v = need(i);
      std::size_t start = 0;
      while (start < v.size()) {
        std::size_t end = v.find(',', start);
        if (end == std::string::npos) end = v.size();
        const int n = std::atoi(v.substr(start, end - start).c_str());
        if (n < 1) throw Error(Error::Kind::usage, "--servers takes counts like 1,2,4");
        a.server_counts.push_back(n);
        start = end + 1;
      }
    } else if (f == "-f" || f == "--stepfactor") {
      const std::string v = need(i);
      char* end = nullptr;
      a.factor = std::strtod(v.c_str(), &end);
      if (v.empty() || *end != 0 || !std::isfinite(a.factor) || a.factor <= 1.0)
        throw Error(Error::Kind::usage,
                    "-f '" + v + "' is not a number over 1 (each size is the last times -f)");
    } else if (f == "-n" || f == "--iters") {
      a.iters = whole(need(i), "-n", 1, kMaxIters);
    } else if (f == "-w" || f == "--warmup") {
      a.warmup = whole(need(i), "-w", 0, kMaxIters);
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
      a.root = whole(need(i), "--root", 0, 1 << 20);
    } else if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw Error(Error::Kind::usage, "unknown flag '" + f + "'\n" + kUsage);
    }
  }
  // nccl-tests refuses a start past the end alike.
  if (a.min_bytes > a.max_bytes)
    throw Error(Error::Kind::usage, "-b " + std::to_string(a.min_bytes) + " is more than -e " +
                                        std::to_string(a.max_bytes) + ": give -b at most -e");
  sizes(a);  // too many rows throws here, before any rank starts
  if (a.ps && (a.device || a.op != BenchOp::allreduce))
    throw Error(Error::Kind::usage, "--mode ps measures push_pull beside allreduce of host buffers");
  // The servers keep every size's keys: a lower default top size.
  if (a.ps && !a.explicit_max) a.max_bytes = 64ull << 20;
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

// How the job's large allreduce works and why this one, in words: the benchmark's header.
std::string allreduce_words(Algo got, const Options& asked, int n) {
  const std::string ranks = std::to_string(n) + " ranks";
  std::string how, why;
  switch (got) {
    case Algo::direct:
      how = "each rank combines one slice of all the inputs, in one shared-memory segment";
      why = "all ranks on one host";
      break;
    case Algo::hd:
      how = "halving/doubling, pairwise exchanges at doubling distances";
      why = "ranks on more than one host, " + ranks + " a power of two";
      break;
    case Algo::bidir:
      how = "two rings in opposite directions, each link busy both ways";
      why = "ranks on more than one host, " + ranks + " not a power of two";
      break;
    default:
      how = "one ring, each rank passing a slice to the next";
      why = n < 3 ? ranks + ": one ring is all it takes" : "the ranks could not share one segment";
      break;
  }
  if (asked.algo == got)
    why = "MLTRAIN_COMM_ALGO=" + std::string(name_of(got));
  else if (asked.algo != Algo::automatic)
    why = "MLTRAIN_COMM_ALGO=" + std::string(name_of(asked.algo)) + " does not apply: " +
          (asked.algo == Algo::direct ? "it needs every rank on one host"
           : n < 3                    ? "it needs 3 ranks or more"
                                      : "it needs a power-of-two number of ranks");
  char small[32];
  std::snprintf(small, sizeof small, "%zuK", asked.small_bytes >> 10);
  return "allreduce of messages over " +
         std::string(asked.small_bytes % 1024 ? std::to_string(asked.small_bytes) : small) + ": " + how +
         " (" + why + ")";
}

// The server counts --mode ps compares: --servers, else 1, 2, 4, ... and every server.
std::vector<int> server_counts(const Args& a, int servers) {
  std::vector<int> counts = a.server_counts;
  if (counts.empty()) {
    for (int s = 1; s <= servers; s *= 2) counts.push_back(s);
    if (counts.back() != servers) counts.push_back(servers);
  }
  for (int s : counts)
    if (s > servers)
      throw Error(Error::Kind::usage, "--servers " + std::to_string(s) + ": the job has " +
                                          std::to_string(servers) +
                                          " PS servers ([ps] hosts and servers_per_host)");
  return counts;
}

// Keys by the server they land on, handed out in order (the same on every rank).
class KeyPool {
 public:
  explicit KeyPool(ps::Client& client) : client_(client), pool_(std::size_t(client.num_servers())) {}
  std::uint64_t on(int server) {
    auto& keys = pool_[std::size_t(server)];
    while (used_[std::size_t(server)] >= keys.size()) {
      const std::uint64_t k = next_key_++;
      pool_[std::size_t(client_.server_of(k, 0))].push_back(k);
    }
    return keys[used_[std::size_t(server)]++];
  }

 private:
  ps::Client& client_;
  std::vector<std::vector<std::uint64_t>> pool_;
  std::vector<std::size_t> used_ = std::vector<std::size_t>(pool_.size(), 0);
  std::uint64_t next_key_ = 1u << 20;
};

void print_ps_head(const Args& a, Communicator& comm, const ps::Options& po, const ps::Client& client,
                   std::size_t partition) {
  std::string hosts;
  for (const auto& sv : po.servers)
    if (hosts.find(sv.host) == std::string::npos) hosts += (hosts.empty() ? "" : ", ") + sv.host;
  std::printf(
      "# mltrain-comm-bench --mode ps: %d workers, %d PS servers (on %s), %s, pieces of at most %zu B\n",
      comm.size(), client.num_servers(), hosts.c_str(), client.sync() ? "sync" : "async", partition);
  std::printf("# push_pull of each size through s servers, and allreduce (%s) of the same bytes;\n",
              name_of(comm.algo()).data());
  std::printf(
      "# per worker: bytes / time; total: workers * bytes / time; ps speed: allreduce time / ps time\n");
  std::printf("# iters %d, warmup %d, %s of interleaved rounds, the slowest worker's\n", a.iters, a.warmup,
              a.median ? "median" : "mean");
  std::printf("#%12s %7s %11s %10s %10s %11s %10s %8s %7s\n", "size", "servers", "ps time", "per-worker",
              "total", "allreduce", "algbw", "ps speed", "#wrong");
  std::printf("#%12s %7s %11s %10s %10s %11s %10s %8s %7s\n", "(B)", "", "(us)", "(GB/s)", "(GB/s)", "(us)",
              "(GB/s)", "(x)", "");
  std::fflush(stdout);
}

// One way to push_pull a size: its pieces (key, elements) over `servers` servers, and its times.
struct Variant {
  int servers = 0;
  std::vector<std::pair<std::uint64_t, std::size_t>> pieces;
  std::vector<double> times;
};

// A push_pull of N bytes over s servers is split in pieces of at most the job's partition size,
// piece i on server i % s, as the client's own partitioning spreads a key's parts.
Variant plan_variant(int s, std::size_t total, std::size_t es, std::size_t partition, KeyPool& keys,
                     ps::Client& client, DataType dtype) {
  Variant v;
  v.servers = s;
  std::size_t k = std::max<std::size_t>(std::size_t(s), (total * es + partition - 1) / partition);
  k = (k + std::size_t(s) - 1) / std::size_t(s) * std::size_t(s);
  k = std::min(k, total);
  const std::size_t per = (total + k - 1) / k;
  for (std::size_t i = 0, off = 0; off < total; ++i, off += per) {
    const std::size_t cnt = std::min(per, total - off);
    const std::uint64_t key = keys.on(int(i % std::size_t(s)));
    client.declare(key, cnt, dtype);
    v.pieces.emplace_back(key, cnt);
  }
  return v;
}

void print_ps_row(const Args& a, int n, const Variant& v, double bytes, double us, double ar,
                  std::int64_t wrong) {
  const double per_worker = bytes / us / 1e3, all = per_worker * n, ar_bw = bytes / ar / 1e3;
  char wrong_text[24] = "N/A";
  if (a.check) std::snprintf(wrong_text, sizeof wrong_text, "%lld", static_cast<long long>(wrong));
  if (a.json)
    std::printf(
        "{\"schema\":1,\"op\":\"push_pull\",\"workers\":%d,\"servers\":%d,\"size\":%.0f,\"type\":\"%s\","
        "\"time_us\":%.2f,\"per_worker\":%.4f,\"total\":%.4f,\"allreduce_us\":%.2f,"
        "\"allreduce_algbw\":%.4f,\"ratio\":%.3f,\"wrong\":%s}\n",
        n, v.servers, bytes, name_of(a.dtype).data(), us, per_worker, all, ar, ar_bw, ar / us,
        a.check ? wrong_text : "null");
  else
    std::printf(" %12.0f %7d %11.2f %10.3f %10.3f %11.2f %10.3f %8.2f %7s\n", bytes, v.servers, us,
                per_worker, all, ar, ar_bw, ar / us, wrong_text);
  std::fflush(stdout);
}

// --mode ps: push_pull of `size` bytes through s servers (for each s asked), beside ring allreduce
// of the same bytes on the same ranks, in interleaved rounds. The keys are picked so that each
// piece lands on the server planned for it (plan_variant).
int bench_ps(const Args& a) {
  auto comm = Communicator::init_from_env();
  ps::Options po = ps::Options::from_env();
  const std::size_t partition = po.partition_bytes;
  po.partition_bytes = std::size_t(1) << 30;  // the most: the bench splits, server by server
  auto client = ps::Client::create(po);
  const int n = comm->size(), r = comm->rank();
  const std::vector<int> counts = server_counts(a, client->num_servers());
  const std::size_t es = size_of(a.dtype);
  KeyPool keys(*client);
  if (r == 0 && !a.json) print_ps_head(a, *comm, po, *client, partition);
  if (!client->sync())
    throw Error(Error::Kind::usage, "--mode ps measures sync push_pull: set [ps] sync = true in the job");
  for (double size : sizes(a)) {
    const std::size_t total = std::max<std::size_t>(1, static_cast<std::size_t>(size) / es);
    std::vector<Variant> vs;
    for (int s : counts) vs.push_back(plan_variant(s, total, es, partition, keys, *client, a.dtype));
    std::vector<std::byte> buf(total * es + 64), out(total * es + 64);
    for (std::size_t i = 0; i < total; ++i)
      detail::store_from_double(buf.data(), i, a.dtype, input_value(a, r, i));
    auto push_pull = [&](const Variant& v) {
      std::vector<ps::Handle> hs;
      std::size_t off = 0;
      for (const auto& [key, cnt] : v.pieces) {
        hs.push_back(client->push_pull_async(key, buf.data() + off * es, out.data() + off * es));
        off += cnt;
      }
      for (auto& h : hs) h.wait();
    };
    auto timed = [](auto&& body) {
      const auto t0 = std::chrono::steady_clock::now();
      body();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<double> ar_times;
    for (int it = 0; it < a.warmup + a.iters; ++it) {
      for (auto& v : vs) {
        comm->barrier();
        const double us = timed([&] { push_pull(v); });
        if (it >= a.warmup) v.times.push_back(us);
      }
      comm->barrier();
      const double us =
          timed([&] { comm->allreduce(buf.data(), out.data(), total, a.dtype, ReduceOp::sum); });
      if (it >= a.warmup) ar_times.push_back(us);
    }
    auto stat = [&](std::vector<double> t) {
      double v = 0;
      if (a.median) {
        std::sort(t.begin(), t.end());
        v = t[t.size() / 2];
      } else {
        for (double x : t) v += x;
        v /= double(t.size());
      }
      comm->allreduce(&v, 1, DataType::f64, ReduceOp::max);  // the slowest worker's
      return v;
    };
    const double ar = stat(ar_times);
    for (auto& v : vs) {
      const double us = stat(v.times);
      std::int64_t wrong = 0;
      if (a.check) {
        push_pull(v);
        for (std::size_t i = 0; i < total; ++i)
          wrong += !close_enough(detail::load_as_double(out.data(), i, a.dtype),
                                 expected_reduce(a, n, i, a.dtype), a.dtype);
        comm->allreduce(&wrong, 1, DataType::i64, ReduceOp::sum);
      }
      if (r == 0) print_ps_row(a, n, v, double(total * es), us, ar, wrong);
    }
  }
  return 0;
}

// The table's head (nccl-tests' columns), on rank 0.
void print_head(const Args& a, Communicator& comm) {
  const int n = comm.size();
  std::printf("# mltrain-comm-bench: %s, %d ranks, rank 0 on %s\n", a.op_name.c_str(), n,
              comm.host().c_str());
  if (a.op == BenchOp::allreduce && !a.device)
    std::printf("# %s\n", allreduce_words(comm.algo(), Options::from_env(), n).c_str());
  std::printf("# %s; buffers in %s memory\n", nccl_status().c_str(), a.device ? "device" : "host");
  std::printf("# iters %d, warmup %d, %s\n", a.iters, a.warmup, a.inplace ? "in place" : "out of place");
  std::printf("#%12s %12s %6s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "time", "algbw",
              "busbw", "#wrong");
  std::printf("#%12s %12s %6s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
              "(GB/s)", "");
  std::fflush(stdout);
}

// Warm up links, page tables and the scheduler before the first timed size.
void warm_up(Communicator& comm) {
  float x = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  int go = 1;
  while (go != 0) {
    for (int i = 0; i < 50; ++i) comm.allreduce(&x, 1, DataType::f32, ReduceOp::sum);
    go = std::chrono::steady_clock::now() < until ? 1 : 0;
    comm.allreduce(&go, 1, DataType::i32, ReduceOp::max);  // everyone stops together
  }
}

// One size's line: the slowest rank's time, and the wrong elements of all ranks (--check).
struct Row {
  std::size_t total = 0;  // elements
  double us = 0, algbw = 0, busbw = 0;
  std::int64_t wrong = 0;
};

Row time_size(Communicator& comm, const Args& a, double size, Buffers& b) {
  const int n = comm.size();
  const std::size_t es = size_of(a.dtype);
  Row row;
  row.total = static_cast<std::size_t>(size) / es;
  if (a.op == BenchOp::allgather || a.op == BenchOp::reduce_scatter)
    row.total -= row.total % static_cast<std::size_t>(n);
  b.send.assign(row.total * es + 64, std::byte{1});
  b.recv.assign(row.total * es + 64, std::byte{0});
  if (a.device) b.to_device();
  for (int i = 0; i < a.warmup; ++i) run_once_and_check(comm, a, row.total, false, b);
  comm.barrier();
  std::vector<double> times;
  const auto t0 = std::chrono::steady_clock::now();
  auto t_prev = t0;
  for (int i = 0; i < a.iters; ++i) {
    run_once_and_check(comm, a, row.total, false, b);
    const auto t = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::micro>(t - t_prev).count());
    t_prev = t;
  }
  row.us = std::chrono::duration<double, std::micro>(t_prev - t0).count() / a.iters;
  if (a.median) {
    std::sort(times.begin(), times.end());
    row.us = times[times.size() / 2];
  }
  comm.allreduce(&row.us, 1, DataType::f64, ReduceOp::max);
  row.wrong = a.check ? run_once_and_check(comm, a, row.total, true, b) : 0;
  if (a.check) comm.allreduce(&row.wrong, 1, DataType::i64, ReduceOp::sum);
  row.algbw = static_cast<double>(row.total * es) / row.us / 1e3;  // bytes/us = MB/s; /1e3 -> GB/s
  row.busbw = row.algbw * bus_factor(a.op, n);
  return row;
}

void print_row(const Args& a, int n, const Row& row) {
  const bool reduces = a.op == BenchOp::allreduce || a.op == BenchOp::reduce_scatter;
  const char* redop = reduces ? name_of(a.redop).data() : "none";
  const double bytes = static_cast<double>(row.total * size_of(a.dtype));
  char wrong_text[24] = "N/A";
  if (a.check) std::snprintf(wrong_text, sizeof wrong_text, "%lld", static_cast<long long>(row.wrong));
  if (a.json) {
    // JSON Lines, one object per size (docs/json.md, "bench"); "wrong" is null without --check.
    std::printf(
        "{\"schema\":1,\"op\":\"%s\",\"ranks\":%d,\"size\":%.0f,\"count\":%zu,\"type\":\"%s\","
        "\"redop\":%s,\"time_us\":%.2f,\"algbw\":%.4f,\"busbw\":%.4f,"
        "\"wrong\":%s}\n",
        a.op_name.c_str(), n, bytes, row.total, name_of(a.dtype).data(),
        reduces ? ("\"" + std::string(redop) + "\"").c_str() : "null", row.us, row.algbw, row.busbw,
        a.check ? wrong_text : "null");
  } else {
    std::printf(" %12.0f %12zu %6s %6s %11.2f %8.3f %8.3f %7s\n", bytes, row.total, name_of(a.dtype).data(),
                redop, row.us, row.algbw, row.busbw, wrong_text);
  }
  std::fflush(stdout);
  if (a.check && row.wrong != 0 && !a.json) std::printf("# WRONG results at size %.0f\n", bytes);
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
    if (a.ps) return bench_ps(a);
    // As torchrun-style workers: the device of this local rank is current before init.
    if (a.device) {
      const int local = detail::local_rank();
      try {
        detail::use_device_of_local_rank(local);
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
    if (r == 0 && !a.json) print_head(a, *comm);
    warm_up(*comm);
    Buffers b;
    double busbw_sum = 0;  // nccl-tests' closing average, over the sizes
    std::int64_t wrong_sum = 0;
    int rows = 0;
    for (double size : sizes(a)) {
      const Row row = time_size(*comm, a, size, b);
      busbw_sum += row.busbw, wrong_sum += row.wrong, ++rows;
      if (r == 0) print_row(a, n, row);
    }
    if (r == 0 && !a.json) {  // nccl-tests' closing lines, which scripts grep for
      if (a.check)
        std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong_sum),
                    wrong_sum == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %.3f\n#\n", rows ? busbw_sum / rows : 0.0);
      std::fflush(stdout);
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mltrain-comm-bench: out of memory for messages of up to %llu bytes: lower -e\n",
                 static_cast<unsigned long long>(a.max_bytes));
    return 1;
  }
}

}  // namespace mltrain::comm
