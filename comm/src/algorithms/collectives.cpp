#include "algorithms/collectives.h"

#include <cstring>
#include <deque>
#include <span>

namespace mltrain::comm::detail {

Algo choose_algo(Algo wanted, int world, bool crosses) {
  // Over TCP, a connection that carries data both ways at once costs less CPU per byte than two
  // one-way ones, and talking to one peer at a time less than to two (docs/comm.md, "Across
  // hosts"): so across hosts, halving/doubling (pairwise exchanges) on power-of-two worlds and
  // two opposite rings otherwise. On one host, the direct allreduce through one shared segment
  // (algorithms/direct.cpp).
  const bool pow2 = (world & (world - 1)) == 0;
  Algo algo = wanted;
  if (algo == Algo::automatic) algo = !crosses ? Algo::direct : pow2 ? Algo::hd : Algo::bidir;
  if (algo == Algo::direct && (crosses || world < 2)) algo = Algo::ring;
  if (algo == Algo::hd && !pow2) algo = Algo::ring;
  if (world < 3 && algo != Algo::direct) algo = Algo::ring;  // with 2 ranks, one ring
  return algo;
}

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Holds the headers received during one collective (deque: stable addresses).
struct HeaderBox {
  std::deque<WireHeader> received;
  std::vector<std::pair<std::size_t, WireHeader*>> by_step;
};

// Appends a header exchange: send mine on tx, receive theirs from rx.
void add_header_step(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, Link* tx, Link* rx) {
  Step s;
  s.tx = tx;
  s.send = &ctx.header;
  s.send_bytes = sizeof(WireHeader);
  s.rx = rx;
  box.received.emplace_back();
  s.recv = &box.received.back();
  s.recv_bytes = sizeof(WireHeader);
  s.align = true;
  s.header = true;
  box.by_step.emplace_back(steps.size(), &box.received.back());
  steps.push_back(s);
}

// Runs the channels, checking each header as it arrives (boxes[i] holds channel i's).
void run(std::vector<std::vector<Step>>& channels, std::span<HeaderBox> boxes, const Context& ctx,
         const EngineConfig& cfg) {
  run_channels(channels, cfg, [&](std::size_t ch, std::size_t step) {
    for (auto& [index, header] : boxes[ch].by_step)
      if (index == step) check_header(ctx.header, *header, *channels[ch][step].rx);
  });
}

void run(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, const EngineConfig& cfg) {
  std::vector<std::vector<Step>> one(1);
  one[0] = std::move(steps);
  run(one, {&box, 1}, ctx, cfg);
}

std::byte* scratch(Context& ctx, std::size_t bytes) {
  if (ctx.scratch->size() < bytes) ctx.scratch->resize(bytes);
  return ctx.scratch->data();
}

EngineConfig reduce_config(const Context& ctx, DataType dtype, ReduceOp op) {
  EngineConfig cfg = ctx.engine;
  cfg.elem = size_of(dtype);
  cfg.reduce = reduce_fn(dtype, op);
  const int world = ctx.size;
  cfg.finalize = [dtype, world](void* p, std::size_t n) { finalize_avg(p, n, dtype, world); };
  return cfg;
}

// One direction of the ring as this rank sees it: its position v and its two neighbours. The
// reverse ring numbers ranks backwards (v = -rank mod n), so the same segment arithmetic holds.
struct RingDir {
  int v;
  Link* right;  // sends go here
  Link* left;   // receives come from here
};
RingDir ring_dir(const Context& ctx, bool reverse) {
  const int n = ctx.size, r = ctx.rank;
  if (!reverse) return {r, ctx.link(mod(r + 1, n)), ctx.link(mod(r - 1, n))};
  return {mod(-r, n), ctx.link(mod(r - 1, n)), ctx.link(mod(r + 1, n))};
}

// Ring reduce-scatter over segments seg, ending with segment `(v + shift) mod n` fully reduced
// at `work`. Step 0 sends from `input`; reduced segments land in `work` (own values from input).
// Returns the index of the last reduce step (or -1 when n == 1).
int add_ring_reduce_scatter(std::vector<Step>& steps, const RingDir& d, int n, const Segments& seg,
                            std::size_t es, const std::byte* input, std::byte* work, int shift,
                            bool finalize_last, std::byte* last_dst) {
  int prev = -1;
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(d.v + shift - 1 - s, n);
    const int recv_seg = mod(send_seg - 1, n);
    Step st;
    st.tx = d.right;
    st.send = (s == 0 ? input : work) + seg.offset(send_seg) * es;
    st.send_bytes = seg.length(send_seg) * es;
    st.send_dep = prev;
    st.rx = d.left;
    const bool last = s == n - 2;
    std::byte* dst_base = (last && last_dst != nullptr) ? last_dst : work + seg.offset(recv_seg) * es;
    st.recv = dst_base;
    st.own = input + seg.offset(recv_seg) * es;
    st.recv_bytes = seg.length(recv_seg) * es;
    st.reduce = true;
    st.finalize = last && finalize_last;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
  }
  return prev;
}

// Ring allreduce of count elements (reduce-scatter: v ends owning segment v+1, then allgather);
// each step's send depends byte-wise on the previous step's receive, so the whole thing streams.
void add_ring_allreduce(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, const RingDir& d,
                        std::size_t count, std::size_t es, const std::byte* send, std::byte* recv, bool avg) {
  const int n = ctx.size;
  add_header_step(steps, box, ctx, d.right, d.left);
  const Segments seg{count, n};
  int prev = add_ring_reduce_scatter(steps, d, n, seg, es, send, recv, 1, avg, nullptr);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(d.v + 1 - s, n);
    const int recv_seg = mod(d.v - s, n);
    Step st;
    st.tx = d.right;
    st.send = recv + seg.offset(send_seg) * es;
    st.send_bytes = seg.length(send_seg) * es;
    st.send_dep = prev;
    st.rx = d.left;
    st.recv = recv + seg.offset(recv_seg) * es;
    st.recv_bytes = seg.length(recv_seg) * es;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
  }
}

// Recursive halving (reduce-scatter), then recursive doubling (allgather), on a power-of-two
// world: round k pairs rank r with r ^ 2^k, and the two swap halves of the range they share,
// both ways on one connection. Nearest partners first, so ranks numbered host by host move
// most bytes inside a host. Each send streams behind the receive it depends on.
void add_hd_allreduce(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, std::size_t count,
                      std::size_t es, const std::byte* send, std::byte* recv, bool avg) {
  const int n = ctx.size, r = ctx.rank;
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  struct Range {
    std::size_t lo, hi;
    std::size_t len() const { return hi - lo; }
  };
  std::vector<Range> keep(static_cast<std::size_t>(rounds)), give(static_cast<std::size_t>(rounds));
  Range cur{0, count};
  int prev = -1;
  for (int k = 0; k < rounds; ++k) {
    Link* peer = ctx.link(r ^ (1 << k));
    const std::size_t mid = cur.lo + cur.len() / 2;
    const bool upper = ((r >> k) & 1) != 0;
    const Range kept = upper ? Range{mid, cur.hi} : Range{cur.lo, mid};
    const Range given = upper ? Range{cur.lo, mid} : Range{mid, cur.hi};
    add_header_step(steps, box, ctx, peer, peer);
    const std::byte* src = k == 0 ? send : recv;
    Step st;
    st.tx = peer;
    st.send = src + given.lo * es;
    st.send_bytes = given.len() * es;
    st.send_dep = prev;  // the previous round received (and reduced) cur; send `given` of it
    st.send_dep_lead = -static_cast<std::int64_t>((given.lo - cur.lo) * es);
    st.rx = peer;
    st.recv = recv + kept.lo * es;
    st.own = src + kept.lo * es;
    st.recv_bytes = kept.len() * es;
    st.reduce = true;
    st.finalize = avg && k == rounds - 1;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
    keep[static_cast<std::size_t>(k)] = kept;
    give[static_cast<std::size_t>(k)] = given;
    cur = kept;
  }
  // Allgather, last round first: send what I own (keep[k]), receive the partner's (give[k]).
  for (int k = rounds - 1; k >= 0; --k) {
    const auto ku = static_cast<std::size_t>(k);
    Link* peer = ctx.link(r ^ (1 << k));
    add_header_step(steps, box, ctx, peer, peer);
    Step st;
    st.tx = peer;
    st.send = recv + keep[ku].lo * es;
    st.send_bytes = keep[ku].len() * es;
    st.send_dep = prev;
    if (k < rounds - 1) {  // keep[k] = keep[k+1] (mine, complete) + give[k+1] (being received)
      const bool mine_first = keep[ku + 1].lo < give[ku + 1].lo;
      st.send_dep_lead = mine_first ? static_cast<std::int64_t>(keep[ku + 1].len() * es) : 0;
    }
    st.rx = peer;
    st.recv = recv + give[ku].lo * es;
    st.recv_bytes = give[ku].len() * es;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
  }
}

}  // namespace

const char* coll_name(Coll coll) {
  switch (coll) {
    case Coll::allreduce:
      return "allreduce";
    case Coll::broadcast:
      return "broadcast";
    case Coll::allgather:
      return "allgather";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::barrier:
      return "barrier";
  }
  return "?";
}

std::string describe(const WireHeader& h) {
  std::string out = coll_name(static_cast<Coll>(h.coll));
  out += "(count=" + std::to_string(h.count);
  if (h.dtype < 7) out += ", " + std::string(name_of(static_cast<DataType>(h.dtype)));
  const auto coll = static_cast<Coll>(h.coll);
  if ((coll == Coll::allreduce || coll == Coll::reduce_scatter) && h.redop < 5)
    out += ", " + std::string(name_of(static_cast<ReduceOp>(h.redop)));
  if (coll == Coll::broadcast) out += ", root=" + std::to_string(h.root);
  if (coll == Coll::allreduce && h.reserved[0] == 1) out += ", shared result " + std::to_string(h.root);
  if (h.algo >= 1 && h.algo <= 4) {
    const char* names[] = {"", "ring", "bidir", "hd", "direct"};
    out += std::string(", MLTRAIN_COMM_ALGO=") + names[h.algo];
  }
  return out + ") #" + std::to_string(h.seq);
}

void check_header(const WireHeader& mine, const WireHeader& theirs, const std::string& label, int rank,
                  const std::string& host) {
  if (theirs.magic != kCollMagic || theirs.version != kCollVersion)
    throw Error(Error::Kind::mismatch,
                label + " speaks another wire format (magic " + std::to_string(theirs.magic) + ", version " +
                    std::to_string(theirs.version) + "; this rank: version " + std::to_string(kCollVersion) +
                    ")",
                rank, host);
  if (std::memcmp(&mine, &theirs, sizeof mine) != 0)
    throw Error(Error::Kind::mismatch,
                "mismatched collective: this rank called " + describe(mine) + " but " + label + " called " +
                    describe(theirs),
                rank, host);
}

void check_header(const WireHeader& mine, const WireHeader& theirs, const Link& from) {
  check_header(mine, theirs, from.peer_label(), from.peer_rank(), from.peer_host());
}

void allreduce(Context& ctx, const void* send_v, void* recv_v, std::size_t count, DataType dtype,
               ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t es = size_of(dtype);
  const auto* send = static_cast<const std::byte*>(send_v);
  auto* recv = static_cast<std::byte*>(recv_v);
  if (n == 1) {
    if (send != recv && count > 0) std::memmove(recv, send, count * es);
    return;
  }
  EngineConfig cfg = reduce_config(ctx, dtype, op);
  std::vector<Step> steps;
  HeaderBox box;
  const std::size_t bytes = count * es;
  const bool pow2 = (n & (n - 1)) == 0;

  if (pow2 && bytes <= ctx.small_bytes) {
    // Recursive doubling: log2(n) exchanges of the whole buffer, ping-ponging between recv and
    // scratch so a step never overwrites what it is still sending. Pairwise a+b is commutative,
    // so every rank computes bit-identical results.
    int rounds = 0;
    while ((1 << rounds) < n) ++rounds;
    std::byte* tmp = scratch(ctx, 2 * bytes + 16);
    std::byte* other = tmp;
    const std::byte* src = send;
    auto out_of = [&](int k) { return ((rounds - 1 - k) % 2 == 0) ? recv : other; };
    if (src == out_of(0)) {                                    // in place: snapshot the input
      std::memcpy(tmp + bytes + 8 - (bytes % 8), src, bytes);  // keep 8-byte alignment
      src = tmp + bytes + 8 - (bytes % 8);
    }
    int prev_data = -1;
    for (int k = 0; k < rounds; ++k) {
      Link* peer = ctx.link(r ^ (1 << k));
      add_header_step(steps, box, ctx, peer, peer);
      Step st;
      st.tx = peer;
      st.send = src;
      st.send_bytes = bytes;
      st.send_dep = prev_data;
      st.rx = peer;
      st.recv = out_of(k);
      st.own = src;
      st.recv_bytes = bytes;
      st.reduce = true;
      st.finalize = (k == rounds - 1) && op == ReduceOp::avg;
      // Round k writes the buffer round k-1 sends from: stay behind that send.
      st.recv_dep = prev_data;
      prev_data = static_cast<int>(steps.size());
      steps.push_back(st);
      src = out_of(k);
    }
    run(steps, box, ctx, cfg);
    return;
  }

  const Algo algo = bytes <= ctx.small_bytes ? Algo::ring : ctx.algo;
  if (algo == Algo::direct && ctx.group != nullptr) {
    allreduce_direct(ctx, send, recv, count, dtype, op);
    return;
  }
  ctx.header.algo = static_cast<std::uint8_t>(algo);
  if (algo == Algo::hd) {
    add_hd_allreduce(steps, box, ctx, count, es, send, recv, op == ReduceOp::avg);
    run(steps, box, ctx, cfg);
    return;
  }
  if (algo != Algo::bidir) {
    add_ring_allreduce(steps, box, ctx, ring_dir(ctx, false), count, es, send, recv, op == ReduceOp::avg);
    run(steps, box, ctx, cfg);
    return;
  }
  // Two rings at once, in opposite directions, each on half of the buffer: every connection to
  // a neighbour carries data both ways. Halves split at a multiple of 16 elements.
  const std::size_t first = (count / 2) & ~std::size_t{15};
  std::vector<std::vector<Step>> channels(2);
  HeaderBox boxes[2];
  add_ring_allreduce(channels[0], boxes[0], ctx, ring_dir(ctx, false), first, es, send, recv,
                     op == ReduceOp::avg);
  add_ring_allreduce(channels[1], boxes[1], ctx, ring_dir(ctx, true), count - first, es, send + first * es,
                     recv + first * es, op == ReduceOp::avg);
  run(channels, boxes, ctx, cfg);
}

void broadcast(Context& ctx, void* buf, std::size_t count, DataType dtype, int root) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1) return;
  const std::size_t bytes = count * size_of(dtype);
  Link* right = ctx.link(mod(r + 1, n));
  Link* left = ctx.link(mod(r - 1, n));
  std::vector<Step> steps;
  HeaderBox box;
  add_header_step(steps, box, ctx, right, left);
  const int pos = mod(r - root, n);  // chain root -> root+1 -> ... -> root-1, pipelined
  int recv_step = -1;
  if (pos != 0) {
    Step st;
    st.rx = left;
    st.recv = buf;
    st.recv_bytes = bytes;
    recv_step = static_cast<int>(steps.size());
    steps.push_back(st);
  }
  if (pos != n - 1) {
    Step st;
    st.tx = right;
    st.send = buf;
    st.send_bytes = bytes;
    st.send_dep = recv_step;
    steps.push_back(st);
  }
  run(steps, box, ctx, ctx.engine);
}

void allgather(Context& ctx, const void* send_v, void* recv_v, std::size_t count, DataType dtype) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t block = count * size_of(dtype);
  auto* recv = static_cast<std::byte*>(recv_v);
  std::byte* mine = recv + static_cast<std::size_t>(r) * block;
  if (send_v != mine && block > 0) std::memmove(mine, send_v, block);
  if (n == 1) return;
  Link* right = ctx.link(mod(r + 1, n));
  Link* left = ctx.link(mod(r - 1, n));
  std::vector<Step> steps;
  HeaderBox box;
  add_header_step(steps, box, ctx, right, left);
  int prev = -1;
  for (int s = 0; s < n - 1; ++s) {
    Step st;
    st.tx = right;
    st.send = recv + static_cast<std::size_t>(mod(r - s, n)) * block;
    st.send_bytes = block;
    st.send_dep = prev;
    st.rx = left;
    st.recv = recv + static_cast<std::size_t>(mod(r - s - 1, n)) * block;
    st.recv_bytes = block;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
  }
  run(steps, box, ctx, ctx.engine);
}

void reduce_scatter(Context& ctx, const void* send_v, void* recv_v, std::size_t recv_count, DataType dtype,
                    ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  const std::size_t es = size_of(dtype);
  const std::size_t block = recv_count * es;
  const auto* send = static_cast<const std::byte*>(send_v);
  auto* recv = static_cast<std::byte*>(recv_v);
  if (n == 1) {
    if (send != recv && block > 0) std::memmove(recv, send, block);
    return;
  }
  std::vector<Step> steps;
  HeaderBox box;
  add_header_step(steps, box, ctx, ctx.link(mod(r + 1, n)), ctx.link(mod(r - 1, n)));
  const Segments seg{recv_count * static_cast<std::size_t>(n), n};  // equal blocks
  std::byte* work = scratch(ctx, block * static_cast<std::size_t>(n));
  // shift 0: rank r ends owning segment r, written straight into recv.
  add_ring_reduce_scatter(steps, ring_dir(ctx, false), n, seg, es, send, work, 0, op == ReduceOp::avg, recv);
  run(steps, box, ctx, reduce_config(ctx, dtype, op));
}

void barrier(Context& ctx) {
  // A ring allgather of one byte per rank: no rank's last receive can complete before every
  // rank has entered.
  std::vector<std::byte> bytes(static_cast<std::size_t>(ctx.size));
  allgather(ctx, bytes.data() + ctx.rank, bytes.data(), 1, DataType::u8);
}

}  // namespace mltrain::comm::detail
