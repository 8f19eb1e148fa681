// Where mltrain keeps its state on this machine: run records (records) and the unpacked local
// agent (transport) live below it.
#pragma once

#include <string>

namespace mltrain {

// MLTRAIN_HOME, else $XDG_STATE_HOME/mltrain, else ~/.local/state/mltrain, else
// /tmp/mltrain-<uid>. Only names the folder; callers create what they need below it.
std::string state_home();

// Creates `path` and any missing parent with mode 0700 whatever the umask (records hold the job's
// command and environment: they are private to the user). With `make_private`, an existing `path`
// is set to 0700 too when the user owns it (the state home and runs/ are mltrain's alone). Throws
// mltrain::Error naming the folder when it cannot be created.
void make_private_dirs(const std::string& path, bool make_private = false);

}  // namespace mltrain
