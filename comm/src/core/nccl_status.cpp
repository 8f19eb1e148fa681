// NCCL is optional and never linked: probe libnccl.so.2 with dlopen and say what was found.
#include <dlfcn.h>

#include "config.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm {

std::string nccl_status() {
#if MLTRAIN_HAVE_NCCL_HEADERS
  void* lib = ::dlopen("libnccl.so.2", RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return std::string("NCCL not found (") + (why ? why : "libnccl.so.2") + "); using the CPU ring";
  }
  using GetVersion = int (*)(int*);
  auto get_version = reinterpret_cast<GetVersion>(::dlsym(lib, "ncclGetVersion"));
  int version = 0;
  if (get_version != nullptr) get_version(&version);
  ::dlclose(lib);
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100) +
         " found; the NCCL backend is not implemented yet, using the CPU ring";
#else
  return "built without NCCL; using the CPU ring";
#endif
}

}  // namespace mltrain::comm
