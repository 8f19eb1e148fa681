// Where NCCL, the CUDA runtime and NVML are found, in one order for every part that dlopens them
// (the comm library's NCCL backend, the agent's preflight, probe and GPU inventory, the telemetry
// sampler): the library's MLTRAIN_*_LIBRARY value alone when set; else the loader's search path
// (LD_LIBRARY_PATH, ld.so.cache, and a library already loaded under that name, as torch's NCCL);
// else /usr/local/cuda's lib folders (and the driver's /usr/local/nvidia for NVML); else the
// `nvidia/*/lib` folders of the Python that runs the job (the pip wheels' layout, e.g.
// site-packages/nvidia/nccl/lib/libnccl.so.2 of nvidia-nccl-cu13).
#pragma once

#include <string>
#include <vector>

namespace mltrain::knobs {

enum class GpuLibrary { nccl, cudart, nvml };

// "MLTRAIN_NCCL_LIBRARY", ...
const char* library_knob(GpuLibrary lib);
// "libnccl.so.2", "libcudart.so.13", "libnvidia-ml.so.1": the first name tried.
const char* library_default_name(GpuLibrary lib);

// The one precedence for a library's knob: the job's value (its env table, --env) when non-empty,
// else this process's variable; "" leaves the choice to library_candidates' search. The launcher
// applies it to what it asks of the agents (top's watch), each agent again for itself.
std::string library_setting(GpuLibrary lib, const std::string& job_value);

struct LibraryCandidate {
  std::string file;   // what dlopen is given: a name (the loader path) or a path
  std::string where;  // "MLTRAIN_NCCL_LIBRARY", "loader path", "/usr/local/cuda", "python /x/bin/python3"
};

// The candidates in the order they are tried. `named`: the library's knob as the caller reads it
// (the job's value, or this process's); when non-empty it is the only candidate. `python`: the
// interpreter whose wheels are searched ("": python3 in this process's PATH); not run, only looked
// beside (its prefix's lib/python3*/{site,dist}-packages, and the user's ~/.local ones).
std::vector<LibraryCandidate> library_candidates(GpuLibrary lib, const std::string& named,
                                                 const std::string& python = {});

struct LoadedLibrary {
  void* handle = nullptr;  // nullptr when none loaded; the caller owns it (dlclose or keep)
  std::string file;        // the file the loader opened (an absolute path where it can tell)
  std::string where;       // which step found it (LibraryCandidate::where)
  std::string error;       // none loaded: the loader's message for the first candidate
  std::string searched;    // none loaded: the places looked in, for a message
  // "/x/libnccl.so.2 (python /opt/torch/.venv/bin/python3)"; "" when none loaded.
  std::string found_text() const;
};

// dlopen the first candidate that loads (flags as dlopen's; RTLD_NOW | RTLD_LOCAL when 0).
LoadedLibrary load_library(GpuLibrary lib, const std::string& named, const std::string& python = {},
                           int flags = 0);

}  // namespace mltrain::knobs
