// KPoolCacheReference.hpp: an independent, serial host reference of the pool
// cache of docs/indexer.md ("The pool cache"), written from that page
// alone (no code shared with src/). Plain C++17 plus KPoolReference.hpp's
// independent bf16/f16 encoders.
//
// Unlike KPoolReference.hpp it is bit-exact: the contract fixes the order of
// every f32 (f64) operation of Q(R(x)), so the reference performs exactly
// those operations in float (double) and returns the bytes a cache entry
// must hold.
//
// Choices the page leaves open, made here and in the library alike:
//  * E4M3FN from f32 saturates infinities to +-448 too (the format has no
//    infinity); NaN keeps its sign (S.1111.111); zero keeps its sign.
//  * A NaN is stored as the positive quiet NaN of C (0x7F in fp8, 0x7FC00000
//    in f32, ...): the page only says NaN stays NaN, and IEEE arithmetic
//    leaves a NaN's sign to the hardware, so one fixed NaN keeps every
//    backend's cache bytes equal.
//  * pow2 scale of a quotient amax / 448 that underflows to 0 in f32 (amax
//    below ~6.3e-43): the smallest f32 power of two, 2^-149. The amax scale
//    of such a pool is that 0 quotient, literally.
#pragma once

#include "KPoolReference.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace KPoolCacheRef {

using KPoolRef::DType;

// ---------------------------------------------------------------------------
// OCP FP8 E4M3FN, from the format definition
// ---------------------------------------------------------------------------

// sign | 4 exponent bits (bias 7) | 3 mantissa bits. Exponent field 0 is
// subnormal (m / 8 * 2^-6); S.1111.111 is NaN; everything else is normal,
// (1 + m / 8) * 2^(e - 7), 1111 included (up to 1.75 * 2^8 = 448).
inline double e4m3_value(std::uint8_t b) {
  int const s = b >> 7;
  int const e = (b >> 3) & 15;
  int const m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double const mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Round to nearest, ties to even, saturating: a search over the decoded
// non-negative finite values (codes 0x00 .. 0x7E, increasing with the
// code), comparing |x| with the midpoint between neighbours (exact in
// double: both are short dyadic numbers). A tie goes to the even code,
// which is the even mantissa.
inline std::uint8_t e4m3_bits(float x) {
  std::uint8_t const sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7F);
  double const a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7E);
  // Largest code whose value is <= a.
  int lo = 0, hi = 0x7E;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    if (e4m3_value(static_cast<std::uint8_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  int code = lo;
  if (e4m3_value(static_cast<std::uint8_t>(lo)) < a) {
    double const below = e4m3_value(static_cast<std::uint8_t>(lo));
    double const above = e4m3_value(static_cast<std::uint8_t>(lo + 1));
    double const midpoint = (below + above) / 2;
    if (a > midpoint || (a == midpoint && (lo & 1)))
      code = lo + 1;
  }
  return static_cast<std::uint8_t>(sign | code);
}

// ---------------------------------------------------------------------------
// Q(R(x))
// ---------------------------------------------------------------------------

enum class Scale { none, amax, pow2 };

struct CacheKind {
  DType t;        // the pools' storage type
  bool fp8;       // C = E4M3FN (else C = T, native)
  Scale scale;    // none for native
  bool rotate;
  bool serving = false;  // the serving profile (fp8, pow2)
};

// One cache entry: the D values' bytes as C stores them, and the scale.
struct Entry {
  std::vector<std::uint8_t> bytes;
  float scale;
};

inline std::size_t element_size(CacheKind const& k) {
  if (k.fp8) return 1;
  switch (k.t) {
    case DType::f64: return 8;
    case DType::f32: return 4;
    default: return 2;
  }
}

// The orthonormal Walsh-Hadamard transform as docs/indexer.md orders it, in the
// arithmetic type A: stages h = 1, 2, ..., D/2, pairs (i, i + h) with
// i & h == 0 becoming (a + b, a - b), then every value times the A nearest
// 1/sqrt(D). D is a power of two, so 1/D is exact and the correctly rounded
// square root of it is that nearest value.
template <class A>
void rotate(std::vector<A>& v) {
  int const D = static_cast<int>(v.size());
  for (int h = 1; h < D; h *= 2)
    for (int i = 0; i < D; ++i)
      if ((i & h) == 0) {
        A const a = v[i], b = v[i + h];
        v[i] = a + b;
        v[i + h] = a - b;
      }
  A const r = std::sqrt(A(1) / static_cast<A>(D));
  for (A& x : v) x = x * r;
}

// The smallest power of two (as an f32) not below q >= 0.
inline float pow2_at_least(float q) {
  if (q == 0.0f) return std::numeric_limits<float>::denorm_min();
  int e = 0;
  float const fr = std::frexp(q, &e);  // q = fr * 2^e, fr in [0.5, 1)
  return fr == 0.5f ? q : std::ldexp(1.0f, e);
}

// The scale of a pool whose R(x) is v.
inline float scale_of(std::vector<float> const& v, Scale mode) {
  float amax = 0.0f;
  for (float x : v)
    if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
  if (amax == 0.0f) return 1.0f;
  float const q = amax / 448.0f;
  return mode == Scale::pow2 ? pow2_at_least(q) : q;
}

// ---------------------------------------------------------------------------
// The serving profile (docs/indexer.md, "The serving profile")
// ---------------------------------------------------------------------------

// The f32 nearest 1/448, through double: 1/448 = (1/7) 2^-6 has a
// periodic binary expansion (001 repeating), so neither rounding lands on
// a tie and the double rounding is the single correct one.
inline float serving_inv448() { return static_cast<float>(1.0 / 448.0); }

// ceil_to_ue8m0 as the page words it: the smallest power of two at least
// q (q itself when it is one), its exponent kept within the f32 normal
// range [2^-126, 2^127].
inline float ue8m0_ceil(float q) {
  if (!(q > 0.0f)) return std::ldexp(1.0f, -126);
  int e = 0;
  float const fr = std::frexp(q, &e);  // q = fr * 2^e, fr in [0.5, 1)
  int const k = fr == 0.5f ? e - 1 : e;
  return std::ldexp(1.0f, std::min(127, std::max(-126, k)));
}

// bf16 round trip, nearest even (KPoolReference.hpp's encoder).
inline float bf16_round(float f) { return KPoolRef::bf16_value(KPoolRef::bf16_bits(f)); }

// One serving row: the D values R(x) (rotated when the cache is, in f32)
// rounded to bf16, the amax of the finite ones floored at 1e-4, the scale
// ue8m0_ceil(amax * f32(1/448)), and each value's E4M3 code of value / s
// (NaN as 0x7F). Used for cache entries and for queries alike.
inline Entry serving_quantize(std::vector<float> v) {
  for (float& f : v) f = bf16_round(f);
  float amax = 0.0f;
  for (float f : v)
    if (std::isfinite(f)) amax = std::max(amax, std::fabs(f));
  amax = std::max(amax, 1e-4f);
  Entry e;
  e.scale = ue8m0_ceil(amax * serving_inv448());
  for (float f : v) e.bytes.push_back(std::isnan(f) ? 0x7F : e4m3_bits(f / e.scale));
  return e;
}

template <class U>
void append(std::vector<std::uint8_t>& out, U const& u) {
  std::uint8_t b[sizeof(U)];
  std::memcpy(b, &u, sizeof(U));
  out.insert(out.end(), b, b + sizeof(U));
}

// cached = Q(R(x)) for one pool x, given as the values stored in T.
inline Entry quantize(CacheKind const& k, std::vector<double> const& x) {
  Entry e;
  if (k.t == DType::f64) {
    KPoolRef::require(!k.fp8, "fp8 caches need a storage type that is not f64");
    std::vector<double> v(x);
    if (k.rotate) rotate(v);
    for (double d : v) append(e.bytes, std::isnan(d) ? std::numeric_limits<double>::quiet_NaN() : d);
    e.scale = 1.0f;
    return e;
  }
  std::vector<float> v(x.size());
  for (std::size_t c = 0; c < x.size(); ++c) v[c] = static_cast<float>(x[c]);  // exact
  if (k.rotate) rotate(v);
  if (k.serving) {
    KPoolRef::require(k.fp8 && k.scale == Scale::pow2,
                      "the serving profile is fp8 with pow2 scales");
    return serving_quantize(v);
  }
  if (k.fp8) {
    e.scale = scale_of(v, k.scale);
    for (float f : v) e.bytes.push_back(std::isnan(f) ? 0x7F : e4m3_bits(f / e.scale));
    return e;
  }
  e.scale = 1.0f;
  for (float f : v) {
    if (std::isnan(f)) f = std::numeric_limits<float>::quiet_NaN();
    switch (k.t) {
      case DType::f32: append(e.bytes, f); break;
      case DType::bf16: append(e.bytes, KPoolRef::bf16_bits(f)); break;
      default: append(e.bytes, KPoolRef::f16_bits(f)); break;
    }
  }
  return e;
}

// The dequantized key s * value of an entry, in the entry's arithmetic
// (f32, or f64 for a native f64 cache), returned as doubles (exact).
inline std::vector<double> dequantize(CacheKind const& k, Entry const& e, int D,
                                      bool unrotate) {
  std::vector<double> out(D);
  if (!k.fp8 && k.t == DType::f64) {
    std::vector<double> v(D);
    std::memcpy(v.data(), e.bytes.data(), 8 * static_cast<std::size_t>(D));
    if (unrotate && k.rotate) rotate(v);
    return v;
  }
  std::vector<float> v(D);
  for (int c = 0; c < D; ++c) {
    if (k.fp8) {
      v[c] = e.scale * static_cast<float>(e4m3_value(e.bytes[c]));
    } else if (k.t == DType::f32) {
      std::memcpy(&v[c], e.bytes.data() + 4 * c, 4);
    } else {
      std::uint16_t h;
      std::memcpy(&h, e.bytes.data() + 2 * c, 2);
      v[c] = k.t == DType::bf16 ? KPoolRef::bf16_value(h) : KPoolRef::f16_value(h);
    }
  }
  if (unrotate && k.rotate) rotate(v);
  for (int c = 0; c < D; ++c) out[c] = v[c];
  return out;
}

}  // namespace KPoolCacheRef
