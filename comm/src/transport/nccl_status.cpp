// What the NCCL backend can use in this process (probe_gpu() loads CUDA and NCCL with dlopen).
#include "mltrain/comm.hpp"
#include "transport/nccl.h"

namespace mltrain::comm {

std::string nccl_status() {
  const detail::GpuVote v = detail::probe_gpu();
  if (v.nccl) return "NCCL " + v.nccl_version + " on GPU " + v.device;
  return v.why;
}

}  // namespace mltrain::comm
