// Element-wise reduction kernels: plain loops over __restrict pointers that GCC vectorises at
// -O2/-O3; f16 and bf16 are widened to float, reduced, and rounded back (round to nearest even).
#pragma once

#include <cstddef>
#include <cstdint>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

// dst[i] = own[i] op in[i] for i < count. own may equal dst; in must not overlap dst.
using ReduceFn = void (*)(void* dst, const void* own, const void* in, std::size_t count);

// Reduction used while combining (avg combines as sum; finalize_avg divides at the end).
ReduceFn reduce_fn(DataType dtype, ReduceOp op);
// buf[i] /= world for avg (integers truncate toward zero).
void finalize_avg(void* buf, std::size_t count, DataType dtype, int world);

float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16(float f);

// Element i of a buffer of `dtype`, as a double, and back (for checks in tests and the bench).
double load_as_double(const void* buf, std::size_t i, DataType dtype);
void store_from_double(void* buf, std::size_t i, DataType dtype, double v);

}  // namespace mltrain::comm::detail
