#ifndef KPOOL_DETAILS_CACHE_WRITE_HPP
#define KPOOL_DETAILS_CACHE_WRITE_HPP

// The pool cache's device side (docs/indexer.md, "The pool cache"): the one
// quantizer every cache write goes through, cached = Q(R(x)), and the team
// scratch it works in.
//
// A team writes its pools in three phases, every team thread taking part
// in each (team-uniform control flow, so every barrier is reached by all):
//
//   1. staging: inside the caller's TeamThreadRange, the thread that made
//      pool i copies it (as stored in T, converted to A) into scratch row
//      `slot` and records its cache entry, or marks the slot empty
//      (cache_stage_row / cache_stage_value + cache_stage_target /
//      cache_stage_skip). The steps stage from the registers their pooling
//      loop rounds the pool in (thread_vector_pool's stage, CacheStage),
//      through team_items and its hooks; store_pools from its input rows;
//   2. rotation (rotated caches): the Walsh-Hadamard butterflies run on the
//      scratch rows. On a device, one stage h at a time with a team
//      barrier between stages, lanes taking pairs (i, i + h): values cross
//      lanes and threads only through scratch, ordered by the barriers. On
//      a host, where a thread's lanes run in turn, one thread transforms a
//      whole row (in vector registers where GCC's vector extensions exist)
//      and a single barrier follows;
//   3. quantization: per slot, a vector-lane max gives amax, then each lane
//      writes its channels' E4M3 (or native) values and one lane the scale.
//
// Phases 2 and 3 are cache_team_write. A step without a cache (NoCache)
// has none of this: team_items is then the plain TeamThreadRange. The arithmetic follows docs/indexer.md's
// order exactly (butterflies in f32, f64 for f64 pools, then the multiply
// by the nearest value to 1/sqrt(D), then the f32 division by the scale),
// so every backend and every writer stores the same bytes, and a rotated
// pool does not depend on which team thread or lane did which pair.
//
// NaN is stored as the positive quiet NaN of C (0x7F in fp8): IEEE leaves a
// NaN result's sign to the hardware (x86 keeps an operand's, CUDA returns a
// canonical NaN), and the cache must hold the same bytes everywhere.

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <cache/detail/KPool_CacheVectors.hpp>
#include <cache/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Lanes.hpp>
#include <common/detail/KPool_Launch.hpp>
#include <common/detail/KPool_Views.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

namespace KPool {
namespace Details {

// The A nearest 1/sqrt(D) for a power of two D: 1/D is exact and the
// square root is correctly rounded.
template <class A>
A nearest_rsqrt(int head_dim) {
  return std::sqrt(A(1) / static_cast<A>(head_dim));
}

// The positive quiet NaN of each arithmetic type, by its bits.
KOKKOS_INLINE_FUNCTION float canonical_nan(float) {
  return KokkosExt::bit_cast<float>(std::uint32_t(0x7FC00000u));
}
KOKKOS_INLINE_FUNCTION double canonical_nan(double) {
  return KokkosExt::bit_cast<double>(std::uint64_t(0x7FF8000000000000ull));
}
KOKKOS_INLINE_FUNCTION bool is_nan(float x) {
  return (KokkosExt::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu) > 0x7F800000u;
}
KOKKOS_INLINE_FUNCTION bool is_nan(double x) {
  return (KokkosExt::bit_cast<std::uint64_t>(x) & 0x7FFFFFFFFFFFFFFFull) >
         0x7FF0000000000000ull;
}

// |x| as bits when x is finite, 0 otherwise. Non-negative floats order like
// their bit patterns, so amax is an integer max: exact, and the same
// whatever order the lanes combine in.
KOKKOS_INLINE_FUNCTION std::uint32_t finite_magnitude_bits(float x) {
  std::uint32_t const a = KokkosExt::bit_cast<std::uint32_t>(x) & 0x7FFFFFFFu;
  // A mask rather than a select: GCC 12 does not vectorize a max reduction
  // over a selected value.
  std::uint32_t const keep = 0u - static_cast<std::uint32_t>(a < 0x7F800000u);
  return a & keep;
}

// The smallest f32 power of two not below q >= 0, q finite (q = 0, an amax
// / 448 that underflowed, gives the smallest one, 2^-149).
KOKKOS_INLINE_FUNCTION float pow2_not_below(float q) {
  std::uint32_t const u = KokkosExt::bit_cast<std::uint32_t>(q);
  if (u >= 0x00800000u) {
    // Normal: q itself when its mantissa is 0, else the next binade.
    std::uint32_t const e = u & 0x7F800000u;
    return KokkosExt::bit_cast<float>((u & 0x007FFFFFu) ? e + 0x00800000u : e);
  }
  // Subnormal or zero: the smallest power-of-two bit pattern >= u (the
  // pattern 0x00800000 is 2^-126, the smallest normal).
  std::uint32_t p = 1u;
  while (p < u) p <<= 1;
  return KokkosExt::bit_cast<float>(p);
}

// s for a pool whose largest finite |R(x)| is amax.
KOKKOS_INLINE_FUNCTION float cache_scale(float amax, CacheScale mode) {
  if (amax == 0.0f) return 1.0f;
  float const q = amax / 448.0f;
  return mode == CacheScale::pow2 ? pow2_not_below(q) : q;
}

// Where a pool goes. block < 0: nowhere (the pool is skipped).
struct CacheSlot {
  int block;
  int entry;
};

// A pool cache and the call's block table, as device code sees them, plus
// the quantization settings. C the element type, A the arithmetic type.
// Pointers and sizes rather than views: a step functor carries one, and a
// CUDA functor of 512 bytes or more launches through constant memory (this
// is about half the size of the three views). The cache's views are
// LayoutRight and held by the PoolCache for the call; the block table may
// have any layout.
template <class C, class A, class MemorySpace>
struct CacheTarget {
  static constexpr bool enabled = true;
  using arithmetic_type = A;

  // Entry e of block b: values + b * values_block_stride + e * dim, its
  // scale scales[b * scales_block_stride + e] (PoolCache's addressing,
  // the same code for the split and the fused layout).
  C* values;
  float* scales;
  std::int64_t values_block_stride;
  std::int64_t scales_block_stride;
  std::int32_t const* block_table;  // [table_rows][table_cols], strided
  std::int64_t table_row_stride;
  std::int64_t table_col_stride;
  int table_rows;
  int table_cols;
  int num_blocks;
  int block_pools;
  int dim;
  A rsqrt;  // the A nearest 1/sqrt(D); used when rotate
  CacheScale scale;
  bool rotate;
  bool serving;  // CacheProfile::serving (fp8, scale pow2)

  KOKKOS_INLINE_FUNCTION int head_dim() const { return dim; }

  // Pool `pool` of batch row r: block_table(r, pool / block_pools), entry
  // pool % block_pools. Anything out of range (row, column, an unassigned
  // or too large block) gives an empty slot: validation reports those
  // before launching, and with it off they are skipped.
  KOKKOS_INLINE_FUNCTION CacheSlot locate(std::int64_t r, std::int64_t pool) const {
    CacheSlot s{-1, 0};
    if (r < 0 || pool < 0 || r >= table_rows) return s;
    std::int64_t const col = pool / block_pools;
    if (col >= table_cols) return s;
    std::int32_t const b = block_table[r * table_row_stride + col * table_col_stride];
    if (b < 0 || b >= num_blocks) return s;
    s.block = b;
    s.entry = static_cast<int>(pool % block_pools);
    return s;
  }

  /// The D values of entry `w`.
  KOKKOS_INLINE_FUNCTION C* row(CacheSlot w) const {
    return values + static_cast<std::int64_t>(w.block) * values_block_stride +
           static_cast<std::int64_t>(w.entry) * dim;
  }
  /// Whether every entry's values start on a `bytes` boundary: the base,
  /// the block stride (the fused layout's is block_pools * (D + 4) bytes,
  /// a multiple of 4 only) and the entry stride. A wide load of an entry
  /// is safe only then (a GPU faults on a misaligned one).
  bool rows_aligned(std::size_t bytes) const {
    return reinterpret_cast<std::uintptr_t>(values) % bytes == 0 &&
           static_cast<std::size_t>(values_block_stride) * sizeof(C) % bytes == 0 &&
           static_cast<std::size_t>(dim) * sizeof(C) % bytes == 0;
  }
  KOKKOS_INLINE_FUNCTION float& scale_at(CacheSlot w) const {
    return scales[static_cast<std::int64_t>(w.block) * scales_block_stride + w.entry];
  }
  /// What prepare_query_row needs to meet this cache's keys.
  KOKKOS_INLINE_FUNCTION QueryPrep<A> query_prep() const {
    return QueryPrep<A>{rsqrt, rotate, serving};
  }
};

template <class C, class A, class MemorySpace, class BlockTable>
CacheTarget<C, A, MemorySpace> cache_target(
    PoolCache<C, MemorySpace> const& cache, BlockTable const& block_table) {
  CacheTarget<C, A, MemorySpace> t;
  t.values = cache.values_data();
  t.scales = cache.scales_data();
  t.values_block_stride = cache.values_block_stride();
  t.scales_block_stride = cache.scales_block_stride();
  t.block_table = block_table.data();
  t.table_row_stride = static_cast<std::int64_t>(block_table.stride(0));
  t.table_col_stride = static_cast<std::int64_t>(block_table.stride(1));
  t.table_rows = static_cast<int>(
      std::min<std::size_t>(block_table.extent(0), 0x7FFFFFFF));
  t.table_cols = static_cast<int>(
      std::min<std::size_t>(block_table.extent(1), 0x7FFFFFFF));
  t.num_blocks = cache.num_blocks();
  t.block_pools = cache.block_pools();
  t.dim = cache.head_dim();
  t.rsqrt = nearest_rsqrt<A>(cache.head_dim());
  t.scale = cache.scale();
  t.rotate = cache.rotated();
  t.serving = cache.profile() == CacheProfile::serving;
  return t;
}

// A slot row as the team's lanes see it. With device shapes the rows are
// padded: channel c sits at word c + c / 32, one pad word after every 32
// channels, so that the staging stores (lane p writing channels
// [p * W, (p + 1) * W), W = 4 for f32 pools and 8 for 16-bit ones, one
// channel w at a time), the quantizer's loads (lane c reading channel c)
// and the butterflies' first stage (lane k taking channels 2k and 2k + 1)
// each reach 32 distinct banks of 4-byte words; unpadded, the stores would
// be 4- and 8-way conflicts and that stage 2-way. Two team threads that
// share a warp stage rows D + D / 32 words apart, which also lands their
// lanes on different banks for D = 128 (cache_row_banks in the unit tests
// checks all of this). Hosts keep rows unpadded and contiguous.
template <class A, bool Padded>
struct SlotRow {
  A* p;
  /// The word channel c sits at.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int word(int c) {
    return Padded ? c + (c >> 5) : c;
  }
  /// Words a row of D channels takes.
  KOKKOS_FORCEINLINE_FUNCTION static constexpr int columns(int D) {
    return Padded ? D + D / 32 : D;
  }
  KOKKOS_FORCEINLINE_FUNCTION A& operator[](int c) const { return p[word(c)]; }
};

// One team's scratch: `slots` rows of D values in A (padded on devices,
// SlotRow), and each slot's cache entry (block, entry; block < 0 when the
// slot holds nothing). Every team thread constructs it, from the start of
// level-0 scratch, identically.
template <class ExecutionSpace, class A>
struct CacheScratch {
  using scratch_space = typename ExecutionSpace::scratch_memory_space;
  using rows_type = Kokkos::View<A**, Kokkos::LayoutRight, scratch_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using dest_type = Kokkos::View<int**, Kokkos::LayoutRight, scratch_space,
                                 Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  static constexpr bool padded = device_shapes<ExecutionSpace>::value;
  using row_type = SlotRow<A, padded>;
  rows_type rows;
  dest_type dest;
  int head_dim;

  /// Words a row of D channels takes.
  KOKKOS_INLINE_FUNCTION static constexpr int columns(int D) {
    return row_type::columns(D);
  }

  /// Level-0 scratch bytes a team needs for `slots` pools of D channels.
  static std::size_t bytes(int slots, int head_dim) {
    return rows_type::shmem_size(slots, columns(head_dim)) +
           dest_type::shmem_size(slots, 2);
  }

  template <class Member>
  KOKKOS_INLINE_FUNCTION CacheScratch(Member const& member, int slots,
                                      int head_dim_)
      : rows(member.team_scratch(0), slots, columns(head_dim_)),
        dest(member.team_scratch(0), slots, 2),
        head_dim(head_dim_) {}

  KOKKOS_INLINE_FUNCTION int slots() const {
    return static_cast<int>(dest.extent(0));
  }
  /// Slot `slot`'s row, channel by channel.
  KOKKOS_INLINE_FUNCTION row_type row(int slot) const { return row_type{&rows(slot, 0)}; }
  /// Slot `slot`'s row as D contiguous values: hosts only (unpadded).
  KOKKOS_INLINE_FUNCTION A* host_row(int slot) const {
    static_assert(!padded, "device rows are padded: use row()");
    return &rows(slot, 0);
  }
};

// Largest slot count up to `wanted` whose scratch fits `max_bytes` (0 when
// not even one does).
template <class ExecutionSpace, class A>
int cache_slots_fitting(std::size_t max_bytes, int head_dim, int wanted) {
  int n = std::max(wanted, 1);
  while (n > 0 && CacheScratch<ExecutionSpace, A>::bytes(n, head_dim) > max_bytes) --n;
  return n;
}

// --- Phase 1: staging (per team thread, inside its work item) -----------

/// Records where slot `slot`'s pool goes (one lane writes).
template <class Member, class ExecutionSpace, class A>
KOKKOS_INLINE_FUNCTION void cache_stage_target(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot,
    CacheSlot where) {
  KokkosExt::single_per_thread(member, [&]() {
    s.dest(slot, 0) = where.block;
    s.dest(slot, 1) = where.entry;
  });
}

/// Marks slot `slot` empty: nothing is written for it.
template <class Member, class ExecutionSpace, class A>
KOKKOS_INLINE_FUNCTION void cache_stage_skip(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot) {
  cache_stage_target(member, s, slot, CacheSlot{-1, 0});
}

/// Stages channel c of slot `slot`: x is the pool's value as stored in T,
/// converted to A (to_accumulator). For a writer staging straight from
/// the registers its pooling loop just rounded into T, so the pool makes
/// no second trip through memory; any lane may stage any channel (the
/// barrier in cache_team_write orders them). Pair it with one
/// cache_stage_target for the slot.
template <class ExecutionSpace, class A>
KOKKOS_FORCEINLINE_FUNCTION void cache_stage_value(
    CacheScratch<ExecutionSpace, A> const& s, int slot, int c, A x) {
  s.row(slot)[c] = x;
}

/// Stages pool x (D values as stored in T, channel stride `stride`) into
/// slot `slot`, bound for `where` (an empty `where` marks the slot empty).
/// The calling team thread's vector lanes copy the channels with the lane
/// mapping of path P (thread_vector_pool's and thread_vector_copy's: lane p
/// takes channels [p * W, (p + 1) * W) on contiguous paths, channel p on
/// strided ones), so a writer may stage the row it has just written to
/// its output: each lane reads back only what it wrote itself.
template <class ExecutionSpace, class P = Path<0, 0, 1, false>, class Member,
          class A, class T>
KOKKOS_INLINE_FUNCTION void cache_stage_row(
    Member const& member, CacheScratch<ExecutionSpace, A> const& s, int slot,
    T const* x, std::ptrdiff_t stride, CacheSlot where) {
  cache_stage_target(member, s, slot, where);
  if (where.block < 0) return;
  auto const row = s.row(slot);
  int const D = s.head_dim;
  constexpr int W = P::width;
  if constexpr (P::contiguous) {
    KokkosExt::vector_for<ExecutionSpace>(member, D / W, [&](int p) {
      KPOOL_IMPL_UNROLL
      for (int w = 0; w < W; ++w) row[p * W + w] = to_accumulator(x[p * W + w]);
    });
  } else {
    KokkosExt::vector_for<ExecutionSpace>(
        member, D, [&](int c) { row[c] = to_accumulator(x[c * stride]); });
  }
}

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

// --- The steps' cache writes --------------------------------------------

// A step without a cache: its functors compile to what they were before
// caches existed (no scratch, no barrier, nothing staged).
struct NoCache {
  static constexpr bool enabled = false;
  using arithmetic_type = void;
};

// thread_vector_pool's stage for a cache write: channel c of the pool, as
// rounded into T, converted to A, into the slot's scratch row.
template <class Row>
struct CacheStage {
  Row row;
  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(int c, T const& v) const {
    row[c] = to_accumulator(v);
  }
  template <class Member, class T>
  KOKKOS_FORCEINLINE_FUNCTION void finish(Member const&, T const*,
                                          std::ptrdiff_t) const {}
};

// What a writer's item function gets to route the pools it makes into the
// cache. open(member, r, pool, k) records where the item's k-th pool goes
// (pool `pool` of batch row r) and returns the stage to pool it with;
// holds(k) says whether the item has a k-th slot. NoCacheHook: no cache.
struct NoCacheHook {
  static constexpr bool enabled = false;
  KOKKOS_FORCEINLINE_FUNCTION bool holds(int) const { return false; }
  template <class Member>
  KOKKOS_FORCEINLINE_FUNCTION NoStage open(Member const&, int, std::int64_t,
                                           int = 0) const {
    return NoStage();
  }
};

// A host's hook for pools written at once (no device shapes: a team
// thread's lanes run in turn, so nothing needs a barrier): the stage does
// nothing per channel, and finish reads the completed pool back from the
// output row just written (still in the core's L1 cache) and writes it
// (cache_write_row). `row` is the thread's D-value buffer. Nothing is held
// per pool, so an item may write any number (holds is always true: a
// decode row whose positions are not consecutive, possible only without
// validation, caches every pool it makes, where a device caches as many as
// it has slots).
template <class ExecutionSpace, class Target>
struct DirectCacheStage {
  using A = typename Target::arithmetic_type;
  Target const* target;
  CacheSlot where;
  A* row;

  template <class T>
  KOKKOS_FORCEINLINE_FUNCTION void operator()(int, T const&) const {}
  template <class Member, class T>
  KOKKOS_INLINE_FUNCTION void finish(Member const& member, T const* out,
                                     std::ptrdiff_t out_c) const {
    if (where.block >= 0)
      cache_write_row<ExecutionSpace>(member, *target, where, out, out_c, row);
  }
};

template <class ExecutionSpace, class Target>
struct DirectCacheHook {
  static constexpr bool enabled = true;
  using A = typename Target::arithmetic_type;

  Target const* target;
  A* row;

  KOKKOS_FORCEINLINE_FUNCTION bool holds(int) const { return true; }
  template <class Member>
  KOKKOS_INLINE_FUNCTION DirectCacheStage<ExecutionSpace, Target> open(
      Member const&, int r, std::int64_t pool, int = 0) const {
    return DirectCacheStage<ExecutionSpace, Target>{target,
                                                    target->locate(r, pool), row};
  }
};

/// How a host writes a step's pools (measured on x86 hosts; the README's
/// "Writing the pool cache"; both store the same bytes): f32 pools of a
/// step's prefill and continuation items are staged from the pooling
/// loop's registers into scratch slots, as on a device, and each thread
/// writes its items' slots after them (cache_write_staged); 16-bit pools,
/// whose staging slows the pooling loop by about 40%, and decode items,
/// which make one pool or none, are written at once (DirectCacheHook).
/// T is the pools' storage type, void for a decode step.
/// (A trait rather than a constexpr function: device code may read it.)
template <class ExecutionSpace, class T, class A>
struct host_stages_cache
    : std::integral_constant<bool, !device_shapes<ExecutionSpace>::value &&
                                       std::is_same<T, float>::value &&
                                       std::is_same<A, float>::value> {};

template <class ExecutionSpace, class Target>
struct TeamCacheHook {
  static constexpr bool enabled = true;
  using A = typename Target::arithmetic_type;

  CacheScratch<ExecutionSpace, A> const* scratch;
  Target const* target;
  int first;  // the item's first slot
  int slots;  // slots an item has

  KOKKOS_FORCEINLINE_FUNCTION bool holds(int k) const { return k < slots; }
  template <class Member>
  KOKKOS_INLINE_FUNCTION CacheStage<typename CacheScratch<ExecutionSpace, A>::row_type> open(
      Member const& member, int r,
                                            std::int64_t pool, int k = 0) const {
    cache_stage_target(member, *scratch, first + k, target->locate(r, pool));
    return {scratch->row(first + k)};
  }
};

/// The team loop of every step functor: body(i, hook) for each item i in
/// [0, items), over the team's threads, T the pools' storage type (void
/// for a decode step). With a cache, on a device or staged on a host
/// (host_stages_cache), each item owns `per_item` scratch slots, marked
/// empty before its body runs, and the team writes every staged pool after
/// the loop (cache_team_write); the loop body holds no barrier and the
/// write phase is team-uniform, so every team thread reaches every barrier
/// however many pools its items made. Otherwise, on a host, each pool is
/// written as soon as it is made (DirectCacheHook), each team thread with
/// one scratch row. Without a cache it is the plain TeamThreadRange.
template <class ExecutionSpace, class T, class Cache, class Member, class Body>
KOKKOS_INLINE_FUNCTION void team_items(Member const& member,
                                       Cache const& cache, int items,
                                       int per_item, Body const& body) {
  if constexpr (Cache::enabled && !device_shapes<ExecutionSpace>::value &&
                !host_stages_cache<ExecutionSpace, T,
                                   typename Cache::arithmetic_type>::value) {
    using A = typename Cache::arithmetic_type;
    CacheScratch<ExecutionSpace, A> const s(member, member.team_size(),
                                            cache.head_dim());
    (void)per_item;
    DirectCacheHook<ExecutionSpace, Cache> const hook{
        &cache, s.host_row(member.team_rank())};
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items),
                         [&](int i) { body(i, hook); });
  } else if constexpr (Cache::enabled) {
    using A = typename Cache::arithmetic_type;
    CacheScratch<ExecutionSpace, A> const s(member, items * per_item,
                                            cache.head_dim());
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items), [&](int i) {
      TeamCacheHook<ExecutionSpace, Cache> const hook{&s, &cache,
                                                      i * per_item, per_item};
      KokkosExt::single_per_thread(member, [&]() {
        for (int k = 0; k < per_item; ++k) s.dest(i * per_item + k, 0) = -1;
      });
      body(i, hook);
    });
    cache_team_write<ExecutionSpace>(member, s, cache);
  } else {
    (void)cache;
    (void)per_item;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, items),
                         [&](int i) { body(i, NoCacheHook()); });
  }
}

// --- Launch ---------------------------------------------------------------

// Level-0 scratch one team of an ExecutionSpace launch may take.
template <class ExecutionSpace>
std::size_t team_scratch_max(ExecutionSpace const& space, int team_size,
                             int lanes) {
  KokkosExt::TeamPolicy<ExecutionSpace> const probe(space, 1, team_size, lanes);
  return static_cast<std::size_t>(probe.scratch_size_max(0));
}

// The team shape of a launch whose team holds `slots_per_item` scratch
// slots per work item: team threads and items per team capped so that the
// team's scratch fits level 0. `width` channels a lane, as team_shape.
template <class ExecutionSpace, class A, class Functor>
TeamShape cache_team_shape(ExecutionSpace const& space, Functor const& f,
                           int head_dim, int width, int slots_per_item,
                           int requested_team_size) {
  TeamShape s = team_shape(space, f, head_dim, width, requested_team_size);
  std::size_t const max = team_scratch_max(space, s.team_size, s.lanes);
  int const per = std::max(slots_per_item, 1);
  int const wanted = s.items_per_team * per;
  int const fit = cache_slots_fitting<ExecutionSpace, A>(max, head_dim, wanted) / per;
  if (fit < s.items_per_team) {
    int const per_thread = items_per_thread<ExecutionSpace>();
    s.team_size = std::max(1, std::min(s.team_size, fit / per_thread));
    s.items_per_team = std::max(1, std::min(s.team_size * per_thread, fit));
  }
  return s;
}

// Whether `slots` pools of D channels fit a team's level-0 scratch at all.
template <class ExecutionSpace, class A>
bool cache_scratch_fits(ExecutionSpace const& space, int head_dim, int slots = 1,
                        std::size_t* max_bytes = nullptr) {
  std::size_t const max = team_scratch_max(space, 1, 1);
  if (max_bytes) *max_bytes = max;
  return CacheScratch<ExecutionSpace, A>::bytes(slots, head_dim) <= max;
}

// A launch of `items` work items whose teams hold `slots_per_item` scratch
// slots per item (the functor reads its items_per_team member). Planned,
// and its size checked, before anything is queued.
template <class ExecutionSpace, class A, class Functor>
LaunchShape cache_items_shape(Checker const& chk, std::string const& argument,
                              ExecutionSpace const& space, Functor const& f,
                              std::uint64_t items, int head_dim, int width,
                              int slots_per_item, int requested_team_size) {
  TeamShape const s = cache_team_shape<ExecutionSpace, A>(
      space, f, head_dim, width, slots_per_item, requested_team_size);
  LaunchShape l;
  l.league = league_for(chk, argument, items, s.items_per_team);
  l.team_size = s.team_size;
  l.lanes = s.lanes;
  l.items_per_team = s.items_per_team;
  l.scratch_bytes = CacheScratch<ExecutionSpace, A>::bytes(
      s.items_per_team * std::max(slots_per_item, 1), head_dim);
  return l;
}

}  // namespace Details
}  // namespace KPool

#endif
