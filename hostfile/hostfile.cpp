// Hostfiles: lines of host items, comments, CRLF and a BOM, read from a path.
#include "hostfile/hostfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <system_error>

#include "hostfile/detail/host_list.h"
#include "hostfile/detail/scan.h"

namespace mltrain::hostfile {
namespace {

constexpr std::size_t max_hostfile_bytes = std::size_t{64} << 20;

}  // namespace

const char* role_name(Role r) {
  switch (r) {
    case Role::server:
      return "server";
    case Role::both:
      return "both";
    case Role::worker:
      break;
  }
  return "worker";
}

std::vector<Host> parse_hostfile(std::string_view text, std::string_view filename) {
  constexpr std::string_view bom = "\xEF\xBB\xBF";  // Windows editors add it; it is not part of a host name
  if (text.substr(0, bom.size()) == bom) text.remove_prefix(bom.size());
  std::vector<Host> hosts;
  std::map<std::string, std::string> seen;
  std::size_t line_no = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    std::string_view line = text.substr(pos, nl == std::string_view::npos ? nl : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    std::string_view content = line.substr(0, line.find('#'));
    if (detail::trim(content).empty()) continue;
    detail::Where w{std::string(filename) + ":" + std::to_string(line_no), true, line};
    detail::parse_items(w, detail::trim(content), w.label, seen, hosts);
  }
  return hosts;
}

std::vector<Host> load_hostfile(const std::string& path) {
  auto cannot_read = [&](int err) {
    return ParseError(path + ": cannot read hostfile: " + std::system_category().message(err));
  };
  // O_NONBLOCK so that opening a FIFO with no writer cannot hang; reads are made blocking again below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw cannot_read(errno);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw cannot_read(errno);
  if (S_ISDIR(st.st_mode)) throw cannot_read(EISDIR);
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) throw cannot_read(errno);

  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw cannot_read(errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > max_hostfile_bytes) {
      throw ParseError(path + ": cannot read hostfile: larger than " +
                       std::to_string(max_hostfile_bytes >> 20) + " MiB (is it really a hostfile?)");
    }
  }
  return parse_hostfile(text, path);
}

}  // namespace mltrain::hostfile
