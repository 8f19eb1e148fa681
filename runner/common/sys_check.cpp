#include "runner/common/sys_check.h"

#include <cstring>

namespace mltrain {

std::string sys_error_text(std::string_view call, std::string_view where, int err) {
  std::string out(call);
  if (!where.empty()) out += " " + std::string(where);
  return out + ": " + std::strerror(err);
}

void throw_sys(std::string_view call, std::string_view where, std::string hint, int code) {
  throw Error(sys_error_text(call, where), std::move(hint), code);
}

}  // namespace mltrain
