// A parameter server's thread: one poll loop over its listener and its workers' connections.
// Payloads are read straight into buffers the server keeps (no copy on the way in), and replies
// send the value's buffer itself (no copy on the way out): buffers are shared with the replies in
// flight, and a value is never changed under a reply (copy on write in async mode).
#include "ps/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/reduce.h"
#include "core/refusal_log.h"
#include "ps/ps_wire.h"
#include "transport/socket.h"

namespace mltrain::comm::detail {

namespace {

using namespace pswire;
using Buf = std::shared_ptr<char[]>;

constexpr std::size_t kDiscard = 64u << 10;
constexpr std::size_t kReadBudget = 8u << 20;  // per connection per turn, so no worker starves others
constexpr std::size_t kPoolBytes = 256u << 20;

// Compares without an early exit, so the time taken tells nothing about the token.
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % (b.size() + 1)]);
  return diff == 0;
}

struct Out {
  std::string head;
  Buf data;
  std::size_t len = 0;
  std::size_t sent = 0;  // of head, then data
};

struct Waiter {
  std::uint64_t conn = 0;
  std::uint32_t id = 0;
  std::uint64_t round = 0;
};

struct Part {
  DataType dtype = DataType::f32;
  std::uint64_t count = 0;
  std::size_t bytes = 0;
  Buf value;               // sync: the last finished round's sum (the initial value before); async: the value
  std::uint64_t done = 0;  // sync: rounds finished
  std::vector<std::uint64_t> pushes;  // sync: rounds each worker pushed
  struct Acc {
    Buf buf;
    int n = 0;
  };
  std::map<std::uint64_t, Acc> rounds;  // sync: rounds under way
  std::vector<Waiter> waiting;          // sync: pulls waiting for their round
  Buf velocity;                         // async sgd with momentum
};

struct PartKey {
  std::uint64_t key;
  std::uint32_t part;
  bool operator==(const PartKey&) const = default;
};
struct PartKeyHash {
  std::size_t operator()(const PartKey& k) const noexcept {
    return std::hash<std::uint64_t>()(k.key * 0x9e3779b97f4a7c15ull ^ k.part);
  }
};

enum class Then { none, declare_new, discard_error, push, declare_check };

struct Conn {
  std::uint64_t serial = 0;
  Fd fd;
  std::string peer;
  std::chrono::steady_clock::time_point accepted{};  // a hello must come within hello_timeout
  int worker = -1;
  std::uint32_t generation = 0;
  bool hello = false;
  std::string in;  // the header being collected
  bool in_payload = false;
  Request req;
  Then then = Then::none;
  char* dst = nullptr;
  std::size_t left = 0, got = 0;
  Buf scratch;  // a push's values, before they join their round
  std::size_t scratch_bytes = 0;
  std::uint64_t round = 0;  // the push's round (sync)
  std::uint16_t error_status = kOk;
  std::string error;
  std::deque<Out> out;
  bool closing = false;  // close once `out` is sent
};

}  // namespace

struct PsServer::State {
  ServerConfig config;
  Fd listener;
  int stop_pipe[2] = {-1, -1};
  std::uint32_t generation = 0;
  std::uint64_t next_serial = 1;
  std::map<std::uint64_t, Conn> conns;
  std::unordered_map<PartKey, Part, PartKeyHash> parts;
  std::unordered_map<std::size_t, std::vector<Buf>> pool;
  std::size_t pool_bytes = 0;
  // What the budget counts (pool_bytes too): the parts' values and momentum, their rounds under
  // way, and the connections' push buffers.
  std::uint64_t value_bytes = 0, round_bytes = 0, scratch_total = 0;
  std::vector<std::pair<Buf, std::size_t>> retired;  // buffers replies may still be sending
  char discard[kDiscard];

  std::atomic<std::uint64_t> bytes_in{0}, bytes_out{0}, requests{0}, keys{0};
  std::atomic<std::uint32_t> workers{0}, queue_depth{0}, max_queue_depth{0};
  mutable std::mutex failure_m;
  std::string failure;
  bool said_fd_limit = false;

  void log(const std::string& line) {
    if (config.log) config.log(line);
  }
  // Strangers' connections: the first few said, the rest summarised (a flood grows no log).
  RefusalLog refusals{[this](const std::string& line) { log(line); }};
  Buf take(std::size_t n) {
    auto it = pool.find(n);
    if (it != pool.end() && !it->second.empty()) {
      Buf b = std::move(it->second.back());
      it->second.pop_back();
      pool_bytes -= n;
      return b;
    }
    return Buf(new char[n ? n : 1]);
  }
  void give(Buf b, std::size_t n) {
    if (!b) return;
    if (b.use_count() > 1) {
      retired.emplace_back(std::move(b), n);
      return;
    }
    // Free buffers are a cache: at most a quarter of the budget, so they never crowd out values.
    const std::size_t cap = config.memory_budget
                                ? std::size_t(std::min<std::uint64_t>(kPoolBytes, config.memory_budget / 4))
                                : kPoolBytes;
    if (pool_bytes + n > cap) return;
    pool[n].push_back(std::move(b));
    pool_bytes += n;
  }
  void recycle() {
    for (std::size_t i = 0; i < retired.size();)
      if (retired[i].first.use_count() == 1) {
        auto [b, n] = std::move(retired[i]);
        retired[i] = std::move(retired.back());
        retired.pop_back();
        give(std::move(b), n);
      } else {
        ++i;
      }
  }
  void depth(int delta) {
    std::uint32_t d = queue_depth.load() + std::uint32_t(delta);
    queue_depth.store(d);
    if (d > max_queue_depth.load()) max_queue_depth.store(d);
  }

  void reply(Conn& c, std::uint32_t id, std::uint16_t status, const std::string& message = {}) {
    Out o;
    Reply{id, status, message.size()}.put_to(o.head);
    o.head += message;
    bytes_out += o.head.size();
    c.out.push_back(std::move(o));
  }
  void reply_value(Conn& c, std::uint32_t id, const Part& p) {
    Out o;
    Reply{id, kOk, p.bytes}.put_to(o.head);
    o.data = p.value;
    o.len = p.bytes;
    bytes_out += o.head.size() + o.len;
    c.out.push_back(std::move(o));
  }

  std::string who(const Conn& c) const { return "worker " + std::to_string(c.worker) + " (" + c.peer + ")"; }
  static std::string what(const Request& r) {
    return "key " + std::to_string(r.key) + " part " + std::to_string(r.part);
  }

  void on_hello(Conn& c, const Hello& h, const std::string& token) {
    HelloReply r;
    r.server = config.index;
    std::string message;
    if (!same_token(token, config.token)) {
      r.status = kBadToken;
      message = "the connection did not prove the job's token (MLTRAIN_TOKEN)";
      refusals.refused("refused " + c.peer + ": it did not prove the job's token");
    } else if (h.version != kVersion) {
      r.status = kBadVersion;
      message = "PS wire version " + std::to_string(h.version) + ", but server " +
                std::to_string(config.index) + " speaks " + std::to_string(kVersion) +
                ": the worker's libmltrain-comm and the agent differ";
    } else if (h.num_workers != config.num_workers || h.worker < 0 || h.worker >= config.num_workers) {
      r.status = kBadHello;
      message = "worker " + std::to_string(h.worker) + " of " + std::to_string(h.num_workers) +
                ", but server " + std::to_string(config.index) + " serves " +
                std::to_string(config.num_workers) + " workers";
    } else if (h.generation < generation) {
      r.status = kStale;
      message = "generation " + std::to_string(h.generation) + " is older than the server's " +
                std::to_string(generation) + " (a worker of a gang that was restarted)";
    } else {
      if (h.generation > generation) {
        log("generation " + std::to_string(h.generation) + " (the gang restarted): every key starts afresh");
        generation = h.generation;
        parts.clear();
        value_bytes = round_bytes = 0;
        keys = 0;
        queue_depth = 0;
        for (auto& [serial, other] : conns)
          if (other.hello && other.generation < generation) other.closing = true, other.out.clear();
      }
      for (const auto& [serial, other] : conns)
        if (other.hello && !other.closing && other.worker == h.worker) {
          r.status = kBadHello;
          message = "worker " + std::to_string(h.worker) + " is already connected (from " + other.peer +
                    "): one client per worker process";
          break;
        }
    }
    r.message_len = std::uint32_t(message.size());
    Out o;
    r.put_to(o.head);
    o.head += message;
    c.out.push_back(std::move(o));
    if (r.status != kOk) {
      if (r.status != kBadToken)
        log("refused worker " + std::to_string(h.worker) + " from " + c.peer + ": " + message);
      c.closing = true;
      return;
    }
    c.hello = true;
    c.worker = h.worker;
    c.generation = h.generation;
    ++workers;
    log("worker " + std::to_string(c.worker) + " connected from " + c.peer);
  }

  std::uint64_t held() const { return value_bytes + round_bytes + scratch_total + pool_bytes; }
  static std::string mib(std::uint64_t b) { return std::to_string((b + (1u << 20) - 1) >> 20) + " MiB"; }
  // "" when a request of `bytes` fits in the budget, with `extra` bytes it holds besides its
  // buffer (momentum); else why not, naming the key and the worker. The buffer becomes the part's
  // value (declare) or a new round's sum (a sync push that opens one); a connection's buffer of
  // the same size is reused.
  std::string over_budget(const Conn& c, const Request& q, std::uint64_t bytes, std::uint64_t extra,
                          const char* doing) const {
    if (config.memory_budget == 0) return {};
    const std::uint64_t buffer = c.scratch && c.scratch_bytes == bytes ? 0 : bytes;
    if (held() + buffer + extra <= config.memory_budget) return {};
    return "worker " + std::to_string(c.worker) + "'s " + doing + " " + what(q) + " (" + mib(bytes) +
           ") would take PS server " + std::to_string(config.index) + " past its memory budget of " +
           mib(config.memory_budget) + " (" + mib(held()) +
           " held): give the servers more (MLTRAIN_PS_MEMORY), add servers ([ps] servers), or push "
           "fewer rounds ahead";
  }

  // A request's header is in: where its payload goes.
  void begin(Conn& c) {
    Request& q = c.req;
    // What cannot be framed ends the connection, with a reply saying why.
    auto refuse = [&](const std::string& why) {
      log("closing " + who(c) + ": " + why);
      reply(c, q.id, kBadRequest, why + "; the connection is closed");
      c.closing = true;
    };
    if (q.dtype > std::uint8_t(DataType::u8) || q.op < kDeclare || q.op > kPushPull) {
      refuse("a request with op " + std::to_string(q.op) + " dtype " + std::to_string(q.dtype) +
             ", which PS wire version " + std::to_string(kVersion) + " does not have");
      return;
    }
    const auto dtype = static_cast<DataType>(q.dtype);
    const std::uint64_t bytes = q.count * size_of(dtype);
    if (q.count > kMaxPartBytes || bytes > kMaxPartBytes) {
      refuse(what(q) + ": a part of " + std::to_string(q.count) + " elements (at most 1 GiB)");
      return;
    }
    ++requests;
    bytes_in += Request::kSize + (q.op == kPull ? 0 : bytes);
    c.then = Then::none;
    c.error_status = kOk;
    c.error.clear();
    auto it = parts.find({q.key, q.part});
    auto mismatch = [&](const Part& p) { return p.count != q.count || p.dtype != dtype; };
    auto describe = [](std::uint64_t n, DataType d) {
      return std::to_string(n) + " " + std::string(name_of(d));
    };
    if (q.op == kDeclare) {
      if (it == parts.end()) {
        // Into the connection's buffer: the part exists once its value is whole (another worker's
        // declaration may finish first; then that one's value stays).
        const std::uint64_t velocity = !config.sync && config.momentum != 0 ? q.count * sizeof(double) : 0;
        if (std::string why = over_budget(c, q, bytes, velocity, "declare of"); !why.empty()) {
          log("refused " + why);
          c.then = Then::discard_error, c.error_status = kNoMemory, c.error = std::move(why);
        } else {
          use_scratch(c, bytes);
          c.then = Then::declare_new;
        }
      } else if (mismatch(it->second)) {
        c.then = Then::discard_error, c.error_status = kMismatch;
        c.error = what(q) + " is declared as " + describe(it->second.count, it->second.dtype) +
                  ", but worker " + std::to_string(c.worker) + " declares it as " + describe(q.count, dtype);
      } else {
        c.then = Then::declare_check;  // the first declaration's value stays
      }
    } else if (it == parts.end()) {
      c.then = Then::discard_error, c.error_status = kUnknownKey;
      c.error =
          what(q) + " is not declared on server " + std::to_string(config.index) + " (declare it first)";
    } else if (mismatch(it->second)) {
      c.then = Then::discard_error, c.error_status = kMismatch;
      c.error = what(q) + " holds " + describe(it->second.count, it->second.dtype) + ", but worker " +
                std::to_string(c.worker) + " sent " + describe(q.count, dtype);
    } else if (q.op == kPull) {
      pull(c, it->second, q.id);
      return;
    } else {
      Part& p = it->second;
      if (!config.sync && !config.optimizer.empty() && dtype != DataType::f32 && dtype != DataType::f64 &&
          dtype != DataType::f16 && dtype != DataType::bf16) {
        c.then = Then::discard_error, c.error_status = kBadRequest;
        c.error = what(q) + " is " + std::string(name_of(dtype)) + ", but the server's optimizer " +
                  config.optimizer + " needs floating point";
      } else {
        // Sync: the worker's next round; a push that opens it hands its buffer to the round's sum.
        // Only opening a round holds more: joining one (worker 1 catching up) or an async push
        // reuses the connection's buffer, one per connection.
        const std::uint64_t round = config.sync ? p.pushes[std::size_t(c.worker)] + 1 : 0;
        const bool opens = config.sync && p.rounds.find(round) == p.rounds.end();
        std::string why = opens ? over_budget(c, q, bytes, 0, "push to") : std::string();
        if (!why.empty()) {
          log("refused " + why);
          c.then = Then::discard_error, c.error_status = kNoMemory, c.error = std::move(why);
        } else {
          use_scratch(c, bytes);
          c.round = round;
          c.then = Then::push;
        }
      }
    }
    const bool has_payload = q.op != kPull;
    if (!has_payload || bytes == 0) {
      finish(c);
      return;
    }
    c.in_payload = true;
    c.left = bytes, c.got = 0;
  }

  void use_scratch(Conn& c, std::size_t bytes) {
    if (c.scratch_bytes != bytes || !c.scratch) {
      release_scratch(c);
      c.scratch = take(bytes), c.scratch_bytes = bytes;
      scratch_total += bytes;
    }
    c.dst = c.scratch.get();
  }
  void release_scratch(Conn& c) {
    if (c.scratch) scratch_total -= c.scratch_bytes;
    give(std::move(c.scratch), c.scratch_bytes);
    c.scratch_bytes = 0;
  }
  // The connection's push buffer now belongs to a part (its value, or a round's sum).
  Buf hand_over_scratch(Conn& c) {
    scratch_total -= c.scratch_bytes;
    c.scratch_bytes = 0;
    return std::move(c.scratch);
  }

  void declare(Conn& c) {
    const Request& q = c.req;
    const auto dtype = static_cast<DataType>(q.dtype);
    auto it = parts.find({q.key, q.part});
    if (it != parts.end()) {
      if (it->second.count != q.count || it->second.dtype != dtype)
        reply(c, q.id, kMismatch,
              what(q) + " is declared as " + std::to_string(it->second.count) + " " +
                  std::string(name_of(it->second.dtype)) + ", but worker " + std::to_string(c.worker) +
                  " declares it as " + std::to_string(q.count) + " " + std::string(name_of(dtype)));
      else
        reply(c, q.id, kOk);
      return;
    }
    Part p;
    p.dtype = dtype, p.count = q.count, p.bytes = c.scratch_bytes;
    p.value = hand_over_scratch(c);
    value_bytes += p.bytes;
    if (!config.sync && config.momentum != 0) value_bytes += p.count * sizeof(double);  // velocity
    if (config.sync) p.pushes.assign(std::size_t(config.num_workers), 0);
    parts.emplace(PartKey{q.key, q.part}, std::move(p));
    ++keys;
    reply(c, q.id, kOk);
  }

  // The request's payload is in.
  void finish(Conn& c) {
    c.in_payload = false;
    Request& q = c.req;
    switch (c.then) {
      case Then::none:
        return;
      case Then::declare_new:
        declare(c);
        return;
      case Then::declare_check:
        reply(c, q.id, kOk);
        return;
      case Then::discard_error:
        reply(c, q.id, c.error_status, c.error);
        return;
      case Then::push:
        break;
    }
    auto it = parts.find({q.key, q.part});
    if (it == parts.end()) {  // the gang restarted meanwhile
      reply(c, q.id, kUnknownKey, what(q) + " is gone: the gang restarted");
      return;
    }
    Part& p = it->second;
    if (config.sync) {
      Part::Acc& acc = p.rounds[c.round];
      if (acc.n == 0) {
        acc.buf = hand_over_scratch(c);  // the round's first push: its buffer becomes the sum
        round_bytes += p.bytes;
      } else {
        reduce_fn(p.dtype, ReduceOp::sum)(acc.buf.get(), acc.buf.get(), c.scratch.get(),
                                          std::size_t(p.count));
      }
      ++acc.n;
      p.pushes[std::size_t(c.worker)] = c.round;
      if (q.op == kPush) reply(c, q.id, kOk);
      complete(p);
      if (q.op == kPushPull) pull(c, p, q.id);
    } else {
      apply(p, c.scratch.get());
      if (q.op == kPush) reply(c, q.id, kOk);
      if (q.op == kPushPull) pull(c, p, q.id);  // the value with this push applied
    }
  }

  // Async: the push in c.scratch changes the value now.
  void apply(Part& p, const void* push) {
    if (p.value.use_count() > 1) {  // a reply is sending it: change a copy
      Buf copy = take(p.bytes);
      std::memcpy(copy.get(), p.value.get(), p.bytes);
      give(std::move(p.value), p.bytes);
      p.value = std::move(copy);
    }
    const std::size_t n = std::size_t(p.count);
    if (config.optimizer.empty()) {
      reduce_fn(p.dtype, ReduceOp::sum)(p.value.get(), p.value.get(), push, n);
      return;
    }
    // sgd: v = momentum * v + (g + weight_decay * w); w -= lr * v
    const double lr = config.lr, mu = config.momentum, wd = config.weight_decay;
    if (mu != 0 && !p.velocity) {
      p.velocity = Buf(new char[n * sizeof(double)]);
      std::memset(p.velocity.get(), 0, n * sizeof(double));
    }
    auto* v = reinterpret_cast<double*>(p.velocity.get());
    if (p.dtype == DataType::f32) {
      auto* w = reinterpret_cast<float*>(p.value.get());
      const auto* g = reinterpret_cast<const float*>(push);
      for (std::size_t i = 0; i < n; ++i) {
        double step = double(g[i]) + wd * w[i];
        if (v) step = v[i] = mu * v[i] + step;
        w[i] = float(w[i] - lr * step);
      }
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const double w = load_as_double(p.value.get(), i, p.dtype);
        double step = load_as_double(push, i, p.dtype) + wd * w;
        if (v) step = v[i] = mu * v[i] + step;
        store_from_double(p.value.get(), i, p.dtype, w - lr * step);
      }
    }
  }
  void pull(Conn& c, Part& p, std::uint32_t id) {
    if (!config.sync) {
      reply_value(c, id, p);
      return;
    }
    const std::uint64_t round = p.pushes[std::size_t(c.worker)];
    if (round <= p.done) {
      reply_value(c, id, p);
      return;
    }
    p.waiting.push_back({c.serial, id, round});
    depth(+1);
  }

  // Sync: finish every round every worker pushed, in order, answering the pulls waiting for it.
  void complete(Part& p) {
    while (!p.rounds.empty() && p.rounds.begin()->first == p.done + 1 &&
           p.rounds.begin()->second.n == config.num_workers) {
      give(std::move(p.value), p.bytes);
      p.value = std::move(p.rounds.begin()->second.buf);
      p.rounds.erase(p.rounds.begin());
      round_bytes -= p.bytes;  // the round's sum is the value now; the old value went
      ++p.done;
      for (std::size_t i = 0; i < p.waiting.size();) {
        if (p.waiting[i].round != p.done) {
          ++i;
          continue;
        }
        auto cit = conns.find(p.waiting[i].conn);
        if (cit != conns.end() && !cit->second.closing) reply_value(cit->second, p.waiting[i].id, p);
        p.waiting[i] = p.waiting.back();
        p.waiting.pop_back();
        depth(-1);
      }
    }
  }

  // Reads what the socket has; false when the connection is done.
  bool read(Conn& c) {
    std::size_t budget = kReadBudget;
    while (budget > 0 && !c.closing) {
      if (c.in_payload) {
        const bool discarding = c.then == Then::discard_error || c.then == Then::declare_check;
        char* to = discarding ? discard : c.dst + c.got;
        std::size_t want = discarding ? std::min(c.left, kDiscard) : c.left;
        ssize_t n = ::recv(c.fd.get(), to, std::min(want, budget), 0);
        if (n == 0) return false;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
        c.got += std::size_t(n), c.left -= std::size_t(n), budget -= std::size_t(n);
        if (c.left == 0) finish(c);
        continue;
      }
      const std::size_t need = !c.hello ? Hello::kSize : Request::kSize;
      std::size_t want = need - std::min(need, c.in.size());
      if (!c.hello && c.in.size() >= Hello::kSize) {
        Hello h = Hello::from(c.in.data());
        if (h.magic != kMagic || h.token_len > kMaxToken) {
          refusals.refused("closing " + c.peer + ": not an mltrain PS worker");
          return false;
        }
        want = Hello::kSize + h.token_len - c.in.size();
        if (want == 0) {
          on_hello(c, h, c.in.substr(Hello::kSize));
          c.in.clear();
          continue;
        }
      }
      char buf[512];
      ssize_t n = ::recv(c.fd.get(), buf, std::min(want, sizeof buf), 0);
      if (n == 0) return false;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      c.in.append(buf, std::size_t(n));
      budget -= std::min(budget, std::size_t(n));
      if (c.hello && c.in.size() == Request::kSize) {
        c.req = Request::from(c.in.data());
        c.in.clear();
        begin(c);
      }
    }
    return true;
  }

  // Sends what is queued; false when the connection failed.
  bool write(Conn& c) {
    while (!c.out.empty()) {
      Out& o = c.out.front();
      iovec iov[2];
      int k = 0;
      if (o.sent < o.head.size()) iov[k++] = {o.head.data() + o.sent, o.head.size() - o.sent};
      std::size_t data_sent = o.sent > o.head.size() ? o.sent - o.head.size() : 0;
      if (o.len > data_sent) iov[k++] = {o.data.get() + data_sent, o.len - data_sent};
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = std::size_t(k);
      ssize_t n = ::sendmsg(c.fd.get(), &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      o.sent += std::size_t(n);
      if (o.sent == o.head.size() + o.len) c.out.pop_front();
    }
    return true;
  }

  void drop(std::uint64_t serial, const char* why) {
    auto it = conns.find(serial);
    if (it == conns.end()) return;
    Conn& c = it->second;
    if (c.hello) {
      --workers;
      if (!c.closing || c.generation == generation)
        log("worker " + std::to_string(c.worker) + " (" + c.peer + ") " + why);
    }
    release_scratch(c);
    conns.erase(it);
  }
};

PsServer::PsServer(ServerConfig config, int port) : state_(std::make_unique<State>()) {
  state_->config = std::move(config);
  auto [fd, bound] = listen_tcp(port);
  set_nonblocking(fd.get());
  state_->listener = std::move(fd);
  port_ = bound;
  if (::pipe2(state_->stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(Error::Kind::internal, std::string("pipe: ") + std::strerror(errno));
}

PsServer::~PsServer() {
  stop();
  for (int fd : state_->stop_pipe)
    if (fd >= 0) ::close(fd);
}

void PsServer::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
}

void PsServer::stop() {
  if (!thread_.joinable()) return;
  char b = 1;
  (void)!::write(state_->stop_pipe[1], &b, 1);
  thread_.join();
}

ps::ServerStats PsServer::stats() const {
  const State& s = *state_;
  ps::ServerStats out;
  out.bytes_in = s.bytes_in, out.bytes_out = s.bytes_out, out.requests = s.requests;
  out.workers = s.workers, out.queue_depth = s.queue_depth, out.max_queue_depth = s.max_queue_depth;
  out.keys = s.keys;
  return out;
}

std::string PsServer::failure() const {
  std::lock_guard<std::mutex> lock(state_->failure_m);
  return state_->failure;
}

void PsServer::serve() {
  State& s = *state_;
  try {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> serials;
    std::chrono::steady_clock::time_point listen_again{};
    for (;;) {
      fds.clear(), serials.clear();
      fds.push_back({s.stop_pipe[0], POLLIN, 0});
      const bool listening = std::chrono::steady_clock::now() >= listen_again;
      fds.push_back({listening ? s.listener.get() : -1, POLLIN, 0});
      for (auto& [serial, c] : s.conns) {
        short ev = c.closing ? 0 : POLLIN;
        if (!c.out.empty()) ev |= POLLOUT;
        fds.push_back({c.fd.get(), ev, 0});
        serials.push_back(serial);
      }
      // While a connection owes its hello, wake up to enforce the deadline.
      const bool strangers = std::any_of(s.conns.begin(), s.conns.end(), [](const auto& kv) {
        return !kv.second.hello && !kv.second.closing;
      });
      const bool summary_due = s.refusals.due() != std::chrono::steady_clock::time_point::max();
      if (::poll(fds.data(), fds.size(), listening && !strangers && !summary_due ? -1 : 100) < 0) {
        if (errno == EINTR) continue;
        throw Error(Error::Kind::internal, std::string("poll: ") + std::strerror(errno));
      }
      if (fds[0].revents) break;
      if (fds[1].revents & POLLIN) {
        for (;;) {
          int fd = ::accept4(s.listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
              // Out of descriptors: say so once, and wait a little rather than spin on the listener.
              if (!s.said_fd_limit)
                s.log(std::string("cannot accept a worker: ") + std::strerror(errno) +
                      " (raise the open files limit, ulimit -n, on this host)");
              s.said_fd_limit = true;
              listen_again = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
            }
            break;
          }
          Conn c;
          c.serial = s.next_serial++;
          c.fd = Fd(fd);
          set_nodelay(fd);
          c.peer = peer_name(fd);
          c.accepted = std::chrono::steady_clock::now();
          s.conns.emplace(c.serial, std::move(c));
        }
      }
      for (std::size_t i = 0; i < serials.size(); ++i) {
        const short rev = fds[i + 2].revents;
        if (!rev) continue;
        auto it = s.conns.find(serials[i]);
        if (it == s.conns.end()) continue;
        Conn& c = it->second;
        bool ok = true;
        if (rev & (POLLIN | POLLHUP | POLLERR)) ok = s.read(c);
        if (ok && !c.out.empty()) ok = s.write(c);
        if (!ok) s.drop(serials[i], "disconnected");
      }
      // Replies queued for connections that were not in this turn's poll set (a round finished).
      for (auto it = s.conns.begin(); it != s.conns.end();) {
        Conn& c = it->second;
        const std::uint64_t serial = it->first;
        ++it;
        if (!c.out.empty() && !s.write(c)) {
          s.drop(serial, "disconnected");
          continue;
        }
        if (c.closing && c.out.empty()) {
          s.drop(serial, "was closed");
        } else if (!c.hello && !c.closing &&
                   std::chrono::steady_clock::now() - c.accepted > s.config.hello_timeout) {
          s.refusals.refused("closing " + c.peer + ": no hello within " +
                             std::to_string(s.config.hello_timeout.count()) + " ms (not an mltrain worker?)");
          s.drop(serial, "was closed");
        }
      }
      s.recycle();
      s.refusals.tick();
    }
    // A stranger still inside its hello time is refused now, and counted: else one that came in the
    // run's last hello_timeout would never be said.
    for (const auto& [serial, c] : s.conns)
      if (!c.hello && !c.closing)
        s.refusals.refused("closing " + c.peer +
                           ": no hello before the server stopped (not an mltrain worker?)");
    s.refusals.summarise();
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(s.failure_m);
      s.failure = e.what();
    }
    s.log(std::string("failed: ") + e.what());
  }
  s.conns.clear();
  s.listener.reset();  // no worker connects to a server that no longer serves
}

}  // namespace mltrain::comm::detail
