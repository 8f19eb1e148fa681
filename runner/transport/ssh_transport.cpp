// The SSH transport (libssh): one connection and one channel per host, however many ranks it
// runs. The channel carries the agent protocol; a pump thread per host moves bytes between the
// channel and a socketpair the supervisor polls like any other agent stream.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <libssh/libssh.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/transport/ssh_transport.h"

namespace mltrain::transport {
namespace {

#if defined(__x86_64__)
constexpr const char* kAgentArch = "x86_64";
#elif defined(__aarch64__)
constexpr const char* kAgentArch = "aarch64";
#else
constexpr const char* kAgentArch = "unknown";
#endif

std::string expand_home(const std::string& p) {
  if (p.size() >= 1 && p[0] == '~') {
    const char* home = std::getenv("HOME");
    return std::string(home ? home : "") + p.substr(1);
  }
  return p;
}

bool file_exists(const std::string& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0;
}

std::string sock_address(int fd, bool peer) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) : ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  if (rc != 0) return {};
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&a)->sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6) ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr, buf, sizeof buf);
  return buf;
}

// The first value the ssh config gives `key` (lower case) for `host`, as ssh reads Host blocks
// (glob patterns; Match blocks are skipped). Used for the settings mltrain itself acts on
// (ConnectTimeout, StrictHostKeyChecking); libssh applies the rest when it parses the file.
std::string config_value(const std::string& config, const std::string& host, const std::string& want) {
  FILE* f = std::fopen(config.c_str(), "r");
  if (!f) return {};
  char line[1024];
  bool applies = true;
  std::string value;
  while (value.empty() && std::fgets(line, sizeof line, f)) {
    std::string l(line);
    size_t b = l.find_first_not_of(" \t");
    if (b == std::string::npos || l[b] == '#') continue;
    std::string key = l.substr(b, l.find_first_of(" \t=", b) - b);
    for (auto& c : key) c = char(std::tolower(static_cast<unsigned char>(c)));
    std::string rest = l.substr(std::min(l.size(), b + key.size()));
    size_t vb = rest.find_first_not_of(" \t=");
    size_t ve = rest.find_last_not_of(" \t\r\n");
    std::string v = vb == std::string::npos || ve < vb ? std::string() : rest.substr(vb, ve - vb + 1);
    if (key == "host") {
      applies = false;
      size_t p = 0;
      while ((p = v.find_first_not_of(" \t", p)) != std::string::npos) {
        size_t e = v.find_first_of(" \t", p);
        std::string pat = v.substr(p, e == std::string::npos ? std::string::npos : e - p);
        if (::fnmatch(pat.c_str(), host.c_str(), 0) == 0) applies = true;
        p = e;
      }
    } else if (key == "match") {
      applies = false;
    } else if (key == want && applies) {
      value = v;
    }
  }
  std::fclose(f);
  for (auto& c : value) c = char(std::tolower(static_cast<unsigned char>(c)));
  return value;
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

std::string agent_remote_path() {
  return "\"$HOME/.cache/mltrain/mltrain-agent-" + std::string(agent_hash().substr(0, 16)) + "\"";
}

struct SessionDeleter {
  void operator()(ssh_session s) const {
    if (s) {
      ssh_disconnect(s);
      ssh_free(s);
    }
  }
};
using Session = std::unique_ptr<ssh_session_struct, SessionDeleter>;

class SshLink : public AgentLink {
 public:
  SshLink(Session s, ssh_channel ch, std::string name, std::string leftover)
      : session_(std::move(s)), channel_(ch), name_(std::move(name)) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw Error(std::string("socketpair: ") + std::strerror(errno), {}, exit_code::internal);
    ours_ = sv[0];
    theirs_ = sv[1];
    ::fcntl(ours_, F_SETFL, ::fcntl(ours_, F_GETFL) | O_NONBLOCK);
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
  std::string describe() const override { return peer_.empty() || peer_ == name_ ? name_ : name_ + " (" + peer_ + ")"; }
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

  void pump(const std::string& leftover) {
    ssh_session s = session_.get();
    if (!leftover.empty() && !write_sock(leftover.data(), leftover.size())) stop_ = true;
    std::vector<char> buf(256 * 1024);
    while (!stop_) {
      pollfd fds[2] = {{theirs_, POLLIN, 0}, {ssh_get_fd(s), POLLIN, 0}};
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
      bool progress = true;
      while (progress && !stop_) {
        progress = false;
        int n = ssh_channel_read_nonblocking(channel_, buf.data(), uint32_t(buf.size()), 0);
        if (n > 0) {
          progress = true;
          if (!write_sock(buf.data(), size_t(n))) stop_ = true;
        } else if (n == SSH_ERROR) {
          stop_ = true;
        }
        int e = ssh_channel_read_nonblocking(channel_, buf.data(), uint32_t(buf.size()), 1);
        if (e > 0) {
          progress = true;
          std::string text(buf.data(), size_t(e));
          while (!text.empty() && text.back() == '\n') text.pop_back();
          std::fprintf(stderr, "mltrain: %s: %s\n", name_.c_str(), text.c_str());
        }
      }
      if (ssh_channel_is_eof(channel_) || ssh_channel_is_closed(channel_) || !ssh_is_connected(s)) break;
    }
    ::shutdown(theirs_, SHUT_RDWR);
    ::close(theirs_);
  }

  Session session_;
  ssh_channel channel_;
  std::string name_, peer_, local_;
  int ours_ = -1, theirs_ = -1;
  std::atomic<bool> stop_{false};
  std::promise<void> done_promise_;
  std::future<void> done_;
  std::thread pump_;
};

class SshTransport : public Transport {
 public:
  explicit SshTransport(SshOptions o) : o_(std::move(o)) {}

  std::unique_ptr<AgentLink> connect(const plan::HostPlan& hp) override {
    const auto& h = hp.host;
    Session s(ssh_new());
    if (!s) throw Error("cannot create an SSH session", {}, exit_code::internal);
    ssh_session ss = s.get();
    std::string name = h.name;
    ssh_options_set(ss, SSH_OPTIONS_HOST, h.name.c_str());
    int no = 0;
    ssh_options_set(ss, SSH_OPTIONS_PROCESS_CONFIG, &no);
    std::string config = expand_home(o_.config.empty() ? "~/.ssh/config" : o_.config);
    if (file_exists(config)) {
      if (ssh_options_parse_config(ss, config.c_str()) != SSH_OK)
        throw Error(config + ": cannot parse the ssh config: " + ssh_get_error(ss), "fix the file, or pass --ssh-config");
    } else if (!o_.config.empty()) {
      throw Error(config + ": ssh config file not found", "check [ssh] config / --ssh-config");
    }
    // libssh turns ProxyJump into "ssh -W ... jump", which would read ~/.ssh/config, not this file.
    if (!o_.config.empty()) {
      std::string jump = config_value(config, h.name, "proxyjump");
      if (!jump.empty() && jump != "none") {
        auto last = jump.rfind(',');
        std::string cmd = "ssh -F '" + config + "' -W '[%h]:%p'" +
                          (last == std::string::npos ? " " + jump : " -J " + jump.substr(0, last) + " " + jump.substr(last + 1));
        ssh_options_set(ss, SSH_OPTIONS_PROXYCOMMAND, cmd.c_str());
      }
    }
    // Explicit settings win over the config: the hostfile's, then the spec's.
    std::string user = !h.user.empty() ? h.user : o_.user;
    if (!user.empty()) ssh_options_set(ss, SSH_OPTIONS_USER, user.c_str());
    int port = h.port > 0 ? h.port : o_.port;
    if (port > 0) ssh_options_set(ss, SSH_OPTIONS_PORT, &port);
    if (!o_.identity_file.empty()) ssh_options_set(ss, SSH_OPTIONS_ADD_IDENTITY, expand_home(o_.identity_file).c_str());
    if (!o_.known_hosts.empty()) ssh_options_set(ss, SSH_OPTIONS_KNOWNHOSTS, expand_home(o_.known_hosts).c_str());
    if (o_.connect_timeout_set || config_value(config, h.name, "connecttimeout").empty()) {
      long timeout = std::max<long>(1, long(o_.connect_timeout.count() / 1000));
      ssh_options_set(ss, SSH_OPTIONS_TIMEOUT, &timeout);
    }

    // Host keys: the spec or flag decides; else the ssh config's StrictHostKeyChecking; else strict.
    std::string strict = o_.strict_host_keys;
    if (!o_.strict_host_keys_set) {
      std::string c = config_value(config, h.name, "stricthostkeychecking");
      if (c == "accept-new") strict = "accept-new";
      else if (c == "no" || c == "off") strict = "no";
    }

    if (ssh_connect(ss) != SSH_OK)
      throw Error(name + ": cannot connect: " + ssh_get_error(ss), "check the host name, that sshd runs there, and the network",
                  exit_code::host_failure);
    verify_host_key(ss, name, strict);
    authenticate(ss, name);
    return start_agent(std::move(s), name);
  }

 private:
  void verify_host_key(ssh_session ss, const std::string& name, const std::string& strict) {
    ssh_key key = nullptr;
    std::string fingerprint = "(unknown)";
    if (ssh_get_server_publickey(ss, &key) == SSH_OK) {
      unsigned char* hash = nullptr;
      size_t hlen = 0;
      if (ssh_get_publickey_hash(key, SSH_PUBLICKEY_HASH_SHA256, &hash, &hlen) == 0) {
        char* fp = ssh_get_fingerprint_hash(SSH_PUBLICKEY_HASH_SHA256, hash, hlen);
        if (fp) {
          fingerprint = std::string(ssh_key_type_to_char(ssh_key_type(key))) + " " + fp;
          ssh_string_free_char(fp);
        }
        ssh_clean_pubkey_hash(&hash);
      }
      ssh_key_free(key);
    }
    switch (ssh_session_is_known_server(ss)) {
      case SSH_KNOWN_HOSTS_OK: return;
      case SSH_KNOWN_HOSTS_CHANGED:
        throw Error(name + ": HOST KEY CHANGED: the host now presents " + fingerprint +
                        ", which differs from the key recorded in known_hosts. Someone may be intercepting the "
                        "connection, or the host was reinstalled",
                    "if the change is expected, remove the old key (ssh-keygen -R " + name + ") and connect again",
                    exit_code::host_failure);
      case SSH_KNOWN_HOSTS_OTHER:
        throw Error(name + ": the host presents a key of another type (" + fingerprint + ") than known_hosts records",
                    "check the host; remove the old entry with ssh-keygen -R " + name + " if the change is expected",
                    exit_code::host_failure);
      case SSH_KNOWN_HOSTS_NOT_FOUND:
      case SSH_KNOWN_HOSTS_UNKNOWN:
        if (strict == "no") return;
        if (strict == "accept-new") {
          if (ssh_session_update_known_hosts(ss) != SSH_OK)
            throw Error(name + ": cannot record the host key: " + ssh_get_error(ss), {}, exit_code::host_failure);
          log::info("transport", name + ": recorded new host key " + fingerprint);
          return;
        }
        throw Error(name + ": unknown host key " + fingerprint + "; refusing to connect",
                    "check the fingerprint, then accept it with --accept-new-host-keys (or [ssh] strict_host_keys = "
                    "\"accept-new\"), which records it in known_hosts",
                    exit_code::host_failure);
      case SSH_KNOWN_HOSTS_ERROR:
      default:
        throw Error(name + ": cannot check the host key: " + ssh_get_error(ss), {}, exit_code::host_failure);
    }
  }

  void authenticate(ssh_session ss, const std::string& name) {
    int rc = ssh_userauth_none(ss, nullptr);
    if (rc == SSH_AUTH_SUCCESS) return;
    rc = ssh_userauth_publickey_auto(ss, nullptr, nullptr);
    if (rc == SSH_AUTH_SUCCESS) return;
    char* user = nullptr;
    ssh_options_get(ss, SSH_OPTIONS_USER, &user);
    std::string who = std::string(user ? user : "?") + "@" + name;
    if (user) ssh_string_free_char(user);
    throw Error(name + ": authentication failed for " + who + " (tried ssh-agent and the identity files)" +
                    (rc == SSH_AUTH_ERROR ? std::string(": ") + ssh_get_error(ss) : std::string()),
                "check that your public key is in the host's authorized_keys, or set [ssh] identity_file",
                exit_code::host_failure);
  }

  // Runs the agent over one exec channel. The remote shell checks the cached agent by content
  // hash (size, where sha256sum is missing); when it is absent or damaged it says so and reads
  // the agent from the same channel (one channel: sshd's MaxSessions may be 1), then execs it.
  std::unique_ptr<AgentLink> start_agent(Session s, const std::string& name) {
    ssh_session ss = s.get();
    auto bytes = agent_bytes();
    std::string size = std::to_string(bytes.size());
    std::string hash(agent_hash());
    std::string cmd =
        "a=" + agent_remote_path() + "; m=$(uname -m); if [ \"$m\" != " + kAgentArch +
        " ]; then echo \"MLTRAIN-ARCH $m\"; exit 0; fi; ok=0; if [ -x \"$a\" ]; then "
        "if command -v sha256sum >/dev/null 2>&1; then [ \"$(sha256sum < \"$a\" | cut -d' ' -f1)\" = " + hash +
        " ] && ok=1; else [ \"$(wc -c < \"$a\")\" -eq " + size + " ] && ok=1; fi; fi; "
        "if [ $ok = 0 ]; then echo MLTRAIN-AGENT-MISSING; mkdir -p \"$HOME/.cache/mltrain\" && t=\"$a.tmp.$$\" && "
        "head -c " + size + " > \"$t\" && chmod 755 \"$t\" && mv -f \"$t\" \"$a\" || "
        "{ echo MLTRAIN-UPLOAD-FAILED; exit 0; }; fi; echo MLTRAIN-AGENT-OK; exec \"$a\"";
    ssh_channel ch = ssh_channel_new(ss);
    if (!ch || ssh_channel_open_session(ch) != SSH_OK || ssh_channel_request_exec(ch, cmd.c_str()) != SSH_OK) {
      std::string err = ssh_get_error(ss);
      if (ch) ssh_channel_free(ch);
      throw Error(name + ": cannot start a command over SSH: " + err, "check the host's sshd (MaxSessions, ForceCommand)",
                  exit_code::host_failure);
    }
    auto fail = [&](const std::string& what, const std::string& hint) -> std::unique_ptr<AgentLink> {
      ssh_channel_close(ch);
      ssh_channel_free(ch);
      throw Error(name + ": " + what, hint, exit_code::host_failure);
    };
    std::string line, rest;
    read_marker(ss, ch, name, line, rest);
    if (line == "MLTRAIN-AGENT-MISSING") {
      size_t off = 0;
      while (off < bytes.size()) {
        int n = ssh_channel_write(ch, bytes.data() + off, uint32_t(std::min<size_t>(bytes.size() - off, 64 * 1024)));
        if (n <= 0) return fail(std::string("cannot upload the agent: ") + ssh_get_error(ss), "check the connection");
        off += size_t(n);
      }
      // The marker after the upload may already be buffered behind the first one.
      std::string pending = rest;
      read_marker(ss, ch, name, line, rest, pending);
      log::info("transport", name + ": agent uploaded (" + size + " bytes)");
    }
    if (line == "MLTRAIN-AGENT-OK") return std::make_unique<SshLink>(std::move(s), ch, name, rest);
    if (line.rfind("MLTRAIN-ARCH ", 0) == 0)
      return fail("the host's architecture is " + line.substr(13) + "; this mltrain carries an agent for " + kAgentArch,
                  "run mltrain built for that architecture");
    if (line == "MLTRAIN-UPLOAD-FAILED")
      return fail("cannot write the agent to ~/.cache/mltrain", "check free space and permissions in the remote home");
    return fail("the agent did not start (got '" + line + "')", "check that the host has a POSIX sh and glibc");
  }

  void read_marker(ssh_session ss, ssh_channel ch, const std::string& name, std::string& line, std::string& rest,
                   const std::string& buffered = {}) {
    auto deadline = std::chrono::steady_clock::now() + o_.connect_timeout + std::chrono::seconds(5);
    std::string got = buffered, err;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      auto nl0 = got.find('\n');
      if (nl0 != std::string::npos) {
        line = got.substr(0, nl0);
        rest = got.substr(nl0 + 1);
        return;
      }
      int n = ssh_channel_read_timeout(ch, buf, sizeof buf, 0, 200);
      if (n > 0) got.append(buf, size_t(n));
      int e = ssh_channel_read_nonblocking(ch, buf, sizeof buf, 1);
      if (e > 0) err.append(buf, size_t(e));
      auto nl = got.find('\n');
      if (nl != std::string::npos) {
        line = got.substr(0, nl);
        rest = got.substr(nl + 1);
        return;
      }
      if (n == SSH_ERROR || ssh_channel_is_eof(ch)) break;
    }
    throw Error(name + ": no answer from the remote shell" + (err.empty() ? std::string() : ": " + err) +
                    (ssh_get_error(ss)[0] ? std::string(" (") + ssh_get_error(ss) + ")" : std::string()),
                "check that the host has a POSIX sh", exit_code::host_failure);
  }

  SshOptions o_;
};

}  // namespace

std::unique_ptr<Transport> make_ssh_transport(SshOptions o) { return std::make_unique<SshTransport>(std::move(o)); }

}  // namespace mltrain::transport
