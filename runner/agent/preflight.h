// The agent's preflight checks, split so their decisions can be unit-tested: which interface
// routes to the master, which ports are free, whether the workdir and the program exist. The
// pure functions take what the system would tell them as arguments; the others ask the system.
// Compiled into the agent executable (libc only) and into a small library for the unit tests.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mltrain::agent {

// At most this many ports are reserved per prepare request.
inline constexpr uint32_t kMaxPreflightPorts = 16;

// One address of one network interface, as getifaddrs lists it.
struct InterfaceAddress {
  std::string name;
  int family = 0;  // AF_INET or AF_INET6
  std::string address;
};

// The interface carrying `local_ip` (of `family`), or "" when none does. The first one wins.
std::string interface_with_address(const std::vector<InterfaceAddress>& interfaces, int family,
                                   const std::string& local_ip);

// The interface and local address this host uses to reach `addr` (no packet is sent). Both are ""
// when `addr` does not resolve or has no route; ifname alone is "" when no interface holds the
// local address.
struct Route {
  std::string ifname;
  std::string local_ip;
};
Route route_to(const std::string& addr);

// Binds up to min(n, kMaxPreflightPorts) distinct free TCP ports (held until all are chosen, then
// released) and returns their numbers; each that cannot be bound adds a line to `problems`.
std::vector<std::string> reserve_free_ports(uint32_t n, std::vector<std::string>& problems);

// The PATH a program is looked up in: the launcher's `requested` one, else the agent's own
// (`agent_path`, null when unset), else the default of execvp.
std::string effective_path(const std::string& requested, const char* agent_path);

// The files `argv0` may name, in the order the lookup tries them: itself when it has a slash
// (relative to `workdir` unless absolute), else argv0 in each PATH entry ("" meaning "."), with
// relative entries taken from `workdir`.
std::vector<std::string> program_candidates(const std::string& argv0, const std::string& workdir,
                                            const std::string& path);

// Whether a TCP port can be bound on every IPv4 address of this host (nobody listens on it).
bool tcp_port_free(uint32_t port);

// What a check needs to know of the file system (real: stat and access).
struct FileSystemView {
  std::function<bool(const std::string&)> is_directory;
  std::function<bool(const std::string&)> is_executable_file;
  // "" when this user may list and enter the folder, else why not (strerror); unset: not checked.
  std::function<std::string(const std::string&)> cannot_enter;
};
FileSystemView real_file_system();

// Problems with the workdir and the program, as lines for the launcher: a missing workdir, or a
// program that is not an executable file (with a slash) or not found in `path` (without one).
// Empty `workdir` or `argv0` skips that check. `path` is the effective one.
std::vector<std::string> check_workdir_and_program(const std::string& workdir, const std::string& argv0,
                                                   const std::string& path, const FileSystemView& fs);

}  // namespace mltrain::agent
