// The worker's side of PS mode: one connection per server, each with a sender thread (requests go
// out from the caller's buffers) and a receiver thread (replies land in the caller's buffers).
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "knobs/registry.h"
#include "mltrain/ps.hpp"
#include "ps/ps_wire.h"
#include "transport/socket.h"

namespace mltrain::comm::ps {

using namespace detail;
using namespace detail::pswire;

struct Handle::State {
  std::mutex m;
  std::condition_variable cv;
  std::size_t left = 0;
  bool failed = false;
  Error::Kind kind = Error::Kind::internal;
  std::string error, host;
  std::string what;  // "push_pull of key 7"
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Client::Impl> impl;
};

namespace {

struct Pending {
  std::shared_ptr<Handle::State> handle;
  char* dst = nullptr;
  std::uint64_t len = 0;  // expected bytes back
  bool sent = false;      // its bytes left: its reply may now be written (into the buffer it was sent from)
};

struct Send {
  std::string head;
  const char* data = nullptr;
  std::size_t len = 0;
  std::shared_ptr<Handle::State> handle;  // counted down once its bytes left (or never will)
  std::uint32_t id = 0;
};

struct Key {
  std::size_t count = 0;
  DataType dtype = DataType::f32;
  std::size_t per_part = 1;  // elements
  std::size_t parts = 1;
};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void complete(const Pending& p, bool ok, Error::Kind kind = Error::Kind::internal,
              const std::string& error = {}, const std::string& host = {}) {
  std::lock_guard<std::mutex> lock(p.handle->m);
  if (!ok && !p.handle->failed) {
    p.handle->failed = true;
    p.handle->kind = kind;
    p.handle->error = error;
    p.handle->host = host;
  }
  if (p.handle->left > 0) --p.handle->left;
  p.handle->cv.notify_all();
}

// A request's bytes were handed to the kernel (or dropped): the caller's send buffer is free again.
// A request is done when it was sent and answered: a reply can come before sendmsg returns.
void sent(Handle::State& h) {
  std::lock_guard<std::mutex> lock(h.m);
  if (h.left > 0) --h.left;
  h.cv.notify_all();
}

bool read_full(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_WAITALL);
    if (k == 0) return false;
    if (k < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += k, n -= std::size_t(k);
  }
  return true;
}

// Reads and drops n bytes (the rest of an overlong message).
bool skip(int fd, std::uint64_t n) {
  char buf[4096];
  while (n > 0) {
    const std::size_t k = std::size_t(std::min<std::uint64_t>(n, sizeof buf));
    if (!read_full(fd, buf, k)) return false;
    n -= k;
  }
  return true;
}

bool write_full(int fd, const Send& s) {
  std::size_t sent = 0;
  const std::size_t total = s.head.size() + s.len;
  while (sent < total) {
    iovec iov[2];
    int k = 0;
    if (sent < s.head.size()) iov[k++] = {const_cast<char*>(s.head.data()) + sent, s.head.size() - sent};
    std::size_t data_sent = sent > s.head.size() ? sent - s.head.size() : 0;
    if (s.len > data_sent) iov[k++] = {const_cast<char*>(s.data) + data_sent, s.len - data_sent};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = std::size_t(k);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    sent += std::size_t(n);
  }
  return true;
}

}  // namespace

struct Client::Impl : std::enable_shared_from_this<Client::Impl> {
  struct Conn {
    int index = 0;
    ServerAddress addr;
    Fd fd;
    std::mutex m;
    std::condition_variable cv;
    std::deque<Send> queue;
    bool closed = false;
    std::unordered_map<std::uint32_t, Pending> pending;
    std::thread sender, receiver;
  };

  Options o;
  std::vector<std::unique_ptr<Conn>> conns;
  std::mutex keys_m;
  std::unordered_map<std::uint64_t, Key> keys;
  std::atomic<std::uint32_t> next_id{1};
  std::mutex broken_m;
  bool broken = false;
  Error::Kind broken_kind = Error::Kind::internal;
  std::string broken_why, broken_host;
  std::mutex join_m;

  std::string name(int s) const {
    const ServerAddress& a = o.servers[std::size_t(s)];
    return "PS server " + std::to_string(s) + " (" + a.host + ", " + a.addr + ":" + std::to_string(a.port) +
           ")";
  }

  void connect_all() {
    const auto deadline = Clock::now() + o.timeout;
    for (std::size_t s = 0; s < o.servers.size(); ++s) {
      auto c = std::make_unique<Conn>();
      c->index = int(s);
      c->addr = o.servers[s];
      const std::string who = name(int(s));
      c->fd = connect_tcp(c->addr.addr, c->addr.port, deadline,
                          "worker " + std::to_string(o.worker) + ": " + who);
      set_nodelay(c->fd.get());
      std::string hello;
      Hello{kMagic, kVersion, o.worker, o.num_workers, o.generation, std::uint32_t(o.token.size())}.put_to(
          hello);
      hello += o.token;
      send_all(c->fd.get(), hello.data(), hello.size(), deadline, who);
      char head[HelloReply::kSize];
      recv_all(c->fd.get(), head, sizeof head, deadline, who);
      HelloReply r = HelloReply::from(head);
      if (r.message_len > (1u << 16))
        throw Error(Error::Kind::peer_closed, who + " is not an mltrain PS server (an overlong reply)", -1,
                    c->addr.host);
      std::string message(r.message_len, '\0');
      if (!message.empty()) recv_all(c->fd.get(), message.data(), message.size(), deadline, who);
      if (r.magic != kMagic)
        throw Error(Error::Kind::peer_closed, who + " is not an mltrain PS server", -1, c->addr.host);
      if (r.status != kOk)
        throw Error(r.status == kBadToken ? Error::Kind::store : Error::Kind::mismatch,
                    who + " refused worker " + std::to_string(o.worker) + ": " + message, -1, c->addr.host);
      if (r.server != int(s))
        throw Error(Error::Kind::mismatch,
                    who + " says it is PS server " + std::to_string(r.server) +
                        ": MLTRAIN_PS_SERVERS does not list the job's servers in order (mltrain run sets it)",
                    -1, c->addr.host);
      const int flags = ::fcntl(c->fd.get(), F_GETFL);
      ::fcntl(c->fd.get(), F_SETFL, flags & ~O_NONBLOCK);
      conns.push_back(std::move(c));
    }
    for (auto& c : conns) {
      Conn* raw = c.get();
      raw->sender = std::thread([this, raw] { send_loop(*raw); });
      raw->receiver = std::thread([this, raw] { receive_loop(*raw); });
    }
  }

  void send_loop(Conn& c) {
    for (;;) {
      Send s;
      {
        std::unique_lock<std::mutex> lock(c.m);
        c.cv.wait(lock, [&] { return c.closed || !c.queue.empty(); });
        if (c.closed) return;
        s = std::move(c.queue.front());
        c.queue.pop_front();
      }
      const bool ok = write_full(c.fd.get(), s);
      const int err = errno;
      {
        std::lock_guard<std::mutex> lock(c.m);
        if (auto it = c.pending.find(s.id); it != c.pending.end()) it->second.sent = true;
      }
      c.cv.notify_all();
      sent(*s.handle);
      errno = err;
      if (!ok) {
        fail(Error::Kind::peer_closed,
             name(c.index) + ": sending failed (" + std::strerror(errno) +
                 "): the server's host or its mltrain agent is gone",
             c.addr.host);
        return;
      }
    }
  }

  void receive_loop(Conn& c) {
    std::vector<char> message;
    for (;;) {
      char head[Reply::kSize];
      if (!read_full(c.fd.get(), head, sizeof head)) break;
      Reply r = Reply::from(head);
      Pending p;
      bool known = false, closed = false;
      {
        // A reply can come before the sender's sendmsg returned: an in-place push_pull must not
        // land in the buffer before the sender is done with it.
        std::unique_lock<std::mutex> lock(c.m);
        c.cv.wait(lock, [&] {
          auto it = c.pending.find(r.id);
          return c.closed || it == c.pending.end() || it->second.sent;
        });
        closed = c.closed;
        if (auto it = c.pending.find(r.id); it != c.pending.end()) {
          p = std::move(it->second);
          c.pending.erase(it);
          known = true;
        }
      }
      if (!known) {
        // After fail() the kernel still hands over replies it buffered: their requests failed already.
        if (!closed)
          fail(Error::Kind::internal,
               name(c.index) + " answered request " + std::to_string(r.id) + ", which is unknown",
               c.addr.host);
        return;
      }
      if (r.status != kOk) {
        message.resize(std::size_t(std::min<std::uint64_t>(r.len, 1u << 20)));
        if (!read_full(c.fd.get(), message.data(), message.size()) ||
            !skip(c.fd.get(), r.len - message.size())) {
          complete(p, false, Error::Kind::peer_closed,
                   p.handle->what + ": " + name(c.index) + " closed the connection", c.addr.host);
          break;
        }
        const Error::Kind kind = r.status == kMismatch ? Error::Kind::mismatch : Error::Kind::usage;
        complete(p, false, kind,
                 p.handle->what + ": " + name(c.index) + ": " + std::string(message.begin(), message.end()),
                 c.addr.host);
        continue;
      }
      if (r.len != p.len) {
        complete(p, false, Error::Kind::internal,
                 p.handle->what + ": " + name(c.index) + " sent " + std::to_string(r.len) + " bytes, not " +
                     std::to_string(p.len),
                 c.addr.host);
        fail(Error::Kind::internal, name(c.index) + " broke the wire protocol", c.addr.host);
        return;
      }
      if (r.len > 0 && !read_full(c.fd.get(), p.dst, std::size_t(r.len))) {
        complete(p, false, Error::Kind::peer_closed,
                 p.handle->what + ": " + name(c.index) + " closed the connection", c.addr.host);
        break;
      }
      complete(p, true);
    }
    fail(Error::Kind::peer_closed,
         name(c.index) +
             " closed the connection: the server's host or its mltrain agent is gone (the job is "
             "ending, or that host failed)",
         c.addr.host);
  }

  // The client is broken: every connection shuts down, every request in flight fails.
  void fail(Error::Kind first_kind, const std::string& first_why, const std::string& first_host) {
    Error::Kind kind;
    std::string why, host;
    {
      // The first cause is what every request in flight fails with (a closed connection's
      // receiver also wakes up here, after the shutdown below).
      std::lock_guard<std::mutex> lock(broken_m);
      if (!broken) broken = true, broken_kind = first_kind, broken_why = first_why, broken_host = first_host;
      kind = broken_kind, why = broken_why, host = broken_host;
    }
    for (auto& c : conns) {
      std::unordered_map<std::uint32_t, Pending> pending;
      std::deque<Send> unsent;
      {
        std::lock_guard<std::mutex> lock(c->m);
        c->closed = true;
        pending.swap(c->pending);
        unsent.swap(c->queue);
      }
      c->cv.notify_all();
      ::shutdown(c->fd.get(), SHUT_RDWR);
      for (auto& u : unsent) sent(*u.handle);
      for (auto& [id, p] : pending) complete(p, false, kind, p.handle->what + ": " + why, host);
    }
  }

  // After fail(): no thread touches a caller's buffer any more.
  void join_all() {
    std::lock_guard<std::mutex> lock(join_m);
    for (auto& c : conns) {
      if (c->sender.joinable() && c->sender.get_id() != std::this_thread::get_id()) c->sender.join();
      if (c->receiver.joinable() && c->receiver.get_id() != std::this_thread::get_id()) c->receiver.join();
    }
  }

  bool is_broken() {
    std::lock_guard<std::mutex> lock(broken_m);
    return broken;
  }

  void throw_if_broken() {
    std::lock_guard<std::mutex> lock(broken_m);
    if (broken) throw Error(broken_kind, "mltrain-comm PS client is broken: " + broken_why, -1, broken_host);
  }

  Key key_of(std::uint64_t key, const char* op) {
    std::lock_guard<std::mutex> lock(keys_m);
    auto it = keys.find(key);
    if (it == keys.end())
      throw Error(Error::Kind::usage, std::string(op) + " of key " + std::to_string(key) +
                                          ": the key is not declared (call declare first, on every worker)");
    return it->second;
  }

  int server_of(std::uint64_t key, std::size_t part) const {
    return int((mix(key) + part) % o.servers.size());
  }

  void submit(int s, const Request& q, const void* payload, std::size_t payload_len, void* dst,
              std::size_t dst_len, const std::shared_ptr<Handle::State>& h) {
    Conn& c = *conns[std::size_t(s)];
    Send send;
    q.put_to(send.head);
    send.data = static_cast<const char*>(payload);
    send.len = payload_len;
    send.handle = h;
    send.id = q.id;
    {
      std::lock_guard<std::mutex> lock(c.m);
      if (c.closed) {
        std::lock_guard<std::mutex> broken_lock(broken_m);
        sent(*h);
        complete(Pending{h, nullptr, 0}, false, broken_kind, h->what + ": " + broken_why, broken_host);
        return;
      }
      c.pending[q.id] = Pending{h, static_cast<char*>(dst), dst_len};
      c.queue.push_back(std::move(send));
    }
    c.cv.notify_all();  // the sender, and not the receiver waiting on the same variable
  }

  // One request per part of `key`.
  Handle request(Op op, std::uint64_t key, const void* send, void* recv, const char* what) {
    throw_if_broken();
    const Key k = key_of(key, what);
    const std::size_t esize = size_of(k.dtype);
    const bool sends = op != kPull, receives = op == kPull || op == kPushPull;
    if (k.count > 0 && ((sends && send == nullptr) || (receives && recv == nullptr)))
      throw Error(Error::Kind::usage, std::string(what) + " of key " + std::to_string(key) + ": null buffer");
    auto h = std::make_shared<Handle::State>();
    h->left = 2 * k.parts;  // each part: sent, and answered
    h->what = std::string(what) + " of key " + std::to_string(key);
    h->timeout = o.timeout;
    h->impl = shared_from_this();
    for (std::size_t part = 0; part < k.parts; ++part) {
      const std::size_t off = part * k.per_part;
      const std::size_t n = std::min(k.per_part, k.count - std::min(k.count, off));
      Request q{op, std::uint8_t(k.dtype), next_id++, key, std::uint32_t(part), n};
      const char* src = sends && send ? static_cast<const char*>(send) + off * esize : nullptr;
      char* dst = receives && recv ? static_cast<char*>(recv) + off * esize : nullptr;
      submit(server_of(key, part), q, src, sends ? n * esize : 0, dst, receives ? n * esize : 0, h);
    }
    return Handle(h);
  }
};

Options Options::from_env() {
  Options o;
  try {
    o.worker = int(knobs::get_int("RANK"));
    o.num_workers = int(knobs::get_int("WORLD_SIZE"));
    o.token = knobs::get_string("MLTRAIN_TOKEN");
    o.timeout = knobs::get_duration("MLTRAIN_COMM_TIMEOUT");
    o.partition_bytes = knobs::get_bytes("MLTRAIN_PS_PARTITION_BYTES");
    o.sync = knobs::get_flag("MLTRAIN_PS_SYNC");
    o.generation = std::uint32_t(knobs::get_int("TORCHELASTIC_RESTART_COUNT"));
    const std::string list = knobs::get_string("MLTRAIN_PS_SERVERS");
    if (list.empty())
      throw Error(
          Error::Kind::usage,
          "MLTRAIN_PS_SERVERS is not set: run the worker under `mltrain run` with a [ps] table in the job "
          "spec (docs/ps.md), which starts the servers and tells every rank where they are");
    std::size_t start = 0;
    while (start <= list.size()) {
      std::size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      std::string item = list.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      ServerAddress a;
      if (auto eq = item.find('='); eq != std::string::npos)
        a.host = item.substr(0, eq), item = item.substr(eq + 1);
      auto [host, port] = split_host_port(item);
      a.addr = host, a.port = port;
      if (a.host.empty()) a.host = host;
      o.servers.push_back(std::move(a));
    }
  } catch (const knobs::BadValue& e) {
    throw Error(Error::Kind::usage, e.what());
  }
  return o;
}

bool Handle::done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->m);
  return state_->left == 0;
}

void Handle::wait() {
  if (!state_) return;
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.m);
  const auto deadline = std::chrono::steady_clock::now() + s.timeout;
  if (!s.cv.wait_until(lock, deadline, [&] { return s.left == 0; })) {
    lock.unlock();
    // Name a server still owing a reply, then break the client so nothing writes the buffers later.
    std::string who = "a PS server";
    std::string host;
    for (auto& c : s.impl->conns) {
      std::lock_guard<std::mutex> cl(c->m);
      for (const auto& [id, p] : c->pending)
        if (p.handle.get() == &s) {
          who = s.impl->name(c->index);
          host = c->addr.host;
          break;
        }
      if (!host.empty()) break;
    }
    const std::string why =
        s.what + ": " + who + " did not answer in " + std::to_string(s.timeout.count() / 1000) +
        " s (MLTRAIN_COMM_TIMEOUT); in sync mode a pull waits for every worker's push of its "
        "round: is a worker stuck or missing?";
    s.impl->fail(Error::Kind::timeout, why, host);
    s.impl->join_all();
    state_.reset();
    throw Error(Error::Kind::timeout, why, -1, host);
  }
  const bool failed = s.failed;
  const Error::Kind kind = s.kind;
  const std::string error = s.error, host = s.host;
  lock.unlock();
  if (failed) {
    if (s.impl->is_broken()) s.impl->join_all();  // then no thread touches the caller's buffers
    throw Error(kind, error, -1, host);
  }
}

std::unique_ptr<Client> Client::init_from_env() { return create(Options::from_env()); }

std::unique_ptr<Client> Client::create(const Options& options) {
  if (options.servers.empty()) throw Error(Error::Kind::usage, "PS mode: no servers to connect to");
  if (options.num_workers < 1 || options.worker < 0 || options.worker >= options.num_workers)
    throw Error(Error::Kind::usage, "PS mode: worker " + std::to_string(options.worker) + " of " +
                                        std::to_string(options.num_workers) + " is out of range");
  if (options.partition_bytes == 0 || options.partition_bytes > kMaxPartBytes)
    throw Error(Error::Kind::usage, "PS mode: partition_bytes must be more than 0 and at most 1 GiB");
  auto impl = std::make_shared<Impl>();
  impl->o = options;
  impl->connect_all();
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  impl_->fail(Error::Kind::usage, "the client was closed", {});
  impl_->join_all();
}

int Client::worker() const noexcept { return impl_->o.worker; }
int Client::num_workers() const noexcept { return impl_->o.num_workers; }
int Client::num_servers() const noexcept { return int(impl_->o.servers.size()); }
bool Client::sync() const noexcept { return impl_->o.sync; }
int Client::server_of(std::uint64_t key, std::size_t part) const { return impl_->server_of(key, part); }
std::size_t Client::parts_of(std::uint64_t key) const { return impl_->key_of(key, "parts_of").parts; }

void Client::declare(std::uint64_t key, std::size_t count, DataType dtype, const void* init) {
  Impl& I = *impl_;
  I.throw_if_broken();
  if (static_cast<unsigned>(dtype) > static_cast<unsigned>(DataType::u8))
    throw Error(Error::Kind::usage, "declare of key " + std::to_string(key) + ": unknown dtype");
  const std::size_t esize = size_of(dtype);
  Key k;
  k.count = count, k.dtype = dtype;
  k.per_part = std::max<std::size_t>(1, I.o.partition_bytes / esize);
  k.parts = count == 0 ? 1 : (count + k.per_part - 1) / k.per_part;
  {
    std::lock_guard<std::mutex> lock(I.keys_m);
    auto it = I.keys.find(key);
    if (it != I.keys.end()) {
      if (it->second.count == count && it->second.dtype == dtype) return;
      throw Error(Error::Kind::mismatch, "declare of key " + std::to_string(key) + ": declared before as " +
                                             std::to_string(it->second.count) + " " +
                                             std::string(name_of(it->second.dtype)) + ", now as " +
                                             std::to_string(count) + " " + std::string(name_of(dtype)));
    }
    I.keys.emplace(key, k);
  }
  std::vector<char> zeros;
  if (init == nullptr) zeros.assign(count * esize, 0), init = zeros.data();
  try {
    I.request(kDeclare, key, init, nullptr, "declare").wait();
  } catch (...) {
    std::lock_guard<std::mutex> lock(I.keys_m);
    I.keys.erase(key);
    throw;
  }
}

Handle Client::push_async(std::uint64_t key, const void* buf) {
  return impl_->request(kPush, key, buf, nullptr, "push");
}
Handle Client::pull_async(std::uint64_t key, void* buf) {
  return impl_->request(kPull, key, nullptr, buf, "pull");
}
Handle Client::push_pull_async(std::uint64_t key, const void* send, void* recv) {
  return impl_->request(kPushPull, key, send, recv, "push_pull");
}

}  // namespace mltrain::comm::ps
