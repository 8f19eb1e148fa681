// The SSH transport (libssh): one connection and one channel per host, however many ranks it
// runs. This file makes the session (options from the spec and the ssh config), checks the host
// key, authenticates and starts the agent; ssh_link.cpp carries the agent's stream afterwards.
#include "runner/transport/ssh_transport.h"

#include <libssh/libssh.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <vector>

#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/transport/detail/ssh_link.h"
#include "runner/transport/ssh_bootstrap.h"
#include "runner/transport/ssh_config.h"

namespace mltrain::transport {
namespace {

using detail::Session;

std::string home_dir() { return knobs::home.get(); }

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// ssh_options_set, checked: a refused option names itself, libssh's reason and the host.
void set_option(ssh_session ss, ssh_options_e option, const void* value, const char* option_name,
                const std::string& host) {
  if (ssh_options_set(ss, option, value) != SSH_OK)
    throw Error(host + ": libssh refused the option SSH_OPTIONS_" + option_name + ": " + ssh_get_error(ss),
                "check the [ssh] settings and the ssh config for this host", exit_code::host_failure);
}

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

class SshTransport : public Transport {
 public:
  explicit SshTransport(SshOptions o) : o_(std::move(o)) {}

  std::unique_ptr<AgentLink> connect(const plan::HostPlan& hp) override {
    Session s = open_session(hp);
    return start_agent(std::move(s), hp.host.name);
  }

  int interactive(const plan::HostPlan& hp, const std::string& script) override;

 private:
  // A connected, host-key-checked and authenticated session to the host.
  Session open_session(const plan::HostPlan& hp) {
    const auto& h = hp.host;
    Session s(ssh_new());
    if (!s) throw Error("cannot create an SSH session", {}, exit_code::internal);
    ssh_session ss = s.get();
    std::string name = h.name;
    set_option(ss, SSH_OPTIONS_HOST, h.name.c_str(), "HOST", name);
    int no = 0;
    set_option(ss, SSH_OPTIONS_PROCESS_CONFIG, &no, "PROCESS_CONFIG", name);
    std::string home = home_dir();
    std::string config = expand_home(o_.config.empty() ? "~/.ssh/config" : o_.config, home);
    if (file_exists(config)) {
      if (ssh_options_parse_config(ss, config.c_str()) != SSH_OK)
        throw Error(config + ": cannot parse the ssh config: " + ssh_get_error(ss),
                    "fix the file, or pass --ssh-config");
    } else if (!o_.config.empty()) {
      throw Error(config + ": ssh config file not found", "check [ssh] config / --ssh-config");
    }
    SshConfig parsed = SshConfig::load(config, home);
    // libssh turns ProxyJump into "ssh -W ... jump", which would read ~/.ssh/config, not this file.
    if (!o_.config.empty()) {
      std::string jump = parsed.value(h.name, "proxyjump");
      if (!jump.empty() && lower(jump) != "none")
        set_option(ss, SSH_OPTIONS_PROXYCOMMAND, proxy_command_for_jump(config, jump).c_str(), "PROXYCOMMAND",
                   name);
    }
    // Explicit settings win over the config: the hostfile's, then the spec's.
    std::string user = !h.user.empty() ? h.user : o_.user;
    if (!user.empty()) set_option(ss, SSH_OPTIONS_USER, user.c_str(), "USER", name);
    int port = h.port > 0 ? h.port : o_.port;
    if (port > 0) set_option(ss, SSH_OPTIONS_PORT, &port, "PORT", name);
    if (!o_.identity_file.empty())
      set_option(ss, SSH_OPTIONS_ADD_IDENTITY, expand_home(o_.identity_file, home).c_str(), "ADD_IDENTITY",
                 name);
    if (!o_.known_hosts.empty())
      set_option(ss, SSH_OPTIONS_KNOWNHOSTS, expand_home(o_.known_hosts, home).c_str(), "KNOWNHOSTS", name);
    if (o_.connect_timeout_set || parsed.value(h.name, "connecttimeout").empty()) {
      long timeout = std::max<long>(1, long(o_.connect_timeout.count() / 1000));
      set_option(ss, SSH_OPTIONS_TIMEOUT, &timeout, "TIMEOUT", name);
    }

    // Host keys: the spec or flag decides; else the ssh config's StrictHostKeyChecking; else strict.
    std::string strict = o_.strict_host_keys;
    if (!o_.strict_host_keys_set) {
      std::string c = lower(parsed.value(h.name, "stricthostkeychecking"));
      if (c == "accept-new")
        strict = "accept-new";
      else if (c == "no" || c == "off")
        strict = "no";
    }

    const auto dialled = std::chrono::steady_clock::now();
    if (ssh_connect(ss) != SSH_OK) {
      std::string why = ssh_get_error(ss);
      const long waited =
          long(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - dialled)
                   .count());
      // A host that does not answer is likely down: say how long we waited and how to go on without it.
      const bool timed_out = lower(why).find("timeout") != std::string::npos ||
                             lower(why).find("timed out") != std::string::npos;
      if (timed_out) why += " (no answer in " + std::to_string(std::max(1L, waited)) + "s)";
      const std::string without = "leave it out with --exclude " + h.name;
      throw Error(name + ": cannot connect: " + why,
                  timed_out ? "the host may be down: check it, or " + without +
                                  " ([ssh] connect_timeout sets the wait)"
                            : "check the host name, that sshd runs there, and the network; or " + without,
                  exit_code::host_failure);
    }
    verify_host_key(ss, name, strict);
    authenticate(ss, name, identity_files(parsed, h.name, home));
    return s;
  }

  // The known_hosts file this session checks: [ssh] known_hosts, the config's UserKnownHostsFile,
  // or libssh's default; the hint must name it, or `ssh-keygen -R` edits another file.
  static std::string known_hosts_file(ssh_session ss) {
    char* path = nullptr;
    std::string out = "~/.ssh/known_hosts";
    if (ssh_options_get(ss, SSH_OPTIONS_KNOWNHOSTS, &path) == SSH_OK && path) {
      out = path;
      ssh_string_free_char(path);
    }
    return out;
  }

  // The command that removes this host's entry, as known_hosts writes its name ("[h]:2222").
  static std::string keygen_remove(ssh_session ss) {
    char* host = nullptr;
    std::string entry;
    if (ssh_options_get(ss, SSH_OPTIONS_HOST, &host) == SSH_OK && host) {
      entry = host;
      ssh_string_free_char(host);
    }
    unsigned int port = 22;
    ssh_options_get_port(ss, &port);
    if (port != 22) entry = "[" + entry + "]:" + std::to_string(port);
    return "ssh-keygen -f " + text::shell_quote(known_hosts_file(ss)) + " -R " + text::shell_quote(entry);
  }

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
      case SSH_KNOWN_HOSTS_OK:
        return;
      case SSH_KNOWN_HOSTS_CHANGED:
        throw Error(
            name + ": HOST KEY CHANGED: the host now presents " + fingerprint +
                ", which differs from the key " + "recorded in " + known_hosts_file(ss) +
                ". Someone may be intercepting the connection, or the " + "host was reinstalled",
            "if the change is expected, remove the old key (" + keygen_remove(ss) + ") and connect again",
            exit_code::host_failure);
      case SSH_KNOWN_HOSTS_OTHER:
        throw Error(
            name + ": the host presents a key of another type (" + fingerprint + ") than " +
                known_hosts_file(ss) + " records",
            "check the host; remove the old entry with " + keygen_remove(ss) + " if the change is expected",
            exit_code::host_failure);
      case SSH_KNOWN_HOSTS_NOT_FOUND:
      case SSH_KNOWN_HOSTS_UNKNOWN:
        if (strict == "no") return;
        if (strict == "accept-new") {
          if (ssh_session_update_known_hosts(ss) != SSH_OK)
            throw Error(name + ": cannot record the host key: " + ssh_get_error(ss), {},
                        exit_code::host_failure);
          log::info("transport", name + ": recorded new host key " + fingerprint);
          return;
        }
        throw Error(
            name + ": unknown host key " + fingerprint + "; refusing to connect",
            "check the fingerprint, then accept it with --accept-new-host-keys (or [ssh] strict_host_keys = "
            "\"accept-new\"), which records it in known_hosts",
            exit_code::host_failure);
      case SSH_KNOWN_HOSTS_ERROR:
      default:
        throw Error(name + ": cannot check the host key: " + ssh_get_error(ss), {}, exit_code::host_failure);
    }
  }

  // The identity files to offer, as ssh does: [ssh] identity_file, then the config's IdentityFile
  // lines (they add up), else ssh's default names; only those that exist.
  std::vector<std::string> identity_files(const SshConfig& parsed, const std::string& host,
                                          const std::string& home) const {
    std::vector<std::string> named;
    if (!o_.identity_file.empty()) named.push_back(o_.identity_file);
    for (auto& v : parsed.values(host, "identityfile")) named.push_back(v);
    if (named.empty())
      for (const char* k : {"id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk", "id_dsa"})
        named.push_back(std::string("~/.ssh/") + k);
    std::vector<std::string> out;
    for (auto& n : named) {
      std::string p = expand_home(n, home);
      for (size_t at; (at = p.find("%d")) != std::string::npos;) p.replace(at, 2, home);
      if (file_exists(p) && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    }
    return out;
  }

  // ssh-agent's keys, then each identity file. Not ssh_userauth_publickey_auto: it writes KEY.pub
  // beside a private key that has none (into the user's key folder, which mltrain never writes),
  // and a stale one left there breaks a later login. A key whose .pub is missing is read whole.
  void authenticate(ssh_session ss, const std::string& name, const std::vector<std::string>& identities) {
    int rc = ssh_userauth_none(ss, nullptr);
    if (rc == SSH_AUTH_SUCCESS) return;
    std::vector<std::string> tried;
    rc = ssh_userauth_agent(ss, nullptr);  // denied at once when no agent runs (SSH_AUTH_SOCK unset)
    if (rc == SSH_AUTH_SUCCESS) return;
    tried.push_back("ssh-agent's keys, if one runs");
    for (const auto& path : identities) {
      std::string why = try_identity(ss, path, rc);
      if (rc == SSH_AUTH_SUCCESS) return;
      tried.push_back(path + " (" + why + ")");
    }
    char* user = nullptr;
    ssh_options_get(ss, SSH_OPTIONS_USER, &user);
    std::string who = std::string(user ? user : "?") + "@" + name;
    if (user) ssh_string_free_char(user);
    throw Error(name + ": authentication failed for " + who + "; offered: " + text::join(tried, ", ") +
                    (identities.empty() ? " (no identity file found)" : ""),
                "check that one of these public keys is in the host's authorized_keys, or set [ssh] "
                "identity_file (a key with a passphrase: add it to ssh-agent)",
                exit_code::host_failure);
  }

  // One identity file: its public key offered first (from KEY.pub, or from the private key when
  // there is none), then the private key used when the host accepts it. Says why not.
  static std::string try_identity(ssh_session ss, const std::string& path, int& rc) {
    rc = SSH_AUTH_DENIED;
    ssh_key pub = nullptr, priv = nullptr;
    auto done = [&](std::string why) {
      if (pub) ssh_key_free(pub);
      if (priv) ssh_key_free(priv);
      return why;
    };
    const std::string pub_path = path + ".pub";
    if (!file_exists(pub_path) || ssh_pki_import_pubkey_file(pub_path.c_str(), &pub) != SSH_OK) {
      pub = nullptr;
      if (ssh_pki_import_privkey_file(path.c_str(), nullptr, nullptr, nullptr, &priv) != SSH_OK) {
        priv = nullptr;
        return done("cannot be read without a passphrase");
      }
      if (ssh_pki_export_privkey_to_pubkey(priv, &pub) != SSH_OK) return done("not a key libssh reads");
    }
    rc = ssh_userauth_try_publickey(ss, nullptr, pub);
    if (rc != SSH_AUTH_SUCCESS) return done(rc == SSH_AUTH_ERROR ? ssh_get_error(ss) : "refused");
    if (!priv && ssh_pki_import_privkey_file(path.c_str(), nullptr, nullptr, nullptr, &priv) != SSH_OK) {
      priv = nullptr;
      rc = SSH_AUTH_DENIED;
      return done("accepted, but cannot be read without a passphrase");
    }
    rc = ssh_userauth_publickey(ss, nullptr, priv);
    return done(rc == SSH_AUTH_SUCCESS ? "" : rc == SSH_AUTH_ERROR ? ssh_get_error(ss) : "refused");
  }

  // Runs the agent over one exec channel, through the bootstrap command (ssh_bootstrap.h), which
  // uploads it first when the host lacks it or cannot verify its copy.
  std::unique_ptr<AgentLink> start_agent(Session s, const std::string& name) {
    ssh_session ss = s.get();
    auto bytes = agent_bytes();
    std::string size = std::to_string(bytes.size());
    std::string hash(agent_hash());
    std::string cmd = agent_start_command(hash, bytes.size(), kAgentArch);
    ssh_channel ch = ssh_channel_new(ss);
    if (!ch || ssh_channel_open_session(ch) != SSH_OK ||
        ssh_channel_request_exec(ch, cmd.c_str()) != SSH_OK) {
      std::string err = ssh_get_error(ss);
      if (ch) ssh_channel_free(ch);
      throw Error(name + ": cannot start a command over SSH: " + err,
                  "check the host's sshd (MaxSessions, ForceCommand)", exit_code::host_failure);
    }
    auto fail = [&](const std::string& what, const std::string& hint) -> std::unique_ptr<AgentLink> {
      ssh_channel_close(ch);
      ssh_channel_free(ch);
      throw Error(name + ": " + what, hint, exit_code::host_failure);
    };
    std::string line, rest;
    read_marker(ss, ch, name, line, rest);
    if (line == kMarkerAgentMissing) {
      size_t off = 0;
      std::string write_error;
      while (off < bytes.size()) {
        int n = ssh_channel_write(ch, bytes.data() + off,
                                  uint32_t(std::min<size_t>(bytes.size() - off, 64 * 1024)));
        if (n <= 0) {
          write_error = ssh_get_error(ss);
          break;
        }
        off += size_t(n);
      }
      // The marker after the upload may already be buffered behind the first one. When the write
      // failed, the remote side may have said why (it could not write the file) before closing.
      std::string pending = rest;
      if (write_error.empty()) {
        read_marker(ss, ch, name, line, rest, pending);
      } else {
        try {
          read_marker(ss, ch, name, line, rest, pending);
        } catch (const Error&) {
          line.clear();
        }
        if (line != kMarkerUploadFailed)
          return fail("cannot upload the agent: " + write_error, "check the connection");
      }
      if (line == kMarkerAgentOk) log::info("transport", name + ": agent uploaded (" + size + " bytes)");
    }
    if (line == kMarkerAgentOk) return detail::make_ssh_link(std::move(s), ch, name, rest);
    if (line.rfind(kMarkerArch, 0) == 0)
      return fail("the host's architecture is " + line.substr(std::string(kMarkerArch).size()) +
                      "; this mltrain carries an agent for " + kAgentArch,
                  "run mltrain built for that architecture");
    if (line == kMarkerUploadFailed) {
      std::string why = text::trim(stderr_until_end(ch));
      return fail("cannot write the agent to ~/.cache/mltrain/" + agent_file_name(hash) +
                      (why.empty() ? std::string() : ": " + text::excerpt(why, 400)),
                  "check free space and permissions of ~/.cache/mltrain in the remote home");
    }
    if (line == kMarkerNoExec)
      return fail("the agent was written to ~/.cache/mltrain/" + agent_file_name(hash) +
                      " but cannot be executed there",
                  "check that the remote home is not on a noexec mount");
    return fail(
        "the agent did not start: the remote shell sent '" + text::excerpt(line) + "' after the upload",
        "report this as a bug, with the host's login shell");
  }

  // What the script said on stderr before it ended (mkdir's or mv's reason), waiting at most 2 s.
  static std::string stderr_until_end(ssh_channel ch) {
    std::string err;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (err.size() < 4096 && std::chrono::steady_clock::now() < deadline) {
      int n = ssh_channel_read_timeout(ch, buf, sizeof buf, 1, 200);
      if (n > 0)
        err.append(buf, size_t(n));
      else if (n == SSH_ERROR || ssh_channel_is_eof(ch))
        break;
    }
    return err;
  }

  static std::string agent_file_name(const std::string& hash) {
    return "mltrain-agent-" + hash.substr(0, 16);
  }

  // Reads what the bootstrap command prints up to its next marker line; what the login shell's
  // startup files print first is skipped (MarkerScanner). `rest` is what follows the marker.
  void read_marker(ssh_session ss, ssh_channel ch, const std::string& name, std::string& line,
                   std::string& rest, const std::string& buffered = {}) {
    auto wait = o_.connect_timeout + std::chrono::seconds(5);
    auto deadline = std::chrono::steady_clock::now() + wait;
    MarkerScanner scan;
    std::string err;
    char buf[4096];
    bool ended = false;
    if (!scan.feed(buffered)) {
      while (std::chrono::steady_clock::now() < deadline) {
        int n = ssh_channel_read_timeout(ch, buf, sizeof buf, 0, 200);
        if (n > 0 && scan.feed(std::string_view(buf, size_t(n)))) break;
        int e = ssh_channel_read_nonblocking(ch, buf, sizeof buf, 1);
        if (e > 0 && err.size() < MarkerScanner::kMaxSkipped) err.append(buf, size_t(e));
        if (n == SSH_ERROR || ssh_channel_is_eof(ch)) {
          ended = true;
          break;
        }
      }
    }
    // At the end, what libssh still holds may hold the marker (a short script's last line).
    if (ended && !scan.found()) {
      int n;
      while (!scan.found() && (n = ssh_channel_read_nonblocking(ch, buf, sizeof buf, 0)) > 0)
        scan.feed(std::string_view(buf, size_t(n)));
      while (err.size() < MarkerScanner::kMaxSkipped &&
             (n = ssh_channel_read_nonblocking(ch, buf, sizeof buf, 1)) > 0)
        err.append(buf, size_t(n));
    }
    if (scan.found()) {
      line = scan.marker();
      rest = scan.rest();
      return;
    }
    no_marker_error(ss, name, scan, err, ended, wait);
  }

  // No marker came: say what the host printed instead, and where that comes from.
  [[noreturn]] static void no_marker_error(ssh_session ss, const std::string& name, const MarkerScanner& scan,
                                           const std::string& err, bool ended,
                                           std::chrono::milliseconds wait) {
    // Lines joined with " | ": excerpt() would show each newline as \x0a.
    auto one_line = [](const std::string& s) {
      std::vector<std::string> lines;
      for (auto& l : text::split(s, '\n'))
        if (!text::trim(l).empty()) lines.push_back(text::trim(l));
      return text::join(lines, " | ");
    };
    std::string out = one_line(scan.skipped()), why = one_line(err);
    std::string what = name + ": the agent did not start: the remote shell ";
    if (out.empty() && why.empty())
      what += ended ? "ended without a word" : "said nothing within " + text::format_duration(wait);
    else if (out.empty())
      what += "said on stderr: " + text::excerpt(why, 400);
    else
      what += "printed this instead: " + text::excerpt(out, 400) +
              (why.empty() ? std::string() : "; on stderr: " + text::excerpt(why, 400));
    if (ssh_get_error(ss)[0]) what += std::string(" (") + ssh_get_error(ss) + ")";
    std::string hint;
    if (why.find("/bin/sh") != std::string::npos &&
        (why.find("not found") != std::string::npos || why.find("No such file") != std::string::npos))
      hint = "the host has no /bin/sh, which mltrain needs to start its agent";
    else
      hint =
          "check the login shell of the remote user and its startup files (~/.bashrc, ~/.zshenv, "
          "~/.config/fish/config.fish): with ssh " +
          name + " 'exec /bin/sh -c \"echo ok\"' they must print nothing but ok";
    throw Error(what, hint, exit_code::host_failure);
  }

  SshOptions o_;
};

}  // namespace

namespace {

volatile sig_atomic_t g_winch = 0;
void on_winch(int) { g_winch = 1; }

// This terminal in raw mode while it lives (the remote PTY does the line editing and echo).
class RawStdin {
 public:
  RawStdin() {
    if (::tcgetattr(0, &saved_) != 0) return;
    termios raw = saved_;
    ::cfmakeraw(&raw);
    active_ = ::tcsetattr(0, TCSAFLUSH, &raw) == 0;
  }
  ~RawStdin() {
    if (active_) ::tcsetattr(0, TCSAFLUSH, &saved_);
  }

 private:
  termios saved_{};
  bool active_ = false;
};

bool write_fd(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= size_t(w);
  }
  return true;
}

}  // namespace

int SshTransport::interactive(const plan::HostPlan& hp, const std::string& script) {
  Session s = open_session(hp);
  ssh_session ss = s.get();
  const std::string& name = hp.host.name;
  ssh_channel ch = ssh_channel_new(ss);
  if (!ch || ssh_channel_open_session(ch) != SSH_OK)
    throw Error(name + ": cannot open an SSH channel: " + ssh_get_error(ss), "check sshd's MaxSessions",
                exit_code::host_failure);
  struct ChannelFree {
    ssh_channel c;
    ~ChannelFree() {
      ssh_channel_close(c);
      ssh_channel_free(c);
    }
  } owned{ch};
  const bool tty = ::isatty(0) == 1;
  if (tty) {
    winsize w{};
    if (::ioctl(0, TIOCGWINSZ, &w) != 0 || w.ws_col == 0) w.ws_col = 80, w.ws_row = 24;
    const std::string term = knobs::term.get();
    if (ssh_channel_request_pty_size(ch, term.empty() ? "xterm" : term.c_str(), w.ws_col, w.ws_row) != SSH_OK)
      throw Error(name + ": the host refused a terminal: " + ssh_get_error(ss),
                  "sshd may forbid PTYs (PermitTTY no); give a command after '--'", exit_code::host_failure);
  }
  // The login shell hands this to /bin/sh unchanged (ssh_bootstrap.h has the same concern).
  const std::string command = "exec /bin/sh -c " + text::shell_quote(script);
  if (ssh_channel_request_exec(ch, command.c_str()) != SSH_OK)
    throw Error(name + ": cannot run the shell: " + ssh_get_error(ss), {}, exit_code::host_failure);

  struct sigaction sa {
  }, old_winch{};
  sa.sa_handler = on_winch;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGWINCH, &sa, &old_winch);
  std::optional<RawStdin> raw;
  if (tty) raw.emplace();
  bool stdin_open = true;
  char buf[32 * 1024];
  while (true) {
    // Output first, both streams, until neither has more right now.
    bool any = false;
    for (int is_err = 0; is_err < 2; ++is_err) {
      int n = ssh_channel_read_nonblocking(ch, buf, sizeof buf, is_err);
      if (n > 0) any = true, write_fd(is_err ? 2 : 1, buf, size_t(n));
    }
    if (any) continue;
    if (ssh_channel_is_eof(ch) || !ssh_channel_is_open(ch)) break;
    if (g_winch) {
      g_winch = 0;
      winsize w{};
      if (tty && ::ioctl(0, TIOCGWINSZ, &w) == 0 && w.ws_col > 0)
        ssh_channel_change_pty_size(ch, w.ws_col, w.ws_row);
    }
    pollfd fds[2] = {{stdin_open ? 0 : -1, POLLIN, 0}, {ssh_get_fd(ss), POLLIN, 0}};
    if (::poll(fds, 2, 200) < 0 && errno != EINTR) break;
    if (stdin_open && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n > 0) {
        ssh_channel_write(ch, buf, uint32_t(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;
        ssh_channel_send_eof(ch);
      }
    }
  }
  raw.reset();
  ::sigaction(SIGWINCH, &old_winch, nullptr);
  int status = ssh_channel_get_exit_status(ch);
  return status < 0 ? exit_code::host_failure : status;
}

std::unique_ptr<Transport> make_ssh_transport(SshOptions o) {
  return std::make_unique<SshTransport>(std::move(o));
}

}  // namespace mltrain::transport