#include "algorithms/collectives.h"

#include <cstring>
#include <deque>

namespace mltrain::comm::detail {

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

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

std::string describe(const WireHeader& h) {
  std::string out = coll_name(static_cast<Coll>(h.coll));
  out += "(count=" + std::to_string(h.count);
  if (h.dtype < 7) out += ", " + std::string(name_of(static_cast<DataType>(h.dtype)));
  const auto coll = static_cast<Coll>(h.coll);
  if ((coll == Coll::allreduce || coll == Coll::reduce_scatter) && h.redop < 5)
    out += ", " + std::string(name_of(static_cast<ReduceOp>(h.redop)));
  if (coll == Coll::broadcast) out += ", root=" + std::to_string(h.root);
  return out + ") #" + std::to_string(h.seq);
}

// Holds the headers received during one collective (deque: stable addresses).
struct HeaderBox {
  std::deque<WireHeader> received;
  std::vector<std::pair<std::size_t, WireHeader*>> by_step;
};

// Appends a header exchange: send mine on tx, receive theirs from rx.
void add_header_step(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, Link* tx,
                     Link* rx) {
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

void run(std::vector<Step>& steps, HeaderBox& box, const Context& ctx, EngineConfig cfg) {
  cfg.on_header = [&](std::size_t step) {
    for (auto& [index, header] : box.by_step)
      if (index == step) check_header(ctx.header, *header, *steps[step].rx);
  };
  run_steps(steps, cfg);
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

// Ring reduce-scatter over segments seg, ending with segment `(rank + shift) mod n` fully reduced
// at `work`. Step 0 sends from `input`; reduced segments land in `work` (own values from input).
// Returns the index of the last reduce step (or -1 when n == 1).
int add_ring_reduce_scatter(std::vector<Step>& steps, const Context& ctx, const Segments& seg,
                            std::size_t es, const std::byte* input, std::byte* work, int shift,
                            bool finalize_last, std::byte* last_dst) {
  const int n = ctx.size, r = ctx.rank;
  Link* right = ctx.link(mod(r + 1, n));
  Link* left = ctx.link(mod(r - 1, n));
  int prev = -1;
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(r + shift - 1 - s, n);
    const int recv_seg = mod(send_seg - 1, n);
    Step st;
    st.tx = right;
    st.send = (s == 0 ? input : work) + seg.offset(send_seg) * es;
    st.send_bytes = seg.length(send_seg) * es;
    st.send_dep = prev;
    st.rx = left;
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

}  // namespace

const char* coll_name(Coll coll) {
  switch (coll) {
  case Coll::allreduce: return "allreduce";
  case Coll::broadcast: return "broadcast";
  case Coll::allgather: return "allgather";
  case Coll::reduce_scatter: return "reduce_scatter";
  case Coll::barrier: return "barrier";
  }
  return "?";
}

void check_header(const WireHeader& mine, const WireHeader& theirs, const Link& from) {
  if (theirs.magic != kCollMagic || theirs.version != kCollVersion)
    throw Error(Error::Kind::mismatch,
                from.peer_label() + " speaks another wire format (magic " +
                    std::to_string(theirs.magic) + ", version " + std::to_string(theirs.version) +
                    "; this rank: version " + std::to_string(kCollVersion) + ")",
                from.peer_rank(), from.peer_host());
  if (std::memcmp(&mine, &theirs, sizeof mine) != 0)
    throw Error(Error::Kind::mismatch,
                "mismatched collective: this rank called " + describe(mine) + " but " +
                    from.peer_label() + " called " + describe(theirs),
                from.peer_rank(), from.peer_host());
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
    if (src == out_of(0)) {  // in place: snapshot the input
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

  // Ring: reduce-scatter (rank r ends owning segment r+1), then allgather; each step's send
  // depends byte-wise on the previous step's receive, so the whole thing streams.
  Link* right = ctx.link(mod(r + 1, n));
  Link* left = ctx.link(mod(r - 1, n));
  add_header_step(steps, box, ctx, right, left);
  const Segments seg{count, n};
  int prev = add_ring_reduce_scatter(steps, ctx, seg, es, send, recv, 1, op == ReduceOp::avg,
                                     nullptr);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = mod(r + 1 - s, n);
    const int recv_seg = mod(r - s, n);
    Step st;
    st.tx = right;
    st.send = recv + seg.offset(send_seg) * es;
    st.send_bytes = seg.length(send_seg) * es;
    st.send_dep = prev;
    st.rx = left;
    st.recv = recv + seg.offset(recv_seg) * es;
    st.recv_bytes = seg.length(recv_seg) * es;
    prev = static_cast<int>(steps.size());
    steps.push_back(st);
  }
  run(steps, box, ctx, cfg);
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

void reduce_scatter(Context& ctx, const void* send_v, void* recv_v, std::size_t recv_count,
                    DataType dtype, ReduceOp op) {
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
  add_ring_reduce_scatter(steps, ctx, seg, es, send, work, 0, op == ReduceOp::avg, recv);
  run(steps, box, ctx, reduce_config(ctx, dtype, op));
}

void barrier(Context& ctx) {
  // A ring allgather of one byte per rank: no rank's last receive can complete before every
  // rank has entered.
  std::vector<std::byte> bytes(static_cast<std::size_t>(ctx.size));
  allgather(ctx, bytes.data() + ctx.rank, bytes.data(), 1, DataType::u8);
}

}  // namespace mltrain::comm::detail
