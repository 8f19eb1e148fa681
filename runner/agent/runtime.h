// The comm runtime the agent executable carries (runtime_blob.S, packed by runtime.cmake):
// libmltrain-comm, its benchmark and the Python package, unpacked beside the agent on each host.
// Part of the executable only: agent_core gets the unpacker through its AgentWorld.
#pragma once

#include <string>

namespace mltrain::agent {

// Unpacks (or repairs) the runtime and returns its folder: lib/libmltrain-comm.so.0,
// bin/mltrain-comm-bench, python/mltrain/. "" with `why` on failure.
std::string unpack_runtime(std::string& why);

// `mltrain-agent --runtime-dir`: unpacks the comm runtime if needed and prints its folder (what
// the agent gives ranks as MLTRAIN_RUNTIME), so `mltrain ssh` gives a shell the ranks'
// PYTHONPATH. Returns the process exit code (1, with the reason on stderr, when it cannot).
int print_runtime_dir();

}  // namespace mltrain::agent
