#include "core/reduce.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace mltrain::comm::detail {

namespace {

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

// After F. Giesen's half<->float conversions (public domain), round to nearest even.
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // Inf/NaN
  } else if (exp == 0) {
    o += 1u << 23;  // subnormal: renormalise
    o = bits_of(float_of(o) - float_of(113u << 23));
  }
  return float_of(o | ((static_cast<std::uint32_t>(h) & 0x8000u) << 16));
}

std::uint16_t f32_to_f16(float f) {
  std::uint32_t u = bits_of(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint32_t o;
  if (u >= (127u + 16u) << 23) {
    o = (u > 255u << 23) ? 0x7e00u : 0x7c00u;  // NaN stays NaN, overflow goes to Inf
  } else if (u < 113u << 23) {
    const std::uint32_t magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    o = bits_of(float_of(u) + float_of(magic)) - magic;
  } else {
    const std::uint32_t mant_odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu;
    u += mant_odd;
    o = u >> 13;
  }
  return static_cast<std::uint16_t>(o | (sign >> 16));
}

float bf16_to_f32(std::uint16_t h) { return float_of(static_cast<std::uint32_t>(h) << 16); }

std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

namespace {

struct Sum {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;  // wrap, never UB
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Prod {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
struct Min {
  template <class T>
  static T apply(T a, T b) {
    return b < a ? b : a;
  }
};
struct Max {
  template <class T>
  static T apply(T a, T b) {
    return a < b ? b : a;
  }
};

struct F16 {
  static float load(std::uint16_t v) { return f16_to_f32(v); }
  static std::uint16_t store(float v) { return f32_to_f16(v); }
};
struct BF16 {
  static float load(std::uint16_t v) { return bf16_to_f32(v); }
  static std::uint16_t store(float v) { return f32_to_bf16(v); }
};

template <class T, class Op>
void kernel_inplace(T* __restrict dst, const T* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], in[i]);
}
template <class T, class Op>
void kernel_3(T* __restrict dst, const T* __restrict own, const T* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = Op::apply(own[i], in[i]);
}

template <class T, class Op>
void reduce_native(void* dst, const void* own, const void* in, std::size_t n) {
  if (dst == own)
    kernel_inplace<T, Op>(static_cast<T*>(dst), static_cast<const T*>(in), n);
  else
    kernel_3<T, Op>(static_cast<T*>(dst), static_cast<const T*>(own), static_cast<const T*>(in), n);
}

template <class H, class Op>
void kernel_half(std::uint16_t* dst, const std::uint16_t* own, const std::uint16_t* __restrict in,
                 std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = H::store(Op::apply(H::load(own[i]), H::load(in[i])));
}
template <class H, class Op>
void reduce_half(void* dst, const void* own, const void* in, std::size_t n) {
  kernel_half<H, Op>(static_cast<std::uint16_t*>(dst), static_cast<const std::uint16_t*>(own),
                     static_cast<const std::uint16_t*>(in), n);
}

template <class Op>
ReduceFn pick(DataType dtype) {
  switch (dtype) {
    case DataType::f32:
      return reduce_native<float, Op>;
    case DataType::f64:
      return reduce_native<double, Op>;
    case DataType::f16:
      return reduce_half<F16, Op>;
    case DataType::bf16:
      return reduce_half<BF16, Op>;
    case DataType::i32:
      return reduce_native<std::int32_t, Op>;
    case DataType::i64:
      return reduce_native<std::int64_t, Op>;
    case DataType::u8:
      return reduce_native<std::uint8_t, Op>;
  }
  throw Error(Error::Kind::usage, "unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

template <class T, class Op>
struct NativeStep {
  static T step(T a, T b) { return Op::apply(a, b); }
  static T div(T v, int world) { return static_cast<T>(v / static_cast<T>(world)); }
};
template <class H, class Op>
struct HalfStep {  // rounded back to 16 bits after every step, as the binary kernel does
  static std::uint16_t step(std::uint16_t a, std::uint16_t b) {
    return H::store(Op::apply(H::load(a), H::load(b)));
  }
  static std::uint16_t div(std::uint16_t v, int world) {
    return H::store(H::load(v) / static_cast<float>(world));
  }
};

// One pass of reduce_many: acc = S::step(acc, src[k][i]) over K sources, where acc starts from the
// first source (First) or from dst (a later pass, for worlds past four); then divided (Div). The
// same operations in the same order per element as the binary passes, so the same bytes.
template <class T, class S, int K, bool First, bool Div>
void many_pass(T* __restrict dst, const T* const* src, std::size_t n, int world) {
  const T* __restrict s0 = src[0];
  const T* __restrict s1 = K > 1 ? src[1] : nullptr;
  const T* __restrict s2 = K > 2 ? src[2] : nullptr;
  const T* __restrict s3 = K > 3 ? src[3] : nullptr;
  for (std::size_t i = 0; i < n; ++i) {
    T v = First ? s0[i] : S::step(dst[i], s0[i]);
    if constexpr (K > 1) v = S::step(v, s1[i]);
    if constexpr (K > 2) v = S::step(v, s2[i]);
    if constexpr (K > 3) v = S::step(v, s3[i]);
    if constexpr (Div) v = S::div(v, world);
    dst[i] = v;
  }
}

template <class T, class S, bool First, bool Div>
void many_pass_of(int k, T* dst, const T* const* src, std::size_t n, int world) {
  switch (k) {
    case 1:
      return many_pass<T, S, 1, First, Div>(dst, src, n, world);
    case 2:
      return many_pass<T, S, 2, First, Div>(dst, src, n, world);
    case 3:
      return many_pass<T, S, 3, First, Div>(dst, src, n, world);
    default:
      return many_pass<T, S, 4, First, Div>(dst, src, n, world);
  }
}

// Up to four sources a pass: the first pass reads four inputs and writes dst once, where the
// binary kernel would pass over dst three times; later passes (worlds past four) fold three more
// into dst each.
template <class T, class S, bool Avg>
void reduce_many(void* dst_v, const void* const* src_v, int n, std::size_t count) {
  T* dst = static_cast<T*>(dst_v);
  const T* const* src = reinterpret_cast<const T* const*>(src_v);
  int done = 1;  // in place over src[0]: dst already holds it (no aliased __restrict pointers)
  if (dst != src[0]) {
    done = std::min(n, 4);
    if (done == n)
      many_pass_of<T, S, true, Avg>(done, dst, src, count, n);
    else
      many_pass_of<T, S, true, false>(done, dst, src, count, n);
  } else if (n == 1 && Avg) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = S::div(dst[i], 1);  // as finalize_avg does
  }
  while (done < n) {
    const int k = std::min(n - done, 3);
    if (done + k == n)
      many_pass_of<T, S, false, Avg>(k, dst, src + done, count, n);
    else
      many_pass_of<T, S, false, false>(k, dst, src + done, count, n);
    done += k;
  }
}

template <class Op, bool Avg>
ReduceManyFn pick_many(DataType dtype) {
  switch (dtype) {
    case DataType::f32:
      return reduce_many<float, NativeStep<float, Op>, Avg>;
    case DataType::f64:
      return reduce_many<double, NativeStep<double, Op>, Avg>;
    case DataType::f16:
      return reduce_many<std::uint16_t, HalfStep<F16, Op>, Avg>;
    case DataType::bf16:
      return reduce_many<std::uint16_t, HalfStep<BF16, Op>, Avg>;
    case DataType::i32:
      return reduce_many<std::int32_t, NativeStep<std::int32_t, Op>, Avg>;
    case DataType::i64:
      return reduce_many<std::int64_t, NativeStep<std::int64_t, Op>, Avg>;
    case DataType::u8:
      return reduce_many<std::uint8_t, NativeStep<std::uint8_t, Op>, Avg>;
  }
  throw Error(Error::Kind::usage, "unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

// finalize_avg's divide: the same S::div the fused kernel applies in its last pass.
template <class T, class S>
void divide(T* buf, std::size_t n, int world) {
  for (std::size_t i = 0; i < n; ++i) buf[i] = S::div(buf[i], world);
}

}  // namespace

ReduceFn reduce_fn(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return pick<Sum>(dtype);
    case ReduceOp::prod:
      return pick<Prod>(dtype);
    case ReduceOp::min:
      return pick<Min>(dtype);
    case ReduceOp::max:
      return pick<Max>(dtype);
  }
  throw Error(Error::Kind::usage, "unknown reduce op " + std::to_string(static_cast<int>(op)));
}

ReduceManyFn reduce_many_fn(DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return pick_many<Sum, false>(dtype);
    case ReduceOp::avg:
      return pick_many<Sum, true>(dtype);
    case ReduceOp::prod:
      return pick_many<Prod, false>(dtype);
    case ReduceOp::min:
      return pick_many<Min, false>(dtype);
    case ReduceOp::max:
      return pick_many<Max, false>(dtype);
  }
  throw Error(Error::Kind::usage, "unknown reduce op " + std::to_string(static_cast<int>(op)));
}

void finalize_avg(void* buf, std::size_t n, DataType dtype, int world) {
  switch (dtype) {
    case DataType::f32:
      return divide<float, NativeStep<float, Sum>>(static_cast<float*>(buf), n, world);
    case DataType::f64:
      return divide<double, NativeStep<double, Sum>>(static_cast<double*>(buf), n, world);
    case DataType::f16:
      return divide<std::uint16_t, HalfStep<F16, Sum>>(static_cast<std::uint16_t*>(buf), n, world);
    case DataType::bf16:
      return divide<std::uint16_t, HalfStep<BF16, Sum>>(static_cast<std::uint16_t*>(buf), n, world);
    case DataType::i32:
      return divide<std::int32_t, NativeStep<std::int32_t, Sum>>(static_cast<std::int32_t*>(buf), n, world);
    case DataType::i64:
      return divide<std::int64_t, NativeStep<std::int64_t, Sum>>(static_cast<std::int64_t*>(buf), n, world);
    case DataType::u8:
      return divide<std::uint8_t, NativeStep<std::uint8_t, Sum>>(static_cast<std::uint8_t*>(buf), n, world);
  }
}

double load_as_double(const void* buf, std::size_t i, DataType dt) {
  switch (dt) {
    case DataType::f32:
      return static_cast<const float*>(buf)[i];
    case DataType::f64:
      return static_cast<const double*>(buf)[i];
    case DataType::f16:
      return f16_to_f32(static_cast<const std::uint16_t*>(buf)[i]);
    case DataType::bf16:
      return bf16_to_f32(static_cast<const std::uint16_t*>(buf)[i]);
    case DataType::i32:
      return static_cast<const std::int32_t*>(buf)[i];
    case DataType::i64:
      return static_cast<double>(static_cast<const std::int64_t*>(buf)[i]);
    case DataType::u8:
      return static_cast<const std::uint8_t*>(buf)[i];
  }
  return 0;
}

void store_from_double(void* buf, std::size_t i, DataType dt, double v) {
  switch (dt) {
    case DataType::f32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DataType::f64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DataType::f16:
      static_cast<std::uint16_t*>(buf)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DataType::bf16:
      static_cast<std::uint16_t*>(buf)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DataType::i32:
      static_cast<std::int32_t*>(buf)[i] = static_cast<std::int32_t>(v);
      break;
    case DataType::i64:
      static_cast<std::int64_t*>(buf)[i] = static_cast<std::int64_t>(v);
      break;
    case DataType::u8:
      static_cast<std::uint8_t*>(buf)[i] = static_cast<std::uint8_t>(v);
      break;
  }
}

}  // namespace mltrain::comm::detail
