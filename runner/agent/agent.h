// The mltrain agent: runs on every host (a child over pipes on localhost, over one SSH channel
// remotely), starts that host's ranks each in its own process group, frames their output and
// exit statuses back, answers heartbeats and kills its process groups when told to or when the
// launcher goes away. Links nothing beyond libc and a static libstdc++.
#pragma once

namespace mltrain::agent {

// Serves the protocol on fds 0 (commands in) and 1 (frames out). Returns the process exit code.
int run_agent();

// `mltrain-agent --runtime-dir`: unpacks the comm runtime if needed and prints its folder (what
// the agent gives ranks as MLTRAIN_RUNTIME), so `mltrain ssh` gives a shell the ranks'
// PYTHONPATH. Returns the process exit code (1, with the reason on stderr, when it cannot).
int print_runtime_dir();

}  // namespace mltrain::agent
