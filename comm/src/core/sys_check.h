// Checked system calls inside the comm library: a failed call becomes an Error naming the call,
// what it worked on and errno's text, e.g. "setsockopt(TCP_NODELAY) fd 7: Bad file descriptor".
#pragma once

#include <string>
#include <string_view>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

[[noreturn]] void throw_sys(std::string_view call, std::string_view where,
                            Error::Kind kind = Error::Kind::internal);

// Returns rc when the call succeeded (rc >= 0); throws as throw_sys when it returned -1.
template <class Rc>
Rc check_sys(Rc rc, std::string_view call, std::string_view where, Error::Kind kind = Error::Kind::internal) {
  if (rc < 0) throw_sys(call, where, kind);
  return rc;
}

// The first line of a small system file (/proc, /sys), without trailing whitespace; "" when it
// cannot be read.
std::string first_line(const char* path);

}  // namespace mltrain::comm::detail
