#include "core/sys_check.h"

#include <cerrno>
#include <cstring>
#include <string>

namespace mltrain::comm::detail {

void throw_sys(std::string_view call, std::string_view where, Error::Kind kind) {
  const int err = errno;
  std::string what(call);
  if (!where.empty()) what += " " + std::string(where);
  throw Error(kind, what + ": " + std::strerror(err));
}

}  // namespace mltrain::comm::detail
