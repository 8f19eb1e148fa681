// Checked system calls: a failed call becomes an Error naming the call, what it worked on and
// errno's text, e.g. "mkdir /home/u/.local/state/mltrain/agent: Permission denied".
#pragma once

#include <cerrno>
#include <string>
#include <string_view>

#include "runner/common/error.h"

namespace mltrain {

// "CALL WHERE: strerror(err)": for warnings about failures that must not stop a run.
std::string sys_error_text(std::string_view call, std::string_view where, int err = errno);

// Throws Error(sys_error_text(call, where), hint, code).
[[noreturn]] void throw_sys(std::string_view call, std::string_view where, std::string hint = {},
                            int code = exit_code::internal);

// Returns rc when the call succeeded (rc >= 0); throws as throw_sys when it returned -1.
template <class Rc>
Rc check_sys(Rc rc, std::string_view call, std::string_view where, std::string hint = {},
             int code = exit_code::internal) {
  if (rc < 0) throw_sys(call, where, std::move(hint), code);
  return rc;
}

}  // namespace mltrain
