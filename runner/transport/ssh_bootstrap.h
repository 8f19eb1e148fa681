// How the agent starts on a remote host over one exec channel. sshd hands the command to the
// user's login shell (bash, zsh, fish, tcsh, ...), so the command is one `exec /bin/sh -c '...'`
// that every common shell parses alike, and the script inside is POSIX sh. The script checks the
// cached agent by content hash (sha256sum, or shasum, openssl, busybox or python3 where that is
// missing; a file it cannot verify is uploaded again), and when it is absent or damaged says so
// and reads the agent from the same channel (one channel: sshd's MaxSessions may be 1), then
// execs it. It answers with one marker line before the agent's own stream begins; what the login
// shell's startup files print before it (banners) is skipped by MarkerScanner.
// Pure: no libssh here.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mltrain::transport {

// The architecture the embedded agent is built for (`uname -m`).
#if defined(__x86_64__)
inline constexpr const char* kAgentArch = "x86_64";
#elif defined(__aarch64__)
inline constexpr const char* kAgentArch = "aarch64";
#else
inline constexpr const char* kAgentArch = "unknown";
#endif

// Where the agent with content hash `hash` is cached on a host, as a quoted shell word.
std::string agent_remote_path(const std::string& hash);

// The POSIX sh script for an agent of `size` bytes with content hash `hash`, built for `arch`.
// One line with no single quote, backslash or `!`, so that csh and fish quote it as sh does.
std::string agent_bootstrap_script(const std::string& hash, size_t size, const std::string& arch);

// The exec request sent to sshd: `exec /bin/sh -c '<agent_bootstrap_script>'`.
std::string agent_start_command(const std::string& hash, size_t size, const std::string& arch);

// The marker lines the script prints (the arch one is followed by the host's `uname -m`).
inline constexpr const char* kMarkerAgentOk = "MLTRAIN-AGENT-OK";
inline constexpr const char* kMarkerAgentMissing = "MLTRAIN-AGENT-MISSING";
inline constexpr const char* kMarkerUploadFailed = "MLTRAIN-UPLOAD-FAILED";
inline constexpr const char* kMarkerNoExec = "MLTRAIN-AGENT-NOEXEC";
inline constexpr const char* kMarkerArch = "MLTRAIN-ARCH ";

// Whether `line` (without its newline) is one of the markers above.
bool is_bootstrap_marker(std::string_view line);

// Finds the first marker line in what the start command prints, skipping the lines before it
// (a ~/.bashrc or config.fish that echoes a banner). Keeps the first kMaxSkipped bytes of what it
// skipped, to show when no marker comes. Everything after the marker line is left untouched:
// it is the start of the agent's own byte stream.
class MarkerScanner {
 public:
  static constexpr size_t kMaxSkipped = 64 * 1024;

  // Adds bytes read from the channel; true once a marker line is complete (later calls do nothing).
  bool feed(std::string_view bytes);
  bool found() const { return found_; }
  // The marker line, without its newline; empty until found().
  const std::string& marker() const { return marker_; }
  // The bytes after the marker line (valid once found()).
  const std::string& rest() const { return pending_; }
  // What came before the marker (or so far), at most kMaxSkipped bytes; `skipped_all` is false
  // when more was dropped.
  std::string skipped() const;
  bool skipped_all() const { return skipped_total_ + (found_ ? 0 : pending_.size()) <= kMaxSkipped; }

 private:
  void skip(std::string_view text);

  std::string pending_, marker_, skipped_;
  size_t skipped_total_ = 0;
  bool found_ = false, mid_line_ = false;
};

}  // namespace mltrain::transport
