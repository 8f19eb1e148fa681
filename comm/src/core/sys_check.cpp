#include "core/sys_check.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

namespace mltrain::comm::detail {

void throw_sys(std::string_view call, std::string_view where, Error::Kind kind) {
  const int err = errno;
  std::string what(call);
  if (!where.empty()) what += " " + std::string(where);
  throw Error(kind, what + ": " + std::strerror(err));
}

std::string first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace mltrain::comm::detail
