#ifndef KPOOL_DETAILS_EXP_HPP
#define KPOOL_DETAILS_EXP_HPP

#include <details/KPool_DetailsKokkosExt.hpp>

#include <cstdint>

namespace KPool {
namespace Details {

// exp for the softmax weights, f32. libm's expf is a call the host
// vectorizer cannot see through, and it made pooling exp-bound on CPUs.
// This one is straight-line arithmetic (no table, no branch), so a channel
// loop around it becomes SIMD code, and it runs unchanged on a GPU.
//
// Only for the softmax's arguments, logit - max: x <= 0. A NaN argument
// (from NaN inputs) gives a NaN or garbage weight, never undefined
// behaviour.
// exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2]
// (ln2 split in two so n ln2 is exact), exp(r) = 1 + r q(r) with q of
// degree 4 interpolating (exp(r) - 1) / r at the Chebyshev nodes of
// [-0.3466, 0.3466] (relative error 2e-7 with f32 coefficients, far inside
// the f32 tolerance of 1e-5; exp(0) is exactly 1), 2^n built in the
// exponent bits. x is clamped at -87 so 2^n stays a normal float; below
// that the true value (< 2e-38) is dropped against a sum of at least 1, so
// the clamp costs nothing. Every multiply-add is KokkosExt::fmadd, so the
// bits do not depend on where the compiler inlines it, and the clamp is an
// integer min. Accuracy: within 4 ulp of expf on [-87, 0], with or without
// FMA (tested).
KOKKOS_FORCEINLINE_FUNCTION float pool_exp(float x) {
  // Clamp at -87 as an unsigned min on the bits: for x <= 0 a larger
  // magnitude is a larger bit pattern, and an integer min is one
  // instruction where a float select with NaN semantics is two.
  std::uint32_t const xb = KokkosExt::bit_cast<std::uint32_t>(x);
  x = KokkosExt::bit_cast<float>(xb < 0xC2AE0000u ? xb : 0xC2AE0000u);
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
  // n is in [-126, 0]: 2^n is a normal float. Unsigned arithmetic keeps a
  // NaN argument's garbage defined.
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
