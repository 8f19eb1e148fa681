// A host's GPUs as its agent finds them: NVML loaded with dlopen (libnvidia-ml.so.1, or the path in
// MLTRAIN_NVML_LIBRARY), else `nvidia-smi -L`, else none with the reason. Which of them the ranks may
// use follows CUDA's reading of CUDA_VISIBLE_DEVICES. The parsers are pure for the unit tests;
// probe_gpus() asks the system. Compiled into the agent (libc only) and a library for the tests.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runner/protocol/protocol.h"

namespace mltrain::agent {

inline constexpr const char* kDefaultNvmlLibrary = "libnvidia-ml.so.1";

struct GpuInventory {
  std::vector<Gpu> gpus;       // in NVML's order (PCI bus id)
  std::string source;          // "nvml", "nvidia-smi", or "" when none was found
  std::string driver_version;  // from NVML, "" otherwise
  std::string cuda_version;    // the newest CUDA the driver supports ("13.0"), from NVML, "" otherwise
  std::string note;            // why there is none, or what failed on the way (may be set with gpus)
  std::string library;         // the NVML file loaded and which step found it (knobs/gpu_library.h)
  std::vector<int> busy;       // NVML only: the GPUs a compute process ran on when probed
};

// The GPUs `nvidia-smi -L` lists: "GPU 0: NAME (UUID: GPU-...)" lines; a GPU followed by
// "  MIG ... Device N: (UUID: MIG-...)" lines has MIG on (mig = 1), otherwise its MIG mode is
// unknown (-1); memory is unknown (0). Other lines are skipped.
std::vector<Gpu> parse_nvidia_smi_list(const std::string& text);

// The physical indices the ranks may use, in CUDA's order, when CUDA_VISIBLE_DEVICES is
// `cuda_visible_devices` (nullopt: unset, every GPU). As CUDA reads it: a comma-separated list of
// indices or UUID prefixes ("GPU-8f3c"); the list ends at the first entry that names no GPU (out
// of range, unknown, ambiguous prefix, repeated, or malformed, "-1" included); "" means none.
std::vector<int> visible_gpus(const GpuInventory& inventory,
                              const std::optional<std::string>& cuda_visible_devices);

// The inventory of this host: NVML from `nvml_library` ("" = libnvidia-ml.so.1), else
// `nvidia-smi -L` looked up in `path` (bounded by a timeout), else none, with `note` saying why
// ("no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi not in PATH").
GpuInventory probe_gpus(const std::string& nvml_library, const std::string& path);

}  // namespace mltrain::agent
