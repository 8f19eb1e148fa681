// The agent link over an SSH channel: a pump thread per host moves bytes between the channel and
// a socketpair the supervisor polls like any other agent stream.
#include "runner/transport/detail/ssh_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"

namespace mltrain::transport::detail {
namespace {

std::string sock_address(int fd, bool peer) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return {};
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf, sizeof buf);
  return buf;
}

// The address of the HostName libssh connects to, resolved here (numeric), or the name itself.
std::string resolved_host(ssh_session s) {
  char* host = nullptr;
  if (ssh_options_get(s, SSH_OPTIONS_HOST, &host) != SSH_OK || !host) return {};
  std::string name = host;
  ssh_string_free_char(host);
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || !res) return name;
  char buf[INET6_ADDRSTRLEN] = {};
  if (res->ai_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  else if (res->ai_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(res->ai_addr)->sin6_addr, buf, sizeof buf);
  ::freeaddrinfo(res);
  return buf[0] ? std::string(buf) : name;
}

class SshLink : public AgentLink {
 public:
  SshLink(Session s, ssh_channel ch, std::string name, std::string leftover)
      : session_(std::move(s)), channel_(ch), name_(std::move(name)) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error(std::string("socketpair: ") + std::strerror(errno), {}, exit_code::internal);
    ours_ = sv[0];
    theirs_ = sv[1];
    int fl = ::fcntl(ours_, F_GETFL);
    if (fl < 0 || ::fcntl(ours_, F_SETFL, fl | O_NONBLOCK) != 0) {
      std::string why = std::string("fcntl(O_NONBLOCK) on the agent stream: ") + std::strerror(errno);
      ::close(ours_);
      ::close(theirs_);
      throw Error(name_ + ": " + why, {}, exit_code::internal);
    }
    int fd = ssh_get_fd(session_.get());
    peer_ = sock_address(fd, true);
    local_ = sock_address(fd, false);
    if (peer_.empty()) peer_ = resolved_host(session_.get());  // through a ProxyCommand: no TCP socket here
    done_ = done_promise_.get_future();
    pump_ = std::thread([this, leftover = std::move(leftover)] {
      pump(leftover);
      done_promise_.set_value();
    });
  }
  ~SshLink() override {
    stop_ = true;
    ::shutdown(ours_, SHUT_RDWR);
    // A pump stuck writing to a cut link must not hang the launcher's exit.
    if (done_.wait_for(std::chrono::seconds(3)) == std::future_status::ready) {
      pump_.join();
      if (channel_) {
        ssh_channel_close(channel_);
        ssh_channel_free(channel_);
      }
    } else {
      log::warn("transport", name_ + ": the connection is stuck; leaving it");
      pump_.detach();
      (void)session_.release();
    }
    ::close(ours_);
  }
  int read_fd() const override { return ours_; }
  int write_fd() const override { return ours_; }
  std::string describe() const override {
    return peer_.empty() || peer_ == name_ ? name_ : name_ + " (" + peer_ + ")";
  }
  std::string address() const override { return peer_; }
  std::string local_address() const override { return local_; }
  void kill() override {
    stop_ = true;
    ::shutdown(ours_, SHUT_RDWR);
  }

 private:
  bool write_sock(const char* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::send(theirs_, p, n, MSG_NOSIGNAL);
      if (w > 0) {
        p += w;
        n -= size_t(w);
      } else if (w < 0 && (errno == EINTR || errno == EAGAIN)) {
        pollfd pf{theirs_, POLLOUT, 0};
        ::poll(&pf, 1, 100);
        if (stop_) return false;
      } else {
        return false;
      }
    }
    return true;
  }

  // What the agent writes on its SSH stderr (a shell's or ~/.ssh/rc's complaint, or anything a
  // process on the host writes to the agent's fd 2): escaped line by line, and bounded, since a
  // compromised host may write without end. The rest is counted and said once at the end.
  void show_stderr(const char* p, size_t n) {
    stderr_partial_.append(p, n);
    size_t start = 0, nl;
    while ((nl = stderr_partial_.find('\n', start)) != std::string::npos ||
           stderr_partial_.size() - start >= kStderrLine) {
      size_t end = nl == std::string::npos ? start + kStderrLine : nl;
      say_stderr(std::string_view(stderr_partial_).substr(start, end - start));
      start = nl == std::string::npos ? end : nl + 1;
    }
    stderr_partial_.erase(0, start);
  }
  void say_stderr(std::string_view line) {
    if (stderr_shown_ >= kStderrShown) {
      stderr_dropped_ += line.size() + 1;
      return;
    }
    stderr_shown_ += line.size() + 1;
    std::fprintf(stderr, "mltrain: %s: %s\n", text::host_text(name_).c_str(), text::host_text(line).c_str());
  }
  void end_stderr() {
    if (!stderr_partial_.empty()) say_stderr(stderr_partial_), stderr_partial_.clear();
    if (stderr_dropped_)
      std::fprintf(stderr, "mltrain: %s: %llu more bytes of the agent's stderr were not shown\n",
                   text::host_text(name_).c_str(), (unsigned long long)stderr_dropped_);
  }

  // Moves bytes both ways. Agent -> supervisor bytes wait in `in` while the supervisor does not
  // take them (its console is slow) and the channel is not read at all meanwhile: libssh opens the
  // channel's window again on every read, of either stream (ssh_channel_read_timeout grows it when
  // `count` exceeds what is buffered plus the window, and again when the window is under half), so
  // one empty stderr read let the agent send on while its stdout piled up in libssh's buffer until
  // the launcher died. Not reading keeps the window shut: SSH's flow control holds the agent, whose
  // bounded outbox holds the ranks. Supervisor -> agent bytes (heartbeats among them) keep flowing.
  void pump(const std::string& leftover) {
    ssh_session s = session_.get();
    std::string in = leftover;
    size_t in_pos = 0;
    std::vector<char> buf(256 * 1024);
    while (!stop_) {
      const bool holding = in_pos < in.size();
      // While holding, the SSH socket is not waited on: nothing of it is read until the supervisor
      // takes what is held (its unread bytes would wake the poll at once, again and again).
      pollfd fds[2] = {{theirs_, short(POLLIN | (holding ? POLLOUT : 0)), 0},
                       {ssh_get_fd(s), short(holding ? 0 : POLLIN), 0}};
      ::poll(fds, 2, 50);
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        ssize_t n = ::read(theirs_, buf.data(), buf.size());
        if (n > 0) {
          if (ssh_channel_write(channel_, buf.data(), uint32_t(n)) == SSH_ERROR) break;
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          ssh_channel_send_eof(channel_);  // the supervisor let go: the agent sees EOF and stops
          break;
        }
      }
      if (holding) {
        ssize_t w = ::send(theirs_, in.data() + in_pos, in.size() - in_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
          in_pos += size_t(w);
          if (in_pos == in.size()) in.clear(), in_pos = 0;
        } else if (w < 0 && errno != EAGAIN && errno != EINTR) {
          break;
        }
      }
      bool progress = true;
      while (progress && !stop_ && in_pos == in.size()) {
        progress = false;
        int n = ssh_channel_read_nonblocking(channel_, buf.data(), uint32_t(buf.size()), 0);
        if (n > 0) {
          progress = true;
          in.assign(buf.data(), size_t(n));
          in_pos = 0;
          ssize_t w = ::send(theirs_, in.data(), in.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          if (w > 0) in_pos = size_t(w);
          if (in_pos == in.size()) in.clear(), in_pos = 0;
          if (w < 0 && errno != EAGAIN && errno != EINTR) stop_ = true;
        } else if (n == SSH_ERROR) {
          stop_ = true;
        }
        if (in_pos < in.size()) break;  // the supervisor is behind: hold the rest, read nothing more
        int e = ssh_channel_read_nonblocking(channel_, buf.data(), uint32_t(buf.size()), 1);
        if (e > 0) {
          progress = true;
          show_stderr(buf.data(), size_t(e));
        }
      }
      // At the end of the channel, what is held still goes to the supervisor.
      if (ssh_channel_is_eof(channel_) || ssh_channel_is_closed(channel_) || !ssh_is_connected(s)) {
        if (in_pos < in.size() && !write_sock(in.data() + in_pos, in.size() - in_pos)) break;
        int n;
        while (!stop_ &&
               (n = ssh_channel_read_nonblocking(channel_, buf.data(), uint32_t(buf.size()), 0)) > 0)
          if (!write_sock(buf.data(), size_t(n))) break;
        break;
      }
    }
    end_stderr();
    ::shutdown(theirs_, SHUT_RDWR);
    ::close(theirs_);
  }

  static constexpr size_t kStderrLine = 4096;        // a longer line is shown in parts
  static constexpr size_t kStderrShown = 64 * 1024;  // shown per connection; the rest counted

  Session session_;
  ssh_channel channel_;
  std::string stderr_partial_;
  size_t stderr_shown_ = 0;
  unsigned long long stderr_dropped_ = 0;
  std::string name_, peer_, local_;
  int ours_ = -1, theirs_ = -1;
  std::atomic<bool> stop_{false};
  std::promise<void> done_promise_;
  std::future<void> done_;
  std::thread pump_;
};

}  // namespace

std::unique_ptr<AgentLink> make_ssh_link(Session session, ssh_channel channel, std::string name,
                                         std::string leftover) {
  return std::make_unique<SshLink>(std::move(session), channel, std::move(name), std::move(leftover));
}

}  // namespace mltrain::transport::detail
