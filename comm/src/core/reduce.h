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
// dst[i] = src[0][i] op src[1][i] op ... op src[n-1][i], folded left in that order, then divided
// by n for avg: the same bytes as n-1 ReduceFn passes and finalize_avg, in one pass over memory
// for up to four sources (three more per later pass). dst may be src[0] (element i is read
// before it is written); it overlaps no other source. n >= 1.
using ReduceManyFn = void (*)(void* dst, const void* const* src, int n, std::size_t count);
ReduceManyFn reduce_many_fn(DataType dtype, ReduceOp op);
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
