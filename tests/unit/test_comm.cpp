// libmltrain-comm: ranks run as threads in this process over the real transports (shared
// memory and TCP), like gloo's tests. Reference results are computed here in the same dtype
// semantics: integers exact (wrapping), floats within n*u*sum|x| (docs/comm.md).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "algorithms/collectives.h"
#include "core/nccl_probe.h"
#include "core/reduce.h"
#include "core/refusal_log.h"
#include "mltrain/comm.h"
#include "mltrain/comm.hpp"
#include "mltrain/comm_stats.h"
#include "rendezvous/blame.h"
#include "rendezvous/records.h"
#include "rendezvous/store.h"
#include "rendezvous/store_wire.h"
#include "transport/nccl.h"
#include "transport/progress.h"
#include "transport/socket.h"
#include "transport/tcp_link.h"

using namespace mltrain::comm;
using namespace std::chrono_literals;

namespace {

struct World {
  int size;
  Transport transport;
};

// Runs fn(comm) on `size` threads, each with its own Communicator; rethrows the first failure.
void run_ranks(int size, Transport transport, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = 20s, const std::function<void(Options&)>& tweak = {}) {
  detail::StoreServer server(0, "secret");
  std::vector<std::thread> threads;
  std::mutex mu;
  std::string failure;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        Options o;
        o.rank = r;
        o.world_size = size;
        o.store_addr = "127.0.0.1:" + std::to_string(server.port());
        o.token = "secret";
        o.host_store = false;
        o.timeout = timeout;
        o.transport = transport;
        o.host = "testhost";
        o.spin_us = 5;
        o.shm_bytes = 256u << 10;  // small rings: exercise wrap-around and back-pressure
        o.chunk_bytes = 32u << 10;
        o.small_bytes = 16u << 10;
        if (tweak) tweak(o);
        auto comm = Communicator::create(o);
        fn(*comm);
      } catch (const std::exception& e) {
        std::lock_guard lock(mu);
        if (failure.empty()) failure = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!failure.empty()) FAIL(failure);
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Input element i of rank r, as a double exactly representable in dtype.
double input(DataType dt, ReduceOp op, int r, std::size_t i) {
  const std::uint64_t h =
      mix(i * 131 + static_cast<std::uint64_t>(r) * 7919 + static_cast<std::uint64_t>(op));
  const double unit = static_cast<double>(h >> 11) / 9007199254740992.0;  // [0,1)
  const bool integral = dt == DataType::i32 || dt == DataType::i64 || dt == DataType::u8;
  double v;
  if (op == ReduceOp::prod)
    v = integral ? static_cast<double>(1 + h % 2) : 0.9 + 0.2 * unit;
  else if (integral)
    v = dt == DataType::u8 ? static_cast<double>(h % 7)
                           : static_cast<double>(static_cast<std::int64_t>(h % 2001) - 1000);
  else
    v = 2 * unit - 1;
  if (dt == DataType::f16) v = detail::f16_to_f32(detail::f32_to_f16(static_cast<float>(v)));
  if (dt == DataType::bf16) v = detail::bf16_to_f32(detail::f32_to_bf16(static_cast<float>(v)));
  if (dt == DataType::f32) v = static_cast<float>(v);
  return v;
}

double unit_roundoff(DataType dt) {
  switch (dt) {
    case DataType::f32:
      return std::ldexp(1.0, -24);
    case DataType::f64:
      return std::ldexp(1.0, -53);
    case DataType::f16:
      return std::ldexp(1.0, -11);
    case DataType::bf16:
      return std::ldexp(1.0, -8);
    default:
      return 0;
  }
}

// Integer reference in the dtype's wrapping arithmetic.
std::int64_t wrap(DataType dt, std::int64_t v) {
  if (dt == DataType::i32) return static_cast<std::int32_t>(static_cast<std::uint32_t>(v));
  if (dt == DataType::u8) return static_cast<std::uint8_t>(v);
  return v;
}

// Checks element i of a reduced result; returns an error text or empty.
std::string check_reduced(DataType dt, ReduceOp op, int n, std::size_t i, double got) {
  const bool integral = dt == DataType::i32 || dt == DataType::i64 || dt == DataType::u8;
  if (integral) {
    std::int64_t acc = static_cast<std::int64_t>(input(dt, op, 0, i));
    for (int r = 1; r < n; ++r) {
      const auto v = static_cast<std::int64_t>(input(dt, op, r, i));
      switch (op) {
        case ReduceOp::prod:
          acc = wrap(
              dt, static_cast<std::int64_t>(static_cast<std::uint64_t>(acc) * static_cast<std::uint64_t>(v)));
          break;
        case ReduceOp::min:
          acc = std::min(acc, v);
          break;
        case ReduceOp::max:
          acc = std::max(acc, v);
          break;
        default:
          acc = wrap(
              dt, static_cast<std::int64_t>(static_cast<std::uint64_t>(acc) + static_cast<std::uint64_t>(v)));
      }
    }
    if (op == ReduceOp::avg) acc /= n;
    if (static_cast<double>(acc) == got) return {};
    return "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(acc);
  }
  double exact = input(dt, op, 0, i), magnitude = std::fabs(exact);
  for (int r = 1; r < n; ++r) {
    const double v = input(dt, op, r, i);
    switch (op) {
      case ReduceOp::prod:
        exact *= v;
        break;
      case ReduceOp::min:
        exact = std::min(exact, v);
        break;
      case ReduceOp::max:
        exact = std::max(exact, v);
        break;
      default:
        exact += v;
        magnitude += std::fabs(v);
    }
  }
  // The reference is computed in double: near exact for the narrower types, but for f64 it
  // rounds as often as the result does, so the two may differ by both errors.
  const double u = unit_roundoff(dt) * (dt == DataType::f64 ? 2 : 1);
  double tol = 0;
  if (op == ReduceOp::sum) tol = n * u * magnitude;
  if (op == ReduceOp::avg) {
    exact /= n;
    tol = 2 * u * magnitude;
  }
  if (op == ReduceOp::prod) tol = n * u * std::fabs(exact);
  tol += 1e-7 * (dt == DataType::f16);  // f16 subnormal spacing (6e-8)
  if (std::fabs(got - exact) <= tol) return {};
  return "element " + std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(exact) +
         " +- " + std::to_string(tol);
}

// Rank r's input elements salt .. salt+count-1, stored in the dtype.
std::vector<std::byte> inputs(DataType dt, ReduceOp op, int r, std::size_t count, std::size_t salt = 0) {
  std::vector<std::byte> v(count * size_of(dt));
  for (std::size_t i = 0; i < count; ++i)
    detail::store_from_double(v.data(), i, dt, input(dt, op, r, i + salt));
  return v;
}

// The first wrong element of a reduced result of inputs(..., salt) over n ranks, or empty.
std::string first_wrong(DataType dt, ReduceOp op, int n, const void* got, std::size_t count,
                        std::size_t salt = 0) {
  for (std::size_t i = 0; i < count; ++i)
    if (auto why = check_reduced(dt, op, n, i + salt, detail::load_as_double(got, i, dt)); !why.empty())
      return why;
  return {};
}

const DataType kDtypes[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,
                            DataType::i32, DataType::i64, DataType::u8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};

struct Shared {
  std::mutex mu;
  std::vector<std::vector<std::byte>> results;  // per rank, for the bitwise-equality check
  std::string first_error;
  void error(const std::string& e) {
    std::lock_guard lock(mu);
    if (first_error.empty()) first_error = e;
  }
};

// Every op x dtype x count for one world; large counts only where `large` says.
void exercise(Communicator& c, const std::vector<std::size_t>& counts, Shared& shared, bool large_subset) {
  const int n = c.size(), r = c.rank();
  std::size_t case_no = 0;
  for (std::size_t count : counts) {
    const bool big = count > 100000;
    for (DataType dt : kDtypes) {
      if (big && large_subset && dt != DataType::f32 && dt != DataType::i64 && dt != DataType::bf16) continue;
      const std::size_t es = size_of(dt);
      for (ReduceOp op : kOps) {
        if (big && large_subset && op != ReduceOp::sum && !(dt == DataType::i64 && op == ReduceOp::max))
          continue;
        const bool inplace = (++case_no % 2) == 0;
        // allreduce
        std::vector<std::byte> in(count * es + 8), out(count * es + 8);
        for (std::size_t i = 0; i < count; ++i)
          detail::store_from_double(in.data(), i, dt, input(dt, op, r, i));
        if (inplace) {
          c.allreduce(in.data(), count, dt, op);
          out = in;
        } else {
          c.allreduce(in.data(), out.data(), count, dt, op);
        }
        for (std::size_t i = 0; i < count; ++i) {
          auto e = check_reduced(dt, op, n, i, detail::load_as_double(out.data(), i, dt));
          if (!e.empty()) {
            shared.error("allreduce " + std::string(name_of(dt)) + " " + std::string(name_of(op)) +
                         " count " + std::to_string(count) + " world " + std::to_string(n) + ": " + e);
            break;
          }
        }
        out.resize(count * es);
        shared.results[static_cast<std::size_t>(r)] = out;
        c.barrier();
        if (shared.results[static_cast<std::size_t>(r)] != shared.results[0])
          shared.error("allreduce results differ between rank 0 and rank " + std::to_string(r));
        c.barrier();
        // reduce_scatter: input n*count, this rank's block back
        std::vector<std::byte> rs_in(count * es * static_cast<std::size_t>(n) + 8), rs_out(count * es + 8);
        for (std::size_t i = 0; i < count * static_cast<std::size_t>(n); ++i)
          detail::store_from_double(rs_in.data(), i, dt, input(dt, op, r, i));
        if (inplace) {
          c.reduce_scatter(rs_in.data(), rs_in.data() + static_cast<std::size_t>(r) * count * es, count, dt,
                           op);
          std::memcpy(rs_out.data(), rs_in.data() + static_cast<std::size_t>(r) * count * es, count * es);
        } else {
          c.reduce_scatter(rs_in.data(), rs_out.data(), count, dt, op);
        }
        for (std::size_t i = 0; i < count; ++i) {
          const std::size_t gi = static_cast<std::size_t>(r) * count + i;
          auto e = check_reduced(dt, op, n, gi, detail::load_as_double(rs_out.data(), i, dt));
          if (!e.empty()) {
            shared.error("reduce_scatter " + std::string(name_of(dt)) + " " + std::string(name_of(op)) +
                         " count " + std::to_string(count) + " world " + std::to_string(n) + ": " + e);
            break;
          }
        }
      }
      // broadcast from a rotating root
      const int root = static_cast<int>(case_no % static_cast<std::size_t>(n));
      std::vector<std::byte> b(count * es + 8);
      for (std::size_t i = 0; i < count; ++i)
        detail::store_from_double(b.data(), i, dt, r == root ? input(dt, ReduceOp::sum, root, i) : 0.0);
      c.broadcast(b.data(), count, dt, root);
      for (std::size_t i = 0; i < count; ++i)
        if (detail::load_as_double(b.data(), i, dt) != input(dt, ReduceOp::sum, root, i)) {
          shared.error("broadcast " + std::string(name_of(dt)) + " count " + std::to_string(count) +
                       " root " + std::to_string(root) + " element " + std::to_string(i));
          break;
        }
      // allgather
      std::vector<std::byte> mine(count * es + 8), all(count * es * static_cast<std::size_t>(n) + 8);
      for (std::size_t i = 0; i < count; ++i)
        detail::store_from_double(mine.data(), i, dt, input(dt, ReduceOp::max, r, i));
      c.allgather(mine.data(), all.data(), count, dt);
      for (int q = 0; q < n; ++q)
        for (std::size_t i = 0; i < count; ++i)
          if (detail::load_as_double(all.data(), static_cast<std::size_t>(q) * count + i, dt) !=
              input(dt, ReduceOp::max, q, i)) {
            shared.error("allgather " + std::string(name_of(dt)) + " count " + std::to_string(count) +
                         " block " + std::to_string(q) + " element " + std::to_string(i));
            q = n;
            break;
          }
    }
  }
}

void correctness(int n, Transport transport, bool with_large, bool large_subset = true) {
  Shared shared;
  shared.results.resize(static_cast<std::size_t>(n));
  std::vector<std::size_t> counts{0, 1, 7};
  if (n > 1) counts.push_back(static_cast<std::size_t>(n - 1));
  if (with_large) counts.push_back((1u << 20) + 3);
  run_ranks(n, transport, [&](Communicator& c) { exercise(c, counts, shared, large_subset); });
  CHECK_MESSAGE(shared.first_error.empty(), shared.first_error);
}

}  // namespace

TEST_CASE("reduce kernels: f16/bf16 conversions round to nearest even") {
  CHECK(detail::f16_to_f32(detail::f32_to_f16(1.0f)) == 1.0f);
  CHECK(detail::f16_to_f32(detail::f32_to_f16(65504.0f)) == 65504.0f);
  CHECK(std::isinf(detail::f16_to_f32(detail::f32_to_f16(70000.0f))));
  CHECK(detail::f16_to_f32(detail::f32_to_f16(1.0f + 1.0f / 4096)) == 1.0f);  // tie to even
  CHECK(detail::f16_to_f32(detail::f32_to_f16(5.96e-8f)) == doctest::Approx(5.96e-8f));
  CHECK(detail::bf16_to_f32(detail::f32_to_bf16(1.00390625f)) == 1.0f);  // tie to even
  CHECK(std::isnan(detail::bf16_to_f32(detail::f32_to_bf16(std::nanf("")))));
}

TEST_CASE(
    "reduce kernels: the fused n-source kernel gives the bytes of the binary passes, dst as src[0] too") {
  const DataType dtypes[] = {DataType::f32, DataType::f64, DataType::f16, DataType::bf16,
                             DataType::i32, DataType::i64, DataType::u8};
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg};
  for (const DataType dt : dtypes)
    for (const ReduceOp op : ops)
      for (int n = 1; n <= 9; ++n)
        for (const std::size_t count : {std::size_t{1}, std::size_t{5}, std::size_t{67}}) {
          CAPTURE(static_cast<int>(dt));
          CAPTURE(static_cast<int>(op));
          CAPTURE(n);
          CAPTURE(count);
          const std::size_t bytes = count * size_of(dt);
          std::vector<std::vector<std::byte>> in(static_cast<std::size_t>(n), std::vector<std::byte>(bytes));
          std::vector<const void*> src;
          for (int j = 0; j < n; ++j) {
            for (std::size_t i = 0; i < count; ++i)
              detail::store_from_double(in[static_cast<std::size_t>(j)].data(), i, dt, input(dt, op, j, i));
            src.push_back(in[static_cast<std::size_t>(j)].data());
          }
          // The reference: binary passes in rank order, then the divide.
          std::vector<std::byte> want(in[0]);
          const detail::ReduceFn fn = detail::reduce_fn(dt, op);
          for (int j = 1; j < n; ++j) fn(want.data(), want.data(), src[static_cast<std::size_t>(j)], count);
          if (op == ReduceOp::avg) detail::finalize_avg(want.data(), count, dt, n);

          std::vector<std::byte> got(bytes, std::byte{0x5a});
          detail::reduce_many_fn(dt, op)(got.data(), src.data(), n, count);
          CHECK(got == want);
          detail::reduce_many_fn(dt, op)(in[0].data(), src.data(), n, count);  // in place over rank 0's input
          CHECK(in[0] == want);
        }
}

TEST_CASE("store: set/get/wait/add, and a wrong token is refused") {
  detail::StoreServer server(0, "tok");
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto dl = [] { return detail::Clock::now() + 5s; };
  detail::StoreClient a(addr, "tok", 0, dl());
  detail::StoreClient b(addr, "tok", 1, dl());
  CHECK_FALSE(a.get("k", dl()).has_value());
  std::thread setter([&] {
    std::this_thread::sleep_for(20ms);
    b.set("k", "value", dl());
  });
  CHECK(a.wait("k", dl()) == "value");
  setter.join();
  CHECK(*b.get("k", dl()) == "value");
  CHECK(a.add("n", 2, dl()) == 2);
  CHECK(b.add("n", 3, dl()) == 5);
  try {
    detail::StoreClient bad(addr, "wrong", 7, dl());
    FAIL("wrong token accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == Error::Kind::store);
    CHECK(std::string(e.what()).find("wrong MLTRAIN_TOKEN") != std::string::npos);
  }
  CHECK_THROWS_AS(a.wait("never", detail::Clock::now() + 50ms), Error);
}

TEST_CASE("store: adding to a value that is not an integer drops that client, not the store") {
  detail::StoreServer server(0, "tok");
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto dl = [] { return detail::Clock::now() + 5s; };
  detail::StoreClient a(addr, "tok", 0, dl());
  a.set("k", "not a number", dl());
  CHECK_THROWS_AS(a.add("k", 1, dl()), Error);
  detail::StoreClient b(addr, "tok", 1, dl());
  CHECK(*b.get("k", dl()) == "not a number");
  CHECK(b.add("n", 4, dl()) == 4);
}

TEST_CASE("store: a wrong token learns nothing, not even the wire version") {
  detail::StoreServer server(0, "tok");
  detail::Fd fd = detail::connect_tcp("127.0.0.1", server.port(), detail::Clock::now() + 5s, "store");
  std::string hello;
  detail::wire::Hello{detail::wire::kStoreMagic, 999, 3, 5}.put_to(hello);
  hello += "wrong";
  detail::send_all(fd.get(), hello.data(), hello.size(), detail::Clock::now() + 5s, "store");
  char head[detail::wire::HelloReply::kSize];
  detail::recv_all(fd.get(), head, sizeof head, detail::Clock::now() + 5s, "store");
  const auto reply = detail::wire::HelloReply::from(head);
  CHECK(reply.status == detail::wire::kBadToken);
  CHECK(reply.version == 0);
}

TEST_CASE("store: idle strangers past the caps do not keep a rank out") {
  detail::StoreServer server(0, "tok");
  const int port = server.port();
  std::vector<detail::Fd> strangers;  // more than the per-peer and total caps, all silent
  for (size_t i = 0; i < detail::StoreServer::kMaxUnproven + 40; ++i)
    strangers.push_back(detail::connect_tcp("127.0.0.1", port, detail::Clock::now() + 5s, "store"));
  const auto t0 = detail::Clock::now();
  detail::StoreClient a("127.0.0.1:" + std::to_string(port), "tok", 0, detail::Clock::now() + 10s);
  a.set("k", "v", detail::Clock::now() + 5s);
  CHECK(*a.get("k", detail::Clock::now() + 5s) == "v");
  CHECK(detail::Clock::now() - t0 < detail::StoreServer::kHelloWithin);  // not after the strangers time out
}

// The unit tier runs a representative of each matrix below; the whole matrix is the comm tier's
// (test suite comm_matrix: ctest comm_matrix, label comm).
TEST_CASE("collectives: every op x dtype x count, world 1 and 3, shared memory and TCP (small counts)") {
  for (int n : {1, 3}) {
    CAPTURE(n);
    correctness(n, Transport::shm, false);
  }
  correctness(3, Transport::tcp, false);
}

TEST_CASE("collectives: every op x dtype x count, world 1..8, shared memory" *
          doctest::test_suite("comm_matrix")) {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    correctness(n, Transport::shm, n == 2 || n == 3);
  }
}

TEST_CASE("collectives: every op x dtype x count, world 2..8, TCP" * doctest::test_suite("comm_matrix")) {
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    correctness(n, Transport::tcp, n == 3);  // 1M+3 over TCP: one world (time budget)
  }
}

// The whole matrix with 1M+3 elements for every op, dtype and world: minutes on 2 cores, so it is
// a test suite of its own (comm_full), run as its own ctest (comm_full_matrix, label comm) rather
// than in the unit tier or with the comm_matrix suite.
TEST_CASE("collectives: full matrix, 1M+3 for every op x dtype x world" * doctest::test_suite("comm_full")) {
  for (int n : {1, 2, 3, 4, 8}) {
    CAPTURE(n);
    correctness(n, Transport::shm, true, false);
  }
  for (int n : {2, 3, 4, 8}) {
    CAPTURE(n);
    correctness(n, Transport::tcp, true, false);
  }
}

TEST_CASE("allreduce: large messages take the pipelined ring, results bitwise equal on all ranks") {
  for (Transport t : {Transport::shm, Transport::tcp}) {
    std::vector<std::vector<float>> got(4);
    run_ranks(4, t, [&](Communicator& c) {
      std::vector<float> v((1u << 20) + 3);
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<float>(input(DataType::f32, ReduceOp::sum, c.rank(), i));
      c.allreduce(v.data(), v.size(), DataType::f32, ReduceOp::sum);
      got[static_cast<std::size_t>(c.rank())] = std::move(v);
    });
    for (int r = 1; r < 4; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
    for (std::size_t i = 0; i < got[0].size(); i += 4099)
      CHECK(check_reduced(DataType::f32, ReduceOp::sum, 4, i, got[0][i]) == "");
  }
}

namespace {

using DtypeOps = std::vector<std::pair<DataType, ReduceOp>>;

// Every algorithm over TCP on each world, in and out of place, for each dtype and op.
void algorithms_case(const std::vector<int>& worlds, const DtypeOps& dtype_ops) {
  // hd on a world that is not a power of two falls back to the ring (every rank the same way).
  for (Algo algo : {Algo::ring, Algo::bidir, Algo::hd, Algo::automatic}) {
    for (int n : worlds) {
      for (bool inplace : {false, true}) {
        for (auto [dt, op] : dtype_ops) {
          CAPTURE(static_cast<int>(algo));
          CAPTURE(n);
          CAPTURE(inplace);
          CAPTURE(name_of(dt));
          CAPTURE(name_of(op));
          const std::size_t count = 100003;  // odd: halves and segments of unequal length
          const std::size_t es = size_of(dt);
          std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
          run_ranks(
              n, Transport::tcp,
              [&](Communicator& c) {
                std::vector<std::byte> in = inputs(dt, op, c.rank(), count), out(count * es);
                if (inplace) {
                  c.allreduce(in.data(), count, dt, op);
                  out = in;
                } else {
                  c.allreduce(in.data(), out.data(), count, dt, op);
                }
                got[static_cast<std::size_t>(c.rank())] = std::move(out);
              },
              20s, [&](Options& o) { o.algo = algo; });
          for (int r = 1; r < n; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
          const std::string wrong = first_wrong(dt, op, n, got[0].data(), count);
          CHECK_MESSAGE(wrong.empty(), wrong);
        }
      }
    }
  }
}

// The direct allreduce on each world, in and out of place, for each dtype and op; counts from one
// element to past three chunks, and 100003 with `large`.
void direct_case(const std::vector<int>& worlds, const DtypeOps& dtype_ops, bool large) {
  // Slots of 8 KiB + 40 bytes: many chunks, chunk and segment edges at odd places; small_bytes 0
  // so every size takes it, down to chunks with fewer elements than ranks (empty segments).
  const std::size_t slot = (8u << 10) + 40;
  for (int n : worlds) {
    for (bool inplace : {false, true}) {
      for (auto [dt, op] : dtype_ops) {
        const std::size_t es = size_of(dt);
        const std::size_t chunk = slot / es;
        std::vector<std::size_t> counts{1, 5, 3 * chunk + 2};
        if (large) counts.push_back(100003);
        for (std::size_t count : counts) {
          CAPTURE(n);
          CAPTURE(inplace);
          CAPTURE(name_of(dt));
          CAPTURE(name_of(op));
          CAPTURE(count);
          std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
          std::atomic<int> direct{0};
          run_ranks(
              n, Transport::shm,
              [&](Communicator& c) {
                direct += c.algo() == Algo::direct;
                std::vector<std::byte> in = inputs(dt, op, c.rank(), count), out(count * es);
                // Twice: the second call's chunks continue the first's counters.
                for (int rep = 0; rep < 2; ++rep) {
                  std::vector<std::byte> buf = in;
                  if (inplace) {
                    c.allreduce(buf.data(), count, dt, op);
                    out = buf;
                  } else {
                    c.allreduce(in.data(), out.data(), count, dt, op);
                  }
                }
                got[static_cast<std::size_t>(c.rank())] = std::move(out);
              },
              20s,
              [&](Options& o) {
                o.shm_bytes = slot;
                o.small_bytes = 0;
              });
          CHECK(direct == n);
          for (int r = 1; r < n; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
          const std::string wrong = first_wrong(dt, op, n, got[0].data(), count);
          CHECK_MESSAGE(wrong.empty(), wrong);
        }
      }
    }
  }
}

const DtypeOps kEveryDtypeOnce = {{DataType::f32, ReduceOp::sum}, {DataType::f64, ReduceOp::avg},
                                  {DataType::f16, ReduceOp::sum}, {DataType::bf16, ReduceOp::avg},
                                  {DataType::i32, ReduceOp::max}, {DataType::i64, ReduceOp::min},
                                  {DataType::u8, ReduceOp::prod}};

}  // namespace

TEST_CASE(
    "allreduce: algorithms ring, bidir and hd give the reference result, world 3 and 4 (f32 sum, f64 avg)") {
  algorithms_case({3, 4}, {{DataType::f32, ReduceOp::sum}, {DataType::f64, ReduceOp::avg}});
}

TEST_CASE("allreduce: algorithms ring, bidir and hd give the reference result (bitwise equal on all ranks)" *
          doctest::test_suite("comm_matrix")) {
  algorithms_case(
      {3, 4, 8},
      {{DataType::f32, ReduceOp::sum}, {DataType::i32, ReduceOp::max}, {DataType::f64, ReduceOp::avg}});
}

TEST_CASE("allreduce: direct gives the reference result, world 3, f32 sum and u8 prod, up to past 3 chunks") {
  direct_case({3}, {{DataType::f32, ReduceOp::sum}, {DataType::u8, ReduceOp::prod}}, false);
}

TEST_CASE(
    "allreduce: direct (one shared segment on one host) gives the reference result, bitwise equal on all "
    "ranks" *
    doctest::test_suite("comm_matrix")) {
  direct_case({2, 3, 4, 8}, kEveryDtypeOnce, true);
}

TEST_CASE("allreduce_shared: on one host the result lands in one shared region, buf keeps its input") {
  const std::size_t slot = (8u << 10) + 40;
  for (int n : {2, 3, 4}) {
    for (auto [dt, op] : {std::pair{DataType::f32, ReduceOp::avg}, std::pair{DataType::i64, ReduceOp::sum},
                          std::pair{DataType::bf16, ReduceOp::sum}}) {
      CAPTURE(n);
      CAPTURE(name_of(dt));
      const std::size_t es = size_of(dt);
      std::atomic<int> bad{0};
      std::mutex mu;
      std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
      run_ranks(
          n, Transport::shm,
          [&](Communicator& c) {
            auto fill = [&](std::size_t count, int salt) { return inputs(dt, op, c.rank(), count, salt); };
            auto reference_ok = [&](const void* at, std::size_t count, int salt) {
              return first_wrong(dt, op, n, at, count, salt).empty();
            };
            const std::size_t count = 5 * (slot / es) + 7;
            const void* first = nullptr;
            for (int rep = 0; rep < 3; ++rep) {
              auto buf = fill(count, rep);
              const auto before = buf;
              const void* at = c.allreduce_shared(buf.data(), count, dt, op, 7);
              if (at == buf.data() || buf != before || !reference_ok(at, count, rep)) ++bad;
              if (rep == 0) first = at;
              if (at != first) ++bad;  // the key's region is kept while its size is
              // A plain allreduce between shared ones: the chunk counters stay in step.
              auto plain = fill(count / 2 + 1, 3);
              c.allreduce(plain.data(), count / 2 + 1, dt, op);
              if (!reference_ok(plain.data(), count / 2 + 1, 3)) ++bad;
            }
            // The same key with another size, and a second key alive at once.
            auto small = fill(100, 0), other = fill(count, 1);
            const void* a = c.allreduce_shared(small.data(), 100, dt, op, 7);
            const void* b = c.allreduce_shared(other.data(), count, dt, op, 8);
            if (a == b || !reference_ok(a, 100, 0) || !reference_ok(b, count, 1)) ++bad;
            std::lock_guard lock(mu);
            got[static_cast<std::size_t>(c.rank())].assign(static_cast<const std::byte*>(b),
                                                           static_cast<const std::byte*>(b) + count * es);
            c.release_shared(7);
            c.release_shared(8);
          },
          20s,
          [&](Options& o) {
            o.shm_bytes = slot;
            o.small_bytes = 0;
          });
      CHECK(bad == 0);
      for (int r = 1; r < n; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
    }
  }
}

namespace {

// A rank's input in a shared file (a memfd named after the rank), at a byte offset of its own.
struct InputFile {
  int fd = -1;
  std::byte* map = nullptr;
  std::size_t len = 0, offset = 0;
  InputFile(int rank, std::size_t bytes)
      : len(64 * 8 + bytes + 1), offset(64 * static_cast<std::size_t>(rank + 1)) {
    const std::string name = "mltrain-test-input-" + std::to_string(rank);
    fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(len)) == 0);
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    REQUIRE(p != MAP_FAILED);
    map = static_cast<std::byte*>(p);
  }
  ~InputFile() {
    ::munmap(map, len);
    ::close(fd);
  }
  std::byte* buf() const { return map + offset; }
  SharedFile file() const { return {fd, offset}; }
};

// How many mappings of rank r's input file this process holds.
int mappings_of_input(int r) {
  std::FILE* f = std::fopen("/proc/self/maps", "r");
  REQUIRE(f != nullptr);
  const std::string name = "memfd:mltrain-test-input-" + std::to_string(r) + " ";
  int found = 0;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    std::string l(line);
    if (l.find(name) != std::string::npos ||
        l.find(name.substr(0, name.size() - 1) + "\n") != std::string::npos)
      ++found;
  }
  std::fclose(f);
  return found;
}

// allreduce_shared and allreduce_mapped over inputs in files, on each world, for each dtype and op.
void shared_inputs_case(const std::vector<int>& worlds, const DtypeOps& dtype_ops) {
  // Blocks of 256 KiB: a count past three of them puts block edges inside every segment.
  for (bool into_inputs : {false, true}) {
    for (int n : worlds) {
      for (auto [dt, op] : dtype_ops) {
        const std::size_t es = size_of(dt);
        for (std::size_t count : {std::size_t{1}, std::size_t{5}, 3 * n * ((256u << 10) / es) + 7}) {
          CAPTURE(into_inputs);
          CAPTURE(n);
          CAPTURE(name_of(dt));
          CAPTURE(count);
          std::atomic<int> bad{0}, mapped{0};
          std::mutex mu;
          std::vector<std::vector<std::byte>> got(static_cast<std::size_t>(n));
          run_ranks(n, Transport::shm, [&](Communicator& c) {
            const int r = c.rank();
            InputFile in(r, count * es);
            const auto input = inputs(dt, op, r, count);
            const SharedFile file = in.file();
            const void* at = in.buf();
            for (int rep = 0; rep < 2; ++rep) {  // the second call reuses the peers' mappings
              std::memcpy(in.buf(), input.data(), input.size());  // nobody writes it after a call
              if (into_inputs) {
                c.allreduce_mapped(in.buf(), count, dt, op, 5, file);
              } else {
                at = c.allreduce_shared(in.buf(), count, dt, op, 5, &file);
                if (at == in.buf() || std::memcmp(in.buf(), input.data(), input.size()) != 0) ++bad;
              }
              if (!first_wrong(dt, op, n, at, count).empty()) ++bad;
            }
            std::vector<std::byte> mine(static_cast<const std::byte*>(at),
                                        static_cast<const std::byte*>(at) + count * es);
            // The staged path (no file) reduces in the same order: the same bytes.
            auto plain = input;
            const void* staged = c.allreduce_shared(plain.data(), count, dt, op, 6);
            if (std::memcmp(staged, mine.data(), mine.size()) != 0) ++bad;
            c.barrier();
            // Every peer mapped this rank's file: its own mapping and one per peer, in this process.
            if (mappings_of_input(r) == n) ++mapped;
            c.barrier();
            c.release_shared(5);
            c.release_shared(6);
            std::lock_guard lock(mu);
            got[static_cast<std::size_t>(r)] = std::move(mine);
          });
          CHECK(bad == 0);
          CHECK(mapped == n);
          for (int r = 1; r < n; ++r) CHECK(got[static_cast<std::size_t>(r)] == got[0]);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("inputs in shared files: allreduce_shared and allreduce_mapped, world 3, f32 avg and u8 max") {
  shared_inputs_case({3}, {{DataType::f32, ReduceOp::avg}, {DataType::u8, ReduceOp::max}});
}

TEST_CASE(
    "inputs in shared files: allreduce_shared reads them where they lie, allreduce_mapped writes every "
    "rank's result into them; the staged path's bytes" *
    doctest::test_suite("comm_matrix")) {
  shared_inputs_case({2, 3, 4}, {{DataType::f32, ReduceOp::avg},
                                 {DataType::i64, ReduceOp::sum},
                                 {DataType::bf16, ReduceOp::sum},
                                 {DataType::u8, ReduceOp::max}});
}

TEST_CASE("shared files: one rank without one (none, or a pipe) makes every rank stage") {
  // Rank 1 passes no file (allreduce_shared only), or a pipe: every rank stages (the peers never
  // map rank 0's file); allreduce_mapped stages in place.
  for (int mode : {0, 1, 2}) {  // shared without a file, shared with a pipe, mapped with a pipe
    CAPTURE(mode);
    const int n = 3;
    const std::size_t count = 300001;
    std::atomic<int> bad{0}, unmapped{0};
    run_ranks(n, Transport::shm, [&](Communicator& c) {
      const int r = c.rank();
      InputFile in(r, count * sizeof(float));
      const auto input = inputs(DataType::f32, ReduceOp::sum, r, count);
      std::memcpy(in.buf(), input.data(), input.size());
      int p[2] = {-1, -1};
      REQUIRE(::pipe(p) == 0);
      const SharedFile file = r == 1 ? SharedFile{p[0], 0} : in.file();
      const void* at = in.buf();
      if (mode == 2)
        c.allreduce_mapped(in.buf(), count, DataType::f32, ReduceOp::sum, 9, file);
      else
        at = c.allreduce_shared(in.buf(), count, DataType::f32, ReduceOp::sum, 9,
                                r == 1 && mode == 0 ? nullptr : &file);
      if (!first_wrong(DataType::f32, ReduceOp::sum, n, at, count).empty()) ++bad;
      c.barrier();
      if (mappings_of_input(r) == 1) ++unmapped;
      c.barrier();
      c.release_shared(9);
      ::close(p[0]);
      ::close(p[1]);
    });
    CHECK(bad == 0);
    CHECK(unmapped == n);
  }
}

TEST_CASE("shared-file calls on one key: a new file on one rank, or writing where it read, maps again") {
  // Calls 2 and 5 find everything as the call before left it (no vote); the others must not.
  const int n = 3;
  const std::size_t count = 200003;
  std::atomic<int> bad{0};
  run_ranks(n, Transport::shm, [&](Communicator& c) {
    const int r = c.rank();
    InputFile a(r, count * sizeof(float)), b(r, count * sizeof(float));
    const auto input = inputs(DataType::f32, ReduceOp::sum, r, count);
    for (int call = 1; call <= 6; ++call) {
      const InputFile& in = (call == 3 || call == 6) && r == 1 ? b : a;  // rank 1 moves, and back
      std::memcpy(in.buf(), input.data(), input.size());
      const SharedFile file = in.file();
      const void* at = in.buf();
      if (call <= 3)
        at = c.allreduce_shared(in.buf(), count, DataType::f32, ReduceOp::sum, 11, &file);
      else
        c.allreduce_mapped(in.buf(), count, DataType::f32, ReduceOp::sum, 11, file);
      if (!first_wrong(DataType::f32, ReduceOp::sum, n, at, count).empty()) ++bad;
      if (call <= 3 && std::memcmp(in.buf(), input.data(), input.size()) != 0) ++bad;  // kept its input
    }
    c.barrier();
    c.release_shared(11);
  });
  CHECK(bad == 0);
}

TEST_CASE("allreduce_mapped beside allreduce_shared on one key: when one rank asks, all get it in place") {
  // Call by call, which ranks call allreduce_mapped (the others allreduce_shared): rank 0 alone
  // (rank 0 then makes no region), rank 2 alone (rank 0's region waits unused), nobody (the
  // region again, buf keeps its input), everybody, and rank 1 without a file among mapped ranks.
  const std::vector<std::vector<int>> mapped_by = {{0}, {2}, {}, {0, 1, 2}, {0, 2}};
  const int n = 3;
  const std::size_t count = 150001;
  std::atomic<int> bad{0};
  run_ranks(n, Transport::shm, [&](Communicator& c) {
    const int r = c.rank();
    InputFile in(r, count * sizeof(float));
    const auto input = inputs(DataType::f32, ReduceOp::sum, r, count);
    for (std::size_t call = 0; call < mapped_by.size(); ++call) {
      const auto& m = mapped_by[call];
      const bool anyone = !m.empty(), me = std::find(m.begin(), m.end(), r) != m.end();
      std::memcpy(in.buf(), input.data(), input.size());
      const SharedFile file = in.file();
      const void* at = in.buf();
      if (me)
        c.allreduce_mapped(in.buf(), count, DataType::f32, ReduceOp::sum, 4, file);
      else
        at = c.allreduce_shared(in.buf(), count, DataType::f32, ReduceOp::sum, 4,
                                call == 4 && r == 1 ? nullptr : &file);
      if ((at == in.buf()) != anyone) ++bad;  // in place exactly when some rank asked for it
      if (!first_wrong(DataType::f32, ReduceOp::sum, n, at, count).empty()) ++bad;
    }
    c.barrier();
    c.release_shared(4);
  });
  CHECK(bad == 0);
}

TEST_CASE("allreduce_shared: across the links (no group) it reduces buf in place and returns it") {
  std::atomic<int> bad{0};
  run_ranks(3, Transport::tcp, [&](Communicator& c) {
    std::vector<float> v(100000);
    for (std::size_t i = 0; i < v.size(); ++i)
      v[i] = static_cast<float>(input(DataType::f32, ReduceOp::sum, c.rank(), i));
    if (c.allreduce_shared(v.data(), v.size(), DataType::f32, ReduceOp::sum, 1) != v.data()) ++bad;
    for (std::size_t i = 0; i < v.size(); i += 997)
      if (!check_reduced(DataType::f32, ReduceOp::sum, 3, i, v[i]).empty()) ++bad;
  });
  CHECK(bad == 0);
}

TEST_CASE("allreduce_shared: ranks that pass different keys fail naming both calls") {
  std::atomic<int> named{0};
  run_ranks(
      2, Transport::shm,
      [&](Communicator& c) {
        std::vector<float> v(100000);
        try {
          c.allreduce_shared(v.data(), v.size(), DataType::f32, ReduceOp::sum, c.rank() == 0 ? 1 : 2);
        } catch (const Error& e) {
          const std::string what = e.what();
          if (e.kind() == Error::Kind::mismatch && what.find("shared result 1") != std::string::npos &&
              what.find("shared result 2") != std::string::npos)
            ++named;
        }
      },
      5s);
  CHECK(named == 2);
}

TEST_CASE("allreduce: ranks that disagree on MLTRAIN_COMM_ALGO fail naming it, no hang") {
  // Over TCP rank 0 runs hd and the others the ring; on one host rank 0 runs the direct
  // allreduce (through the group segment) and the others the ring (over the links).
  for (auto [transport, mine, named_as] :
       {std::tuple{Transport::tcp, Algo::hd, "MLTRAIN_COMM_ALGO=hd"},
        std::tuple{Transport::shm, Algo::direct, "MLTRAIN_COMM_ALGO=direct"}}) {
    CAPTURE(named_as);
    std::atomic<int> named{0}, failed{0};
    run_ranks(
        4, transport,
        [&](Communicator& c) {
          std::vector<float> v(100000);
          try {
            c.allreduce(v.data(), v.size(), DataType::f32, ReduceOp::sum);
          } catch (const Error& e) {
            ++failed;
            if (std::string(e.what()).find(named_as) != std::string::npos) ++named;
          }
        },
        5s, [&](Options& o) { o.algo = o.rank == 0 ? mine : Algo::ring; });
    CHECK(failed == 4);
    CHECK(named >= 1);
  }
}

TEST_CASE("mismatched counts are detected and named") {
  std::atomic<int> named{0};
  detail::StoreServer server(0, "");
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      Options o;
      o.rank = r;
      o.world_size = 2;
      o.store_addr = "127.0.0.1:" + std::to_string(server.port());
      o.host_store = false;
      o.timeout = 5s;
      o.host = "testhost";
      auto c = Communicator::create(o);
      std::vector<float> v(20);
      try {
        c->allreduce(v.data(), r == 0 ? 10 : 11, DataType::f32, ReduceOp::sum);
      } catch (const Error& e) {
        const std::string what = e.what();
        if (e.kind() == Error::Kind::mismatch && what.find("count=10") != std::string::npos &&
            what.find("count=11") != std::string::npos)
          ++named;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(named == 2);
}

namespace {
// Rank 1 stops taking part (closing its links, or just hanging); the others must fail fast,
// naming rank 1.
// World 3 over TCP runs the two-ring allreduce, world 4 over TCP halving/doubling (where rank 2
// never talks to rank 1 directly before it is stuck: it must learn the culprit).
void fault(Transport transport, bool hang, int world = 3) {
  detail::StoreServer server(0, "t");
  const auto timeout = 1000ms;
  std::atomic<int> named{0}, finished{0};
  std::vector<std::string> messages(static_cast<std::size_t>(world));
  std::vector<double> seconds(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      Options o;
      o.rank = r;
      o.world_size = world;
      o.store_addr = "127.0.0.1:" + std::to_string(server.port());
      o.token = "t";
      o.host_store = false;
      o.timeout = timeout;
      o.transport = transport;
      o.host = "testhost";
      auto c = Communicator::create(o);
      std::vector<float> v(1u << 20, 1.0f);
      c->allreduce(v.data(), v.size(), DataType::f32, ReduceOp::sum);  // all fine once
      if (r == 1) {
        // Hang (holding the links open) until the others have given up.
        for (int i = 0; hang && finished < world - 1 && i < 1000; ++i) std::this_thread::sleep_for(10ms);
        return;  // destroys the communicator: links close mid-job
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        for (int i = 0; i < 3; ++i) c->allreduce(v.data(), v.size(), DataType::f32, ReduceOp::sum);
      } catch (const Error& e) {
        messages[static_cast<std::size_t>(r)] = e.what();
        if (e.peer_rank() == 1 && std::string(e.what()).find("rank 1 (testhost)") != std::string::npos)
          ++named;
      }
      seconds[static_cast<std::size_t>(r)] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++finished;
    });
  for (auto& t : threads) t.join();
  CAPTURE(world);
  for (int r = 0; r < world; ++r) {
    if (r == 1) continue;
    CAPTURE(messages[static_cast<std::size_t>(r)]);
    // timeout 1 s + at most 0.5 s of blame-finding grace, with slack
    CHECK(seconds[static_cast<std::size_t>(r)] < 3.0);
  }
  CHECK(named == world - 1);
}
}  // namespace

TEST_CASE(
    "shared memory: once init returns nothing of the job is named in /dev/shm but the counters for top") {
  // A rank killed later (SIGKILL: no destructor) then leaves nothing behind, agent or not.
  const std::string run = "shm-names-" + std::to_string(::getpid());
  auto named = [&run] {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
      const std::string n = e.path().filename().string();
      if (n.find(run) != std::string::npos && n.find("-stats-") == std::string::npos) out.push_back(n);
    }
    return out;
  };
  std::mutex mu;
  std::vector<std::string> seen;
  run_ranks(
      4, Transport::shm,
      [&](Communicator& c) {
        c.barrier();
        {
          std::lock_guard lock(mu);
          for (auto& n : named()) seen.push_back(std::move(n));
        }
        c.barrier();
        // Links made after init (rank 0 and rank 2 pair up in recursive doubling; not ring
        // neighbours) still ring their peer's bell, mapped at init.
        std::int64_t v = c.rank() + 1;
        c.allreduce(&v, &v, 1, DataType::i64, ReduceOp::sum);
        CHECK(v == 10);
      },
      20s, [&run](Options& o) { o.run_id = run; });
  std::string left;
  for (const auto& n : seen) left += " " + n;
  CHECK_MESSAGE(seen.empty(), "left in /dev/shm:" << left);
}

TEST_CASE("fault: a rank that closes mid-job is named by the others (shm and TCP)") {
  fault(Transport::shm, false);
  fault(Transport::tcp, false);
  fault(Transport::tcp, false, 4);
}

TEST_CASE("fault: a rank that hangs is named within the timeout (shm and TCP)") {
  fault(Transport::shm, true);
  fault(Transport::tcp, true);
  fault(Transport::tcp, true, 4);
}

TEST_CASE("C API: single-rank job from the environment, and errors as codes") {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "1", 1);
  mltrain_comm_t* comm = nullptr;
  REQUIRE(mltrain_comm_init_from_env(&comm) == MLTRAIN_COMM_OK);
  CHECK(mltrain_comm_rank(comm) == 0);
  CHECK(mltrain_comm_size(comm) == 1);
  double x[3] = {1, 2, 3}, y[3] = {};
  CHECK(mltrain_comm_allreduce(comm, x, y, 3, MLTRAIN_F64, MLTRAIN_SUM) == MLTRAIN_COMM_OK);
  CHECK(y[2] == 3.0);
  CHECK(mltrain_comm_barrier(comm) == MLTRAIN_COMM_OK);
  CHECK(mltrain_comm_allreduce(comm, x, y, 3, 42, MLTRAIN_SUM) == MLTRAIN_COMM_EUSAGE);
  CHECK(std::string(mltrain_comm_last_error()).find("dtype") != std::string::npos);
  // No GPU on this machine (the fakes are not selected): the CPU backend, and it says why.
  CHECK(mltrain_comm_backend(comm) == 0);
  CHECK(std::string(mltrain_comm_backend_reason(comm)).find("rank 0") == 0);
  mltrain_comm_destroy(comm);
  CHECK(mltrain_comm_backend(nullptr) == -1);
  CHECK(mltrain_comm_barrier(nullptr) == MLTRAIN_COMM_EUSAGE);
  CHECK(!nccl_status().empty());
}

TEST_CASE("backend choice: every rank resolves the same backend from every rank's vote") {
  using detail::GpuVote;
  auto gpu = [](std::string bus, std::string version = "2.28.9") {
    GpuVote v;
    v.gpu = v.nccl = true;
    v.device = std::move(bus);
    v.nccl_version = std::move(version);
    return v;
  };
  GpuVote no_nccl;
  no_nccl.gpu = true;
  no_nccl.device = "00000000:18:00.0";
  no_nccl.why = "NCCL not found (libnccl.so.2: cannot open shared object file)";
  const std::vector<std::string> hosts{"h1", "h1", "h2", "h2"}, memory{"a", "a", "b", "b"};
  // The vote survives its trip through the store, in the rank's record.
  auto through_store = [](const GpuVote& v) {
    detail::PeerRecord r;
    r.gpu = v;
    return detail::PeerRecord::decode(r.encode()).value().gpu;
  };
  CHECK(through_store(no_nccl).why == no_nccl.why);
  CHECK(through_store(gpu("x")).nccl);
  CHECK_FALSE(detail::PeerRecord::decode(""));

  std::vector<GpuVote> all{gpu("18"), gpu("19"), gpu("18"), gpu("19")};  // same bus ids, other machine
  auto c = detail::choose_backend(Backend::automatic, all, hosts, memory);
  CHECK(c.backend == Backend::nccl);
  CHECK(c.why == "every rank has its own GPU and NCCL 2.28.9 loads");
  CHECK(detail::choose_backend(Backend::tcp, all, hosts, memory).backend == Backend::tcp);

  auto missing = all;
  missing[2] = no_nccl;
  c = detail::choose_backend(Backend::automatic, missing, hosts, memory);
  CHECK(c.backend == Backend::tcp);
  CHECK_FALSE(c.refused);
  CHECK(c.why == "rank 2 (h2): " + no_nccl.why);
  c = detail::choose_backend(Backend::nccl, missing, hosts, memory);
  CHECK(c.refused);

  auto shared = all;
  shared[1] = gpu("18");  // ranks 0 and 1 on one machine, one GPU
  c = detail::choose_backend(Backend::automatic, shared, hosts, memory);
  CHECK(c.backend == Backend::tcp);
  CHECK(c.why.find("ranks 0 and 1 (h1) share GPU 18") == 0);
  CHECK(detail::choose_backend(Backend::nccl, shared, hosts, memory).refused);

  auto versions = all;
  versions[3] = gpu("19", "2.21.5");
  c = detail::choose_backend(Backend::automatic, versions, hosts, memory);
  CHECK(c.backend == Backend::tcp);
  CHECK(c.why.find("NCCL needs the same version on every rank") != std::string::npos);
  CHECK(detail::nccl_version_text(22809) == "2.28.9");
  CHECK(detail::nccl_version_text(2804) == "2.8.4");
}

TEST_CASE("init: a rank that never joins is named; a wrong token is refused") {
  detail::StoreServer server(0, "job-secret");
  Options o;
  o.world_size = 2;
  o.store_addr = "127.0.0.1:" + std::to_string(server.port());
  o.token = "job-secret";
  o.host_store = false;
  o.timeout = 300ms;
  o.rank = 0;
  try {
    Communicator::create(o);
    FAIL("init finished without rank 1");
  } catch (const Error& e) {
    CHECK(e.kind() == Error::Kind::timeout);
    CHECK(e.peer_rank() == 1);
    CHECK(std::string(e.what()).find("rank 1 did not join") != std::string::npos);
  }
  o.rank = 1;
  o.token = "guess";
  try {
    Communicator::create(o);
    FAIL("wrong token accepted");
  } catch (const Error& e) {
    CHECK(e.kind() == Error::Kind::store);
    CHECK(std::string(e.what()).find("wrong MLTRAIN_TOKEN") != std::string::npos);
  }
}

TEST_CASE("options: knobs parse from the environment") {
  ::setenv("MLTRAIN_COMM_TIMEOUT", "2.5", 1);
  ::setenv("MLTRAIN_COMM_TRANSPORT", "tcp", 1);
  ::setenv("MLTRAIN_COMM_SHM_BYTES", "4M", 1);
  ::setenv("MLTRAIN_STORE_ADDR", "h0:1234", 1);
  const Options o = Options::from_env();
  CHECK(o.timeout == 2500ms);
  CHECK(o.transport == Transport::tcp);
  CHECK(o.shm_bytes == (4u << 20));
  CHECK(o.store_addr == "h0:1234");
  ::setenv("MLTRAIN_COMM_TIMEOUT", "5m", 1);  // once read by strtod as 5 seconds
  CHECK(Options::from_env().timeout == 300000ms);
  ::setenv("MLTRAIN_COMM_TIMEOUT", "5x", 1);
  CHECK_THROWS_WITH_AS(Options::from_env(), doctest::Contains("MLTRAIN_COMM_TIMEOUT='5x' is not a duration"),
                       Error);
  ::setenv("MLTRAIN_COMM_TIMEOUT", "0s", 1);
  CHECK_THROWS_WITH_AS(Options::from_env(), doctest::Contains("must be more than 0"), Error);
  ::unsetenv("MLTRAIN_COMM_TIMEOUT");
  ::setenv("MLTRAIN_COMM_TRANSPORT", "carrier-pigeon", 1);
  CHECK_THROWS_AS(Options::from_env(), Error);
  ::unsetenv("MLTRAIN_COMM_TRANSPORT");
  CHECK(Options::from_env().algo == Algo::automatic);
  ::setenv("MLTRAIN_COMM_ALGO", "hd", 1);
  CHECK(Options::from_env().algo == Algo::hd);
  ::setenv("MLTRAIN_COMM_ALGO", "tree", 1);
  CHECK_THROWS_WITH_AS(Options::from_env(), doctest::Contains("expected auto, ring, bidir, hd or direct"),
                       Error);
  for (const char* k : {"MLTRAIN_COMM_TIMEOUT", "MLTRAIN_COMM_TRANSPORT", "MLTRAIN_COMM_SHM_BYTES",
                        "MLTRAIN_STORE_ADDR", "MLTRAIN_COMM_ALGO"})
    ::unsetenv(k);
}

TEST_CASE("stats: each rank's time in collectives is in shared memory; the slow rank spends least") {
  // Rank 1 computes 20 ms before each allreduce: ranks 0 and 2 wait inside theirs for it.
  const std::string run = "stats-test-" + std::to_string(::getpid());
  std::vector<mltrain_comm_stats> seen(3);
  std::mutex mu;
  run_ranks(
      3, Transport::automatic,
      [&](Communicator& c) {
        float x[1024] = {};
        for (int i = 0; i < 8; ++i) {
          if (c.rank() == 1) std::this_thread::sleep_for(20ms);
          c.allreduce(x, 1024, DataType::f32, ReduceOp::sum);
        }
        c.barrier();
        // The block is there while the communicator lives, and another process could read it.
        const std::string name = "/mltrain-" + run + "-stats-" + std::to_string(c.rank());
        const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
        REQUIRE(fd >= 0);
        void* p = ::mmap(nullptr, sizeof(mltrain_comm_stats), PROT_READ, MAP_SHARED, fd, 0);
        ::close(fd);
        REQUIRE(p != MAP_FAILED);
        {
          std::lock_guard lock(mu);
          std::memcpy(&seen[std::size_t(c.rank())], p, sizeof(mltrain_comm_stats));
        }
        ::munmap(p, sizeof(mltrain_comm_stats));
        c.barrier();
      },
      20s, [&](Options& o) { o.run_id = run; });
  for (int r = 0; r < 3; ++r) {
    const auto& s = seen[std::size_t(r)];
    CHECK(s.magic == MLTRAIN_COMM_STATS_MAGIC);
    CHECK(s.version == MLTRAIN_COMM_STATS_VERSION);
    CHECK(s.rank == r);
    CHECK(s.world_size == 3);
    CHECK(s.calls == 9);  // 8 allreduces and the barrier before the read
    CHECK(s.bytes == 8 * 4096 + 1);
    CHECK(s.entered_ns == 0);
    CHECK(s.last_exit_ns >= s.started_ns);
  }
  CHECK(seen[0].comm_ns > 100'000'000u);  // waited ~8 x 20 ms for rank 1
  CHECK(seen[2].comm_ns > 100'000'000u);
  CHECK(seen[1].comm_ns * 4 < seen[0].comm_ns);
  CHECK(seen[1].comm_ns * 4 < seen[2].comm_ns);
  // Gone with the communicators.
  CHECK(::shm_open(("/mltrain-" + run + "-stats-0").c_str(), O_RDONLY, 0) < 0);
}

TEST_CASE("stats: a reader gives up on a clock that never settles, and on a scale no rank writes") {
  // Issue 31 item 4: a block planted with an odd clock_seq made the agent spin forever.
  mltrain_comm_stats s{};
  s.magic = MLTRAIN_COMM_STATS_MAGIC, s.version = MLTRAIN_COMM_STATS_VERSION;
  s.clock_ticks = 10, s.clock_ns = 20, s.clock_scale = 1ull << 32;
  mltrain_comm_stats_clock c{};
  CHECK(mltrain_comm_stats_try_read_clock(&s, &c) == 1);
  CHECK(c.ticks == 10);
  CHECK(c.ns == 20);
  s.clock_seq = 1;  // a writer stopped mid-update, or a stranger's file
  mltrain_comm_stats_clock untouched{7, 7, 7};
  const auto start = std::chrono::steady_clock::now();
  CHECK(mltrain_comm_stats_try_read_clock(&s, &untouched) == 0);
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(untouched.ticks == 7);
  CHECK(mltrain_comm_stats_read_clock(&s).scale == 0);  // the old form: bounded too
  s.clock_seq = 2, s.clock_scale = (1ull << 32) + 1;    // would overflow the span arithmetic
  CHECK(mltrain_comm_stats_try_read_clock(&s, &c) == 0);
}

TEST_CASE("stats: a stranger's file at the block's name is neither removed nor used; the rank goes on") {
  // Issue 31 item 4: a rank (here as root) unlinked whatever sat at its block's name.
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to leave a file of another user (nobody) in /dev/shm");
    return;
  }
  const std::string run = "stranger-test-" + std::to_string(::getpid());
  std::vector<std::string> planted;
  for (int r = 0; r < 2; ++r) {
    const std::string path = "/dev/shm/mltrain-" + run + "-stats-" + std::to_string(r);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::fchown(fd, 65534, 65534) == 0);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    ::close(fd);
    planted.push_back(path);
  }
  run_ranks(
      2, Transport::automatic,
      [&](Communicator& c) {
        float x[16] = {1};
        c.allreduce(x, 16, DataType::f32, ReduceOp::sum);
      },
      20s, [&](Options& o) { o.run_id = run; });
  for (const auto& path : planted) {
    struct stat st {};
    CHECK(::stat(path.c_str(), &st) == 0);
    CHECK(st.st_uid == 65534u);
    CHECK(st.st_size == 4096);  // untouched
    ::unlink(path.c_str());
  }
  // A name given by the agent (MLTRAIN_COMM_STATS_NAME) is used instead, made 0600, and removed.
  const std::string given = "/mltrain-" + run + "-stats-0-0123456789abcdef";
  run_ranks(
      1, Transport::automatic,
      [&](Communicator&) {
        struct stat st {};
        CHECK(::stat(("/dev/shm" + given).c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0600);
        CHECK(st.st_uid == ::geteuid());
      },
      20s, [&](Options& o) { o.run_id = run, o.stats_name = given; });
  CHECK(::access(("/dev/shm" + given).c_str(), F_OK) != 0);
}

TEST_CASE("refusal log: a flood of strangers gives a few lines and one summary per window") {
  // Issue 31 item 13: 20,000 tokenless connections wrote 20,000 lines into ps-<host>.log.
  std::vector<std::string> lines;
  detail::RefusalLog log([&](const std::string& l) { lines.push_back(l); });
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20000; ++i)
    log.refused("refused 10.0.0.9:" + std::to_string(i) + ": it did not prove the job's token",
                t0 + std::chrono::microseconds(i * 290));  // 20,000 in 5.8 s
  CHECK(lines.size() == std::size_t(detail::RefusalLog::kBurst));
  CHECK(lines.back().find("further refusals are counted") != std::string::npos);
  CHECK(log.due() == t0 + detail::RefusalLog::kWindow);
  log.tick(t0 + detail::RefusalLog::kWindow);
  REQUIRE(lines.size() == std::size_t(detail::RefusalLog::kBurst) + 1);
  CHECK(lines.back() ==
        "19995 more refused connections (the last: refused 10.0.0.9:19999: it did not prove "
        "the job's token)");
  CHECK(log.due() == std::chrono::steady_clock::time_point::max());
  log.summarise();  // nothing held back: nothing said
  CHECK(lines.size() == std::size_t(detail::RefusalLog::kBurst) + 1);
  log.refused("one more", t0 + detail::RefusalLog::kWindow + 1s);  // a new window: said in full
  CHECK(lines.back() == "one more");
}

TEST_CASE(
    "TCP links: congestion control auto turns bbr into cubic or reno; a name the host refuses is an error") {
  auto socket = [] {
    detail::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(fd);
    return fd;
  };
  auto use = [](int fd, const std::string& cc) {
    return ::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc.data(), static_cast<socklen_t>(cc.size())) == 0;
  };
  auto now = [](int fd) {
    char b[32] = {};
    socklen_t len = sizeof b - 1;
    REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, b, &len) == 0);
    return std::string(b);
  };
  const detail::Fd paced = socket(), plain = socket(), kept = socket(), named = socket();
  REQUIRE(use(paced.get(), "bbr"));  // the test hosts' default; the tests run as root
  const std::string set = detail::set_congestion(paced.get(), "auto");
  CHECK((set == "cubic" || set == "reno"));
  CHECK(now(paced.get()) == set);
  REQUIRE(use(plain.get(), "reno"));
  CHECK(detail::set_congestion(plain.get(), "auto").empty());  // not bbr: the host's stays
  CHECK(now(plain.get()) == "reno");
  REQUIRE(use(kept.get(), "bbr"));
  CHECK(detail::set_congestion(kept.get(), "system").empty());
  CHECK(now(kept.get()) == "bbr");
  CHECK(detail::set_congestion(named.get(), "reno") == "reno");
  CHECK(now(named.get()) == "reno");
  std::string what;
  try {
    detail::set_congestion(named.get(), "no-such-cc");
  } catch (const Error& e) {
    what = e.what();
    CHECK(e.kind() == Error::Kind::usage);
  }
  CHECK(what.find("MLTRAIN_COMM_TCP_CC=no-such-cc: the kernel refused it") != std::string::npos);
  CHECK(what.find("; this host allows ") != std::string::npos);
  // Init refuses it at once, before it joins anyone.
  Options o;
  o.tcp_congestion = "no-such-cc";
  CHECK_THROWS_WITH_AS(Communicator::create(o), doctest::Contains("MLTRAIN_COMM_TCP_CC=no-such-cc"), Error);
}

TEST_CASE("records: a rank's record and the abort record survive the store; damaged ones decode to nothing") {
  detail::PeerRecord peer;
  peer.host = "h1";
  peer.ip = "10.0.0.1";
  peer.port = 40123;
  peer.pid = 4242;
  peer.memory = "boot-id/shm:1:2/name:h1";
  peer.gpu.gpu = true;
  peer.gpu.device = "00000000:18:00.0";
  peer.gpu.why = "line one\nline two\twith a tab";  // no separator is special any more
  const auto back = detail::PeerRecord::decode(peer.encode());
  REQUIRE(back);
  CHECK(back->host == peer.host);
  CHECK(back->ip == peer.ip);
  CHECK(back->port == peer.port);
  CHECK(back->pid == peer.pid);
  CHECK(back->memory == peer.memory);
  CHECK(back->gpu.gpu);
  CHECK_FALSE(back->gpu.nccl);
  CHECK(back->gpu.device == peer.gpu.device);
  CHECK(back->gpu.why == peer.gpu.why);

  detail::AbortRecord abort;
  abort.culprit = 3;
  abort.culprit_host = "h3";
  abort.reporter = 1;
  abort.message = "rank 1 (h1): allreduce #7: rank 3 (h3) sent nothing\nsecond line";
  const auto got = detail::AbortRecord::decode(abort.encode());
  REQUIRE(got);
  CHECK(got->culprit == 3);
  CHECK(got->culprit_host == "h3");
  CHECK(got->reporter == 1);
  CHECK(got->message == abort.message);

  // Bounded: a longer field is cut on the way out, never refused on the way in.
  abort.message.assign(detail::AbortRecord::kMaxMessage + 100, 'x');
  CHECK(detail::AbortRecord::decode(abort.encode())->message.size() == detail::AbortRecord::kMaxMessage);
  peer.host.assign(detail::PeerRecord::kMaxField + 1, 'h');
  CHECK(detail::PeerRecord::decode(peer.encode())->host.size() == detail::PeerRecord::kMaxField);

  // The old newline-joined record, another record's bytes, another version: nothing.
  CHECK_FALSE(detail::PeerRecord::decode("h1\n10.0.0.1\n40123\n4242"));
  CHECK_FALSE(detail::PeerRecord::decode(abort.encode()));
  CHECK_FALSE(detail::AbortRecord::decode(peer.encode()));
  std::string newer = got->encode();
  newer[4] = 2;  // the version's low byte
  CHECK_FALSE(detail::AbortRecord::decode(newer));

  // Every cut and every flipped byte of a good record decodes to nothing or to a bounded record,
  // never past the buffer (ASan in CI) and never with bytes left over.
  const std::string good_peer = back->encode(), good_abort = got->encode();
  for (const std::string* good : {&good_peer, &good_abort}) {
    for (std::size_t n = 0; n < good->size(); ++n) {
      CHECK_FALSE(detail::PeerRecord::decode(good->substr(0, n)));
      CHECK_FALSE(detail::AbortRecord::decode(good->substr(0, n)));
    }
    CHECK_FALSE(detail::PeerRecord::decode(*good + "x"));
    CHECK_FALSE(detail::AbortRecord::decode(*good + "x"));
  }
  std::mt19937 rng(34);
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = i % 2 ? good_peer : good_abort;
    for (int flips = 1 + int(rng() % 4); flips > 0; --flips)
      bytes[rng() % bytes.size()] = static_cast<char>(rng());
    if (const auto r = detail::PeerRecord::decode(bytes)) {
      CHECK(r->host.size() <= detail::PeerRecord::kMaxField);
      CHECK(r->port >= 0);
      CHECK(r->port <= 65535);
      CHECK(r->encode() == bytes);  // what decodes, re-encodes to the same bytes
    }
    if (const auto r = detail::AbortRecord::decode(bytes)) {
      CHECK(r->message.size() <= detail::AbortRecord::kMaxMessage);
      CHECK(r->culprit >= -1);
      CHECK(r->encode() == bytes);
    }
  }
}

TEST_CASE("algorithm choice: one host goes direct, across hosts hd on powers of two, else bidir") {
  using detail::choose_algo;
  CHECK(choose_algo(Algo::automatic, 4, false) == Algo::direct);
  CHECK(choose_algo(Algo::automatic, 2, false) == Algo::direct);
  CHECK(choose_algo(Algo::automatic, 4, true) == Algo::hd);
  CHECK(choose_algo(Algo::automatic, 6, true) == Algo::bidir);
  CHECK(choose_algo(Algo::automatic, 2, true) == Algo::ring);  // with 2 ranks, one ring
  CHECK(choose_algo(Algo::direct, 4, true) == Algo::ring);     // direct needs one host
  CHECK(choose_algo(Algo::hd, 6, false) == Algo::ring);        // hd needs a power of two
  CHECK(choose_algo(Algo::bidir, 2, true) == Algo::ring);
}

TEST_CASE("blame: a timeout follows the wait chain to the rank that stopped; the first report wins") {
  detail::StoreServer server(0, "tok");
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto dl = [] { return detail::Clock::now() + std::chrono::seconds(5); };
  detail::StoreClient store(addr, "tok", 0, dl());
  const std::vector<std::string> hosts{"h0", "h1", "h2", "h3"};
  const auto timeout = std::chrono::milliseconds(100);  // the peers get 50 ms to report
  const detail::Blame rank0(&store, 0, hosts, timeout);

  // Rank 1 waits on rank 2, which waits on nobody: rank 2 stopped.
  store.set("waiting/1", "2", dl());
  auto v = rank0.settle(Error(Error::Kind::timeout, "rank 1 (h1) sent nothing", 1, "h1"), "allreduce #3");
  CHECK(v.culprit == 2);
  CHECK(v.culprit_host == "h2");
  CHECK(v.detail ==
        "rank 1 (h1) sent nothing; rank 1, which waits on rank 2 (rank 2 (h2) stopped making progress)");
  CHECK(v.first.empty());  // it claimed the first failure itself
  const auto claimed = detail::AbortRecord::decode(store.get("abort", dl()).value());
  REQUIRE(claimed);
  CHECK(claimed->culprit == 2);
  CHECK(claimed->reporter == 0);
  CHECK(claimed->message == "rank 0 (h0): allreduce #3: " + v.detail);

  // Rank 3 closed on: the record rank 0 wrote names the root cause.
  const detail::Blame rank3(&store, 3, hosts, timeout);
  v = rank3.settle(Error(Error::Kind::peer_closed, "rank 0 (h0) closed the connection", 0, "h0"),
                   "allreduce #3");
  CHECK(v.culprit == 2);
  CHECK(v.culprit_host == "h2");
  CHECK(v.first == claimed->message);

  // Ranks that wait on each other: nobody in particular stopped.
  detail::StoreServer server2(0, "tok");
  detail::StoreClient store2("127.0.0.1:" + std::to_string(server2.port()), "tok", 0, dl());
  store2.set("waiting/1", "0", dl());
  v = detail::Blame(&store2, 0, hosts, timeout)
          .settle(Error(Error::Kind::timeout, "rank 1 (h1) sent nothing", 1, "h1"), "barrier #1");
  CHECK(v.culprit == 1);
  CHECK(v.detail ==
        "rank 1 (h1) sent nothing; rank 1, which waits on rank 0 (a cycle: the ranks wait on each other)");

  // A usage error is this rank's own; without a store the local verdict stands.
  v = detail::Blame(nullptr, 2, hosts, timeout)
          .settle(Error(Error::Kind::usage, "null buffer"), "allreduce #1");
  CHECK(v.culprit == 2);
  CHECK(v.culprit_host == "h2");
  CHECK(v.detail == "null buffer");
}

TEST_CASE("progress wait: a TCP link wakes it when bytes arrive; with none it returns at the cap") {
  auto [listener, port] = detail::listen_tcp(0, 1, true);
  const auto dl = detail::Clock::now() + 5s;
  detail::Fd there = detail::connect_tcp("127.0.0.1", port, dl, "test");
  detail::TcpLink a(detail::accept_tcp(listener.get(), dl), 1, "b", 1 << 16),
      b(std::move(there), 0, "a", 1 << 16);
  detail::ProgressWait wait;
  std::vector<detail::Link*> none{nullptr}, from_b{&a};
  auto t0 = std::chrono::steady_clock::now();
  wait.wait(none, from_b, nullptr, 30);  // nothing to read: back at the cap
  CHECK(std::chrono::steady_clock::now() - t0 >= 25ms);
  const char byte = 'x';
  std::thread writer([&] {
    std::this_thread::sleep_for(10ms);
    CHECK(b.send_some(&byte, 1) == 1);
  });
  t0 = std::chrono::steady_clock::now();
  wait.wait(none, from_b, nullptr, 5000);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  writer.join();
  std::byte got{};
  CHECK(a.recv_into(&got, 1) == 1);
  CHECK(got == std::byte{'x'});
  std::vector<detail::Link*> to_b{&a};
  wait.wait(to_b, none, nullptr, 5000);  // room to write: at once
}

TEST_CASE("nccl probe: one oldest version and one message for the backend and the agent") {
  CHECK(detail::nccl_too_old(21205, "/x/libnccl.so.2") ==
        "NCCL 2.12.5 at /x/libnccl.so.2 is older than 2.13.0, the oldest mltrain supports (set "
        "MLTRAIN_NCCL_LIBRARY to a newer one)");
  const auto missing = detail::probe_nccl("/nonexistent/libnccl.so.2");
  CHECK(missing.handle == nullptr);
  CHECK(missing.error.find("/nonexistent/libnccl.so.2") != std::string::npos);
  CHECK_FALSE(missing.new_enough());
  detail::NcclProbe p;
  p.version_known = true;
  p.version = detail::kMinNcclVersion;
  CHECK(p.new_enough());
  p.version = 21205;
  CHECK_FALSE(p.new_enough());
}
