#ifndef KPOOL_COMMON_DETAIL_CACHE_TARGET_HPP
#define KPOOL_COMMON_DETAIL_CACHE_TARGET_HPP

// The pool cache as a write sees it (docs/indexer.md, "The pool cache"):
// the quantizer's scalar numerics (the scale of each mode, the canonical
// NaN, 1/sqrt(D)), and CacheTarget, a cache and the call's block table as
// pointers and sizes.

#include <cache/KPool_PoolCache.hpp>
#include <common/KPool_Float8.hpp>
#include <common/KPool_Types.hpp>
#include <common/detail/KPool_ServingQuant.hpp>
#include <common/detail/KPool_KokkosExt.hpp>
#include <common/detail/KPool_Launch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
  // A write's share of a sharded cache (docs/ranks.md): locate() takes the
  // sequence's pools, skips those of other ranks and places the rest at
  // their local pools. Readers (the selections, load_pools) address local
  // pools and clear it.
  Shard shard;

  KOKKOS_INLINE_FUNCTION int head_dim() const { return dim; }

  // Pool `pool` of batch row r: block_table(r, pool / block_pools), entry
  // pool % block_pools (of its local pool, on a shard that holds it; none
  // on another). Anything out of range (row, column, an unassigned or too
  // large block) gives an empty slot: validation reports those before
  // launching, and with it off they are skipped.
  KOKKOS_INLINE_FUNCTION CacheSlot locate(std::int64_t r, std::int64_t pool) const {
    int entry = 0;
    std::int64_t const at = table_index(r, pool, entry);
    return slot(at >= 0 ? block_table[at] : -1, entry);
  }
  // locate() in two steps, so that a reader can load a block id well
  // before it needs it (the tensor-core scoring's key ring): where in
  // block_table pool `pool` of batch row r has its block id (-1: none),
  // and its entry in that block; then the slot of that id.
  KOKKOS_INLINE_FUNCTION std::int64_t table_index(std::int64_t r, std::int64_t pool,
                                                  int& entry) const {
    if (r < 0 || pool < 0 || r >= table_rows) return -1;
    if (shard.ranks > 1) {
      if (shard.owner(static_cast<std::uint64_t>(pool)) != shard.rank) return -1;
      pool = static_cast<std::int64_t>(shard.local(static_cast<std::uint64_t>(pool)));
    }
    std::int64_t const col = pool / block_pools;
    if (col >= table_cols) return -1;
    entry = static_cast<int>(pool % block_pools);
    return r * table_row_stride + col * table_col_stride;
  }
  KOKKOS_INLINE_FUNCTION CacheSlot slot(std::int32_t b, int entry) const {
    if (b < 0 || b >= num_blocks) return CacheSlot{-1, 0};
    return CacheSlot{b, entry};
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
  t.shard = cache.shard();
  return t;
}


}  // namespace Details
}  // namespace KPool

#endif
