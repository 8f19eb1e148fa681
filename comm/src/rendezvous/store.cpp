#include "rendezvous/store.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

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
  std::string name;
};

}  // namespace

StoreServer::StoreServer(int port, std::string token) : token_(std::move(token)) {
  auto [fd, bound] = listen_tcp(port);
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

void StoreServer::serve() {
  std::vector<std::unique_ptr<Conn>> conns;
  std::map<std::string, std::string> data;
  std::map<std::string, std::vector<Conn*>> waiters;

  auto reply = [](Conn& c, const std::string& out) {
    try {
      send_all(c.fd.get(), out.data(), out.size(), Clock::now() + std::chrono::seconds(10), "store reply");
    } catch (const Error&) {
      c.fd.reset();  // a client that cannot take its answer is dropped
    }
  };
  auto value_frame = [](bool found, const std::string& value) {
    std::string out;
    ValueReply{std::uint8_t(found), static_cast<std::uint32_t>(value.size())}.put_to(out);
    out += value;
    return out;
  };
  auto publish = [&](const std::string& key) {
    auto it = waiters.find(key);
    if (it == waiters.end()) return;
    const std::string out = value_frame(true, data[key]);
    for (Conn* c : it->second)
      if (c->fd) reply(*c, out);
    waiters.erase(it);
  };

  // Handles every complete frame in c.in; returns false when the connection must close.
  auto handle = [&](Conn& c) -> bool {
    while (true) {
      std::string& in = c.in;
      if (!c.hello_done) {
        if (in.size() < Hello::kSize) return true;
        const Hello hello = Hello::from(in.data());
        if (hello.magic != kStoreMagic || hello.token_len > kMaxToken) {
          std::fprintf(stderr,
                       "mltrain-comm store: refused connection from %s: not an mltrain "
                       "store client (bad magic)\n",
                       c.name.c_str());
          return false;
        }
        if (in.size() < Hello::kSize + hello.token_len) return true;
        const auto version = hello.version;
        c.rank = hello.rank;
        const std::string token = in.substr(Hello::kSize, hello.token_len);
        in.erase(0, Hello::kSize + hello.token_len);
        std::string msg;
        Status status = kOk;
        if (version != kStoreVersion) {
          status = kBadVersion;
          msg = "store speaks wire version " + std::to_string(kStoreVersion) + ", client " +
                std::to_string(version);
        } else if (token != token_) {
          status = kBadToken;
          msg = "wrong MLTRAIN_TOKEN";
        }
        std::string out;
        HelloReply{kStoreMagic, kStoreVersion, status, static_cast<std::uint32_t>(msg.size())}.put_to(out);
        out += msg;
        reply(c, out);
        if (status != kOk) {
          std::fprintf(stderr, "mltrain-comm store: refused connection from %s (rank %d): %s\n",
                       c.name.c_str(), c.rank, msg.c_str());
          return false;
        }
        c.hello_done = true;
        continue;
      }
      if (in.size() < Request::kSize) return true;
      const Request req = Request::from(in.data());
      const auto op = req.op;
      const std::size_t klen = req.key_len;
      const std::size_t head = Request::kSize;
      std::size_t need = head + klen;
      if (op == kSet) {
        if (in.size() < need + 4) return true;
        need += 4 + get<std::uint32_t>(in.data() + need);
      } else if (op == kAdd) {
        need += 8;
      } else if (op != kGet && op != kWait) {
        return false;
      }
      if (in.size() < need) return true;
      const std::string key = in.substr(head, klen);
      if (op == kSet) {
        data[key] = in.substr(head + klen + 4, need - (head + klen + 4));
        reply(c, std::string(1, '\1'));
        publish(key);
      } else if (op == kGet) {
        auto it = data.find(key);
        reply(c, it == data.end() ? value_frame(false, {}) : value_frame(true, it->second));
      } else if (op == kWait) {
        auto it = data.find(key);
        if (it != data.end())
          reply(c, value_frame(true, it->second));
        else
          waiters[key].push_back(&c);
      } else {
        const auto delta = get<std::int64_t>(in.data() + head + klen);
        auto it = data.find(key);
        std::int64_t value = 0;
        if (it != data.end()) {
          const char* end = it->second.data() + it->second.size();
          if (std::from_chars(it->second.data(), end, value).ptr != end) {
            std::fprintf(stderr,
                         "mltrain-comm store: rank %d added to key '%s', whose value is not an integer\n",
                         c.rank, key.c_str());
            return false;
          }
        }
        value += delta;
        data[key] = std::to_string(value);
        std::string out;
        put(out, value);
        reply(c, out);
        publish(key);
      }
      in.erase(0, need);
    }
  };

  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({listen_.get(), POLLIN, 0});
    for (auto& c : conns) fds.push_back({c->fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents != 0) break;
    if (fds[1].revents != 0) {
      while (true) {
        Fd fd = accept_tcp(listen_.get(), Clock::now());
        if (!fd) break;
        auto c = std::make_unique<Conn>();
        c->name = peer_name(fd.get());
        c->fd = std::move(fd);
        conns.push_back(std::move(c));
      }
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Conn& c = *conns[i - 2];
      char buf[65536];
      const ssize_t k = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (k > 0) {
        c.in.append(buf, static_cast<std::size_t>(k));
        if (!handle(c)) c.fd.reset();
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        c.fd.reset();
      }
    }
    for (auto it = conns.begin(); it != conns.end();) {
      if ((*it)->fd) {
        ++it;
        continue;
      }
      for (auto& [key, list] : waiters) std::erase(list, it->get());
      it = conns.erase(it);
    }
  }
}

StoreClient::StoreClient(std::string addr, std::string token, int rank, Deadline connect_deadline)
    : addr_(std::move(addr)), token_(std::move(token)), rank_(rank) {
  ensure_connected(connect_deadline);
}

void StoreClient::ensure_connected(Deadline deadline) {
  if (fd_) return;
  const auto [host, port] = split_host_port(addr_);
  Fd fd = connect_tcp(host, port, deadline, "store at " + addr_);
  std::string hello;
  Hello{kStoreMagic, kStoreVersion, rank_, static_cast<std::uint32_t>(token_.size())}.put_to(hello);
  hello += token_;
  const std::string what = "store at " + addr_;
  send_all(fd.get(), hello.data(), hello.size(), deadline, what);
  char head[HelloReply::kSize];
  recv_all(fd.get(), head, sizeof head, deadline, what + " (hello)");
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
