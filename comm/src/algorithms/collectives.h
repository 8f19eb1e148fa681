// Collective algorithms over links: ring (reduce-scatter + allgather, pipelined) for large
// messages, recursive doubling for small ones on power-of-two worlds, chain broadcast, ring
// allgather/reduce-scatter, and a barrier. They see links and the engine only, never sockets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "algorithms/engine.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

inline constexpr std::uint32_t kCollMagic = 0x4d4c4343;  // "MLCC"
inline constexpr std::uint16_t kCollVersion = 1;

enum class Coll : std::uint8_t {
  allreduce = 1,
  broadcast = 2,
  allgather = 3,
  reduce_scatter = 4,
  barrier = 5
};
const char* coll_name(Coll coll);

// Sent to each peer at the start of every collective and compared on arrival, so ranks that
// disagree on the call fail with a message naming both sides instead of corrupting data.
struct WireHeader {
  std::uint32_t magic = kCollMagic;
  std::uint16_t version = kCollVersion;
  std::uint8_t coll = 0;
  std::uint8_t dtype = 0;
  std::uint8_t redop = 0;
  std::uint8_t algo = 0;  // large allreduce: Algo (1 ring, 2 bidir, 3 hd, 4 direct); else 0
  std::uint8_t reserved[2] = {};
  std::int32_t root = 0;
  std::uint64_t count = 0;
  std::uint64_t seq = 0;
};
static_assert(sizeof(WireHeader) == 32);

// Element range of segment i when count elements are split into n near-equal segments.
struct Segments {
  std::size_t count;
  int n;
  std::size_t offset(int i) const {
    const std::size_t base = count / static_cast<std::size_t>(n);
    const std::size_t extra = count % static_cast<std::size_t>(n);
    const auto u = static_cast<std::size_t>(i);
    return u * base + std::min(u, extra);
  }
  std::size_t length(int i) const { return offset(i + 1) - offset(i); }
};

class ShmGroup;

struct Context {
  int rank = 0;
  int size = 1;
  std::function<Link*(int)> link;  // connects on first use
  EngineConfig engine;
  std::size_t small_bytes = 64u << 10;
  Algo algo = Algo::ring;  // large allreduce on 3+ ranks (resolved: never automatic)
  std::vector<std::byte>* scratch = nullptr;
  ShmGroup* group = nullptr;  // every rank on this host: the direct allreduce's shared memory
  WireHeader header;          // this rank's view of the call (seq, coll, dtype, ...)
};

// The large allreduce's algorithm for a world of `world` ranks; `crosses`: some ring neighbours
// talk over TCP (another machine). Every rank sees the same, so every rank decides the same (the
// wire header checks it anyway). Algo::direct still needs the shared group (else the ring).
Algo choose_algo(Algo wanted, int world, bool crosses);

// Throws Error(mismatch) naming both calls when theirs differs from mine.
void check_header(const WireHeader& mine, const WireHeader& theirs, const Link& from);
void check_header(const WireHeader& mine, const WireHeader& theirs, const std::string& label, int rank,
                  const std::string& host);
// "allreduce(count=10, f32, sum) #3": a call, for messages.
std::string describe(const WireHeader& h);

void allreduce(Context& ctx, const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op);
// Large allreduce through ctx.group (algorithms/direct.cpp). With shared_key, the result goes to
// the key's region that every rank maps (ShmGroup::map_result) and that is returned, else (or
// when the region could not be made) to recv, which is returned. With `file` too (send lies in a
// shared file), the ranks read each other's inputs there when all of them can. into_inputs (with
// key and file, send == recv): this rank wants the result in its buffer; when any rank does,
// there is no region: each rank writes its reduced part straight into every rank's buffer when
// all of them can map every peer's for writing, else the call stages in place, and every rank's
// result is in its recv.
std::byte* allreduce_direct(Context& ctx, const std::byte* send, std::byte* recv, std::size_t count,
                            DataType dtype, ReduceOp op, const std::uint64_t* shared_key = nullptr,
                            const SharedFile* file = nullptr, bool into_inputs = false);
void broadcast(Context& ctx, void* buf, std::size_t count, DataType dtype, int root);
void allgather(Context& ctx, const void* send, void* recv, std::size_t count, DataType dtype);
void reduce_scatter(Context& ctx, const void* send, void* recv, std::size_t recv_count, DataType dtype,
                    ReduceOp op);
void barrier(Context& ctx);

}  // namespace mltrain::comm::detail
