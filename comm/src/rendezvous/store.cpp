#include "rendezvous/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "core/refusal_log.h"
#include "mltrain/comm.hpp"
#include "rendezvous/store_wire.h"

namespace mltrain::comm::detail {

namespace {

using namespace wire;

struct Conn {
  Fd fd;
  std::string in;
  bool hello_done = false;
  int rank = -1;
  std::string name;  // the peer's address
  Clock::time_point hello_by{};
};

// Compares without an early exit, so the time taken tells nothing about the token.
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= std::uint8_t(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

// The server thread's state and its one poll loop (StoreServer::serve).
class ServeLoop {
 public:
  ServeLoop(int listen_fd, int wake_fd, const std::string& token)
      : listen_fd_(listen_fd), wake_fd_(wake_fd), token_(token) {}
  void run();

 private:
  void reply(Conn& c, const std::string& out);
  static std::string value_frame(bool found, const std::string& value);
  void publish(const std::string& key);
  void forget_unproven(Conn& c);
  // Handles every complete frame in c.in; returns false when the connection must close.
  bool handle(Conn& c);
  // The hello: 1 handled, 0 incomplete, -1 the connection must close.
  int handle_hello(Conn& c);
  // One request: its length when handled, 0 incomplete, -1 the connection must close.
  std::ptrdiff_t handle_request(Conn& c);
  void accept_all();
  // Drops what is out of descriptors' way (the oldest stranger) or rests the listener.
  void out_of_descriptors();
  // Drops strangers past their hello's time and closed connections; the next such time.
  Clock::time_point sweep(Clock::time_point now);

  int listen_fd_, wake_fd_;
  const std::string& token_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::map<std::string, std::string> data_;
  std::map<std::string, std::vector<Conn*>> waiters_;
  // Connections that have not proven the token yet, by peer address; and when accept() last failed
  // for lack of descriptors (then the listener rests a moment instead of spinning).
  std::map<std::string, std::size_t> unproven_by_peer_;
  std::size_t unproven_ = 0;
  Clock::time_point accept_rest_until_{};
  bool said_fds_ = false, said_flood_ = false;
  // Strangers' refused connections: the first few said, the rest summarised (core/refusal_log.h).
  RefusalLog refusals_{
      [](const std::string& line) { std::fprintf(stderr, "mltrain-comm store: %s\n", line.c_str()); }};
};

void ServeLoop::reply(Conn& c, const std::string& out) {
  try {
    send_all(c.fd.get(), out.data(), out.size(), Clock::now() + std::chrono::seconds(10), "store reply");
  } catch (const Error&) {
    c.fd.reset();  // a client that cannot take its answer is dropped
  }
}

std::string ServeLoop::value_frame(bool found, const std::string& value) {
  std::string out;
  ValueReply{std::uint8_t(found), static_cast<std::uint32_t>(value.size())}.put_to(out);
  out += value;
  return out;
}

void ServeLoop::publish(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  const std::string out = value_frame(true, data_[key]);
  for (Conn* c : it->second)
    if (c->fd) reply(*c, out);
  waiters_.erase(it);
}

void ServeLoop::forget_unproven(Conn& c) {
  if (c.hello_done || c.hello_by == Clock::time_point{}) return;
  --unproven_;
  if (--unproven_by_peer_[c.name] == 0) unproven_by_peer_.erase(c.name);
  c.hello_by = {};
}

int ServeLoop::handle_hello(Conn& c) {
  std::string& in = c.in;
  if (in.size() < Hello::kSize) return 0;
  const Hello hello = Hello::from(in.data());
  if (hello.magic != kStoreMagic || hello.token_len > kMaxToken) {
    refusals_.refused("refused connection from " + c.name + ": not an mltrain store client (bad magic)");
    return -1;
  }
  if (in.size() < Hello::kSize + hello.token_len) return 0;
  const auto version = hello.version;
  c.rank = hello.rank;
  const std::string token = in.substr(Hello::kSize, hello.token_len);
  in.erase(0, Hello::kSize + hello.token_len);
  // The token first: a stranger learns nothing, not even the wire version.
  std::string msg;
  Status status = kOk;
  if (!same_token(token, token_)) {
    status = kBadToken;
    msg = "wrong MLTRAIN_TOKEN";
  } else if (version != kStoreVersion) {
    status = kBadVersion;
    msg =
        "store speaks wire version " + std::to_string(kStoreVersion) + ", client " + std::to_string(version);
  }
  std::string out;
  HelloReply{kStoreMagic, std::uint16_t(status == kBadToken ? 0 : kStoreVersion), status,
             static_cast<std::uint32_t>(msg.size())}
      .put_to(out);
  out += msg;
  reply(c, out);
  if (status == kBadToken) {
    refusals_.refused("refused connection from " + c.name + " (rank " + std::to_string(c.rank) + "): " + msg);
    return -1;
  }
  if (status != kOk) {  // a token holder of another version: said every time
    std::fprintf(stderr, "mltrain-comm store: refused connection from %s (rank %d): %s\n", c.name.c_str(),
                 c.rank, msg.c_str());
    return -1;
  }
  forget_unproven(c);
  c.hello_done = true;
  return 1;
}

std::ptrdiff_t ServeLoop::handle_request(Conn& c) {
  const std::string& in = c.in;
  if (in.size() < Request::kSize) return 0;
  const Request req = Request::from(in.data());
  const auto op = req.op;
  const std::size_t klen = req.key_len;
  const std::size_t head = Request::kSize;
  std::size_t need = head + klen;
  if (op == kSet) {
    if (in.size() < need + 4) return 0;
    need += 4 + get<std::uint32_t>(in.data() + need);
  } else if (op == kAdd) {
    need += 8;
  } else if (op != kGet && op != kWait) {
    return -1;
  }
  if (in.size() < need) return 0;
  const std::string key = in.substr(head, klen);
  if (op == kSet) {
    data_[key] = in.substr(head + klen + 4, need - (head + klen + 4));
    reply(c, std::string(1, '\1'));
    publish(key);
  } else if (op == kGet) {
    auto it = data_.find(key);
    reply(c, it == data_.end() ? value_frame(false, {}) : value_frame(true, it->second));
  } else if (op == kWait) {
    auto it = data_.find(key);
    if (it != data_.end())
      reply(c, value_frame(true, it->second));
    else
      waiters_[key].push_back(&c);
  } else {
    const auto delta = get<std::int64_t>(in.data() + head + klen);
    auto it = data_.find(key);
    std::int64_t value = 0;
    if (it != data_.end()) {
      const char* end = it->second.data() + it->second.size();
      if (std::from_chars(it->second.data(), end, value).ptr != end) {
        std::fprintf(stderr, "mltrain-comm store: rank %d added to key '%s', whose value is not an integer\n",
                     c.rank, key.c_str());
        return -1;
      }
    }
    value += delta;
    data_[key] = std::to_string(value);
    std::string out;
    put(out, value);
    reply(c, out);
    publish(key);
  }
  return static_cast<std::ptrdiff_t>(need);
}

bool ServeLoop::handle(Conn& c) {
  while (true) {
    if (!c.hello_done) {
      const int got = handle_hello(c);
      if (got <= 0) return got == 0;
      continue;
    }
    const std::ptrdiff_t used = handle_request(c);
    if (used <= 0) return used == 0;
    c.in.erase(0, static_cast<std::size_t>(used));
  }
}

void ServeLoop::out_of_descriptors() {
  // Make room by dropping the oldest stranger, else rest a moment.
  if (!said_fds_)
    std::fprintf(stderr, "mltrain-comm store: accept(): %s; dropping unproven connections\n",
                 std::strerror(errno));
  said_fds_ = true;
  auto oldest =
      std::find_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->fd && !c->hello_done; });
  if (oldest != conns_.end()) {
    forget_unproven(**oldest);
    (*oldest)->fd.reset();
  } else {
    accept_rest_until_ = Clock::now() + std::chrono::milliseconds(50);
  }
}

void ServeLoop::accept_all() {
  // A bounded batch: the loop then drops what was pushed out and serves the ranks in between.
  for (int batch = 0; batch < 64; ++batch) {
    Fd fd(::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) out_of_descriptors();
      return;  // EAGAIN (nothing more), or anything else: never fatal, poll again
    }
    set_nodelay(fd.get());
    auto c = std::make_unique<Conn>();
    c->name = peer_name(fd.get());
    // Past a cap, the oldest stranger (from this peer, else any) makes room: a rank's hello comes
    // at once, so it proves itself long before strangers arriving after it can push it out (and
    // a rank that is pushed out connects again).
    const bool peer_full = unproven_by_peer_[c->name] >= StoreServer::kMaxUnprovenPerPeer;
    if (peer_full || unproven_ >= StoreServer::kMaxUnproven) {
      if (!said_flood_)
        std::fprintf(stderr,
                     "mltrain-comm store: too many connections that have not proven the token (from %s); "
                     "dropping the oldest\n",
                     c->name.c_str());
      said_flood_ = true;
      for (auto& old : conns_)
        if (old->fd && !old->hello_done && old->hello_by != Clock::time_point{} &&
            (!peer_full || old->name == c->name)) {
          forget_unproven(*old);
          old->fd.reset();
          break;
        }
    }
    ++unproven_by_peer_[c->name], ++unproven_;
    c->hello_by = Clock::now() + StoreServer::kHelloWithin;
    c->fd = std::move(fd);
    conns_.push_back(std::move(c));
  }
}

Clock::time_point ServeLoop::sweep(Clock::time_point now) {
  // Strangers that did not prove the token in time are dropped.
  Clock::time_point next = Clock::time_point::max();
  for (auto& c : conns_) {
    if (!c->fd || c->hello_done || c->hello_by == Clock::time_point{}) continue;
    if (c->hello_by <= now) {
      forget_unproven(*c);
      c->fd.reset();
    } else {
      next = std::min(next, c->hello_by);
    }
  }
  for (auto it = conns_.begin(); it != conns_.end();) {
    if ((*it)->fd) {
      ++it;
      continue;
    }
    for (auto& [key, list] : waiters_) std::erase(list, it->get());
    it = conns_.erase(it);
  }
  return next;
}

void ServeLoop::run() {
  std::vector<pollfd> fds;
  while (true) {
    const auto now = Clock::now();
    Clock::time_point next = sweep(now);
    refusals_.tick(now);
    next = std::min(next, refusals_.due());
    const bool resting = now < accept_rest_until_;
    if (resting) next = std::min(next, accept_rest_until_);
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({resting ? -1 : listen_fd_, POLLIN, 0});
    for (auto& c : conns_) fds.push_back({c->fd.get(), POLLIN, 0});
    const int timeout_ms = next == Clock::time_point::max()
                               ? -1
                               : int(std::chrono::ceil<std::chrono::milliseconds>(next - now).count());
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) continue;
    if (fds[0].revents != 0) {
      refusals_.summarise();
      break;
    }
    if (fds[1].revents != 0) accept_all();
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn& c = *conns_[i - 2];
      char buf[65536];
      const ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (k > 0) {
        c.in.append(buf, static_cast<std::size_t>(k));
        if (handle(c)) continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
        continue;
      }
      forget_unproven(c);
      c.fd.reset();
    }
  }
}

}  // namespace

StoreServer::StoreServer(int port, std::string token, bool loopback_only) : token_(std::move(token)) {
  auto [fd, bound] = listen_tcp(port, 1024, loopback_only);
  listen_ = std::move(fd);
  port_ = bound;
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw Error(Error::Kind::internal, "pipe2 failed");
  wake_read_ = Fd(pipe_fds[0]);
  wake_write_ = Fd(pipe_fds[1]);
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  const char byte = 'x';
  [[maybe_unused]] auto n = ::write(wake_write_.get(), &byte, 1);
  thread_.join();
}

void StoreServer::serve() { ServeLoop(listen_.get(), wake_read_.get(), token_).run(); }

StoreClient::StoreClient(std::string addr, std::string token, int rank, Deadline connect_deadline)
    : addr_(std::move(addr)), token_(std::move(token)), rank_(rank) {
  ensure_connected(connect_deadline);
}

void StoreClient::ensure_connected(Deadline deadline) {
  if (fd_) return;
  const auto [host, port] = split_host_port(addr_);
  const std::string what = "store at " + addr_;
  std::string hello;
  Hello{kStoreMagic, kStoreVersion, rank_, static_cast<std::uint32_t>(token_.size())}.put_to(hello);
  hello += token_;
  char head[HelloReply::kSize];
  Fd fd;
  // A store under a flood of strangers may drop a connection before reading its hello: connect
  // again until the deadline. A refusal (below) is final.
  for (int attempt = 0;; ++attempt) {
    fd = connect_tcp(host, port, deadline, what);
    try {
      send_all(fd.get(), hello.data(), hello.size(), deadline, what);
      recv_all(fd.get(), head, sizeof head, deadline, what + " (hello)");
      break;
    } catch (const Error&) {
      if (Clock::now() >= deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10 << std::min(attempt, 5), 200)));
    }
  }
  const HelloReply answer = HelloReply::from(head);
  const auto status = answer.status;
  if (answer.magic != kStoreMagic)
    throw Error(Error::Kind::store, what + " is not an mltrain store (bad magic)");
  std::string msg(std::min<std::uint32_t>(answer.message_len, 4096), '\0');
  recv_all(fd.get(), msg.data(), msg.size(), deadline, what);
  if (status != kOk)
    throw Error(Error::Kind::store,
                what + " refused rank " + std::to_string(rank_) + ": " + msg +
                    (status == kBadToken ? " (all ranks must share the job's MLTRAIN_TOKEN)" : ""));
  local_ip_ = local_ip(fd.get());
  fd_ = std::move(fd);
}

void StoreClient::request(const std::string& frame, Deadline deadline) {
  ensure_connected(deadline);
  try {
    send_all(fd_.get(), frame.data(), frame.size(), deadline, "store at " + addr_);
  } catch (const Error&) {
    fd_.reset();
    throw;
  }
}

void StoreClient::read_exact(void* data, std::size_t n, Deadline deadline) {
  try {
    recv_all(fd_.get(), data, n, deadline, "store at " + addr_);
  } catch (const Error&) {
    fd_.reset();  // the answer may still come: this connection's framing is lost
    throw;
  }
}

namespace {
std::string key_frame(std::uint8_t op, const std::string& key) {
  std::string out;
  Request{op, static_cast<std::uint32_t>(key.size())}.put_to(out);
  out += key;
  return out;
}
}  // namespace

void StoreClient::set(const std::string& key, const std::string& value, Deadline deadline) {
  std::string frame = key_frame(kSet, key);
  put(frame, static_cast<std::uint32_t>(value.size()));
  frame += value;
  request(frame, deadline);
  char ack;
  read_exact(&ack, 1, deadline);
}

std::optional<std::string> StoreClient::get(const std::string& key, Deadline deadline) {
  request(key_frame(kGet, key), deadline);
  char head[ValueReply::kSize];
  read_exact(head, sizeof head, deadline);
  const ValueReply answer = ValueReply::from(head);
  std::string value(answer.value_len, '\0');
  read_exact(value.data(), value.size(), deadline);
  if (!answer.found) return std::nullopt;
  return value;
}

std::string StoreClient::wait(const std::string& key, Deadline deadline) {
  request(key_frame(kWait, key), deadline);
  char head[ValueReply::kSize];
  try {
    read_exact(head, sizeof head, deadline);
  } catch (const Error& e) {
    if (e.kind() == Error::Kind::timeout)
      throw Error(Error::Kind::timeout,
                  "store at " + addr_ + ": key '" + key + "' was not set before the timeout");
    throw;
  }
  std::string value(ValueReply::from(head).value_len, '\0');
  read_exact(value.data(), value.size(), deadline);
  return value;
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta, Deadline deadline) {
  std::string frame = key_frame(kAdd, key);
  put(frame, delta);
  request(frame, deadline);
  std::int64_t value;
  read_exact(&value, 8, deadline);
  return value;
}

}  // namespace mltrain::comm::detail
