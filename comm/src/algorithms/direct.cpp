// The direct allreduce, for worlds whose ranks all share one host (docs/comm.md, "One host"):
// through the group's shared memory instead of the pairwise rings. Each chunk of the buffer
// (one slot) goes in three stages:
//   A. every rank copies the chunk into its own slot (all but its own segment);
//   B. rank r reduces segment r of the chunk from every slot (its own from its input), in rank
//      order, into its slot, and divides there for avg;
//   C. every rank copies each segment j out of rank j's slot into its output.
// A rank moves 2.75N bytes in and 2N out per N reduced (the ring: 3.75N and 3N), and waits on
// its peers three times a chunk, where the ring hands off 2(n-1) pieces one by one. Stages run
// B(k), A(k+1), C(k), so a rank's next copy-in overlaps its peers finishing their reductions;
// two slots per rank let A(k+1) fill one while C(k) still reads the other.
// With a shared result (allreduce_shared), B writes straight into a region every rank maps and
// there is no C: 1.75N in and 1N out per rank.
// When moreover every rank's input lies in a shared file that every rank can map (SharedFile: a
// DDP bucket after share_memory_()), there is no A either: rank r reduces its segment of the whole
// buffer straight from the peers' inputs into the region, 1N in and N/n out per rank, and the
// call waits on its peers three times (posted, voted, reduced) instead of three times a chunk;
// twice when the key's last call was read the same way and nothing moved (ShmGroup::all_agreed).
// With the result in the inputs themselves (allreduce_mapped: every rank maps every peer's file
// for writing), there is no region either: rank r reduces its segment into a block that stays in
// its cache and copies the block into every rank's buffer, 1N in and 1N out per rank, and the
// buffers hold the result where the caller wants it (a DDP bucket its gradients view).
#include <cstring>
#include <vector>

#include "algorithms/collectives.h"
#include "transport/shm_group.h"

namespace mltrain::comm::detail {

namespace {

// len elements of every rank's part (source(j): rank j's, fetched in rank order) into dst, divided
// for avg, in one pass over memory for up to four ranks. Both paths reduce through here, so they
// give the same bytes. ptrs: n entries of scratch.
template <typename Source>
void reduce_in_rank_order(std::byte* dst, std::size_t len, int n, ReduceManyFn many, Source source,
                          std::vector<const void*>& ptrs) {
  for (int j = 0; j < n; ++j) ptrs[static_cast<std::size_t>(j)] = source(j);
  many(dst, ptrs.data(), n, len);
}

// Rank r's segment of the whole buffer from every rank's input (src, in rank order), in blocks
// that stay in this core's cache across the passes (worlds past four take several): into `out`,
// or, with `into` (every rank's buffer, dst[j] rank j's, which src[j] reads too: the same memory,
// disjoint segments per rank, so nobody reads what another rank writes during the call), each
// block reduced into this core's cache and copied into all of them at once.
void reduce_mapped(const std::vector<const std::byte*>& src, std::byte* out,
                   const std::vector<std::byte*>* into, std::size_t count, int n, int r, DataType dtype,
                   ReduceManyFn many) {
  const std::size_t es = size_of(dtype);
  const Segments seg{count, n};
  const std::size_t off = seg.offset(r), len = seg.length(r);
  const std::size_t block = std::max<std::size_t>(1, (std::size_t{256} << 10) / es);
  std::vector<std::byte> tmp(into != nullptr ? std::min(block, len) * es : 0);
  std::vector<const void*> ptrs(static_cast<std::size_t>(n));
  for (std::size_t b = 0; b < len; b += block) {
    const std::size_t m = std::min(block, len - b), at = (off + b) * es;
    reduce_in_rank_order(
        into != nullptr ? tmp.data() : out + at, m, n, many,
        [&](int j) { return src[static_cast<std::size_t>(j)] + at; }, ptrs);
    if (into != nullptr)
      for (int i = 0; i < n; ++i)
        std::memcpy((*into)[static_cast<std::size_t>((r + i) % n)] + at, tmp.data(), m * es);
  }
}

// While this rank waits in the group: a rank that started a collective over the links meanwhile
// disagrees with this one, and its header arrives on a ring neighbour's link. (A neighbour that
// closed its links has set its closed flag in the group too, if it failed; one that finished is
// no reason to fail.)
void throw_if_a_neighbour_sent(Context& ctx) {
  const int n = ctx.size, r = ctx.rank;
  for (const int j : {(r + 1) % n, (r + n - 1) % n}) {
    Link* l = ctx.link(j);
    if (!l->can_recv()) continue;
    std::span<const std::byte> bytes;
    try {
      bytes = l->peek();
    } catch (const Error&) {
      continue;  // closed, nothing left to read
    }
    if (bytes.empty()) continue;
    const std::size_t pad = (8 - l->rx_pos() % 8) % 8;  // headers start 8-byte aligned
    WireHeader theirs;
    if (bytes.size() >= pad + sizeof theirs) {
      std::memcpy(&theirs, bytes.data() + pad, sizeof theirs);
      check_header(ctx.header, theirs, *l);
    }
    throw Error(Error::Kind::mismatch,
                l->peer_label() + " sent data over its link while this rank ran a direct allreduce (" +
                    describe(ctx.header) + ")",
                l->peer_rank(), l->peer_host());
  }
}

// One call through the group: what every stage needs.
struct DirectCall {
  ShmGroup& g;
  ShmGroup::WaitConfig wc;
  int n, r;
  DataType dtype;
  std::size_t es, count;
  ReduceManyFn many;
  const std::byte* send;
  std::byte* recv;
  std::byte* shared = nullptr;  // the shared result, when there is one
  const std::uint64_t* key;

  // The end of a call with a shared result: done when every segment is in (chunk counter
  // `done`), then nobody reads this rank's input or slots any more. Every rank mapped the
  // region before reducing, so rank 0 unlinks its name.
  void finish_shared(std::uint64_t done) {
    for (int j = 0; j < n; ++j)
      if (j != r) g.wait(j, ShmGroup::reduced, done, wc);
    if (r == 0 && shared != nullptr) g.unlink_result(*key);
    g.publish(ShmGroup::copied, done);
  }
  // Inputs where they lie, when every rank posted one (all see the same) and all can map them;
  // false when the call must stage instead.
  bool reduce_from_inputs(bool into, std::uint64_t seq);
  // Stages A, B and C, chunk by chunk through the slots.
  void stage();
};

bool DirectCall::reduce_from_inputs(bool into, std::uint64_t seq) {
  bool all_posted = shared != nullptr || into;
  for (int j = 0; j < n && all_posted; ++j) all_posted = g.has_input(j);
  if (!all_posted) return false;
  // Every rank read the key's last call mapped and nothing changed since: no vote (ShmGroup).
  const bool agreed = g.all_agreed(into);
  std::vector<std::byte*> bufs(static_cast<std::size_t>(n), recv);
  bool ok = true;
  for (int j = 0; j < n && ok; ++j)
    if (j != r) ok = (bufs[static_cast<std::size_t>(j)] = g.map_input(*key, j, count * es, into)) != nullptr;
  if (agreed && !ok)  // the peers read mapped now: this rank cannot fall back alone
    throw Error(Error::Kind::internal, "a peer's shared file mapped in the last call of this key is gone");
  if (!agreed && !g.vote(ok, seq, wc)) return false;
  g.remember(*key);
  const std::uint64_t id = g.chunks++;  // one chunk, so the counters run on alike
  std::vector<const std::byte*> src(bufs.begin(), bufs.end());
  src[static_cast<std::size_t>(r)] = send;
  if (n > 1) reduce_mapped(src, shared, into ? &bufs : nullptr, count, n, r, dtype, many);
  g.publish(ShmGroup::written, id + 1);
  g.publish(ShmGroup::reduced, id + 1);
  finish_shared(id + 1);
  return true;
}

void DirectCall::stage() {
  if (key != nullptr) g.forget(*key);  // staged: the next call of the key votes
  const std::size_t chunk = std::max<std::size_t>(1, g.slot_bytes() / es);
  const std::size_t chunks = (count + chunk - 1) / chunk;
  const std::uint64_t base = g.chunks;
  g.chunks += chunks;
  auto elems_of = [&](std::size_t k) { return std::min(chunk, count - k * chunk); };
  auto seg_of = [&](std::size_t k, int j) {  // (offset, length) of segment j of chunk k, in elements
    const Segments seg{elems_of(k), n};
    return std::pair{seg.offset(j), seg.length(j)};
  };
  auto slot_of = [](std::size_t k) { return static_cast<int>(k % ShmGroup::kSlots); };

  auto copy_in = [&](std::size_t k) {
    const std::uint64_t id = base + k;  // chunk id; this slot last held chunk id - kSlots
    if (id + 1 > ShmGroup::kSlots) {
      // Every rank must be done reading it: reduced it, and with stage C copied out of it too.
      const std::uint64_t need = id + 1 - ShmGroup::kSlots;
      const auto counter = shared != nullptr && need > base ? ShmGroup::reduced : ShmGroup::copied;
      for (int j = 0; j < n; ++j)
        if (j != r) g.wait(j, counter, need, wc);
    }
    std::byte* slot = g.slot(r, slot_of(k));
    const std::byte* in = send + k * chunk * es;
    const auto [off, len] = seg_of(k, r);
    std::memcpy(slot, in, off * es);  // everything but segment r, which only this rank reads
    const std::size_t after = off + len;
    std::memcpy(slot + after * es, in + after * es, (elems_of(k) - after) * es);
    g.publish(ShmGroup::written, id + 1);
  };
  std::vector<const void*> ptrs(static_cast<std::size_t>(n));
  auto reduce = [&](std::size_t k) {
    const std::uint64_t id = base + k;
    const auto [off, len] = seg_of(k, r);
    std::byte* dst = shared != nullptr ? shared + (k * chunk + off) * es : g.slot(r, slot_of(k)) + off * es;
    auto source = [&](int j) -> const std::byte* {
      if (j == r) return send + (k * chunk + off) * es;
      g.wait(j, ShmGroup::written, id + 1, wc);
      return g.slot(j, slot_of(k)) + off * es;
    };
    if (len > 0) {
      reduce_in_rank_order(dst, len, n, many, source, ptrs);
    } else {
      for (int j = 0; j < n; ++j) source(j);  // nothing to reduce: still in step with the others
    }
    g.publish(ShmGroup::reduced, id + 1);
  };
  auto copy_out = [&](std::size_t k) {
    const std::uint64_t id = base + k;
    std::byte* dst = recv + k * chunk * es;
    for (int i = 0; i < n; ++i) {
      const int j = (r + i) % n;  // own segment first: it is ready
      if (j != r) g.wait(j, ShmGroup::reduced, id + 1, wc);
      const auto [off, len] = seg_of(k, j);
      std::memcpy(dst + off * es, g.slot(j, slot_of(k)) + off * es, len * es);
    }
    g.publish(ShmGroup::copied, id + 1);
  };

  if (chunks > 0) copy_in(0);
  for (std::size_t k = 0; k < chunks; ++k) {
    reduce(k);
    if (k + 1 < chunks) copy_in(k + 1);
    if (shared == nullptr) copy_out(k);
  }
  if (shared != nullptr) finish_shared(base + chunks);
}

}  // namespace

std::byte* allreduce_direct(Context& ctx, const std::byte* send, std::byte* recv, std::size_t count,
                            DataType dtype, ReduceOp op, const std::uint64_t* shared_key,
                            const SharedFile* file, bool into_inputs) {
  ShmGroup& g = *ctx.group;
  const int n = ctx.size, r = ctx.rank;
  const std::size_t es = size_of(dtype);
  ctx.header.algo = static_cast<std::uint8_t>(Algo::direct);
  // This rank asks for the result in its buffer; when any rank does, every rank gets it there.
  const bool wants_inputs = into_inputs && shared_key != nullptr && file != nullptr && send == recv;
  if (shared_key != nullptr) {
    ctx.header.reserved[0] = 1;  // every rank must ask for a shared-file call of the same key
    ctx.header.root =
        static_cast<std::int32_t>(static_cast<std::uint32_t>(*shared_key ^ (*shared_key >> 32)));
  }
  DirectCall call{g, {}, n, r, dtype, es, count, reduce_many_fn(dtype, op), send, recv, nullptr, shared_key};
  call.wc.spin_us = ctx.engine.spin_us;
  call.wc.timeout = ctx.engine.timeout;
  call.wc.on_idle = [&ctx] { throw_if_a_neighbour_sent(ctx); };

  if (shared_key != nullptr && r == 0) {
    if (wants_inputs)
      g.post_no_result();
    else
      g.make_result(*shared_key, count * es);
  }
  if (shared_key != nullptr)
    g.post_input(file != nullptr ? file->fd : -1, file != nullptr ? file->offset : 0, *shared_key, count * es,
                 wants_inputs);
  g.post_header(&ctx.header);
  g.publish(ShmGroup::posted, ctx.header.seq);
  for (int j = 0; j < n; ++j) {
    if (j == r) continue;
    g.wait(j, ShmGroup::posted, ctx.header.seq, call.wc);
    WireHeader theirs;
    g.read_header(j, &theirs);
    check_header(ctx.header, theirs, g.peer(j).label, j, g.peer(j).host);
  }
  // The shared result, unless rank 0 could not reserve it or some rank wants the result in its
  // buffer: then in place, like any call (rank 0's region, if it made one, waits for a later call).
  const bool into = shared_key != nullptr && g.any_wants_inputs();
  if (shared_key != nullptr && !into)
    if (const std::uint64_t id = g.posted_result(); id != 0)
      call.shared = g.map_result(*shared_key, id, count * es);
  std::byte* const out = call.shared != nullptr ? call.shared : recv;
  if (!call.reduce_from_inputs(into, ctx.header.seq)) call.stage();
  return out;
}

}  // namespace mltrain::comm::detail
