#ifndef KPOOL_COMMON_DETAIL_CACHE_VECTORS_HPP
#define KPOOL_COMMON_DETAIL_CACHE_VECTORS_HPP

// Host code for the pool cache written with GCC's vector extensions: the
// Walsh-Hadamard butterflies of a row held in vector registers, and the
// E4M3 rounding of 16 values at a time. A host's cache write is bound by
// these instructions rather than by memory (docs/indexer.md, "The pool
// cache"; docs/performance.md, "Writing the pool cache"), and GCC's auto-vectorizer
// turns the scalar E4M3 conversion into masked byte shuffles that cost
// several times as much. Everything here performs the same IEEE operations
// on the same values as the portable code it stands in for, so it stores
// the same bits; unit_tests/tst_float8.cpp checks the rounding on all 2^32
// f32 inputs it accepts.
//
// Device code, other compilers and other hosts take the portable loops
// (KPOOL_IMPL_GNU_VECTORS undefined).

#include <cstdint>
#include <cstring>

#if defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && \
    !defined(__NVCC__) && !defined(__CUDACC__) && !defined(__HIPCC__) &&     \
    !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#define KPOOL_IMPL_GNU_VECTORS 1

namespace KPool {
namespace Details {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int i32x16 __attribute__((vector_size(64)));
typedef unsigned u32x16 __attribute__((vector_size(64)));
typedef unsigned char u8x16 __attribute__((vector_size(16)));

// Vectors are passed and returned by reference: a vector passed by value
// changes the ABI between builds with and without AVX-512, which GCC warns
// about.

// Stage H (1, 2, 4 or 8) of the butterflies inside one vector of 16
// channels: a lane with bit H clear holds a + b, its partner a - b, a the
// lower channel's value. t is the partner's value; the upper lane adds the
// negated own value (t + (-v) is t - v exactly), so one shuffle, one sign
// flip and one add do the stage.
template <int H>
inline void butterfly_in_vector(f32x16& v) {
  constexpr i32x16 partner = {0 ^ H, 1 ^ H, 2 ^ H,  3 ^ H,  4 ^ H,  5 ^ H,
                              6 ^ H, 7 ^ H, 8 ^ H,  9 ^ H,  10 ^ H, 11 ^ H,
                              12 ^ H, 13 ^ H, 14 ^ H, 15 ^ H};
  constexpr unsigned s = 0x80000000u;
  constexpr u32x16 flip = {0,             (1 & H) ? s : 0,  (2 & H) ? s : 0,
                           (3 & H) ? s : 0,  (4 & H) ? s : 0,
                           (5 & H) ? s : 0,  (6 & H) ? s : 0,
                           (7 & H) ? s : 0,  (8 & H) ? s : 0,
                           (9 & H) ? s : 0,  (10 & H) ? s : 0,
                           (11 & H) ? s : 0, (12 & H) ? s : 0,
                           (13 & H) ? s : 0, (14 & H) ? s : 0,
                           (15 & H) ? s : 0};
  f32x16 const t = __builtin_shuffle(v, partner);
  v = t + reinterpret_cast<f32x16>(reinterpret_cast<u32x16>(v) ^ flip);
}

// The whole transform of N vectors (D = 16 N channels) in registers.
template <int N>
inline void rotate_vectors(f32x16 (&r)[N]) {
#pragma GCC unroll 16
  for (int i = 0; i < N; ++i) {
    butterfly_in_vector<1>(r[i]);
    butterfly_in_vector<2>(r[i]);
    butterfly_in_vector<4>(r[i]);
    butterfly_in_vector<8>(r[i]);
  }
#pragma GCC unroll 16
  for (int h = 1; h < N; h *= 2)
#pragma GCC unroll 16
    for (int i = 0; i < N; ++i)
      if ((i & h) == 0) {
        f32x16 const a = r[i], b = r[i + h];
        r[i] = a + b;
        r[i + h] = a - b;
      }
}

// D a power of two, at least 16: the row transformed in place.
inline void rotate_row_vectors(float* p, int D) {
  if (D == 128) {  // the checkpoint's head_dim: the row stays in registers
    f32x16 r[8];
    std::memcpy(r, p, sizeof r);
    rotate_vectors(r);
    std::memcpy(p, r, sizeof r);
    return;
  }
  for (int g = 0; g < D; g += 16) {
    f32x16 v;
    std::memcpy(&v, p + g, sizeof v);
    butterfly_in_vector<1>(v);
    butterfly_in_vector<2>(v);
    butterfly_in_vector<4>(v);
    butterfly_in_vector<8>(v);
    std::memcpy(p + g, &v, sizeof v);
  }
  for (int h = 16; h < D; h *= 2)
    for (int base = 0; base < D; base += 2 * h)
      for (int j = base; j < base + h; j += 16) {
        f32x16 a, b;
        std::memcpy(&a, p + j, sizeof a);
        std::memcpy(&b, p + j + h, sizeof b);
        f32x16 const sum = a + b, difference = a - b;
        std::memcpy(p + j, &sum, sizeof sum);
        std::memcpy(p + j + h, &difference, sizeof difference);
      }
}

// The largest |bits| of the N vectors (as unsigned integers: non-negative
// floats order like their bit patterns, infinity and NaN above every
// finite value).
template <int N>
inline std::uint32_t max_magnitude_bits(f32x16 const (&r)[N]) {
  u32x16 m = reinterpret_cast<u32x16>(r[0]) & 0x7FFFFFFFu;
#pragma GCC unroll 16
  for (int i = 1; i < N; ++i) {
    u32x16 const a = reinterpret_cast<u32x16>(r[i]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  u32x16 t = __builtin_shuffle(m, u32x16{8, 9, 10, 11, 12, 13, 14, 15, 0, 1,
                                         2, 3, 4, 5, 6, 7});
  m = t > m ? t : m;
  t = __builtin_shuffle(m, u32x16{4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8,
                                  9, 10, 11});
  m = t > m ? t : m;
  t = __builtin_shuffle(m, u32x16{2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14,
                                  15, 12, 13});
  m = t > m ? t : m;
  t = __builtin_shuffle(m, u32x16{1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13,
                                  12, 15, 14});
  m = t > m ? t : m;
  return m[0];
}

// float_to_e4m3_bits (common/KPool_Float8.hpp) of 16 values whose magnitudes are
// below 464 (the midpoint between 448 and the missing 480), NaN excluded:
// the range a cache write's scaled values stay in, which needs neither the
// saturation nor the NaN case. |q| is rounded onto the E4M3 grid of its
// binade by one f32 addition of c = 2^(e + 20), e the binade's exponent
// (at least -6, where the subnormals' fixed step 2^-9 begins): the sum's
// last place is then the E4M3 step, the addition rounds to nearest even on
// that grid, and the sum's bits minus c's count the steps above c: 8 + the
// mantissa for a normal result (16 when it carried into the next binade,
// which the exponent term below turns into that binade's code), the
// subnormal's mantissa (0 to 8, 8 the smallest normal) below 2^-6. Adding
// (e - 121) * 8 gives the code.
inline void e4m3_store16(f32x16 const& q, std::uint8_t* dst) {
  u32x16 const u = reinterpret_cast<u32x16>(q);
  u32x16 const a = u & 0x7FFFFFFFu;
  u32x16 e = a >> 23;
  e = e > 121u ? e : u32x16{} + 121u;
  u32x16 const c = (e << 23) + (20u << 23);
  f32x16 const sum =
      reinterpret_cast<f32x16>(a) + reinterpret_cast<f32x16>(c);
  u32x16 const code = (reinterpret_cast<u32x16>(sum) - c) +
                      ((e << 3) - 968u) + ((u >> 24) & 0x80u);
  u8x16 const b = __builtin_convertvector(code, u8x16);
  std::memcpy(dst, &b, sizeof b);
}

}  // namespace Details
}  // namespace KPool

#endif

#endif
