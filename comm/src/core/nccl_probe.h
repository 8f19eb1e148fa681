// The NCCL that comm's backend accepts and how a library is checked against it: one source for
// the backend (transport/nccl.cpp) and the agent's preflight (runner/agent/prepare.cpp), which
// compiles this file alone, without the rest of comm.
#pragma once

#include <string>

namespace mltrain::comm::detail {

// The oldest NCCL the backend accepts: ncclRemoteError and ncclGetLastError (2.13), ncclAvg and
// ncclBfloat16 (2.10) are all used.
inline constexpr int kMinNcclVersion = 21300;  // 2.13.0

// "2.28.9" from ncclGetVersion's code.
std::string nccl_version_text(int code);

struct NcclProbe {
  void* handle = nullptr;        // the library, when one loaded; the caller owns it (dlclose or keep)
  std::string file;              // the file the loader opened
  std::string found;             // "/x/libnccl.so.2 (loader path)": the file and which step found it
  std::string error, searched;   // none loaded: the loader's message, and the places looked in
  bool has_get_version = false;  // the library exports ncclGetVersion
  bool version_known = false;    // ... and it answered
  int version = 0;               // its code: 22809 for 2.28.9
  bool new_enough() const { return version_known && version >= kMinNcclVersion; }
};

// Loads libnccl in the one search order (knobs/gpu_library.h) and asks its version. named: the
// MLTRAIN_NCCL_LIBRARY value as the caller reads it (the job's or this process's); python: the
// job's interpreter, whose wheels are searched.
NcclProbe probe_nccl(const std::string& named, const std::string& python = {});

// "NCCL 2.12.5 at <at> is older than 2.13.0, the oldest mltrain supports (set ...)".
std::string nccl_too_old(int version, const std::string& at);

}  // namespace mltrain::comm::detail
