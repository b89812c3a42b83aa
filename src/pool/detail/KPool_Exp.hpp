#ifndef KPOOL_POOL_DETAIL_EXP_HPP
#define KPOOL_POOL_DETAIL_EXP_HPP

#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// exp for the softmax weights, f32. libm's expf is a call the host
// vectorizer cannot see through, and it made pooling exp-bound on CPUs.
// This one is straight-line arithmetic (no table, no branch), so a channel
// loop around it becomes SIMD code, and it runs unchanged on a GPU.
//
// Only for the softmax's arguments, logit - max: x <= 0, -inf or NaN.
// exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2]
// (ln2 split in two so n ln2 is exact), exp(r) = 1 + r q(r) with q of
// degree 4 interpolating (exp(r) - 1) / r at the Chebyshev nodes of
// [-0.3466, 0.3466] (relative error 2e-7 with f32 coefficients, far inside
// the f32 tolerance of 1e-5; exp(0) is exactly 1), 2^n built in the
// exponent bits. Every multiply-add is KokkosExt::fmadd, so the bits do not
// depend on where the compiler inlines it.
// Accuracy: within 3 ulp of exp(x) rounded to f32 on [-87, 0], with or
// without FMA (measured by the unit test PoolExp).
// Below about -87.3 the true value (< 1.2e-38) is dropped against a sum of
// at least 1: x is clamped at -88, where n = -127 builds a scale of exactly
// 0, so exp(-inf) = 0 as IEEE arithmetic has it (a -inf gate with an
// infinite key is NaN, as the contract's formulas give).
// NaN in gives NaN out whatever its sign. The clamp is an unsigned min on
// the bits (for x <= 0 a larger magnitude is a larger bit pattern), which
// alone would turn a negative NaN (x86's default NaN, from inf - inf) into
// -88; NaN is exempted by an integer test. Both stay integer selects, which
// GCC vectorizes even for SSE2, where it leaves a float compare-and-select
// scalar.
KOKKOS_FORCEINLINE_FUNCTION float pool_exp(float x) {
  std::uint32_t const xb = KokkosExt::bit_cast<std::uint32_t>(x);
  bool const nan = static_cast<std::int32_t>(xb & 0x7FFFFFFFu) > 0x7F800000;
  std::uint32_t const clamped = xb < 0xC2B00000u ? xb : 0xC2B00000u;
  x = KokkosExt::bit_cast<float>(nan ? xb : clamped);
  // Round to nearest integer by the 1.5 * 2^23 shift: exact for |t| < 2^22,
  // and vectorizes without SSE4.1's roundps. The low bits of t hold n.
  float const shifter = 12582912.0f;
  float const t = KokkosExt::fmadd(x, 1.44269504088896341f, shifter);
  float const n = t - shifter;
  std::uint32_t const ni = KokkosExt::bit_cast<std::uint32_t>(t) -
                           KokkosExt::bit_cast<std::uint32_t>(shifter);
  float const r = KokkosExt::fmadd(
      -n, 1.42860682030941723e-06f, KokkosExt::fmadd(-n, 0.693145751953125f, x));
  float p = 8.363178000e-03f;
  p = KokkosExt::fmadd(p, r, 4.187567532e-02f);
  p = KokkosExt::fmadd(p, r, 1.666657627e-01f);
  p = KokkosExt::fmadd(p, r, 4.999937117e-01f);
  p = KokkosExt::fmadd(p, r, 1.0f);
  p = KokkosExt::fmadd(p, r, 1.0f);
  // n is in [-127, 0]: 2^n is a normal float or, for n = -127, exactly 0
  // (the exponent field 0 with an empty mantissa). For a NaN argument p is
  // NaN and the unsigned arithmetic keeps the scale's garbage defined.
  float const scale = KokkosExt::bit_cast<float>((ni + 127u) << 23);
  return p * scale;
}

// f64 storage computes in f64 (docs/pools.md); speed is not the point there.
KOKKOS_FORCEINLINE_FUNCTION double pool_exp(double x) {
  return KokkosExt::exp(x);
}

}  // namespace Details
}  // namespace KPool

#endif
