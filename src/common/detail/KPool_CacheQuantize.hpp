#ifndef KPOOL_COMMON_DETAIL_CACHE_QUANTIZE_HPP
#define KPOOL_COMMON_DETAIL_CACHE_QUANTIZE_HPP

// Phases 2 and 3 of a team's cache write (KPool_CacheWrite.hpp): the
// rotation and the quantization of the staged rows, on devices lane by
// lane, on hosts a row by one thread (GCC vector extensions where they
// exist, KPool_CacheVectors.hpp).

#include <common/detail/KPool_CacheStaging.hpp>
#include <common/detail/KPool_CacheTarget.hpp>
#include <common/detail/KPool_CacheVectors.hpp>
#include <common/detail/KPool_ServingQuant.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace KPool {
namespace Details {

// --- Phase 2: the rotation (every team thread) ---------------------------

// The whole transform of one row by one thread (host lanes run in turn, so
// nothing needs ordering). Stages 1, 2 and 4 run together on each group of
// 8 channels, in registers: every value goes through the same butterflies
// in the same order as stage by stage, and the loop over groups
// vectorizes. Stages 8 and up run over contiguous halves and vectorize as
// they are.
template <class A>
KOKKOS_INLINE_FUNCTION void rotate_row_serial(A* v, int D) {
#if defined(KPOOL_IMPL_GNU_VECTORS)
  if constexpr (std::is_same<A, float>::value) {
    if (D >= 16) {
      rotate_row_vectors(v, D);
      return;
    }
  }
#endif
  int h = 1;
  if (D >= 8) {
    KPOOL_IMPL_IVDEP
    for (int g = 0; g < D; g += 8) {
      A* const p = v + g;
      A const a0 = p[0] + p[1], a1 = p[0] - p[1];
      A const a2 = p[2] + p[3], a3 = p[2] - p[3];
      A const a4 = p[4] + p[5], a5 = p[4] - p[5];
      A const a6 = p[6] + p[7], a7 = p[6] - p[7];
      A const b0 = a0 + a2, b2 = a0 - a2, b1 = a1 + a3, b3 = a1 - a3;
      A const b4 = a4 + a6, b6 = a4 - a6, b5 = a5 + a7, b7 = a5 - a7;
      p[0] = b0 + b4;
      p[4] = b0 - b4;
      p[1] = b1 + b5;
      p[5] = b1 - b5;
      p[2] = b2 + b6;
      p[6] = b2 - b6;
      p[3] = b3 + b7;
      p[7] = b3 - b7;
    }
    h = 8;
  }
  for (; h < D; h *= 2)
    for (int base = 0; base < D; base += 2 * h) {
      A* const lo = v + base;
      A* const hi = lo + h;
      KPOOL_IMPL_IVDEP
      for (int j = 0; j < h; ++j) {
        A const a = lo[j], b = hi[j];
        lo[j] = a + b;
        hi[j] = a - b;
      }
    }
}

// The butterfly stages h = 1, 2, ..., D/2 on every non-empty slot, ending
// with a team barrier. Expects the rows staged and visible (a barrier
// before). On a device, lanes share a row: lane k takes pair k of a stage,
// and a team barrier separates stages (the pairs of stage 2h mix values
// other lanes wrote in stage h). On a host one thread transforms a whole
// row. Either way the barrier count depends only on D: every team thread
// reaches every barrier.
template <class ExecutionSpace, class Member, class A>
KOKKOS_INLINE_FUNCTION void cache_team_butterflies(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s) {
  int const D = s.head_dim;
  if constexpr (device_shapes<ExecutionSpace>::value) {
    for (int h = 1; h < D; h *= 2) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, s.slots()), [&](int slot) {
        if (s.dest(slot, 0) < 0) return;
        auto const v = s.row(slot);
        // i has bit h clear and the other bits of k spread around it.
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, D / 2), [&](int k) {
          int const i = ((k & ~(h - 1)) << 1) | (k & (h - 1));
          A const a = v[i], b = v[i + h];
          v[i] = a + b;
          v[i + h] = a - b;
        });
      });
      member.team_barrier();
    }
  } else {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, s.slots()), [&](int slot) {
      if (s.dest(slot, 0) >= 0) rotate_row_serial(s.host_row(slot), D);
    });
    member.team_barrier();
  }
}

// --- Phase 3: quantization of one slot (one team thread, its lanes) ------

// max over c of f(c) (non-negative integers), across the calling thread's
// vector lanes; every lane gets the result.
template <class ExecutionSpace, class Member, class F>
KOKKOS_INLINE_FUNCTION std::uint32_t vector_max_u32(Member const& member, int n,
                                                    F const& f) {
  std::uint32_t m = 0;
  if constexpr (device_shapes<ExecutionSpace>::value) {
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(member, n),
        [&](int c, std::uint32_t& acc) {
          std::uint32_t const v = f(c);
          acc = v > acc ? v : acc;
        },
        Kokkos::Max<std::uint32_t>(m));
  } else {
    (void)member;
    for (int c = 0; c < n; ++c) {
      std::uint32_t const v = f(c);
      m = v > m ? v : m;
    }
  }
  return m;
}

// x: the row, x[c] its channel c (a pointer, or a padded SlotRow).
template <class ExecutionSpace, class Member, class X, class C, class A, class M>
KOKKOS_INLINE_FUNCTION void cache_quantize_row(Member const& member,
                                               X const& x,
                                               CacheTarget<C, A, M> const& t,
                                               CacheSlot where) {
  int const D = t.head_dim();
  C* const out = t.row(where);
  // R(x)[c]: the butterflies already ran; the final multiply happens here,
  // where the value is consumed, recomputed identically for amax and
  // values. Unrotated, the factor is 1 and the product x exactly.
  A const r = t.rotate ? t.rsqrt : A(1);
  auto const rx = [&](int c) { return x[c] * r; };
  if constexpr (std::is_same<C, float8_e4m3>::value) {
    static_assert(std::is_same<A, float>::value, "fp8 caches quantize in f32");
    if (t.serving) {
      // The serving profile (docs/indexer.md): each value is R(x)[c]
      // rounded to bf16, recomputed identically for amax and codes; amax
      // over the finite ones, floored; a UE8M0 scale, so the quotient is
      // the exact product with its reciprocal.
      auto const sv = [&](int c) { return round_to_bf16(rx(c)); };
      float const s = serving_scale(vector_max_u32<ExecutionSpace>(
          member, D, [&](int c) { return serving_magnitude_bits(sv(c)); }));
      float const inv = 1.0f / s;
      KokkosExt::vector_for<ExecutionSpace>(
          member, D, [&](int c) { out[c] = serving_code(sv(c), inv); });
      KokkosExt::single_per_thread(member, [&]() { t.scale_at(where) = s; });
      return;
    }
    // The largest finite |x[c] * r| is (the largest finite |x[c]|) * r: r
    // is positive and at most 1 (no product overflows, a finite x gives a
    // finite product), and rounding is monotone and symmetric. One
    // multiply instead of D.
    float const amax =
        KokkosExt::bit_cast<float>(vector_max_u32<ExecutionSpace>(
            member, D, [&](int c) { return finite_magnitude_bits(x[c]); })) *
        r;
    float const s = cache_scale(amax, t.scale);
    // A pow2 scale of 2^-126 or more has an exact reciprocal, and v * (1 /
    // s) is then the same correctly rounded number as v / s.
    if (t.scale == CacheScale::pow2 && s >= 1.1754943508222875e-38f) {
      float const inv = 1.0f / s;
      KokkosExt::vector_for<ExecutionSpace>(member, D, [&](int c) {
        float const v = rx(c);
        out[c] = is_nan(v) ? float8_e4m3::from_bits(0x7F) : float8_e4m3(v * inv);
      });
    } else {
      KokkosExt::vector_for<ExecutionSpace>(member, D, [&](int c) {
        float const v = rx(c);
        out[c] = is_nan(v) ? float8_e4m3::from_bits(0x7F) : float8_e4m3(v / s);
      });
    }
    KokkosExt::single_per_thread(
        member, [&]() { t.scale_at(where) = s; });
  } else {
    static_assert(std::is_same<A, accumulator_t<C>>::value,
                  "a native cache computes in its storage type's accumulator");
    KokkosExt::vector_for<ExecutionSpace>(member, D, [&](int c) {
      A const v = rx(c);
      out[c] = from_accumulator<C>(is_nan(v) ? canonical_nan(v) : v);
    });
    KokkosExt::single_per_thread(
        member, [&]() { t.scale_at(where) = 1.0f; });
  }
}

// --- Hosts: phases 2 and 3 by one thread --------------------------------
//
// Without device shapes a team thread's vector lanes run in turn, so one
// thread can rotate and quantize a pool by itself, with no team barrier:
// cache_write_row from the pool as stored (read back from the output row
// just written), cache_write_staged from a scratch slot. The operations
// and their order are those of phases 1 to 3, so the cache holds the same
// bytes either way (HostCacheHook below says which a step takes).

#if defined(KPOOL_IMPL_GNU_VECTORS)
// A pool's 128 values, as f32, into eight 16-lane vectors.
template <class T>
inline void load_row_128(T const* x, f32x16 (&r)[8]) {
  if constexpr (std::is_same<T, float>::value) {
    std::memcpy(r, x, sizeof r);
  } else {
    alignas(64) float row[128];
    KPOOL_IMPL_IVDEP
    for (int c = 0; c < 128; ++c) row[c] = to_accumulator(x[c]);
    std::memcpy(r, row, sizeof r);
  }
}

// D = 128 with f32 arithmetic into an fp8 cache (the checkpoint's shape):
// the pool stays in vector registers from the read-back to the store of its
// 128 bytes. Returns false, with the rotated row in `spill`, for a pool the
// general quantizer must take: one holding a non-finite value, or whose
// scale is below 2^-126. Otherwise every scaled value q = R(x)[c] / s
// (times 1 / s for pow2 scales, then exact) is finite with |q| below 464,
// the range e4m3_store16 takes: |R(x)[c]| <= amax and s is amax / 448
// rounded (at least that for pow2), both normal, so |q| <= 448 (1 + 2^-23).
template <class T>
inline bool e4m3_row_128(T const* x, bool rotate, float rsqrt, CacheScale mode,
                         void* out, float& scale, float* spill) {
  f32x16 r[8];
  load_row_128(x, r);
  if (rotate) rotate_vectors(r);
  std::uint32_t const m = max_magnitude_bits(r);
  float const factor = rotate ? rsqrt : 1.0f;
  float const s = m < 0x7F800000u
                      ? cache_scale(KokkosExt::bit_cast<float>(m) * factor, mode)
                      : 0.0f;
  if (!(s >= 1.1754943508222875e-38f)) {
    std::memcpy(spill, r, sizeof r);
    return false;
  }
  scale = s;
  auto* const dst = static_cast<std::uint8_t*>(out);
  if (mode == CacheScale::pow2) {
    float const inv = 1.0f / s;
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      f32x16 const q = (r[i] * factor) * inv;
      e4m3_store16(q, dst + 16 * i);
    }
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      f32x16 const q = (r[i] * factor) / s;
      e4m3_store16(q, dst + 16 * i);
    }
  }
  return true;
}

// e4m3_row_128 in the serving profile: every value R(x)[c] rounded to
// bf16 in registers, a UE8M0 scale from the floored amax. Returns false,
// with the butterflied row in `spill`, when a value is not finite or
// rounds to a bf16 infinity (at or above 0x7F7F8000): the general
// quantizer takes those. Otherwise amax is the rounded largest magnitude
// (rounding is monotone), s >= amax * f32(1/448) rounded, a power of two
// of at least 2^-22, and every |value / s| is at most 448 (1 + 2^-22),
// inside e4m3_store16's range.
template <class T>
inline bool e4m3_row_128_serving(T const* x, bool rotate, float rsqrt,
                                 void* out, float& scale, float* spill) {
  f32x16 r[8];
  load_row_128(x, r);
  if (rotate) rotate_vectors(r);
  f32x16 v[8];
  float const factor = rotate ? rsqrt : 1.0f;
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) v[i] = r[i] * factor;
  std::uint32_t const m = max_magnitude_bits(v);
  if (m >= 0x7F7F8000u) {
    std::memcpy(spill, r, sizeof r);
    return false;
  }
  std::uint32_t const amax = (m + 0x7FFFu + ((m >> 16) & 1u)) & 0xFFFF0000u;
  float const s = serving_scale(amax);
  float const inv = 1.0f / s;
  scale = s;
  auto* const dst = static_cast<std::uint8_t*>(out);
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    u32x16 const u = reinterpret_cast<u32x16>(v[i]);
    u32x16 const b = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    f32x16 const q = reinterpret_cast<f32x16>(b) * inv;
    e4m3_store16(q, dst + 16 * i);
  }
  return true;
}
#endif

/// Writes the pool x (D values as stored in T, channel stride `stride`;
/// x may be `row` itself, a pool staged in A) to cache entry `where` (not
/// empty), by the calling thread alone; `row` is a D-value buffer of that
/// thread. Hosts only: phases 2 and 3 of one pool.
template <class ExecutionSpace, class Member, class C, class A, class M, class T>
KOKKOS_INLINE_FUNCTION void cache_write_one(Member const& member,
                                            CacheTarget<C, A, M> const& t,
                                            CacheSlot where, T const* x,
                                            std::ptrdiff_t stride, A* row) {
  static_assert(!device_shapes<ExecutionSpace>::value,
                "device shapes write the cache as a team (cache_team_write)");
  int const D = t.head_dim();
#if defined(KPOOL_IMPL_GNU_VECTORS)
  if constexpr (std::is_same<C, float8_e4m3>::value) {
    if (D == 128 && stride == 1) {
      float s;
      bool const done =
          t.serving ? e4m3_row_128_serving(x, t.rotate, t.rsqrt, t.row(where), s, row)
                    : e4m3_row_128(x, t.rotate, t.rsqrt, t.scale, t.row(where), s, row);
      if (done)
        t.scale_at(where) = s;
      else
        cache_quantize_row<ExecutionSpace>(member, row, t, where);
      return;
    }
  }
#endif
  if (static_cast<void const*>(x) != static_cast<void const*>(row)) {
    KPOOL_IMPL_IVDEP
    for (int c = 0; c < D; ++c) row[c] = to_accumulator(x[c * stride]);
  }
  if (t.rotate) rotate_row_serial(row, D);
  cache_quantize_row<ExecutionSpace>(member, row, t, where);
}

/// cache_write_one from a pool as stored, out of line: one copy serves
/// every writer of a cache type, and the pooling loop before the call
/// compiles as it does without a cache.
template <class ExecutionSpace, class Member, class C, class A, class M, class T>
KPOOL_IMPL_NOINLINE void cache_write_row(Member const& member,
                                         CacheTarget<C, A, M> const& t,
                                         CacheSlot where, T const* x,
                                         std::ptrdiff_t stride, A* row) {
  cache_write_one<ExecutionSpace>(member, t, where, x, stride, row);
}

/// cache_write_one from a slot row (staged unrotated in A; overwritten).
template <class ExecutionSpace, class Member, class C, class A, class M>
KOKKOS_INLINE_FUNCTION void cache_write_staged(Member const& member,
                                               CacheTarget<C, A, M> const& t,
                                               CacheSlot where, A* row) {
  cache_write_one<ExecutionSpace>(member, t, where, static_cast<A const*>(row),
                                  std::ptrdiff_t(1), row);
}

/// Phases 2 and 3 for every slot of the team: call it from every team
/// thread, outside any TeamThreadRange, after every slot in [0, slots) was
/// staged or skipped. It starts with a team barrier (the staging must be
/// visible) and does not end with one: a caller reusing the scratch
/// afterwards barriers first.
template <class ExecutionSpace, class Member, class C, class A, class M>
KOKKOS_INLINE_FUNCTION void cache_team_write(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s,
    CacheTarget<C, A, M> const& t) {
  member.team_barrier();
  if constexpr (!device_shapes<ExecutionSpace>::value) {
    // Hosts: one thread a slot, in vector registers where it can.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, s.slots()), [&](int slot) {
      CacheSlot const where{s.dest(slot, 0), s.dest(slot, 1)};
      if (where.block >= 0)
        cache_write_staged<ExecutionSpace>(member, t, where, s.host_row(slot));
    });
    return;
  }
  if (t.rotate) cache_team_butterflies<ExecutionSpace>(member, s);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(member, s.slots()), [&](int slot) {
    CacheSlot const where{s.dest(slot, 0), s.dest(slot, 1)};
    if (where.block < 0) return;
    cache_quantize_row<ExecutionSpace>(member, s.row(slot), t, where);
  });
}

}  // namespace Details
}  // namespace KPool

#endif
