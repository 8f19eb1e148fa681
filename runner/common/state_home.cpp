#include "runner/common/state_home.h"

#include <unistd.h>

#include <cstdlib>

#include "knobs/registry.h"

namespace mltrain {

std::string state_home() {
  if (knobs::is_set("MLTRAIN_HOME")) return knobs::get_string("MLTRAIN_HOME");
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return std::string(x) + "/mltrain";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.local/state/mltrain";
  return "/tmp/mltrain-" + std::to_string(::getuid());
}

}  // namespace mltrain
