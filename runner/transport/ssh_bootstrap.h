// The shell script that starts the agent on a remote host over one exec channel: it checks the
// cached agent by content hash (by size where sha256sum is missing), and when it is absent or
// damaged says so and reads the agent from the same channel (one channel: sshd's MaxSessions may
// be 1), then execs it. It answers with one marker line before the agent's own stream begins.
// Pure: no libssh here.
#pragma once

#include <cstddef>
#include <string>

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

// The script for an agent of `size` bytes with content hash `hash`, built for `arch`.
std::string agent_bootstrap_script(const std::string& hash, size_t size, const std::string& arch);

// The marker lines the script prints (the arch one is followed by the host's `uname -m`).
inline constexpr const char* kMarkerAgentOk = "MLTRAIN-AGENT-OK";
inline constexpr const char* kMarkerAgentMissing = "MLTRAIN-AGENT-MISSING";
inline constexpr const char* kMarkerUploadFailed = "MLTRAIN-UPLOAD-FAILED";
inline constexpr const char* kMarkerArch = "MLTRAIN-ARCH ";

}  // namespace mltrain::transport
