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
// exp(x) = 2^n * exp(r), n = round(x / ln2), r = x - n ln2 in [-ln2/2, ln2/2]
// (ln2 split in two so n ln2 is exact to 2^-32), exp(r) by its Taylor
// polynomial to degree 7 (truncation below 2^-26 relative), 2^n built in the
// exponent bits; every multiply-add is KokkosExt::fmadd, so the bits do not
// depend on where the compiler inlines it. The softmax only feeds it x <= 0;
// x is clamped to
// [-87, 88] so 2^n stays a normal float. Below -87 the true value (< 2e-38)
// is dropped against a sum of at least 1, so the clamp costs nothing.
// Accuracy: within 2 ulp of expf on [-87, 0] (tested).
KOKKOS_FORCEINLINE_FUNCTION float pool_exp(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest integer by the 1.5 * 2^23 shift: exact for |t| < 2^22,
  // and vectorizes without SSE4.1's roundps.
  float const shifter = 12582912.0f;
  float const t = KokkosExt::fmadd(x, 1.44269504088896341f, shifter);
  float const n = t - shifter;
  std::int32_t const ni = KokkosExt::bit_cast<std::int32_t>(t) -
                          KokkosExt::bit_cast<std::int32_t>(shifter);
  float const r = KokkosExt::fmadd(
      -n, 1.42860682030941723e-06f, KokkosExt::fmadd(-n, 0.693145751953125f, x));
  float p = 1.98412698e-4f;                          // 1/5040
  p = KokkosExt::fmadd(p, r, 1.38888889e-3f);        // 1/720
  p = KokkosExt::fmadd(p, r, 8.33333333e-3f);        // 1/120
  p = KokkosExt::fmadd(p, r, 4.16666667e-2f);        // 1/24
  p = KokkosExt::fmadd(p, r, 1.66666667e-1f);        // 1/6
  p = KokkosExt::fmadd(p, r, 0.5f);
  p = KokkosExt::fmadd(p, r, 1.0f);
  p = KokkosExt::fmadd(p, r, 1.0f);
  float const scale =
      KokkosExt::bit_cast<float>(static_cast<std::int32_t>((ni + 127) << 23));
  return p * scale;
}

// f64 storage computes in f64 (SEMANTICS.md); speed is not the point there.
KOKKOS_FORCEINLINE_FUNCTION double pool_exp(double x) {
  return KokkosExt::exp(x);
}

}  // namespace Details
}  // namespace KPool

#endif
