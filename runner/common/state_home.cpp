#include "runner/common/state_home.h"

#include <unistd.h>

#include <cstdlib>

namespace mltrain {

std::string state_home() {
  if (const char* m = std::getenv("MLTRAIN_HOME"); m && *m) return m;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/mltrain";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/mltrain";
  return "/tmp/mltrain-" + std::to_string(::getuid());
}

}  // namespace mltrain
