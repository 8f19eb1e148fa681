#include "runner/agent/preflight.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace mltrain::agent {
namespace {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  const void* a = sa->sa_family == AF_INET
                      ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
                      : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
  ::inet_ntop(sa->sa_family, a, buf, sizeof buf);
  return buf;
}

std::vector<InterfaceAddress> interface_addresses() {
  std::vector<InterfaceAddress> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6)) continue;
    out.push_back({i->ifa_name, i->ifa_addr->sa_family, address_text(i->ifa_addr)});
  }
  ::freeifaddrs(ifs);
  return out;
}

}  // namespace

std::string interface_with_address(const std::vector<InterfaceAddress>& interfaces, int family,
                                   const std::string& local_ip) {
  for (const auto& i : interfaces)
    if (i.family == family && i.address == local_ip) return i.name;
  return {};
}

Route route_to(const std::string& addr) {
  Route route;
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(addr.c_str(), "9", &hints, &res) != 0 || !res) return route;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  bool ok = fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  if (!ok) return route;
  route.local_ip = address_text(reinterpret_cast<const sockaddr*>(&local));
  route.ifname = interface_with_address(interface_addresses(), local.ss_family, route.local_ip);
  return route;
}

std::vector<std::string> reserve_free_ports(uint32_t n, std::vector<std::string>& problems) {
  std::vector<std::string> ports;
  std::vector<int> held;
  for (uint32_t i = 0; i < n && i < kMaxPreflightPorts; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      ports.push_back(std::to_string(ntohs(a.sin_port)));
      held.push_back(fd);  // held until all are chosen, so they differ
    } else {
      problems.push_back(std::string("cannot find a free TCP port: ") + std::strerror(errno));
      if (fd >= 0) ::close(fd);
    }
  }
  for (int fd : held) ::close(fd);
  return ports;
}

bool tcp_port_free(uint32_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  // SO_REUSEADDR as the ranks' servers set it: a port in TIME_WAIT is free for them too.
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::string effective_path(const std::string& requested, const char* agent_path) {
  if (!requested.empty()) return requested;
  return agent_path ? agent_path : "/usr/bin:/bin";
}

std::vector<std::string> program_candidates(const std::string& argv0, const std::string& folder,
                                            const std::string& path) {
  if (argv0.empty()) return {};
  std::string workdir = folder;  // "proj/" joins as "proj/x", not "proj//x"
  while (workdir.size() > 1 && workdir.back() == '/') workdir.pop_back();
  if (argv0.find('/') != std::string::npos)
    return {argv0[0] == '/' || workdir.empty() ? argv0 : workdir + "/" + argv0};
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t colon = path.find(':', start);
    std::string dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir.assign(1, '.');  // an empty entry means the current folder
    if (dir[0] != '/' && !workdir.empty()) dir = workdir + "/" + dir;
    out.push_back(dir + "/" + argv0);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

FileSystemView real_file_system() {
  FileSystemView fs;
  fs.is_directory = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  };
  fs.is_executable_file = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  fs.cannot_enter = [](const std::string& p) -> std::string {
    return ::access(p.c_str(), R_OK | X_OK) == 0 ? "" : std::strerror(errno);
  };
  return fs;
}

std::vector<std::string> check_workdir_and_program(const std::string& workdir, const std::string& argv0,
                                                   const std::string& path, const FileSystemView& fs) {
  if (!workdir.empty() && !fs.is_directory(workdir)) return {"workdir " + workdir + " does not exist here"};
  if (!workdir.empty() && fs.cannot_enter)
    if (std::string why = fs.cannot_enter(workdir); !why.empty())
      return {"workdir " + workdir + " is not readable here by this login (" + why + ")"};
  if (argv0.empty()) return {};
  bool has_slash = argv0.find('/') != std::string::npos;
  for (const auto& candidate : program_candidates(argv0, workdir, path))
    if (fs.is_executable_file(candidate)) return {};
  if (has_slash) return {"program " + argv0 + " is not an executable file here"};
  return {"program " + argv0 + " not found in PATH (" + path + ")"};
}

}  // namespace mltrain::agent
