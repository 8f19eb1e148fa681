// Communicator: joins the job through the store, connects links on first use (shm to ranks on
// the same machine, TCP otherwise), runs collectives, and turns failures into one message that
// names the rank that failed first.
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "algorithms/collectives.h"
#include "core/sys_check.h"
#include "mltrain/comm.hpp"
#include "mltrain/comm_stats.h"
#include "rendezvous/blame.h"
#include "rendezvous/join.h"
#include "rendezvous/records.h"
#include "rendezvous/store.h"
#include "session/stat_recorder.h"
#include "transport/nccl.h"
#include "transport/shm_group.h"
#include "transport/shm_link.h"
#include "transport/tcp_link.h"

namespace mltrain::comm {

using namespace detail;

namespace {

std::string this_host() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// Two processes can share POSIX shared memory when they run on one kernel (its boot id, as NCCL's
// host hash uses it) and see the same /dev/shm (its device and inode): host names prove neither,
// since cloned machines often share one. Without a boot id, the host name is all there is.
std::string memory_identity(const std::string& host) {
  std::string boot = first_line("/proc/sys/kernel/random/boot_id");
  if (boot.empty()) boot = "host:" + host;
  struct stat st {};
  if (::stat("/dev/shm", &st) == 0)
    boot += "/shm:" + std::to_string(static_cast<unsigned long long>(st.st_dev)) + ":" +
            std::to_string(static_cast<unsigned long long>(st.st_ino));
  return boot;
}

}  // namespace

struct Communicator::Impl {
  Options opt;
  std::string host;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<StoreClient> store;
  std::uint64_t session = 0;
  std::string shm_base;  // "/mltrain-<run id>-<session>": the start of every shared memory name
  Fd listener;
  std::unique_ptr<ShmMapping> bell_map;
  // Each shared-memory peer's bell, mapped at init so every name can go before init returns;
  // moved into the peer's link when it is made.
  std::vector<std::unique_ptr<ShmMapping>> peer_bells;
  Bell local_bell;  // used when shared memory is off
  Bell* bell = &local_bell;
  std::vector<PeerRecord> peers;  // by rank, this one's included
  std::map<int, std::unique_ptr<Link>> links;
  std::unique_ptr<ShmGroup> group;  // algo direct: every rank's shared memory on this host
  std::map<int, Fd> accepted;       // connections from lower ranks not claimed yet
  struct PendingLink {              // accepted, its hello not complete yet
    Fd fd;
    std::string from, got;
    Clock::time_point by;
  };
  std::vector<PendingLink> pending;
  std::vector<std::byte> scratch;
  std::uint64_t seq = 0;
  bool broken = false;
  Algo algo = Algo::ring;  // the same on every rank: from options and the hosts of all ranks
  std::string broken_reason;
  bool gpu_here = false;  // CUDA loaded and a device is visible: buffers may be device memory
  BackendChoice choice;   // the same on every rank
  std::unique_ptr<NcclComm> nccl;
  std::unique_ptr<ShmMapping> stats_map;  // the counters the agent reads (comm_stats.h)
  mltrain_comm_stats* stats = nullptr;
  StatRecorder recorder;  // writes *stats

  explicit Impl(const Options& o);
  ~Impl();
  Deadline deadline() const { return Clock::now() + opt.timeout; }
  std::string me() const { return "rank " + std::to_string(opt.rank) + " (" + host + ")"; }
  std::string label(int peer) const {
    return "rank " + std::to_string(peer) + " (" + peers[static_cast<std::size_t>(peer)].host + ")";
  }
  Link* link(int peer);
  // Hosts the store (rank 0, unless the launcher does), connects to it, agrees on the session.
  void join_store(Deadline dl);
  bool join_group(Deadline dl);  // false: rank 0 could not reserve it (every rank then uses the ring)
  Fd accept_from(int peer);
  bool wants_shm(int peer) const { return shm_between(opt.rank, peer); }
  bool shm_between(int a, int b) const;  // whether ranks a and b talk through shared memory
  Context context(Coll coll, DataType dtype, ReduceOp op, int root, std::size_t count);
  template <class Body>
  void collective(Coll coll, DataType dtype, ReduceOp op, int root, std::size_t count, Body&& body);
  [[noreturn]] void fail(Coll coll, const Error& e);
  void settle_backend(Deadline dl);
  void publish_stats();
  // Whether a collective's buffers are in device memory (then NCCL carries it); throws a usage
  // Error for mixed buffers or device buffers on the CPU backend.
  bool on_device(const void* a, const void* b) const;
};

Communicator::Impl::Impl(const Options& o) : opt(o) {
  if (opt.world_size < 1 || opt.world_size > 4096)
    throw Error(Error::Kind::usage,
                "WORLD_SIZE=" + std::to_string(opt.world_size) + " is out of range (1..4096)");
  if (opt.rank < 0 || opt.rank >= opt.world_size)
    throw Error(Error::Kind::usage,
                "RANK=" + std::to_string(opt.rank) + " is not in 0.." + std::to_string(opt.world_size - 1));
  host = opt.host.empty() ? this_host() : opt.host;
  if (!opt.run_id.empty() && opt.stats) recorder.begin();  // joining gives the clock its scale
  opt.shm_bytes = std::max<std::size_t>((opt.shm_bytes + 4095) / 4096 * 4096, 64u << 10);
  opt.chunk_bytes = std::max<std::size_t>(opt.chunk_bytes, 4096);
  PeerRecord mine;
  mine.host = host;
  mine.memory = memory_identity(host);
  if (opt.host_splits_shm) mine.memory += "/name:" + host;
  mine.gpu = probe_gpu();
  gpu_here = mine.gpu.gpu;
  peers.resize(static_cast<std::size_t>(opt.world_size));
  peers[static_cast<std::size_t>(opt.rank)] = mine;

  const Deadline dl = deadline();
  if (opt.world_size == 1) {  // nothing to join
    settle_backend(dl);
    return;
  }
  join_store(dl);
  auto [fd, port] = listen_tcp(0);
  listener = std::move(fd);
  if (opt.transport != Transport::tcp) {
    bell_map = std::make_unique<ShmMapping>(shm_base + "-bell-" + std::to_string(opt.rank), 4096, true);
    bell = new (bell_map->data()) Bell{};
  }
  mine.ip = store->local_address();
  mine.port = port;
  mine.pid = ::getpid();
  peers = exchange_records(*store, opt.rank, opt.world_size, mine, dl, opt.timeout, me());
  bool crosses = false;
  for (int p = 0; p < opt.world_size; ++p) crosses |= !shm_between(p, (p + 1) % opt.world_size);
  algo = choose_algo(opt.algo, opt.world_size, crosses);
  if (algo == Algo::direct && !join_group(dl)) algo = Algo::ring;
  peer_bells.resize(static_cast<std::size_t>(opt.world_size));
  for (int p = 0; p < opt.world_size; ++p)
    if (p != opt.rank && wants_shm(p))
      peer_bells[static_cast<std::size_t>(p)] =
          std::make_unique<ShmMapping>(shm_base + "-bell-" + std::to_string(p), 4096, false);
  // Ring neighbours now, so later failures are about collectives, not setup.
  link((opt.rank + 1) % opt.world_size);
  link((opt.rank + opt.world_size - 1) % opt.world_size);
  // Every rank leaves init together: a barrier on the ring links, outside the collectives' count
  // (seq 0). Rank 0's process hosts the store and each rank its shared-memory bell, so a rank that
  // returned from init and exited at once (a script that stops on a bad argument) would pull them
  // from under a peer still joining.
  try {
    Context ctx = context(Coll::barrier, DataType::u8, ReduceOp::sum, 0, 1);
    ctx.header.seq = 0;
    detail::barrier(ctx);
  } catch (const Error& e) {
    throw Error(e.kind(), "mltrain-comm: " + me() + ": joining: " + e.what(), e.peer_rank(), e.peer_host());
  }
  // Every rank has mapped the group and its peers' bells now: nothing is left behind in
  // /dev/shm if one dies.
  if (group && opt.rank == 0) group->mapping().unlink();
  if (bell_map) bell_map->unlink_quietly();
  settle_backend(dl);
}

void Communicator::Impl::join_store(Deadline dl) {
  if (opt.rank == 0 && opt.host_store) {
    try {
      // A store at a loopback address serves ranks on this host only: it listens there alone.
      const auto [store_host, store_port] = split_host_port(opt.store_addr);
      const bool loopback = store_host == "localhost" || store_host.rfind("127.", 0) == 0;
      server = std::make_unique<StoreServer>(store_port, opt.token, loopback);
    } catch (const Error& e) {
      throw Error(e.kind(), "mltrain-comm: " + me() + ": cannot host the store at " + opt.store_addr +
                                " (MLTRAIN_STORE_ADDR): " + e.what());
    }
  }
  store = std::make_unique<StoreClient>(opt.store_addr, opt.token, opt.rank, dl);
  const JobSession joined = agree_session(*store, opt.rank, opt.run_id, dl);
  session = joined.id;
  shm_base = joined.shm_base;
}

// The counter block is created exclusively, mode 0600 (ShmMapping). /dev/shm is everyone's: a
// file already at the name that is not this user's (a stranger's, even one made to look like a
// block) is neither removed nor used, and the rank goes without counters. The agent names each
// rank's block with a random part, so a stranger cannot take the name first.
void Communicator::Impl::publish_stats() {
  if (opt.run_id.empty() || !opt.stats) return;
  std::string name = opt.stats_name;
  if (name.size() < 10 || name.size() > 250 || name.compare(0, 9, "/mltrain-") != 0 ||
      name.find('/', 1) != std::string::npos) {
    name = "/mltrain-" + shm_safe(opt.run_id) + "-stats-" + std::to_string(opt.rank);
  }
  const std::string path = "/dev/shm" + name;
  // O_NONBLOCK: a FIFO planted there must not hold init.
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC); fd >= 0) {
    struct stat st {};
    const bool ours = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid();
    ::close(fd);
    if (!ours) {
      std::fprintf(stderr,
                   "mltrain-comm: %s: %s is not this user's (uid %u owns it): it is left alone and this rank "
                   "keeps no counters for mltrain top\n",
                   me().c_str(), path.c_str(), static_cast<unsigned>(st.st_uid));
      return;
    }
    ::shm_unlink(name.c_str());  // this user's block of an earlier gang: a restarted rank replaces it
  } else if (errno == ELOOP) {
    std::fprintf(stderr,
                 "mltrain-comm: %s: %s is a symbolic link: it is left alone and this rank keeps no counters "
                 "for mltrain top\n",
                 me().c_str(), path.c_str());
    return;
  }
  try {
    stats_map = std::make_unique<ShmMapping>(name, 4096, true);  // O_CREAT|O_EXCL, 0600
  } catch (const Error& e) {
    if (opt.debug_links)
      std::fprintf(stderr, "mltrain-comm: %s: no counters for top: %s\n", me().c_str(), e.what());
    return;
  }
  stats = static_cast<mltrain_comm_stats*>(stats_map->data());
  stats->version = MLTRAIN_COMM_STATS_VERSION;
  stats->rank = opt.rank;
  stats->world_size = opt.world_size;
  stats->pid = static_cast<std::int32_t>(::getpid());
  stats->backend = choice.backend == Backend::nccl ? 1u : 0u;
  recorder.start(*stats);
  __atomic_store_n(&stats->magic, MLTRAIN_COMM_STATS_MAGIC, __ATOMIC_RELEASE);
}

void Communicator::Impl::settle_backend(Deadline dl) {
  std::vector<GpuVote> votes;
  std::vector<std::string> hosts, memory;
  bool any_gpu = false;
  for (const auto& p : peers) {
    votes.push_back(p.gpu);
    hosts.push_back(p.host);
    memory.push_back(p.memory);
    any_gpu |= p.gpu.gpu;
  }
  choice = choose_backend(opt.backend, votes, hosts, memory);
  if (choice.refused)
    throw Error(Error::Kind::usage, "mltrain-comm: " + me() +
                                        ": MLTRAIN_COMM_BACKEND=nccl ([comm] backend), but " + choice.why +
                                        "; use backend = \"auto\" to fall back to the CPU backend");
  // One line, from rank 0, whenever a GPU is in play: which backend device buffers get, and why.
  if (opt.rank == 0 && (any_gpu || opt.backend == Backend::nccl))
    std::fprintf(stderr, "mltrain-comm: backend %s: %s\n",
                 choice.backend == Backend::nccl ? "nccl" : "tcp (CPU)", choice.why.c_str());
  if (choice.backend == Backend::nccl) {
    try {
      nccl = std::make_unique<NcclComm>(opt.rank, opt.world_size, store.get(), dl, opt.timeout, host);
    } catch (const Error& e) {
      throw Error(e.kind(), "mltrain-comm: " + me() + ": NCCL init: " + e.what(), e.peer_rank(),
                  e.peer_host());
    }
  }
  publish_stats();
}

bool Communicator::Impl::on_device(const void* a, const void* b) const {
  if (!gpu_here) return false;
  const bool da = is_device_pointer(a);
  const bool db = b == a ? da : is_device_pointer(b);
  if (da != db)
    throw Error(Error::Kind::usage,
                "one buffer is in device memory and the other in host memory; pass both in "
                "the same kind of memory");
  if (da && !nccl)
    throw Error(Error::Kind::usage,
                "a buffer in device memory, but this job uses the CPU backend (" + choice.why + ")");
  return da;
}

Communicator::Impl::~Impl() {
  if (group) group->close();
  for (auto& [peer, l] : links) l->close();
  links.clear();
}

bool Communicator::Impl::shm_between(int a, int b) const {
  if (opt.transport == Transport::shm) return true;
  if (opt.transport == Transport::tcp) return false;
  return peers[static_cast<std::size_t>(a)].memory == peers[static_cast<std::size_t>(b)].memory;
}

Fd Communicator::Impl::accept_from(int peer) {
  if (auto it = accepted.find(peer); it != accepted.end()) {
    Fd fd = std::move(it->second);
    accepted.erase(it);
    return fd;
  }
  // Every connection proves itself with its hello concurrently, each within kLinkHelloWithin: a
  // stranger that connects and sends nothing is dropped without delaying the peers (or being
  // mistaken for one of them). At most kMaxPending wait at once; the oldest makes room.
  constexpr auto kLinkHelloWithin = std::chrono::seconds(5);
  constexpr std::size_t kMaxPending = 64;
  const Deadline dl = deadline();
  auto drop = [&](std::size_t i, const std::string& why) {
    std::fprintf(stderr, "mltrain-comm %s: dropped connection from %s: %s\n", me().c_str(),
                 pending[i].from.c_str(), why.c_str());
    pending.erase(pending.begin() + std::ptrdiff_t(i));
  };
  while (true) {
    const auto now = Clock::now();
    if (now >= dl)
      throw Error(
          Error::Kind::timeout,
          label(peer) + " did not connect within " + std::to_string(opt.timeout.count() / 1000) + " s", peer,
          peers[static_cast<std::size_t>(peer)].host);
    Clock::time_point wake = dl;
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (pending[i].by <= now)
        drop(i, "no hello within " + std::to_string(kLinkHelloWithin.count()) + " s");
      else
        wake = std::min(wake, pending[i].by);
    }
    std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
    for (const auto& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
    const int ms =
        int(std::max<std::int64_t>(1, std::chrono::ceil<std::chrono::milliseconds>(wake - now).count()));
    if (::poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR)
      throw_sys("poll", "accepting links on fd " + std::to_string(listener.get()));
    for (std::size_t i = fds.size(); i-- > 1;) {  // backwards: drop() shifts what follows
      if (fds[i].revents == 0) continue;
      PendingLink& p = pending[i - 1];
      char buf[sizeof(LinkHello)];
      const ssize_t k = ::recv(p.fd.get(), buf, sizeof(LinkHello) - p.got.size(), 0);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (k <= 0) {
        drop(i - 1, k == 0 ? "closed before its hello" : std::string(std::strerror(errno)));
        continue;
      }
      p.got.append(buf, std::size_t(k));
      if (p.got.size() < sizeof(LinkHello)) continue;
      LinkHello hello;
      std::memcpy(&hello, p.got.data(), sizeof hello);
      if (hello.magic != kLinkMagic || hello.version != kLinkVersion || hello.session != session ||
          hello.to_rank != opt.rank || hello.from_rank < 0 || hello.from_rank >= opt.world_size) {
        drop(i - 1, hello.magic != kLinkMagic || hello.version != kLinkVersion
                        ? "bad magic or wire version"
                        : "not from this job (session or rank mismatch)");
        continue;
      }
      Fd fd = std::move(p.fd);
      pending.erase(pending.begin() + std::ptrdiff_t(i - 1));
      if (hello.from_rank == peer) return fd;  // the rest stay pending for the next call
      accepted[hello.from_rank] = std::move(fd);
    }
    if (fds[0].revents != 0) {
      for (int batch = 0; batch < 64; ++batch) {
        Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd) {
          // Out of descriptors (a flood): the oldest waiting connection makes room. Never fatal.
          if ((errno == EMFILE || errno == ENFILE) && !pending.empty())
            drop(0, "out of descriptors: " + std::string(std::strerror(errno)));
          break;
        }
        set_nodelay(fd.get());
        if (pending.size() >= kMaxPending) drop(0, "too many connections waiting for their hello");
        std::string from = peer_name(fd.get());
        pending.push_back({std::move(fd), std::move(from), {}, Clock::now() + kLinkHelloWithin});
      }
    }
  }
}

Link* Communicator::Impl::link(int peer) {
  if (auto it = links.find(peer); it != links.end()) return it->second.get();
  const PeerRecord& pi = peers[static_cast<std::size_t>(peer)];
  const Deadline dl = deadline();
  const int r = opt.rank;
  std::unique_ptr<Link> made;
  std::string congestion;  // what set_congestion chose for a TCP link
  if (wants_shm(peer)) {
    const int a = std::min(r, peer), b = std::max(r, peer);
    const std::string pair = std::to_string(a) + "-" + std::to_string(b);
    const std::string name = shm_base + "-" + pair;
    const std::size_t bytes = ShmLink::segment_bytes(opt.shm_bytes);
    std::unique_ptr<ShmMapping> segment;
    if (r == a) {
      segment = std::make_unique<ShmMapping>(name, bytes, true);
      ShmLink::init_segment(segment->data(), opt.shm_bytes);
      store->set("shm/" + pair, name, dl);
    } else {
      store->wait("shm/" + pair, dl);
      segment = std::make_unique<ShmMapping>(name, bytes, false);
      segment->unlink();  // both ends mapped: nothing left behind if a process dies
      ShmLink::check_segment(segment->data(), opt.shm_bytes, label(peer));
    }
    made = std::make_unique<ShmLink>(std::move(segment), r == a ? 0 : 1, bell,
                                     std::move(peer_bells[static_cast<std::size_t>(peer)]), pi.pid, peer,
                                     pi.host);
  } else {
    Fd fd;
    if (r < peer) {
      fd = connect_tcp(pi.ip, pi.port, dl, me() + " connecting to " + label(peer));
      LinkHello hello;
      hello.from_rank = r;
      hello.to_rank = peer;
      hello.session = session;
      send_all(fd.get(), &hello, sizeof hello, dl, "hello to " + label(peer));
    } else {
      fd = accept_from(peer);
    }
    congestion = set_congestion(fd.get(), opt.tcp_congestion);
    made = std::make_unique<TcpLink>(std::move(fd), peer, pi.host,
                                     std::max<std::size_t>(4 * opt.chunk_bytes, 1u << 20));
  }
  if (opt.debug_links) {
    const char* why = opt.transport != Transport::automatic ? "MLTRAIN_COMM_TRANSPORT"
                      : wants_shm(peer)                     ? "same boot id and /dev/shm"
                      : opt.host_splits_shm ? "different boot id, /dev/shm or MLTRAIN_COMM_HOST"
                                            : "different boot id or /dev/shm";
    std::fprintf(stderr, "mltrain-comm: %s: link to %s: %s (%s)%s%s\n", me().c_str(), label(peer).c_str(),
                 made->kind(), why, congestion.empty() ? "" : ", congestion control ", congestion.c_str());
  }
  Link* raw = made.get();
  links[peer] = std::move(made);
  return raw;
}

bool Communicator::Impl::join_group(Deadline dl) {
  const std::string name = shm_base + "-group";
  const std::size_t bytes = ShmGroup::segment_bytes(opt.world_size, opt.shm_bytes);
  std::unique_ptr<ShmMapping> segment;
  if (opt.rank == 0) {
    try {
      segment = std::make_unique<ShmMapping>(name, bytes, true, /*reserve=*/true);
    } catch (const Error& e) {
      std::fprintf(stderr, "mltrain-comm: %s: %s; the large allreduce uses the ring instead\n", me().c_str(),
                   e.what());
      store->set("shm/group", "", dl);
      return false;
    }
    ShmGroup::init_segment(segment->data(), opt.world_size, opt.shm_bytes);
    store->set("shm/group", name, dl);
  } else {
    if (store->wait("shm/group", dl).empty()) return false;
    segment = std::make_unique<ShmMapping>(name, bytes, false);
    ShmGroup::check_segment(segment->data(), opt.world_size, opt.shm_bytes);
  }
  std::vector<ShmGroup::Peer> members(static_cast<std::size_t>(opt.world_size));
  for (int p = 0; p < opt.world_size; ++p) {
    auto& m = members[static_cast<std::size_t>(p)];
    m.pid = p == opt.rank ? 0 : peers[static_cast<std::size_t>(p)].pid;
    m.label = p == opt.rank ? me() : label(p);
    m.host = p == opt.rank ? host : peers[static_cast<std::size_t>(p)].host;
  }
  group = std::make_unique<ShmGroup>(std::move(segment), shm_base, opt.rank, std::move(members));
  return true;
}

Context Communicator::Impl::context(Coll coll, DataType dtype, ReduceOp op, int root, std::size_t count) {
  Context ctx;
  ctx.rank = opt.rank;
  ctx.size = opt.world_size;
  ctx.link = [this](int peer) { return link(peer); };
  ctx.engine.piece = opt.chunk_bytes;
  ctx.engine.spin_us = opt.spin_us;
  ctx.engine.bell = bell;
  ctx.engine.timeout = opt.timeout;
  ctx.small_bytes = opt.small_bytes;
  ctx.algo = algo;
  ctx.scratch = &scratch;
  ctx.group = group.get();
  ctx.header.coll = static_cast<std::uint8_t>(coll);
  ctx.header.dtype = static_cast<std::uint8_t>(dtype);
  ctx.header.redop = static_cast<std::uint8_t>(op);
  ctx.header.root = root;
  ctx.header.count = count;
  ctx.header.seq = seq;
  return ctx;
}

template <class Body>
void Communicator::Impl::collective(Coll coll, DataType dtype, ReduceOp op, int root, std::size_t count,
                                    Body&& body) {
  if (broken)
    throw Error(Error::Kind::usage, "mltrain-comm: " + me() + ": " + coll_name(coll) +
                                        " on a communicator broken by an earlier error: " + broken_reason);
  ++seq;
  // Time inside the call, for the agent's counters (StatRecorder).
  struct Account {
    mltrain_comm_stats* s;
    StatRecorder& recorder;
    std::uint64_t bytes;
    Account(mltrain_comm_stats* st, StatRecorder& r, std::uint64_t b) : s(st), recorder(r), bytes(b) {
      if (s) recorder.enter(*s);
    }
    ~Account() {
      if (s) recorder.leave(*s, bytes);
    }
  } account(stats, recorder, static_cast<unsigned>(dtype) <= 6u ? count * size_of(dtype) : 0);
  try {
    if (static_cast<unsigned>(dtype) > 6u)
      throw Error(Error::Kind::usage, "unknown dtype " + std::to_string(static_cast<int>(dtype)));
    if (static_cast<unsigned>(op) > 4u)
      throw Error(Error::Kind::usage, "unknown reduce op " + std::to_string(static_cast<int>(op)));
    if (root < 0 || root >= opt.world_size)
      throw Error(Error::Kind::usage, "root " + std::to_string(root) + " is not a rank");
    Context ctx = context(coll, dtype, op, root, count);
    body(ctx);
  } catch (const Error& e) {
    fail(coll, e);
  }
}

void Communicator::Impl::fail(Coll coll, const Error& e) {
  broken = true;
  std::vector<std::string> hosts;
  for (const auto& p : peers) hosts.push_back(p.host);
  const std::string what = std::string(coll_name(coll)) + " #" + std::to_string(seq);
  const Verdict v = Blame(store.get(), opt.rank, std::move(hosts), opt.timeout).settle(e, what);
  if (nccl) nccl->abort();
  if (group) group->close();
  for (auto& [peer, l] : links) l->close();
  std::string msg = "mltrain-comm: " + me() + ": " + what + ": " + v.detail;
  if (!v.first.empty()) msg += "\n  first failure: " + v.first;
  broken_reason = msg;
  throw Error(e.kind(), msg, v.culprit, v.culprit_host);
}

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;

std::unique_ptr<Communicator> Communicator::create(const Options& options) {
  detail::check_congestion(options.tcp_congestion);
  return std::unique_ptr<Communicator>(new Communicator(std::make_unique<Impl>(options)));
}

std::unique_ptr<Communicator> Communicator::init_from_env() { return create(Options::from_env()); }

int Communicator::rank() const noexcept { return impl_->opt.rank; }
int Communicator::size() const noexcept { return impl_->opt.world_size; }
const std::string& Communicator::host() const noexcept { return impl_->host; }
Algo Communicator::algo() const noexcept { return impl_->algo; }
Backend Communicator::backend() const noexcept { return impl_->choice.backend; }
const std::string& Communicator::backend_reason() const noexcept { return impl_->choice.why; }
void Communicator::set_cuda_stream(void* stream) noexcept {
  if (impl_->nccl) impl_->nccl->set_stream(stream);
}

namespace {
void require(bool ok, const char* what) {
  if (!ok) throw Error(Error::Kind::usage, what);
}
}  // namespace

void Communicator::allreduce(const void* send, void* recv, std::size_t count, DataType dtype, ReduceOp op) {
  impl_->collective(Coll::allreduce, dtype, op, 0, count, [&](Context& ctx) {
    require(count == 0 || (send != nullptr && recv != nullptr), "null buffer");
    if (impl_->on_device(send, recv))
      impl_->nccl->allreduce(send, recv, count, dtype, op);
    else
      detail::allreduce(ctx, send, recv, count, dtype, op);
  });
}

namespace {
// allreduce_shared and allreduce_mapped: through the group when there is one, else in place.
const void* keyed_allreduce(Communicator::Impl& impl, void* buf, std::size_t count, DataType dtype,
                            ReduceOp op, std::uint64_t key, const SharedFile* file, bool into_inputs) {
  const void* result = buf;
  impl.collective(Coll::allreduce, dtype, op, 0, count, [&](Context& ctx) {
    require(count == 0 || buf != nullptr, "null buffer");
    auto* bytes = static_cast<std::byte*>(buf);
    if (impl.on_device(buf, buf))
      impl.nccl->allreduce(buf, buf, count, dtype, op);
    else if (ctx.group != nullptr)
      result = detail::allreduce_direct(ctx, bytes, bytes, count, dtype, op, &key, file, into_inputs);
    else
      detail::allreduce(ctx, buf, buf, count, dtype, op);
  });
  return result;
}
}  // namespace

const void* Communicator::allreduce_shared(void* buf, std::size_t count, DataType dtype, ReduceOp op,
                                           std::uint64_t key, const SharedFile* file) {
  return keyed_allreduce(*impl_, buf, count, dtype, op, key, file, false);
}

void Communicator::allreduce_mapped(void* buf, std::size_t count, DataType dtype, ReduceOp op,
                                    std::uint64_t key, const SharedFile& file) {
  keyed_allreduce(*impl_, buf, count, dtype, op, key, &file, true);
}

void Communicator::release_shared(std::uint64_t key) noexcept {
  if (impl_->group) impl_->group->release_result(key);
}

void Communicator::broadcast(void* buf, std::size_t count, DataType dtype, int root) {
  impl_->collective(Coll::broadcast, dtype, ReduceOp::sum, root, count, [&](Context& ctx) {
    require(count == 0 || buf != nullptr, "null buffer");
    if (impl_->on_device(buf, buf))
      impl_->nccl->broadcast(buf, count, dtype, root);
    else
      detail::broadcast(ctx, buf, count, dtype, root);
  });
}

void Communicator::allgather(const void* send, void* recv, std::size_t count, DataType dtype) {
  impl_->collective(Coll::allgather, dtype, ReduceOp::sum, 0, count, [&](Context& ctx) {
    require(count == 0 || (send != nullptr && recv != nullptr), "null buffer");
    if (impl_->on_device(send, recv))
      impl_->nccl->allgather(send, recv, count, dtype);
    else
      detail::allgather(ctx, send, recv, count, dtype);
  });
}

void Communicator::reduce_scatter(const void* send, void* recv, std::size_t recv_count, DataType dtype,
                                  ReduceOp op) {
  impl_->collective(Coll::reduce_scatter, dtype, op, 0, recv_count, [&](Context& ctx) {
    require(recv_count == 0 || (send != nullptr && recv != nullptr), "null buffer");
    if (impl_->on_device(send, recv))
      impl_->nccl->reduce_scatter(send, recv, recv_count, dtype, op);
    else
      detail::reduce_scatter(ctx, send, recv, recv_count, dtype, op);
  });
}

void Communicator::barrier() {
  impl_->collective(Coll::barrier, DataType::u8, ReduceOp::sum, 0, 1, [&](Context& ctx) {
    if (impl_->nccl)
      impl_->nccl->barrier();
    else
      detail::barrier(ctx);
  });
}

}  // namespace mltrain::comm
