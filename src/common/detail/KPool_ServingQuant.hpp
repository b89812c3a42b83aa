#ifndef KPOOL_COMMON_DETAIL_SERVING_QUANT_HPP
#define KPOOL_COMMON_DETAIL_SERVING_QUANT_HPP

// The serving profile's quantization (docs/indexer.md, "The serving
// profile"), shared by the cache writers and every scoring engine:
//
//   value  = bf16(R(x)[c])                  (round to nearest even, back to f32)
//   amax   = max(largest finite |value|, 1e-4f)
//   s      = ceil_ue8m0(amax * f32(1/448))  (a power of two, 2^-126 .. 2^127)
//   code   = E4M3FN(value / s)              (exact quotient; saturating, NaN kept)
//
// and prepare_query_row, the one place a scoring engine turns a query row
// (t, h) into what it multiplies with the cached keys: in the exact profile
// R(q) and the weight as given; in the serving profile the E4M3 codes of
// q as f32 values and the weight times the query's scale s_q, so that
//   sum_h w'_h relu(s_k * (q8_h . k8)) = s_k * sum_h w_h s_q,h relu(q8_h . k8)
// (s_k and s_q are powers of two: both forms round identically).
// The codes are exact in f32, f16 and bf16 alike (4 significant bits,
// magnitudes 2^-9 .. 448), so an engine may stage them in any of those.

#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_CacheVectors.hpp>
#include <common/detail/KPool_KokkosExt.hpp>

#include <cstdint>
#include <type_traits>

namespace KPool {
namespace Details {

/// The f32 nearest 1/448 (the division is correctly rounded).
constexpr float serving_inv448 = 1.0f / 448.0f;
/// The floor of a serving row's amax.
constexpr float serving_amax_floor = 1e-4f;

/// x rounded to bf16 (nearest even) and back to f32; NaN stays NaN, values
/// rounding past the largest bf16 become infinities.
KOKKOS_FORCEINLINE_FUNCTION float round_to_bf16(float x) {
  return bf16_bits_to_float(float_to_bf16_bits(x));
}

/// DeepGEMM's ceil_to_ue8m0 of a non-negative finite f32: the exponent
/// field, plus one when any mantissa bit is set, clamped to [1, 254], with
/// the mantissa cleared. A power of two at least x (for x in the normal
/// range), and x itself when x is one.
KOKKOS_INLINE_FUNCTION float ceil_ue8m0(float x) {
  std::uint32_t const u = KokkosExt::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
  std::uint32_t e = (u >> 23) + ((u & 0x007FFFFFu) != 0u ? 1u : 0u);
  e = e < 1u ? 1u : e > 254u ? 254u : e;
  return KokkosExt::bit_cast<float>(e << 23);
}

/// The serving scale of a row whose largest finite |value| (after the bf16
/// rounding) has the bits `amax_bits` (0 when none is finite).
KOKKOS_INLINE_FUNCTION float serving_scale(std::uint32_t amax_bits) {
  float amax = KokkosExt::bit_cast<float>(amax_bits);
  amax = amax < serving_amax_floor ? serving_amax_floor : amax;
  return ceil_ue8m0(amax * serving_inv448);
}

/// The E4M3 code of a serving value v for the row's scale with reciprocal
/// `inv` (exact: s is a power of two in [2^-22, 2^120], its reciprocal a
/// normal f32), NaN as the positive quiet NaN 0x7F as every cache write
/// stores it.
KOKKOS_FORCEINLINE_FUNCTION float8_e4m3 serving_code(float v, float inv) {
  bool const nan = (KokkosExt::bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu) > 0x7F800000u;
  return nan ? float8_e4m3::from_bits(0x7F) : float8_e4m3(v * inv);
}

// |x| as bits when x is finite, else 0 (the amax of finite values as an
// integer max, exact in any order).
KOKKOS_FORCEINLINE_FUNCTION std::uint32_t serving_magnitude_bits(float x) {
  std::uint32_t const a = KokkosExt::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
  return a < 0x7F800000u ? a : 0u;
}

/// What prepare_query_row needs of the cache a query meets.
template <class A>
struct QueryPrep {
  A rsqrt;       // the A nearest 1/sqrt(D) (used when rotate)
  bool rotate;   // the cache is rotated
  bool serving;  // the cache is in the serving profile
};

// The Walsh-Hadamard butterflies of a row in place, one thread (the
// cache writers' rotate_row_serial, declared there).
template <class A>
KOKKOS_INLINE_FUNCTION void rotate_row_serial(A* v, int D);

/// Prepares query row x[0, D) (on entry q(t, h, :) converted to A, on exit
/// the row the engine multiplies with the cached keys) and returns the
/// weight to fold its products with. One thread, D values, no scratch of
/// its own. Exact profile: x = R(q) (butterflies, then times rsqrt), the
/// weight as given. Serving profile (A = float): x = the E4M3 codes of
/// bf16(R(q)) as values, the weight times s_q.
template <class A>
KOKKOS_INLINE_FUNCTION A prepare_query_row(A* x, int D, QueryPrep<A> const& prep,
                                           float weight) {
  if (prep.rotate) rotate_row_serial(x, D);
  if constexpr (std::is_same<A, float>::value) {
    if (prep.serving) {
      float const factor = prep.rotate ? prep.rsqrt : 1.0f;
      std::uint32_t m = 0;
      for (int c = 0; c < D; ++c) {
        float const v = round_to_bf16(x[c] * factor);
        x[c] = v;
        std::uint32_t const a = serving_magnitude_bits(v);
        m = a > m ? a : m;
      }
      float const s = serving_scale(m);
      float const inv = 1.0f / s;
      KPOOL_IMPL_IVDEP
      for (int c = 0; c < D; ++c) x[c] = static_cast<float>(serving_code(x[c], inv));
      return weight * s;
    }
  }
  if (prep.rotate) {
    KPOOL_IMPL_IVDEP
    for (int c = 0; c < D; ++c) x[c] *= prep.rsqrt;
  }
  return static_cast<A>(weight);
}

}  // namespace Details
}  // namespace KPool

#endif
