// Where mltrain keeps its state on this machine: run records (records) and the unpacked local
// agent (transport) live below it.
#pragma once

#include <string>

namespace mltrain {

// MLTRAIN_HOME, else $XDG_STATE_HOME/mltrain, else ~/.local/state/mltrain, else
// /tmp/mltrain-<uid>. Only names the folder; callers create what they need below it.
std::string state_home();

}  // namespace mltrain
