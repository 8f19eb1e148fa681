#include "core/nccl_probe.h"

#include <dlfcn.h>

#include "knobs/gpu_library.h"

namespace mltrain::comm::detail {

std::string nccl_version_text(int code) {
  // Since 2.9 the code is major*10000 + minor*100 + patch; before, major*1000 + minor*100 + patch.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code / 100 % 100 : code / 100 % 10;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

NcclProbe probe_nccl(const std::string& named, const std::string& python) {
  NcclProbe p;
  knobs::LoadedLibrary l = knobs::load_library(knobs::GpuLibrary::nccl, named, python);
  p.handle = l.handle;
  p.file = l.file;
  p.found = l.found_text();
  p.error = l.error;
  p.searched = l.searched;
  if (p.handle == nullptr) return p;
  using GetVersion = int (*)(int*);  // ncclResult_t ncclGetVersion(int*); ncclSuccess is 0
  const auto get_version = reinterpret_cast<GetVersion>(::dlsym(p.handle, "ncclGetVersion"));
  p.has_get_version = get_version != nullptr;
  p.version_known = p.has_get_version && get_version(&p.version) == 0;
  return p;
}

std::string nccl_too_old(int version, const std::string& at) {
  return "NCCL " + nccl_version_text(version) + " at " + at + " is older than " +
         nccl_version_text(kMinNcclVersion) +
         ", the oldest mltrain supports (set MLTRAIN_NCCL_LIBRARY to a newer one)";
}

}  // namespace mltrain::comm::detail
